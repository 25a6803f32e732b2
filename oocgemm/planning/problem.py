"""What the planner needs to know about a product: shapes, dtype, layout. No I/O here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Operand:
    """Metadata of one stored matrix, as the planner sees it."""

    shape: tuple[int, int]
    """Stored shape (rows, cols), before any transpose."""
    chunks: tuple[int, int] | None = None
    """Stored chunk shape (Zarr chunks); None for arrays without chunking."""
    on_disk: bool = False
    """True when reads come from storage (Zarr or .npy on disk), False for memory."""
    name: str = ""
    """How messages name this operand (a path or 'numpy array')."""
    zero_copy: bool = False
    """In memory, of the compute dtype and in a layout BLAS takes: an unstaged executor uses
    it in place and moves no bytes for it."""
    sliced: bool = False
    """Chunked but uncompressed, a file per chunk: reads take the part of a chunk they need
    from its file (no decode, no decoded chunks held), as from a .npy file."""

    decodes_into: bool = False
    """A whole chunk decodes straight into a caller's buffer (a plain chunk file and its
    codec): a staged plan may decode it into a pinned ring buffer (``Plan.io.into_ring``)."""
    cached: bool = False
    """On disk, and held by the OS page cache (a fact of the run's I/O): its storage reads
    run at the host's memory rate; of an output, the page cache takes all its writes (at the
    model's ``cache_write`` rate). Only the prediction hears it: the plan's choices are made
    as for storage, so that a product plans the same blocks (the same bits) warm and cold."""
    stored: float = 1.0
    """Bytes stored per byte decoded, on disk (below 1 where compressed: a sample of its
    objects' sizes, a fact of the run's I/O): its storage reads move this share of the bytes
    decoded."""
    zstd_frames: tuple[int, int] | None = None
    """The decoded shape of one zstd frame (a chunk, or an inner chunk of a shard) where every
    stored object is a local file of zstd frames of plain bytes, which a device may decode
    (``Plan.io.gpu_decode``); None otherwise."""

    def __post_init__(self) -> None:
        if not 0 < self.stored < float("inf"):
            raise ValueError(f"{self.name or 'operand'}: stored={self.stored!r}, expected a "
                             f"positive share of its decoded bytes")

    @property
    def decoded(self) -> bool:
        """Read by decoding whole chunks (:mod:`oocgemm.planning.chunks`)."""
        return self.on_disk and bool(self.chunks) and not self.sliced


@dataclass(frozen=True)
class Problem:
    """``out = alpha * op(a) @ op(b) + beta * c`` with ``op(a)`` M×K and ``op(b)`` K×N."""

    m: int
    """Rows of op(a) and of the output."""
    n: int
    """Columns of op(b) and of the output."""
    k: int
    """Inner dimension."""
    itemsize: int
    """Bytes per element of the compute dtype."""
    dtype: str
    """Compute dtype name (numpy), e.g. 'float64'."""
    a: Operand
    b: Operand
    c: Operand | None = None
    """The matrix read when beta != 0 (None when C is not read)."""
    out: Operand | None = None
    """The output, when it exists already and has its own chunking."""
    alpha: float | complex = 1.0
    beta: float | complex = 0.0
    trans_a: bool = False
    trans_b: bool = False
    shared: bool = False
    """A and B are one stored matrix (the same file, array or store, found by identity): it
    is read, decoded and staged once for both roles."""

    @property
    def gram(self) -> bool:
        """``X^T X`` or ``X X^T``: one stored matrix on both sides, exactly one of them
        transposed, and a product to compute. C is symmetric (for complex dtypes too: the
        plain transpose, not the conjugate)."""
        return self.shared and self.trans_a != self.trans_b and self.computes_product

    @property
    def computes_product(self) -> bool:
        """False when alpha == 0 or K == 0: A and B are then never read."""
        return self.alpha != 0 and self.k > 0

    @property
    def reads_c(self) -> bool:
        """BLAS semantics: beta == 0 means C is never read."""
        return self.beta != 0

    def clipped(self, tile: tuple[int, int, int]) -> tuple[int, int, int]:
        """``tile`` cut to the product's extents (at least 1 each): the largest blocks and
        panels it makes."""
        w, h, r = tile
        return min(w, max(self.m, 1)), min(h, max(self.n, 1)), min(r, max(self.k, 1))

    @property
    def flops(self) -> int:
        """Real floating-point operations of the product (complex counts 4x)."""
        if not self.computes_product:
            return 0
        factor = 8 if self.dtype.startswith("complex") else 2
        return factor * self.m * self.n * self.k

    def operand_bytes(self, name: str) -> int:
        """Bytes of op(A) ('A', M×K) or op(B) ('B', K×N) in the compute dtype."""
        elements = {"A": self.m * self.k, "B": self.k * self.n}[name]
        return elements * self.itemsize

    def k_axis(self, name: str) -> int:
        """The stored axis of A or B (``name``) that runs along K."""
        transposed = self.trans_a if name == "A" else self.trans_b
        return (0 if transposed else 1) if name == "A" else (1 if transposed else 0)

    def k_part(self, lo: int, hi: int) -> Problem:
        """``alpha * op(A) @ op(B)`` over K's range ``lo:hi`` alone, as a product of its own
        (A's and B's stored shapes cut along K; no C read, no output of its own): one
        executor's partial C where several split K."""
        def cut(x: Operand, axis: int) -> Operand:
            shape = list(x.shape)
            shape[axis] = hi - lo
            return dataclasses.replace(x, shape=(shape[0], shape[1]))

        return dataclasses.replace(self, k=hi - lo, beta=0.0, c=None, out=None,
                                   a=cut(self.a, self.k_axis("A")),
                                   b=cut(self.b, self.k_axis("B")))

    def a_chunks_mk(self) -> tuple[int | None, int | None]:
        """A's chunk sizes along (M, K), after the transpose."""
        return _oriented(self.a.chunks, self.trans_a)

    def b_chunks_kn(self) -> tuple[int | None, int | None]:
        """B's chunk sizes along (K, N), after the transpose."""
        return _oriented(self.b.chunks, self.trans_b)


def _oriented(chunks: tuple[int, int] | None, transposed: bool) -> tuple[int | None, int | None]:
    if chunks is None:
        return (None, None)
    return (chunks[1], chunks[0]) if transposed else (chunks[0], chunks[1])

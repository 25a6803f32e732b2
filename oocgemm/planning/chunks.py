"""How a schedule's reads meet the storage's chunks: which chunks each load touches, and how
many times each chunk is decoded.

A chunked source (Zarr) is read at its grain: every chunk a read touches is decoded whole,
once, and the read copies its part out of the decoded chunk. What happens between two loads
of the same panel is a budget decision of the plan (``Plan.io.cache``):

- *kept*: the decoded chunks of the operand stay in host memory for the whole run, so every
  chunk is decoded exactly once;
- *streamed*: the decoded chunks of a load are dropped when its last read is done, and a later
  load that touches the same chunk decodes it again (a panel reloaded for another block row,
  or two neighbouring panels that share a chunk because their boundary cuts it).

Pure functions of regions and chunk shapes; nothing here touches storage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .grid import Region as Region
from .grid import chunk_range as chunk_range
from .grid import chunk_region as chunk_region
from .grid import chunks_of as chunks_of
from .grid import on_chunk_edges as on_chunk_edges
from .schedule import Op, OpKind


@dataclass(frozen=True)
class Load:
    """One load of a region (a panel, a C block) as the schedule reads it: ``reads`` READ
    operations (stripes, or one read of the whole region), touching ``chunks``, each of them
    by ``uses`` of those reads (a chunk of 4096 rows by four 1024-row stripes)."""

    region: Region
    reads: int
    chunks: tuple[tuple[int, int], ...]
    uses: tuple[int, ...]
    first: int = -1
    """The schedule's index of its first READ (where the run needs it first)."""


def reads_of(op: Op, operands) -> bool:
    """Whether ``op`` reads one of ``operands`` from storage: a READ, or a WRITE that adds
    C as read (a symmetric product meets C as its blocks are written)."""
    if op.kind is OpKind.READ:
        return op.operand in operands
    return op.kind is OpKind.WRITE and op.beta != 0 and "C" in operands


def loads(ops: Iterable[Op], operand: str | tuple[str, ...], chunks: tuple[int, int]
          ) -> list[Load]:
    """The loads of ``operand`` (or of several, one stored matrix in several roles) in
    schedule order: consecutive READs of one block key are one load (a staged load reads its
    region in row stripes)."""
    operands = (operand,) if isinstance(operand, str) else operand
    out: list[Load] = []
    current: tuple[tuple, Region] | None = None  # the open load: role and key, region so far
    reads = first = 0
    uses: dict[tuple[int, int], int] = {}
    for op in ops:
        if not reads_of(op, operands):
            continue
        if current is None or (op.operand, op.key) != current[0]:
            if current is not None:
                out.append(Load(current[1], reads, tuple(uses), tuple(uses.values()), first))
            current, reads, uses, first = ((op.operand, op.key), op.region), 0, {}, op.index
        key, ((r0, r1), (c0, c1)) = current
        (s0, s1), (d0, d1) = op.region
        current = (key, ((min(r0, s0), max(r1, s1)), (min(c0, d0), max(c1, d1))))
        reads += 1
        for index in chunks_of(op.region, chunks):
            uses[index] = uses.get(index, 0) + 1
    if current is not None:
        out.append(Load(current[1], reads, tuple(uses), tuple(uses.values()), first))
    return out


def chunk_ends(load_list: list[Load], kept: bool, gap: int = 1
               ) -> dict[tuple[int, int], list[int]]:
    """After how many of its reads each chunk is dropped: once, after its last, when kept;
    when streamed, at the end of each stretch of loads that touch it, where a stretch goes on
    while the next load that touches the chunk comes at most ``gap`` loads later (a chunk
    larger than a panel is decoded once and its rows handed to every panel of the stretch;
    ``gap`` is 2 for one matrix read in two roles, whose loads alternate). One decode per
    stretch: ``len(ends)``."""
    uses: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for number, load in enumerate(load_list):
        for index, count in zip(load.chunks, load.uses):
            uses.setdefault(index, []).append((number, count))
    ends: dict[tuple[int, int], list[int]] = {}
    for index, reads in uses.items():
        marks: list[int] = []
        total, last = 0, -gap - 1
        for number, count in reads:
            total += count
            if marks and (kept or number - last <= gap):
                marks[-1] = total
            else:
                marks.append(total)
            last = number
        ends[index] = marks
    return ends


def decode_counts(load_list: list[Load], kept: bool, gap: int = 1
                  ) -> dict[tuple[int, int], int]:
    """How many times each chunk is decoded: once when kept, once per stretch of loads that
    touch it (:func:`chunk_ends`) when streamed."""
    return {index: len(marks) for index, marks in chunk_ends(load_list, kept, gap).items()}


@dataclass(frozen=True)
class ChunkReport:
    """What the plan expects of one chunked operand, for ``print(plan)``."""

    operand: str
    chunks: tuple[int, int]
    """Stored chunk shape (the unit decoded at once)."""
    grid: tuple[int, int]
    """Chunks along the stored rows and columns."""
    kept: bool
    loads: int
    """Panel (or block) loads of the operand in the run, at most."""
    decodes: int
    """Chunk decodes in the run, at most (the ``grid`` product when each chunk is decoded
    once): the schedule reuses a panel that a slot still holds, which this does not count."""
    cut: bool = False
    """True when panel edges cut chunks (neighbouring loads share chunks)."""
    roles: str = ""
    """How ``print(plan)`` names it: the operand, or 'A and B' for one matrix in both."""
    into_ring: bool = False
    """Each chunk decoded once, by a reader, straight into a pinned ring buffer
    (:attr:`~oocgemm.planning.plan.IOChoices.into_ring`)."""
    stored: float = 1.0
    """Bytes stored per byte decoded (:attr:`Operand.stored
    <oocgemm.planning.problem.Operand.stored>`)."""

    @property
    def n_chunks(self) -> int:
        return self.grid[0] * self.grid[1]

    def describe(self) -> str:
        per = self.decodes / max(self.n_chunks, 1)
        why = "panels reloaded" + (", panel edges cut chunks" if self.cut else "")
        how = ("kept in host memory: each decoded once" if self.kept else
               "each decoded once, straight into the pinned ring" if self.into_ring else
               f"streamed: each decoded up to {per:.3g} times on average"
               + (f", {why}" if per > 1 else ""))
        stored = (f", stored in {self.stored:.0%} of their decoded bytes"
                  if self.stored < 0.995 else "")
        return (f"{self.roles or self.operand} {self.grid[0]}x{self.grid[1]} chunks of "
                f"{self.chunks[0]}x{self.chunks[1]}{stored}, "
                + (f"{self.decodes} decodes" if self.kept or self.into_ring else
                   f"up to {self.loads} loads, {self.decodes} decodes") + f" ({how})")


def estimate(plan, operand: str) -> ChunkReport | None:
    """Loads and decodes of a chunked on-disk operand, from the plan's geometry alone (no
    operation list): every panel of A is loaded once per C block when K has several panels
    (once per block row otherwise), every panel of B once per block row, C once per block.
    The K panels of one pass are consecutive loads, which decode each chunk along K once
    (:func:`chunk_ends`), however the panel edges cut it."""
    prob = plan.problem
    op = {"A": prob.a, "B": prob.b, "C": prob.c}[operand]
    if op is None or not op.decoded:
        return None
    if operand in ("A", "B") and not prob.computes_product:
        return None
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    p, q, nk = plan.grid
    along = None  # the stored axis that is K
    if operand == "A":
        split_r, split_c = (ks, rows) if prob.trans_a else (rows, ks)
        along, per_panel = prob.k_axis("A"), (1 if nk == 1 else q)
    elif operand == "B":
        split_r, split_c = (cols, ks) if prob.trans_b else (ks, cols)
        along, per_panel = prob.k_axis("B"), p
    else:
        split_r, split_c, per_panel = rows, cols, 1
    chunks = op.chunks
    grid = (math.ceil(op.shape[0] / chunks[0]), math.ceil(op.shape[1] / chunks[1]))
    touched = [[len(chunk_range(a, b, chunk)) for a, b in zip(split, split[1:])]
               for split, chunk in ((split_r, chunks[0]), (split_c, chunks[1]))]
    kept = operand in plan.io.cache
    panels = len(touched[0]) * len(touched[1])
    passes = [grid[axis] if axis == along else sum(touched[axis]) for axis in (0, 1)]
    decodes = grid[0] * grid[1] if kept else per_panel * passes[0] * passes[1]
    cut = any(sum(touched[axis]) > grid[axis] for axis in (0, 1) if axis != along)
    return ChunkReport(operand=operand, chunks=chunks, grid=grid, kept=kept,
                       loads=per_panel * panels, decodes=decodes, cut=cut, stored=op.stored)


def gram_estimate(plan) -> ChunkReport | None:
    """The report of the one matrix X of a symmetric plan (:attr:`Plan.symmetric`), read in
    both roles by one reader: each computed C block is a pass over K whose loads decode the
    chunks along K of the block's columns of X (its row's and, above the diagonal, its
    column's), each once (:func:`chunk_ends`)."""
    prob = plan.problem
    x = prob.a
    if not x.decoded:
        return None
    along = prob.k_axis("A")  # X's axis that is K
    other = 1 - along
    grid = (math.ceil(x.shape[0] / x.chunks[0]), math.ceil(x.shape[1] / x.chunks[1]))
    p, _, nk = plan.grid
    blocks = p * (p + 1) // 2
    kept = "A" in plan.io.cache
    width = most_touched(plan.tile[0], x.chunks[other], x.shape[other])
    per_pass = p * min(width, grid[other]) + (blocks - p) * min(2 * width, grid[other])
    touched = sum(len(chunk_range(a, b, x.chunks[other]))
                  for a, b in zip(plan.row_splits, plan.row_splits[1:]))
    return ChunkReport(operand="A", chunks=x.chunks, grid=grid, kept=kept,
                       loads=(2 * blocks - p) * nk,
                       decodes=grid[0] * grid[1] if kept else grid[along] * per_pass,
                       cut=touched > grid[other], roles="A and B (one matrix)",
                       stored=x.stored)


def one_matrix(a: ChunkReport, b: ChunkReport) -> ChunkReport:
    """The report of one stored matrix read in both roles (A and B) by one reader: its loads
    are both roles', and a chunk both decode once when kept."""
    decodes = a.n_chunks if a.kept else a.decodes + b.decodes
    return ChunkReport(operand="A", chunks=a.chunks, grid=a.grid, kept=a.kept,
                       loads=a.loads + b.loads, decodes=decodes, cut=a.cut or b.cut,
                       roles="A and B (one matrix)", stored=a.stored)


def most_touched(extent: int, chunk: int, total: int | None = None, step: int | None = None
                 ) -> int:
    """The most chunks (of ``chunk``) that one of the ranges ``[i * step, i * step + extent)``
    touches (``step``: ``extent`` unless given): the ranges start on multiples of
    ``gcd(step, chunk)`` within a chunk, so one starting that much short of a chunk's end
    reaches furthest; never more than the ``total`` elements' chunks."""
    extent = max(extent, 1)
    grain = math.gcd(step or extent, chunk)
    most = (chunk - grain + extent - 1) // chunk + 1
    return most if total is None else min(most, -(-max(total, 1) // chunk))


def assembly_bytes(block: tuple[int, int], chunks: tuple[int, int] | None, stripe: int,
                   itemsize: int) -> int:
    """Bytes a sink holds to write an output stored in chunks at its grain, behind compute
    (:class:`~oocgemm.storage.chunked.ChunkWriter`): the rows of each chunk row band of a C
    block (a *cell*: the band within the block) wait in host memory until the band is
    complete and its chunks are stored by the encoder threads. A C block of ``block`` leaves
    a staged ring in row stripes of ``stripe`` rows (``stripe`` 0: whole blocks, or the
    row stripes of an unstaged plan's last block). Where stripes are not whole chunk rows, at
    most two blocks are being written at once (the ring holds the end of one and the start of
    the next), each with at most two bands open (a stripe ends in one band and the next
    begins it): four cells. Else two: one being copied while the one before it is stored."""
    if not chunks:
        return 0
    w, h = block
    band = min(chunks[0], w)
    if stripe <= 0 or (stripe % band == 0 and w % band == 0):
        return 2 * band * h * itemsize
    return 4 * band * h * itemsize


def window_bytes(region_shape: tuple[int, int], chunks: tuple[int, int] | None,
                 itemsize: int, shape: tuple[int, int] | None = None) -> int:
    """Bytes of the decoded chunks that one load of a region of ``region_shape`` may hold
    (regions placed on multiples of their own shape, in an array of ``shape``): whole chunks
    on both sides."""
    if not chunks:
        return 0
    total = itemsize
    for axis, (extent, chunk) in enumerate(zip(region_shape, chunks)):
        total *= most_touched(extent, chunk, shape[axis] if shape else None) * chunk
    return total

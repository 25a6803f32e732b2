"""``X^T X`` and ``X X^T`` of one matrix, computed half: whether a product is one
(:func:`is_gram`; ``matmul(x.T, x)`` is seen through to ``x`` read transposed), each band's part
on and right of the diagonal (:func:`band_boxes`), and each chunk of the result taken from the chunk
that holds it: as is above the diagonal, its upper triangle mirrored on it, the transpose of the
result chunk across below it (:func:`held_by`), so that C == C.T bit for bit. Where the bands
and chunks are cut is :mod:`.partition`'s; the runs compute their boxes like any group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .runner import Handle, take_chunk

if TYPE_CHECKING:
    from .operands import Operand


def is_gram(ops: dict[str, Operand], options: Mapping[str, Any]) -> bool:
    """Whether the product is ``X^T X`` or ``X X^T`` of one matrix (the same stored array, by
    identity, or the same dask array), with beta == 0 and the default kernel: C is then
    symmetric, and bands of it need compute only their part on and right of the diagonal."""
    from ..kernel_catalog import DEFAULT as DEFAULT_KERNEL
    from ..storage.identity import identity, same_matrix

    a, b = ops["A"], ops["B"]
    if "C" in ops or a.transposed == b.transposed or \
            options.get("kernel", DEFAULT_KERNEL) != DEFAULT_KERNEL:
        return False
    if a.array is not None or b.array is not None:
        return a.array is not None and b.array is not None and a.array.name == b.array.name
    return same_matrix(identity(a.stored), identity(b.stored))


def band_boxes(rows: list[int], cols: list[int], symmetric: bool
           ) -> dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]]:
    """Each group's part of C, ``(rows, cols)``: its rows and columns; of a symmetric product
    (bands of whole rows) the band's columns from its first row on, on and right of the
    diagonal (what lies left of it is the transpose of what bands above computed)."""
    return {(i, j): ((rows[i], rows[i + 1]),
                     (rows[i], cols[-1]) if symmetric else (cols[j], cols[j + 1]))
            for i in range(len(rows) - 1) for j in range(len(cols) - 1)}


def held_by(ci: int, cj: int, symmetric: bool
            ) -> tuple[int, int, Callable[..., np.ndarray] | None]:
    """Result chunk (ci, cj) as ``(ti, tj, take)``: the chunk of the groups' products that
    holds it, and the task that takes it from that one's group. A symmetric product's groups
    compute the chunks on and above the diagonal: a diagonal chunk is its upper triangle,
    mirrored; one below the diagonal (``take`` None) is the result chunk across it,
    transposed (:func:`transposed`): made of that chunk's own bits, so that C == C.T bit for
    bit."""
    if not symmetric or ci < cj:
        return ci, cj, take_chunk
    if ci == cj:
        return ci, cj, _diagonal_chunk
    return cj, ci, None


def _diagonal_chunk(handle: Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """A chunk on the diagonal of a symmetric product: its upper triangle, and the same
    mirrored below (an exact copy, the plain transpose for complex dtypes, as ``multiply``'s)."""
    square = handle.chunk(r0, r1, c0, c1)
    return np.where(np.triu(np.ones(square.shape, dtype=bool)), square, square.T)


def transposed(chunk: np.ndarray) -> np.ndarray:
    """A chunk below the diagonal of a symmetric product: the result chunk across it,
    transposed (a contiguous copy)."""
    return np.ascontiguousarray(chunk.T)

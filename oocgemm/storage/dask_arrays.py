"""Dask arrays as operands: each chunk computed by the graph when the run reads it."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .base import MatrixSource


class DaskSource(MatrixSource):
    """A dask array, read chunk by chunk (a :class:`~oocgemm.storage.base.ChunkedSource`):
    each chunk is computed by the active scheduler (a ``dask.distributed`` Client when there
    is one), and the run's chunk readers keep what they computed, so that each chunk is
    computed once per run where the plan keeps the operand (``print(plan)`` says)."""

    def __init__(self, array, name: str = "dask array"):
        self.name = name
        if array.ndim != 2:  # its shape says so (arguments.check_matrix): no grid to read
            self._array, self.shape, self.dtype = array, tuple(array.shape), np.dtype(array.dtype)
            self.chunks, self.on_disk = None, True
            return
        rows, cols = array.chunks
        if any(c != c for axis in (rows, cols) for c in axis):  # NaN: sizes dask does not know
            raise InputError(f"{name}: a dask array whose chunk sizes are unknown (after a "
                             f"boolean mask or a filter); call .compute_chunk_sizes() first")
        if not (_regular(rows) and _regular(cols)):  # a regular grid, as storage has
            array = array.rechunk((max(rows, default=1), max(cols, default=1)))
            rows, cols = array.chunks
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        # a 0-size dimension has a chunk of size 0: a grid of 1 still covers it
        self.chunks = (max(rows[0], 1) if rows else 1, max(cols[0], 1) if cols else 1)
        self.on_disk = True  # not in memory: produced by its graph, read at its grain

    def read_chunk(self, index, out, *, files=None) -> None:
        """Compute chunk ``index`` into ``out`` (counted as decoded: what its graph read is
        its own; ``files`` unused: its graph reads)."""
        np.copyto(out, host_array(self._array.blocks[tuple(index)].compute()),
                  casting="same_kind")
        self.count(0, out.nbytes)

    def read(self, rows, cols, out):
        np.copyto(out, host_array(self._array[rows[0]:rows[1], cols[0]:cols[1]].compute()),
                  casting="same_kind")


def host_array(block):
    """A computed chunk in host memory (a CuPy-backed graph gives device arrays)."""
    return block.get() if hasattr(block, "get") and not isinstance(block, np.ndarray) else block


def _regular(sizes) -> bool:
    """Chunk sizes of a regular grid: all equal, but for a smaller last one."""
    return all(c == sizes[0] for c in sizes[:-1]) and (not sizes or sizes[-1] <= sizes[0])

"""A part of a stored matrix along one axis, read as a matrix of its own: what one of several
executors reads when they split a product's K among them
(:mod:`oocgemm.runtime.multi_device`)."""

from __future__ import annotations

import numpy as np

from .base import MatrixSource


class Part(MatrixSource):
    """Rows (``axis=0``) or columns (``axis=1``) ``lo:hi`` of ``inner``. Where ``inner`` is
    chunked, ``lo`` lies on a chunk edge and the part's chunks are the inner's, shifted: read
    at its grain by a :class:`~oocgemm.storage.chunked.ChunkReader` as the whole would be.
    What it takes from storage is counted by ``inner``."""

    def __init__(self, inner: MatrixSource, axis: int, lo: int, hi: int):
        chunks = inner.chunks
        if chunks is not None and lo % chunks[axis]:
            raise ValueError(f"a part from {lo} cuts a chunk of {chunks[axis]}")
        shape = list(inner.shape)
        shape[axis] = hi - lo
        self.inner, self.axis, self.lo = inner, axis, lo
        self.shape = (shape[0], shape[1])
        span = ((lo, hi), (0, inner.shape[1])) if axis == 0 else ((0, inner.shape[0]), (lo, hi))
        self.region = span
        self.dtype = inner.dtype
        self.chunks = chunks
        self.on_disk = inner.on_disk
        self.sliced = inner.sliced
        self.name = inner.name
        self.path = inner.path
        self._shift = chunks[axis] and lo // chunks[axis] if chunks else 0

    def _outer(self, rows, cols) -> tuple[tuple[int, int], tuple[int, int]]:
        if self.axis == 0:
            return (rows[0] + self.lo, rows[1] + self.lo), (cols[0], cols[1])
        return (rows[0], rows[1]), (cols[0] + self.lo, cols[1] + self.lo)

    def _index(self, index):
        i, j = index
        return (i + self._shift, j) if self.axis == 0 else (i, j + self._shift)

    def read(self, rows, cols, out) -> None:
        outer_rows, outer_cols = self._outer(rows, cols)
        self.inner.read(outer_rows, outer_cols, out)

    def view(self, rows, cols, dtype) -> np.ndarray | None:
        outer_rows, outer_cols = self._outer(rows, cols)
        return self.inner.view(outer_rows, outer_cols, dtype)

    def read_chunk(self, index, out, *, files=None) -> None:
        self.inner.read_chunk(self._index(index), out, files=files)  # type: ignore[attr-defined]

    def stored_chunk(self, index) -> tuple[int, int]:
        """Chunk ``index`` of the part as the inner source's chunk index."""
        return self._index(index)

    def prefetch_chunk(self, index) -> None:
        hint = getattr(self.inner, "prefetch_chunk", None)
        if hint is not None:
            hint(self._index(index))

    def array(self):
        return self.inner.array()

    def close(self) -> None:
        """Nothing: the inner source belongs to the whole run."""

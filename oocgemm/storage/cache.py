"""A host-memory cache of the regions read from storage: an operand re-read once per block
row or column (B once per row of C blocks, A once per column when K has several panels) is
read from storage once when it fits, as the traffic model wants of slow storage."""

from __future__ import annotations

import threading

import numpy as np

from .base import MatrixSource


class CachedSource(MatrixSource):
    """Wraps a source; keeps every region read (as its rows × cols) up to ``budget`` bytes.

    The executors read the same regions again when they reload a panel (the schedule's
    regions are fixed by the plan), so a hit is a memory copy instead of a storage read.
    Regions that would pass the budget are read through and not kept.
    """

    def __init__(self, inner: MatrixSource, budget: int):
        self.inner = inner
        self.budget = int(budget)
        self.shape = inner.shape
        self.dtype = inner.dtype
        self.chunks = inner.chunks
        self.on_disk = inner.on_disk
        self.name = inner.name
        self.path = inner.path
        self._kept: dict[tuple, np.ndarray] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        """Reads served from memory."""
        self.misses = 0
        """Reads that went to storage."""

    def read(self, rows, cols, out) -> None:
        key = (tuple(rows), tuple(cols), np.dtype(out.dtype).str)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self.hits += 1
            else:
                self.misses += 1
        if kept is not None:
            np.copyto(out, kept)
            return
        self.inner.read(rows, cols, out)
        with self._lock:
            if key not in self._kept and self._bytes + out.nbytes <= self.budget:
                self._kept[key] = out.copy()
                self._bytes += out.nbytes

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def view(self, rows, cols, dtype):
        return self.inner.view(rows, cols, dtype)

    def array(self):
        return self.inner.array()

    def close(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
        self.inner.close()

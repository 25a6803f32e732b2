"""In-memory operands: numpy arrays and memmaps of any strides, CuPy arrays (dask arrays are
in :mod:`oocgemm.storage.dask_arrays`)."""

from __future__ import annotations

import sys

import numpy as np

from ..errors import OutputError, operand_name
from .base import MatrixSink, MatrixSource, blas_view


class NumpySource(MatrixSource):
    split_reads = True  # a copy (of memory, or of a memmap's pages)

    def __init__(self, array: np.ndarray, name: str = "numpy array", on_disk: bool = False,
                 path: str | None = None):
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.name = name
        self.on_disk = on_disk
        self.path = path

    def read(self, rows, cols, out):
        np.copyto(out, self._array[rows[0]:rows[1], cols[0]:cols[1]], casting="same_kind")
        if self.on_disk:  # a memmap: the bytes came from its file's pages
            self.count(out.size * self.dtype.itemsize)

    def view(self, rows, cols, dtype):
        return None if self.on_disk else blas_view(self._array, rows, cols, dtype)

    def cached_fraction(self, most: int = 64) -> float | None:
        """A memmapped file's share held by the OS page cache (None for memory, or a
        mapping of no known file)."""
        if not (self.on_disk and self.path):
            return None
        from .files import cached_fraction

        return cached_fraction([self.path])

    def array(self):
        return self._array


class CupySource(MatrixSource):
    """A CuPy array read back to the host (the CPU executor); the CUDA executor may use it
    on the device directly."""

    def __init__(self, array, name: str = "cupy array"):
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.name = name

    def read(self, rows, cols, out):
        block = self._array[rows[0]:rows[1], cols[0]:cols[1]]
        np.copyto(out, block.get(), casting="same_kind")

    def array(self):
        return self._array


class NumpySink(MatrixSink):
    """Writes into a caller's array (in place), or a new one for ``out=None``."""

    split_writes = True

    def __init__(self, array: np.ndarray, name: str = "numpy array"):
        if not array.flags.writeable:
            raise OutputError(f"{operand_name('out', name)} is read-only")
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.name = name

    def write(self, rows, cols, block):
        self._array[rows[0]:rows[1], cols[0]:cols[1]] = block

    def commit(self):
        if isinstance(self._array, np.memmap):
            self._array.flush()
        return self._array

    def view(self, rows, cols, dtype):
        region = blas_view(self._array, rows, cols, dtype)
        return region if region is not None and region.strides[1] == region.itemsize else None

    def array(self):
        return self._array


class CupySink(MatrixSink):
    def __init__(self, array, name: str = "cupy array"):
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        self.name = name

    def write(self, rows, cols, block):
        cupy = sys.modules["cupy"]
        self._array[rows[0]:rows[1], cols[0]:cols[1]] = cupy.asarray(block)

    def commit(self):
        return self._array

    def array(self):
        return self._array

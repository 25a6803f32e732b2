"""Zarr arrays (format 2 or 3) on disk or given as ``zarr.Array`` objects."""

from __future__ import annotations

import os
import threading

import numpy as np
import zarr
from zarr.core.buffer import cpu as zarr_cpu

from ..errors import InputError
from . import _files
from .base import MatrixSink, MatrixSource


def open_zarr_array(path: str, role: str):
    """Open an existing Zarr array read-only, with a clear error for everything else."""
    try:
        node = zarr.open(store=path, mode="r")
    except FileNotFoundError as exc:
        raise InputError(f"{role}: no Zarr array at {path!r} ({exc})") from None
    except Exception as exc:  # zarr raises several kinds for broken metadata
        raise InputError(f"{role}: {path!r} is not a readable Zarr array "
                         f"(corrupt or missing metadata: {type(exc).__name__}: {exc})") from None
    if not isinstance(node, zarr.Array):
        raise InputError(f"{role}: {path!r} is a Zarr group, not an array")
    return node


class ZarrSource(MatrixSource):
    def __init__(self, array: "zarr.Array", name: str, path: str | None = None):
        self._array = array
        self.shape = tuple(array.shape)
        self.dtype = np.dtype(array.dtype)
        chunks = array.chunks
        self.chunks = tuple(chunks) if len(chunks) == 2 else None
        self.on_disk = True
        self.name = name
        self.path = path

    def read(self, rows, cols, out):
        selection = (slice(*rows), slice(*cols))
        try:
            if out.dtype == self.dtype and out.flags.c_contiguous:
                self._array.get_basic_selection(
                    selection, out=zarr_cpu.NDBuffer.from_numpy_array(out))
            else:
                np.copyto(out, self._array.get_basic_selection(selection), casting="same_kind")
        except Exception as exc:
            raise InputError(f"{self.name}: cannot read rows {rows[0]}:{rows[1]}, columns "
                             f"{cols[0]}:{cols[1]} (corrupt or truncated chunk? "
                             f"{type(exc).__name__}: {exc})") from exc

    def array(self):
        return self._array


def block_chunks(tile_rows: int, tile_cols: int, itemsize: int, target: int = 16 << 20
                 ) -> tuple[int, int]:
    """Chunks that divide a C block (so that every block write covers whole chunks) and are
    near ``target`` bytes, so that downstream readers get reasonable chunks."""

    def shrink(extent: int, other: int) -> int:
        for parts in range(1, 65):
            if extent % parts == 0 and (extent // parts) * other * itemsize <= target:
                return extent // parts
        return extent

    rows = shrink(max(tile_rows, 1), max(tile_cols, 1))
    cols = shrink(max(tile_cols, 1), rows)
    return rows, cols


class ZarrSink(MatrixSink):
    """Writes into a new Zarr v3 array under a temporary name, renamed on commit; or into a
    given ``zarr.Array`` in place, flagged incomplete in its attributes until commit."""

    def __init__(self, *, shape, dtype, name: str, path: str | None = None,
                 chunks: tuple[int, int] | None = None, array: "zarr.Array | None" = None,
                 attributes: dict | None = None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.name = name
        self.on_disk = True
        self._final = path
        self._temporary = None
        self._attributes = attributes or {}
        self._lock = threading.Lock()
        if array is None:
            self.path = os.path.abspath(path)
            self._temporary = _files.temporary_sibling(path)
            self._array = zarr.create_array(
                store=self._temporary, shape=self.shape, dtype=self.dtype,
                chunks=chunks or self.shape, compressors=None, fill_value=0,
                zarr_format=3, attributes={"oocgemm": {"complete": False}})
        else:
            self._array = array
            self.path = None
            array.attrs["oocgemm"] = {"complete": False}
        # The unit a write rewrites: the shard of a sharded array (its inner chunks share one
        # object), else the chunk. Blocks aligned to inner chunks only would race on a shard.
        self.chunks = tuple(getattr(self._array, "shards", None) or self._array.chunks)

    def _aligned(self, rows, cols) -> bool:
        ok = True
        for (lo, hi), chunk, extent in zip((rows, cols), self.chunks, self.shape):
            ok &= lo % chunk == 0 and (hi % chunk == 0 or hi == extent)
        return ok

    def write(self, rows, cols, block):
        selection = (slice(*rows), slice(*cols))
        if self._aligned(rows, cols):
            self._array[selection] = block
        else:  # blocks that share a chunk would lose each other's updates
            with self._lock:
                self._array[selection] = block

    def commit(self):
        self._array.attrs["oocgemm"] = {"complete": True, **self._attributes}
        if self._temporary is None:
            return self._array
        _files.replace(self._temporary, self._final)
        self._temporary = None
        return zarr.open_array(self._final, mode="r+")

    def abort(self):
        if self._temporary is not None:
            _files.remove(self._temporary)
            self._temporary = None

    def array(self):
        return self._array

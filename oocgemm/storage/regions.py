"""A region of a Zarr array as a run's output: where one of several runs writes its part of
C (a group of :func:`oocgemm.dask.matmul`'s ``to_zarr``), chunk by chunk as ``multiply``
writes a Zarr output of its own, the GPU's frames included, and nothing else of the array.

    >>> z = zarr.open_array("c.zarr", mode="r+")                          # doctest: +SKIP
    >>> oocgemm.multiply(a_rows, b, out=ZarrRegion(z, (0, 8192), (0, z.shape[1])))  # doctest: +SKIP

The region lies on the edges of what one write of the array rewrites (its shards, else its
chunks) or at the array's end, so that runs of other regions never rewrite its chunks. A run
marks nothing complete: the whole array is complete when every region is, which only the
caller knows."""

from __future__ import annotations

import threading

import numpy as np

from ..errors import OutputError
from ..planning.chunks import chunk_region, chunks_of, on_chunk_edges
from .base import MatrixSink


class ZarrRegion:
    """Rows ``rows`` and columns ``cols`` of the ``zarr.Array`` ``array``, as an output."""

    def __init__(self, array, rows: tuple[int, int], cols: tuple[int, int]):
        if getattr(array, "read_only", False):
            raise OutputError("out: the zarr array is open read-only")
        self.array = array
        self.rows, self.cols = (int(rows[0]), int(rows[1])), (int(cols[0]), int(cols[1]))
        self.shape = (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0])
        self.dtype = np.dtype(array.dtype)
        self.write_unit = write_unit(array)
        """What one write of the array rewrites: a shard, else a chunk."""
        whole = tuple(array.shape)
        if not (0 <= self.rows[0] <= self.rows[1] <= whole[0]
                and 0 <= self.cols[0] <= self.cols[1] <= whole[1]):
            raise OutputError(f"out: rows {self.rows}, columns {self.cols} are not inside the "
                              f"zarr array's {whole}")
        if not on_edges(self.rows, self.cols, self.write_unit, whole):
            raise OutputError(f"out: rows {self.rows}, columns {self.cols} cut the zarr "
                              f"array's chunks of {self.write_unit}: a run of another region "
                              f"would rewrite them")

    @property
    def region(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return self.rows, self.cols


def write_unit(array) -> tuple[int, int]:
    """What one write of a ``zarr.Array`` rewrites: its shard, else its chunk."""
    unit = tuple(getattr(array, "shards", None) or array.chunks)
    return unit[0], unit[1]


def on_edges(rows: tuple[int, int], cols: tuple[int, int], unit: tuple[int, int],
             shape: tuple[int, int]) -> bool:
    """Whether rows x cols start on ``unit``'s edges and end on them or at the array's end."""
    return all(lo % u == 0 and (hi % u == 0 or hi == n)
               for (lo, hi), u, n in zip((rows, cols), unit, shape, strict=True))


class RegionSink(MatrixSink):
    """Writes a run's C into a :class:`ZarrRegion`: whole chunks as files where the array is
    local, unsharded and its chunks plain (encoded by the writer's threads, or stored as the
    frames the GPU encoded), else through zarr. Its commit publishes nothing (see the
    module)."""

    chunks: tuple[int, int]

    def __init__(self, region: ZarrRegion):
        from . import frames
        from .zarr_store import direct

        self._region = region
        self._array = region.array
        self.shape, self.dtype = region.shape, region.dtype
        self.name = "out (a region of a zarr array)"
        self.on_disk = True
        self.chunks = region.write_unit
        self._shift = (region.rows[0] // self.chunks[0], region.cols[0] // self.chunks[1])
        self._lock = threading.Lock()
        self._writer = direct(self._array)
        w = self._writer
        # the region's chunks are the array's (it starts on their edges); its last ones
        # are cut where the array's are, or are whole
        self._framing = (frames.Framing(self.chunks, self.shape, self.dtype.itemsize,
                                        codec=w.codec)
                         if w is not None and frames.storable(w.codec, w.fill, self.dtype)
                         else None)

    @property
    def region(self):
        return self._region.region

    def _outer(self, index: tuple[int, int]) -> tuple[int, int]:
        return index[0] + self._shift[0], index[1] + self._shift[1]

    def write(self, rows, cols, block) -> None:
        top, left = self._region.rows[0], self._region.cols[0]
        aligned = on_chunk_edges((rows, cols), self.chunks, self.shape)
        if self._writer is not None and aligned:
            for index in chunks_of((tuple(rows), tuple(cols)), self.chunks):
                (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
                self._writer.write(self._outer(index), block[r0 - rows[0]:r1 - rows[0],
                                                             c0 - cols[0]:c1 - cols[0]])
            return
        selection = (slice(rows[0] + top, rows[1] + top), slice(cols[0] + left, cols[1] + left))
        if aligned:
            self._array[selection] = block
        else:  # blocks that share a chunk would lose each other's updates
            with self._lock:
                self._array[selection] = block

    def framing(self):
        return self._framing

    def store_frames(self, index, rows, cols, frames) -> None:
        assert self._writer is not None
        self._writer.write_frames(self._outer(index), frames)

    def commit(self):
        return None

    def array(self):
        return self._array


def open_region(out, **_) -> RegionSink:
    """The sink adapter of :class:`ZarrRegion` outputs (kind ``'oocgemm array'``)."""
    if not isinstance(out, ZarrRegion):
        raise OutputError(f"out: expected None, a path (.zarr or .npy) or a writable array, "
                          f"got {type(out).__name__}")
    return RegionSink(out)

"""What every storage adapter does: read a region into a buffer, write a block, commit or abort."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

_COUNTING = threading.Lock()

#: Reads a whole stored file: ``files(path)`` its bytes, or ``files(path, into)`` into a
#: buffer of at least its size (the bytes read as a memoryview either way).
FileReads = Callable[..., memoryview]


def library_of(obj) -> str:
    """The top-level package of ``obj``'s type: 'numpy', 'zarr', 'dask', 'cupy'..., which
    the adapters are chosen by without importing those packages."""
    return type(obj).__module__.split(".")[0]


class MatrixSource(abc.ABC):
    """A 2-D matrix that the executors read regions of (in its stored layout)."""

    #: Stored shape (rows, cols).
    shape: tuple[int, int]
    #: numpy dtype of the stored elements.
    dtype: np.dtype
    #: Stored chunk shape, or None where the storage has no chunks.
    chunks: tuple[int, int] | None = None
    #: True when reads go to storage (disk), False for memory.
    on_disk: bool = False
    #: How messages name it: a path, or 'numpy array'.
    name: str = "array"
    #: Where a path-backed source lives (resolved), to refuse aliasing; None for arrays.
    path: str | None = None
    #: Chunked, but read in the parts a read needs (uncompressed chunk files), never decoded
    #: whole: no :class:`~oocgemm.storage.chunked.ChunkReader` in front of it.
    sliced: bool = False
    #: A whole chunk decodes straight into a caller's C-contiguous buffer by ``read_chunk``
    #: (a plain chunk file and its codec), with no decoded copy in between.
    decodes_into: bool = False
    #: A read of a region costs what its rows do and no more (a copy out of memory or of a
    #: file's pages, nothing decoded), so a large one may be made in row bands at once.
    split_reads: bool = False
    #: ((r0, r1), (c0, c1)): the part of the stored matrix behind it that this source reads,
    #: where it reads a part (another matrix than the whole, by identity); None: the whole.
    region: tuple[tuple[int, int], tuple[int, int]] | None = None
    #: Bytes taken from storage so far: the stored (compressed) bytes of the chunks decoded,
    #: or what reads copied out of a file's pages; 0 for memory.
    bytes_read: int = 0
    #: Bytes of the chunks decoded so far (stored dtype): 0 where nothing is decoded.
    decoded_bytes: int = 0

    #: Stored objects (chunk files, shards) read as stored for a device to decode
    #: (:attr:`Plan.io.gpu_decode <oocgemm.planning.plan.IOChoices.gpu_decode>`).
    objects_read: int = 0

    def count(self, stored: int, decoded: int = 0, objects: int = 0) -> None:
        """Add to :attr:`bytes_read`, :attr:`decoded_bytes` and :attr:`objects_read` (from
        any thread)."""
        with _COUNTING:
            self.bytes_read += stored
            self.decoded_bytes += decoded
            self.objects_read += objects

    @abc.abstractmethod
    def read(self, rows: tuple[int, int], cols: tuple[int, int], out: np.ndarray) -> None:
        """Fill ``out`` (C-contiguous, shape of the region, any float dtype) with the region."""

    def array(self):
        """The underlying array object (for aliasing checks); None where there is none."""
        return None

    def cached_fraction(self, most: int = 64) -> float | None:
        """The share of its stored bytes that the OS page cache holds (from ``most`` of its
        files at most; nothing read); None where it cannot tell."""
        return None

    def stored_fraction(self, most: int = 64) -> float:
        """Bytes stored per byte decoded (below 1 where compressed), from ``most`` of its
        stored objects at most (their sizes; nothing read); 1 where it cannot tell."""
        return 1.0

    def view(self, rows: tuple[int, int], cols: tuple[int, int], dtype) -> np.ndarray | None:
        """The region as a zero-copy array BLAS can use in place, or None where the data must
        be copied (on disk, another dtype, a layout BLAS cannot take)."""
        return None

    def close(self) -> None:
        """Release file handles."""


@runtime_checkable
class ChunkedSource(Protocol):
    """A source stored in chunks: it tells the planner its chunk grid (``chunks``, the unit
    decoded at once: the chunk, or the shard of a sharded array) and decodes one whole chunk
    at a time. Reads at this grain decode each chunk once
    (:class:`oocgemm.storage.chunked.ChunkReader`)."""

    shape: tuple[int, int]
    dtype: np.dtype
    chunks: tuple[int, int]
    on_disk: bool
    name: str
    path: str | None

    def read_chunk(self, index: tuple[int, int], out: np.ndarray, *,
                   files: FileReads | None = None) -> None:
        """Decode chunk ``index`` (row, column of the chunk grid) into ``out``: C-contiguous,
        of the stored dtype, the chunk's shape clipped at the array's edges. ``files``: how
        to read a whole stored file, where the source reads files and its chunks are not in
        the OS page cache (:meth:`DiskQueue.read <oocgemm.storage.chunked.DiskQueue.read>`)."""

    def array(self): ...

    def close(self) -> None: ...


@runtime_checkable
class PartialSink(Protocol):
    """A sink whose temporary output an interrupted run can leave behind for a later
    ``resume=True`` (the .npy and Zarr file sinks)."""

    def close_partial(self) -> None:
        """Leave the temporary output where it is (flushed), for a later resume."""


class MatrixSink(abc.ABC):
    """Where C blocks go. Nothing looks complete until :meth:`commit`."""

    shape: tuple[int, int]
    dtype: np.dtype
    chunks: tuple[int, int] | None = None
    on_disk: bool = False
    name: str = "array"
    path: str | None = None
    #: A write of a region costs what its rows do (a copy into memory), so a large one may
    #: be made in row bands at once.
    split_writes: bool = False

    @abc.abstractmethod
    def write(self, rows: tuple[int, int], cols: tuple[int, int], block: np.ndarray) -> None:
        """Store ``block`` at the region; safe to call from several threads for disjoint
        regions."""

    @abc.abstractmethod
    def commit(self):
        """Make the output complete and visible; returns what ``Result.out`` holds."""

    def flush(self) -> None:
        """Write out what the sink holds back (at the end of a run; most hold nothing)."""

    def settle(self) -> None:
        """The run failed or was interrupted: stop writing in the background (what is not
        begun is dropped, what runs ends) before the output is cleaned up or kept."""

    def attach(self, log) -> None:
        """An executor's event log, for the sink to record its own work in (a sink that
        stores behind the run); most record nothing."""

    def abort(self) -> None:
        """Remove whatever a failed run wrote under a temporary name."""

    @property
    def temporary_path(self) -> str | None:
        """Where a file output is written until its commit (None: no file, or in place)."""
        return None

    def array(self):
        return None

    def view(self, rows: tuple[int, int], cols: tuple[int, int], dtype) -> np.ndarray | None:
        """The region as a writable zero-copy array, or None: see :meth:`MatrixSource.view`."""
        return None

    def framing(self):
        """How this sink takes C's chunks as frames encoded elsewhere
        (:class:`~oocgemm.storage.frames.Framing`, for :meth:`store_frames`), or None: most
        sinks take arrays only."""
        return None

    def store_frames(self, index: tuple[int, int], rows: tuple[int, int],
                     cols: tuple[int, int], frames: list) -> None:
        """Store chunk ``index`` (``rows`` x ``cols`` of C) as the concatenation of
        ``frames`` (bytes-like, in order): see :mod:`oocgemm.storage.frames`."""
        raise NotImplementedError(f"{type(self).__name__} takes no frames")


def blas_view(array: np.ndarray, rows, cols, dtype) -> np.ndarray | None:
    """``array[rows, cols]`` when it is in memory, of ``dtype`` and has a unit stride in one
    dimension (what BLAS takes without a copy); None otherwise."""
    if isinstance(array, np.memmap) or array.dtype != np.dtype(dtype):
        return None
    region = array[rows[0]:rows[1], cols[0]:cols[1]]
    size = region.itemsize
    if region.size == 0 or region.strides[1] == size or region.strides[0] == size:
        return region
    return None

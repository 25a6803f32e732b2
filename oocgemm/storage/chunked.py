"""Reads at the grain of the storage: whole chunks, each decoded once, shared by every read
that needs part of it.

A schedule reads regions (panels, or row stripes of them through the pinned ring); a chunked
store decodes whole chunks. :class:`ChunkReader` sits between the two. Every read asks for the
chunks its region touches; a chunk that is neither in memory nor being decoded is handed to a
pool of decoder threads (so the chunks of one region decode in parallel, and the readers of
neighbouring stripes wait for the same decode instead of each decoding the chunk again), and
the read copies its part out. A chunk stays in memory until the last read of the stretch of
loads that need it (streamed operands: consecutive loads, so that a chunk larger than a panel
is decoded once and its rows handed to each panel in turn), or for the whole run (kept
operands, ``Plan.io.cache``); the plan's :func:`~oocgemm.planning.chunks.loads` say how many
reads each load makes.

When a read starts a load of a streamed operand, the decodes of the whole load are queued at
once, in the load's row order: the decoders run ahead of the stripes by up to one load. A kept
operand has its whole size budgeted anyway: the first read queues every chunk's decode in the
order the schedule first needs them, so that the decoders (and the storage under them) never
wait for the executor.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..errors import OOCGemmError, OutputError
from ..planning.chunks import (
    Load,
    chunk_ends,
    chunk_range,
    chunk_region,
    chunks_of,
    on_chunk_edges,
)
from .base import ChunkedSource, MatrixSink, MatrixSource
from .frames import Framing, encode_piece, encode_stripe


class _Entry:
    """One chunk: its decode (a future of the array), how many reads used it so far, and
    after how many reads it may be dropped (the end of each stretch of loads that touch it)."""

    __slots__ = ("future", "used", "ends")

    def __init__(self, ends: list[int]):
        self.future: Future | None = None
        self.used = 0
        self.ends = ends


#: Bytes of chunks the cold sources of a run decode at once: enough requests to keep a disk
#: busy, few enough that the chunks needed first are not shared out with all the others
#: (measured by window on one disk: docs/lab-notes.md, "The disk queue's window").
COLD_WINDOW = 512 << 20

#: Bytes of one request of a cold file's read (:meth:`DiskQueue.read`): its pieces are read
#: at once, by :data:`DISK_READERS` threads shared by every run in the process. A disk reads
#: at its rate only with many requests under way; a file decoded from its pages as they
#: fault in (mmap) is read a little at a time, about 0.6-0.7 of that rate whatever the
#: threads (docs/lab-notes.md, "Cold chunks: read in pieces, then decoded").
DISK_PIECE = 16 << 20
DISK_READERS = 32


class DiskQueue:
    """The decodes of a run's cold sources (chunks the page cache does not hold: read from
    the disk itself), begun in the order the schedule needs them, across the sources (each
    at the rank of the load it is for), with at most :data:`COLD_WINDOW` bytes of them under
    way (one at least).

    Begun all at once, every chunk shared the disk with every other, and the first ones
    needed came in with the last: a product's first GEMM waited for nearly all of its
    inputs, and each source's own order let A's later chunks share the disk with the B
    chunks the first C block needed.
    """

    def __init__(self, window: int | None = None):
        self.window = COLD_WINDOW if window is None else window
        self._lock = threading.Lock()
        self._pending: list[tuple[int, int, int, Callable[[], None]]] = []  # a heap
        self._count = 0  # ties in rank begin in the order queued
        self._running = 0  # bytes under way
        self._pumping = False  # a thread is beginning decodes (a failed begin calls done)

    @staticmethod
    def read(path: str, into=None) -> memoryview:
        """The bytes of the file at ``path``, read in pieces of :data:`DISK_PIECE` at once
        (the calling thread reads the first), into ``into`` (a writable buffer of at least
        the file's size) or a new buffer. FileNotFoundError where there is no file,
        ValueError where ``into`` is too small or the file ends early."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            buf = (np.empty(size, np.uint8).data if into is None
                   else memoryview(into).cast("B"))
            if size > buf.nbytes:
                raise ValueError(f"{size} bytes, more than the {buf.nbytes} expected")

            def piece(at: int) -> None:
                end = min(at + DISK_PIECE, size)
                while at < end:
                    got = os.preadv(fd, [buf[at:end]], at)
                    if got <= 0:
                        raise ValueError(f"the file ends at {at} of its {size} bytes")
                    at += got

            rest: list[Future] = []
            try:
                for at in range(DISK_PIECE, size, DISK_PIECE):
                    rest.append(_disk_readers().submit(piece, at))
                piece(0)
            finally:  # (every piece begun over before the file is closed)
                futures.wait(rest)
            for future in rest:
                future.result()
            return buf[:size]
        finally:
            os.close(fd)

    def put(self, rank: int, nbytes: int, begin: Callable[[], None]) -> None:
        """Queue a decode of ``nbytes`` first needed at schedule index ``rank``; ``begin()``
        starts it, and it calls :meth:`done` when it ends."""
        with self._lock:
            heapq.heappush(self._pending, (rank, self._count, nbytes, begin))
            self._count += 1
        self._pump()

    def done(self, nbytes: int) -> None:
        with self._lock:
            self._running -= nbytes
        self._pump()

    def _pump(self) -> None:
        """Begin what the window lets begin; one thread at a time (the others' calls, and a
        begin that fails at once and calls :meth:`done`, leave it to the one pumping, which
        looks again after each begin: no recursion however many fail)."""
        with self._lock:
            if self._pumping:
                return
            self._pumping = True
        while True:
            with self._lock:
                if not self._pending or (self._running and self._running
                                         + self._pending[0][2] > self.window):
                    self._pumping = False
                    return
                _, _, nbytes, begin = heapq.heappop(self._pending)
                self._running += nbytes
            try:
                begin()
            except BaseException:
                with self._lock:
                    self._pumping = False
                raise


class ChunkReader(MatrixSource):
    """Wraps a :class:`ChunkedSource`; reads regions by decoding whole chunks, each once per
    load (``kept=False``) or once per run (``kept=True``).

    Parameters
    ----------
    inner
        The chunked source.
    load_list
        The loads of this operand in schedule order (:func:`oocgemm.planning.chunks.loads`).
    kept
        Keep every decoded chunk until its last read in the run.
    decoders
        Decoder threads.
    gap
        A streamed chunk stays decoded from one load that touches it to the next when that
        comes at most ``gap`` loads later (:func:`~oocgemm.planning.chunks.chunk_ends`): 2
        where one matrix is read in two roles, whose loads alternate.
    into
        The plan's reads are whole chunks, each read once (``Plan.io.into_ring``): a read that
        is one decodes it on the reading thread straight into its destination (a pinned
        ring buffer), with no decoded copy held and none copied out of; the storage reads
        of the chunks after it are hinted ahead. Any other read goes the usual way.
    disk
        Its stored chunks are not in the OS page cache: its decodes begin through the run's
        :class:`DiskQueue`, in the order the schedule needs them across the run's cold
        sources (as many chunks hinted ahead as it lets begin at once), each object's file
        read whole in pieces at once (:meth:`DiskQueue.read`) where it is at most half the
        queue's window, else decoded from its pages.

    A kept source begins decoding all its chunks, in the order the run needs them, as it is
    made: while the executor starts (a GPU's buffers, its pinned ring, its threads).
    """

    chunks: tuple[int, int]

    def __init__(self, inner: ChunkedSource, load_list: list[Load], *, kept: bool,
                 decoders: int = 4, gap: int = 1, into: bool = False,
                 disk: DiskQueue | None = None):
        self.inner = inner
        self.shape = inner.shape
        self.dtype = inner.dtype
        self.chunks = inner.chunks
        self.on_disk = inner.on_disk
        self.name = inner.name
        self.path = inner.path
        self.kept = kept
        self.into = into
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, decoders), thread_name_prefix="oocgemm-decode")
        self._disk = disk
        self._chunk_bytes = max(1, self.chunks[0] * self.chunks[1] * self.dtype.itemsize)
        # how its cold files are read: whole into a buffer, where an object's buffer is not
        # large beside the window (a larger one is decoded from its pages: no copy of it held)
        self._files = (disk.read if disk is not None and self._chunk_bytes <= disk.window // 2
                       else None)
        self._queued_on_disk: list[tuple[int, tuple[int, int], Future]] = []
        self.prefetch = (max(1, disk.window // self._chunk_bytes) if disk is not None
                         else 2 * max(1, decoders))
        """Chunks ahead of the decodes started whose storage reads are hinted to the OS."""
        self._queued: list[tuple[int, int]] = []  # decodes in the order they were queued
        self._started = 0
        self._hinted = 0
        self._hint_lock = threading.Lock()
        self._loads = list(load_list)
        self._next_load = 0  # the first load whose decodes are not queued
        self._first_open = 0  # the first load with reads still to begin
        self._begun = [0] * len(self._loads)  # reads begun, per load
        self._entries = {index: _Entry(ends)
                         for index, ends in chunk_ends(self._loads, kept, gap).items()}
        # where each chunk comes in the order of need, for the hints of reads decoded in place
        self._order = list(dict.fromkeys(index for load in self._loads for index in load.chunks))
        self._place = {index: at for at, index in enumerate(self._order)}
        self.decodes = 0
        """Chunks decoded so far."""
        self.decoded_at: list[tuple[int, int]] = []
        """Which: each decode's chunk, by its index in the stored array (the inner source's
        ``stored_chunk``, where it is a part of one)."""
        self._stored = getattr(inner, "stored_chunk", None)
        self.decoded_bytes = 0
        """Bytes of the decoded chunks (stored dtype)."""
        self.resident_bytes = 0
        self.peak_bytes = 0
        """Most bytes of decoded chunks held at once."""
        self.copy_seconds = 0.0
        """Time the readers spent copying parts of decoded chunks into their destinations
        (the pinned ring, on a GPU), summed over reader threads."""
        if kept and not into:  # all of it, from now (while the run starts), in order of need
            with self._lock:
                self._queue_loads(len(self._loads) - 1)
            self._to_disk()

    @property
    def n_chunks(self) -> int:
        """Chunks of the stored array."""
        rows, cols = (-(-extent // chunk) for extent, chunk in zip(self.shape, self.chunks))
        return rows * cols

    # -- decoding ----------------------------------------------------------------------------
    def _hint_ahead(self) -> None:
        """Let the storage start on the chunks queued up to ``prefetch`` decodes ahead of those
        started (a cold disk then reads while the decoders decode)."""
        hint = getattr(self.inner, "prefetch_chunk", None)
        if hint is None:
            return
        with self._hint_lock:  # hints go out in queue order, each before its own decode
            with self._lock:
                self._started += 1
                upto = min(len(self._queued), self._started + self.prefetch)
                ahead, self._hinted = self._queued[self._hinted:upto], max(self._hinted, upto)
            for index in ahead:
                hint(index)

    def _decode(self, index: tuple[int, int]) -> np.ndarray:
        self._hint_ahead()
        shared = getattr(self.inner, "shared_chunk", None)
        if shared is not None:  # decoded once for several runs (oocgemm.dask's tasks)
            out, fresh = shared(index)
        else:
            (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
            out = np.empty((r1 - r0, c1 - c0), dtype=self.dtype)
            self._read_chunk(index, out)
            fresh = True
        with self._lock:
            if fresh:  # (a chunk another run decoded is held here, not decoded)
                self._decoded(index, out.nbytes)
            self.resident_bytes += out.nbytes
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
        return out

    def _read_chunk(self, index: tuple[int, int], out: np.ndarray) -> None:
        """The inner source's chunk, its file read as the disk's queue reads cold ones where
        it says how (``files``, asked of the inner source only then)."""
        if self._files is None:
            self.inner.read_chunk(index, out)
        else:
            self.inner.read_chunk(index, out, files=self._files)

    def _start(self, index: tuple[int, int], rank: int = -1) -> Future:
        """The chunk's decode, started if it is not in memory nor under way (under the lock);
        on a cold source queued on the disk at ``rank``: where the schedule needs it (a
        load's first read), or -1 for a read that waits on it now."""
        entry = self._entries.get(index)
        if entry is None:  # a region the plan did not announce: decode it for this read only
            entry = self._entries[index] = _Entry([1 << 62])
        if entry.future is None:
            self._queued.append(index)
            if self._disk is None:
                entry.future = self._pool.submit(self._decode, index)
            else:  # (queued now, begun by the disk's queue: never under this lock)
                future: Future = Future()
                entry.future = future
                self._queued_on_disk.append((rank, index, future))
        return entry.future

    def _to_disk(self) -> None:
        """Hand the decodes queued under the lock to the run's :class:`DiskQueue` (a cold
        source's; nothing to hand on a warm one)."""
        disk = self._disk
        if disk is None:
            return
        with self._lock:
            queued, self._queued_on_disk = self._queued_on_disk, []
        for rank, index, future in queued:
            disk.put(rank, self._chunk_bytes, functools.partial(self._begin, index, future))

    def _begin(self, index: tuple[int, int], future: Future) -> None:
        """The disk's queue begins the decode of chunk ``index`` for ``future``."""
        try:
            self._pool.submit(self._decode_to, index, future)
        except RuntimeError:  # closed: nothing more begins
            future.cancel()
            self._ended()

    def _decode_to(self, index: tuple[int, int], future: Future) -> None:
        """Decode chunk ``index`` for ``future``, then let the disk's queue begin the next."""
        try:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self._decode(index))
                except BaseException as exc:  # the reads waiting on it raise it
                    future.set_exception(exc)
        finally:
            self._ended()

    def _ended(self) -> None:
        """One of its decodes through the disk's queue is over: the queue begins the next."""
        if self._disk is not None:
            self._disk.done(self._chunk_bytes)

    def _release(self, index: tuple[int, int]) -> None:
        """One read is done with the chunk; drop it at the end of a load (under the lock)."""
        entry = self._entries[index]
        entry.used += 1
        if entry.used in entry.ends and entry.future is not None:
            future, entry.future = entry.future, None
            if future.done() and future.exception() is None:
                self.resident_bytes -= future.result().nbytes

    def _announce(self, rows, cols) -> None:
        """Match the read to its load, the first whose region holds it with reads still to
        begin, and queue the decodes of every load up to that one not queued yet (under the
        lock): the decoders run ahead of the reads by up to one load."""
        for at in range(self._first_open, min(len(self._loads), self._first_open + 64)):
            load = self._loads[at]
            (r0, r1), (c0, c1) = load.region
            holds = r0 <= rows[0] and rows[1] <= r1 and c0 <= cols[0] and cols[1] <= c1
            if holds and self._begun[at] < load.reads:
                break
        else:  # not a read of the plan's loads: decode for this read alone
            return
        self._begun[at] += 1
        if self.kept and self._next_load == 0:  # budgeted whole: decode all, in order of need
            at = len(self._loads) - 1
        self._queue_loads(at)
        while (self._first_open < len(self._loads)
               and self._begun[self._first_open] >= self._loads[self._first_open].reads):
            self._first_open += 1

    def _queue_loads(self, upto: int) -> None:
        """Queue the decodes of the loads not queued yet up to load ``upto``, each at the
        rank of its load (a chunk already decoded or under way is not queued again; under
        the lock)."""
        for ahead in self._loads[self._next_load:upto + 1]:
            for index in ahead.chunks:
                self._start(index, ahead.first)
        self._next_load = max(self._next_load, upto + 1)

    def _decode_into(self, rows, cols, out) -> bool:
        """A read that is one whole chunk, decoded straight into ``out`` (``into``): True
        when done so."""
        index = (rows[0] // self.chunks[0], cols[0] // self.chunks[1])
        if (chunk_region(index, self.chunks, self.shape) != (tuple(rows), tuple(cols))
                or out.dtype != self.dtype or not out.flags.c_contiguous):
            return False
        hint = getattr(self.inner, "prefetch_chunk", None)
        at = self._place.get(index)
        if hint is not None and at is not None:
            with self._hint_lock:
                upto = min(len(self._order), at + 1 + self.prefetch)
                ahead, self._hinted = self._order[self._hinted:upto], max(self._hinted, upto)
            for later in ahead:
                hint(later)
        self._read_chunk(index, out)
        with self._lock:
            self._decoded(index, out.nbytes)
        return True

    def _decoded(self, index: tuple[int, int], nbytes: int) -> None:
        """(Under the lock.) Count one decode of chunk ``index``."""
        self.decodes += 1
        self.decoded_bytes += nbytes
        self.decoded_at.append(self._stored(index) if self._stored is not None else index)

    # -- MatrixSource --------------------------------------------------------------------------
    def read(self, rows, cols, out) -> None:
        if self.into and self._decode_into(rows, cols, out):
            return
        region = (tuple(rows), tuple(cols))
        indices = chunks_of(region, self.chunks)
        with self._lock:
            self._announce(rows, cols)
            futures = [self._start(index) for index in indices]
        self._to_disk()
        copying = 0.0
        try:
            for index, future in zip(indices, futures):
                chunk = future.result()
                (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
                lo_r, hi_r = max(r0, rows[0]), min(r1, rows[1])
                lo_c, hi_c = max(c0, cols[0]), min(c1, cols[1])
                start = time.perf_counter()
                np.copyto(out[lo_r - rows[0]:hi_r - rows[0], lo_c - cols[0]:hi_c - cols[0]],
                          chunk[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0], casting="same_kind")
                copying += time.perf_counter() - start
        finally:
            with self._lock:
                self.copy_seconds += copying
                for index in indices:
                    self._release(index)

    def view(self, rows, cols, dtype):
        """A region that is one whole decoded chunk, as that chunk itself (no copy: the CPU
        executor binds its slot to it), where its dtype is ``dtype``; else None. The read is
        counted as :meth:`read` counts it; the chunk stays alive while the slot holds it."""
        if np.dtype(dtype) != self.dtype:
            return None
        index = (rows[0] // self.chunks[0], cols[0] // self.chunks[1])
        if chunk_region(index, self.chunks, self.shape) != (tuple(rows), tuple(cols)):
            return None
        with self._lock:
            self._announce(rows, cols)
            future = self._start(index)
        self._to_disk()
        try:
            return future.result()
        finally:
            with self._lock:
                self._release(index)

    def array(self):
        return self.inner.array()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for entry in self._entries.values():
                if entry.future is not None:  # (queued on the disk, not begun: never will)
                    entry.future.cancel()
                entry.future = None
            self.resident_bytes = 0
        self.inner.close()


_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _forget_pools() -> None:
    """(In a forked child.) The parent's pools: their threads are not the child's, and a pool
    that counts them idle would never start its own; the child makes new ones."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _process_pool(name: str, threads: Callable[[], int]) -> ThreadPoolExecutor:
    """The process's pool of threads named ``oocgemm-<name>`` (``threads()`` of them, made at
    its first use), shared by every run in it."""
    with _POOLS_LOCK:
        pool = _POOLS.get(name)
        if pool is None:
            pool = _POOLS[name] = ThreadPoolExecutor(threads(),
                                                     thread_name_prefix=f"oocgemm-{name}")
        return pool


def _disk_readers() -> ThreadPoolExecutor:
    """The readers of cold files' pieces (:meth:`DiskQueue.read`)."""
    return _process_pool("disk", lambda: DISK_READERS)


def _encoders() -> ThreadPoolExecutor:
    """The chunk encoder threads, one per core."""
    from .. import machine

    return _process_pool("encode", machine.cores)


_WAIT = object()  # ChunkWriter._take: no room until a store ends


class _Band:
    """A cell's buffer, chunk by chunk: the rows of each chunk's part of the cell (its
    columns ``cols[k]:cols[k + 1]``) in an array of their own, so that a whole chunk is
    stored from where it was gathered, in one piece. (Rows of a chunk gathered inside a
    row-major cell are a column slice of it, much slower to write than one piece of memory:
    docs/performance.md, "C compressed on the GPU by default".)"""

    __slots__ = ("shape", "cols", "parts", "nbytes")

    def __init__(self, rows: int, cols: list[int], dtype):
        self.shape = (rows, cols[-1] - cols[0])
        self.cols = cols
        self.parts = [np.empty((rows, hi - lo), dtype=dtype) for lo, hi in zip(cols, cols[1:])]
        self.nbytes = sum(part.nbytes for part in self.parts)

    def key(self) -> tuple:
        """What a spare band must match to be taken for another cell."""
        return (self.shape, tuple(x - self.cols[0] for x in self.cols))

    def put(self, top: int, cols: tuple[int, int], piece: np.ndarray) -> None:
        """``piece`` into the rows from ``top`` (of the cell) and the columns ``cols`` (of
        the array)."""
        rows = slice(top, top + piece.shape[0])
        for (lo, hi), part in zip(zip(self.cols, self.cols[1:]), self.parts):
            a, b = max(lo, cols[0]), min(hi, cols[1])
            if a < b:
                np.copyto(part[rows, a - lo:b - lo], piece[:, a - cols[0]:b - cols[0]],
                          casting="same_kind")

    def pieces(self, top: int, rows: tuple[int, int], cols: tuple[int, int]):
        """(columns, data) of each chunk's part of the region ``rows`` x ``cols`` (rows of
        the array; the cell's first row is ``top``)."""
        rs = slice(rows[0] - top, rows[1] - top)
        for (lo, hi), part in zip(zip(self.cols, self.cols[1:]), self.parts):
            a, b = max(lo, cols[0]), min(hi, cols[1])
            if a < b:
                yield (a, b), part[rs, a - lo:b - lo]


class _Cell:
    """The rows of one chunk row band inside one C block, gathered until all have come:
    ``buffer`` (None once the cell is written straight through, see ``ChunkWriter``), the
    pieces that came (to write a cell left incomplete), and how many elements they hold."""

    __slots__ = ("region", "buffer", "pieces", "filled")

    def __init__(self, region, buffer: _Band | None):
        self.region = region
        self.buffer = buffer
        self.pieces: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.filled = 0


class _Framed:
    """The frames of one chunk gathered until all its rows have come: (first row, bytes)
    of each piece, and the rows and bytes they hold."""

    __slots__ = ("parts", "rows", "nbytes")

    def __init__(self):
        self.parts: list[tuple[int, bytes]] = []
        self.rows = 0
        self.nbytes = 0


class ChunkWriter(MatrixSink):
    """Writes at the grain of the storage: whole chunks, each encoded once, behind compute.

    A staged schedule writes a C block in row stripes; a chunked store encodes whole chunks,
    so a stripe that covers part of a chunk makes the store read, decode, update, encode and
    write the whole chunk again, once per stripe (and under the sink's lock, since the other
    stripes rewrite the same chunk). The writer sits between the two: the rows a stripe
    brings to a chunk row band of its block (a *cell*) wait in a host buffer until the cell
    is complete, and the cell's chunks then go to the encoder threads, each chunk encoded and
    stored by one of them, while the write that completed the cell returns: the staging
    buffer it came from goes back to the run at once, and encoding (slow on one thread:
    docs/performance.md, "Zarr writes, n = 32768") runs behind compute on every core. A
    write that covers whole cells is copied into a buffer of its own and handed on the same
    way.

    ``budget`` bounds the buffered bytes, those of cells being gathered and those of cells
    waiting for the encoders: a write that needs a buffer waits while the encoders free
    one, and a cell that cannot get one at all (larger than the budget) is written straight
    through, stripe by stripe. A cell lies inside one C block, so once a block's last cell
    is stored, the block is (a journal under this writer records it then). :meth:`flush`
    waits for the encoders and writes the pieces of cells left incomplete (a run that did
    not write whole blocks); :meth:`settle` drops what waits for an encoder and waits for
    what runs (a failed or interrupted run). An encoder's failure fails the next write, or
    the flush. With an event log attached (:meth:`attach`), every chunk stored is a 'store'
    event on its encoder's lane.

    Chunks may also come as frames encoded on the GPU (:meth:`write_frames`, where
    :meth:`framing` says so): the frames of a chunk wait here until all its rows have come,
    and an encoder thread then only writes them to the chunk's file.
    """

    chunks: tuple[int, int]

    def __init__(self, inner: MatrixSink, rows, cols, *, budget: int,
                 encoders: ThreadPoolExecutor | None = None):
        self.inner = inner
        self.shape, self.dtype, self.name = inner.shape, inner.dtype, inner.name
        self.on_disk, self.path = inner.on_disk, inner.path
        assert inner.chunks is not None
        self.chunks = inner.chunks
        self._rows, self._cols = tuple(rows), tuple(cols)
        self.budget = budget
        self._encoders = encoders
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a store ended (a buffer came back)
        self._cells: dict[tuple[int, int, int], _Cell] = {}
        self._spare: list = []  # buffers of written cells (arrays, bands), for the next ones
        self._stores: set[Future] = set()  # chunk stores handed to the encoders, not ended
        self._error: BaseException | None = None
        self._log = None
        self.held_bytes = 0
        """Bytes of the buffers held: those of open cells, of cells being stored, and the
        spare ones."""
        self.peak_bytes = 0
        """Most bytes of buffers held at once."""
        self.cells_written = 0
        """Cells gathered and written whole."""
        self._framed: dict[tuple[int, int], _Framed] = {}
        self._host_frames: Framing | None = None  # once told to encode stripes as frames
        self.chunks_framed = 0
        """Chunks stored from frames (:meth:`write_frames`)."""

    def attach(self, log) -> None:
        """Record each chunk stored in ``log`` (an :class:`~oocgemm.diagnostics.EventLog`;
        the first attached keeps them: one writer under several executors)."""
        if self._log is None:
            self._log = log

    def _block(self, rows, cols) -> tuple[int, int] | None:
        """The C block that holds the region, or None when it spans several."""
        i = bisect.bisect_right(self._rows, rows[0]) - 1
        j = bisect.bisect_right(self._cols, cols[0]) - 1
        inside = (0 <= i < len(self._rows) - 1 and 0 <= j < len(self._cols) - 1
                  and rows[1] <= self._rows[i + 1] and cols[1] <= self._cols[j + 1])
        return (i, j) if inside else None

    def write(self, rows, cols, block) -> None:
        self._raise()
        key = self._block(rows, cols)
        if key is None:  # not a piece of one C block: nothing to gather it with
            self.inner.write(rows, cols, block)
            return
        if self._host_frames is not None:
            self._encode_stripe(rows, cols, block, key)
            return
        i, j = key
        top, bottom = self._rows[i], self._rows[i + 1]
        left, right = self._cols[j], self._cols[j + 1]
        band = self.chunks[0]
        for b in chunk_range(rows[0], rows[1], band):
            lo, hi = max(rows[0], b * band), min(rows[1], (b + 1) * band)
            cell = (max(top, b * band), min(bottom, (b + 1) * band))
            piece = block[lo - rows[0]:hi - rows[0]]
            if (lo, hi) == cell and cols == (left, right):  # a whole cell: copied and on
                with self._lock:
                    while (buffer := self._take(piece.shape, cols)) is _WAIT:
                        self._freed.wait()
                if buffer is None:
                    self._store(((lo, hi), cols), piece, key)
                else:
                    buffer.put(0, cols, piece)
                    self._hand_on(((lo, hi), cols), buffer, key)
            else:
                self._gather((i, j, b), (cell, (left, right)), (lo, hi), cols, piece)

    def framing(self):
        """The inner sink's :class:`~oocgemm.storage.frames.Framing` where every C block
        starts on chunk edges (a chunk then lies in one block); else None."""
        framing = self.inner.framing()
        if framing is None or not on_chunk_edges((self._rows, self._cols), self.chunks,
                                                 self.shape):
            return None
        return framing

    def encode_frames(self):
        """From now on, encode each stripe that :meth:`write` brings as the frames of its
        chunk pieces, one piece per encoder thread, as soon as it comes (a GPU's stripes
        come as frames already, :meth:`write_frames`): every chunk is then stored from
        frames. Returns the framing, or None where this writer has none (nothing changes)."""
        self._host_frames = self.framing()
        return self._host_frames

    def _encode_stripe(self, rows, cols, block: np.ndarray, key) -> None:
        """A stripe copied and handed to the encoders, a piece each (:meth:`encode_frames`);
        encoded here where the budget has no room for its copy."""
        framing = self._host_frames
        assert framing is not None
        with self._lock:
            while (buffer := self._take(block.shape)) is _WAIT:
                self._freed.wait()
        if buffer is None:
            self.write_frames(rows, cols, encode_stripe(framing, block, rows, cols))
            return
        np.copyto(buffer, block, casting="same_kind")
        pieces = framing.pieces(rows, cols)
        encoded: list = []

        def encode(piece) -> None:
            data = encode_piece(framing, buffer, rows, cols, piece, frame_bytes=1 << 30)
            with self._lock:
                encoded.append((piece, data))
                last = len(encoded) == len(pieces)
                if last:  # the copy goes, and the frames take its place in the budget
                    self.held_bytes -= buffer.nbytes
            if last:
                self._add_frames(key, encoded)

        self._submit([functools.partial(encode, piece) for piece in pieces])

    def write_frames(self, rows, cols, pieces) -> None:
        """The frames of a stripe of C, piece by piece (:func:`.frames.encode_stripe`):
        held until each chunk's rows have all come, the chunk then stored by an encoder
        thread. Waits while the budget is held by chunks being stored."""
        self._raise()
        nbytes = sum(len(data) for _, data in pieces)
        key = self._block(rows, cols)
        assert key is not None, "a framed stripe lies in one C block"
        with self._lock:
            self._drop_spares(nbytes)
            while self.held_bytes + nbytes > self.budget and self._stores:
                self._freed.wait()
        self._add_frames(key, pieces)

    def _add_frames(self, key, pieces) -> None:
        """Frames of chunk pieces of block ``key`` kept (their bytes counted, no wait: an
        encoder thread calls this too); each chunk whose rows have all come is stored."""
        nbytes = sum(len(data) for _, data in pieces)
        cr = self.chunks[0]
        done = []
        with self._lock:
            self.held_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            for piece, data in pieces:
                chunk = self._framed.setdefault(piece.index, _Framed())
                chunk.parts.append((piece.rows[0], data))
                chunk.rows += piece.rows[1] - piece.rows[0]
                chunk.nbytes += len(data)
                b = piece.index[0]
                if chunk.rows == min((b + 1) * cr, self.shape[0]) - b * cr:
                    done.append((piece, self._framed.pop(piece.index)))
        for piece, chunk in done:
            self._hand_frames(piece, chunk, key)

    def _hand_frames(self, piece, chunk: _Framed, key) -> None:
        """Store a chunk whose frames have all come, on an encoder thread."""
        b, jc = piece.index
        cr = self.chunks[0]
        rows = (b * cr, min((b + 1) * cr, self.shape[0]))
        framing = self.inner.framing()
        frames = [data for _, data in sorted(chunk.parts, key=lambda part: part[0])]
        frames.append(framing.padding(piece.index))

        def store() -> None:
            self._stored(key, (rows, piece.cols), chunk.nbytes, self.inner.store_frames,
                         piece.index, rows, piece.cols, frames)

        def ended() -> None:
            self.held_bytes -= chunk.nbytes
            self.chunks_framed += 1

        self._submit([store], ended)

    def _edges(self, cols: tuple[int, int]) -> list[int]:
        """The columns where the chunks of ``cols`` begin and end (clipped to it)."""
        c0, c1 = cols
        step = self.chunks[1]
        return [c0, *range((c0 // step + 1) * step, c1, step), c1]

    def _parts(self, region, data):
        """The chunks of a cell (in ``data``, an array of its region or its :class:`_Band`):
        (rows, cols) and data of each."""
        rows, (c0, c1) = region
        if isinstance(data, _Band):
            return [((rows, cols), part) for cols, part in data.pieces(rows[0], rows, (c0, c1))]
        edges = self._edges((c0, c1))
        return [((rows, (lo, hi)), data[:, lo - c0:hi - c0]) for lo, hi in zip(edges, edges[1:])]

    def _store_chunk(self, where, data: np.ndarray, key) -> None:
        """Encode and store one chunk (on an encoder thread, or the caller's)."""
        rows, cols = where
        self._stored(key, where, data.nbytes, self.inner.write, rows, cols, data)

    def _stored(self, key, where, nbytes: int, store, *args) -> None:
        """``store(*args)``, the chunk at ``where`` of block ``key`` (``nbytes`` of C): an
        error the run's, the store a 'store' event of the calling encoder's lane."""
        log = self._log
        start = log.now() if log is not None else 0.0
        try:
            store(*args)
        except OOCGemmError:
            raise
        except Exception as exc:  # a full disk, a store gone: the run's error
            (r0, r1), (c0, c1) = where
            raise OutputError(f"{self.name}: cannot store rows {r0}:{r1}, columns {c0}:{c1} "
                              f"({type(exc).__name__}: {exc})") from exc
        if log is not None:
            lane = "encode-" + threading.current_thread().name.rsplit("_", 1)[-1]
            log.add_store(key, lane, start, log.now(), nbytes)

    def _store(self, region, data: np.ndarray, key) -> None:
        """Write whole cells now, from ``data`` (which the caller keeps): their chunks
        encoded side by side on the encoder threads and this one; returns when all are
        stored."""
        parts = self._parts(region, data)
        futures = [self._pool().submit(self._store_chunk, where, part, key)
                   for where, part in parts[1:]]
        try:
            self._store_chunk(parts[0][0], parts[0][1], key)
        finally:
            for future in futures:
                future.result()

    def _pool(self) -> ThreadPoolExecutor:
        return self._encoders or _encoders()

    def _hand_on(self, region, buffer: _Band, key) -> None:
        """Hand a complete cell in ``buffer`` to the encoders: each chunk stored by one of
        them; the buffer becomes spare when the last is."""
        parts = self._parts(region, buffer)
        left = [len(parts)]

        def ended() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._spare.append(buffer)
                self.cells_written += 1

        self._submit([functools.partial(self._store_chunk, where, part, key)
                      for where, part in parts], ended)

    def _submit(self, calls, ended=None) -> None:
        """Hand ``calls`` (of no arguments) to the encoders. As each ends it is forgotten,
        its failure kept for the run (raised by the next write, or the flush), and
        ``ended`` called under the lock (what its end frees)."""
        def done(future: Future) -> None:
            with self._lock:
                self._stores.discard(future)
                if not future.cancelled() and future.exception() is not None:
                    self._error = self._error or future.exception()
                if ended is not None:
                    ended()
                self._freed.notify_all()

        with self._lock:
            futures = [self._pool().submit(call) for call in calls]
            self._stores.update(futures)
        for future in futures:
            future.add_done_callback(done)

    def _raise(self) -> None:
        """An encoder's failure, raised in the run (once)."""
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _gather(self, key, region, rows, cols, piece: np.ndarray) -> None:
        (r0, r1), (c0, c1) = region
        with self._lock:
            while (cell := self._cells.get(key)) is None:
                buffer = self._take((r1 - r0, c1 - c0), (c0, c1))
                if buffer is not _WAIT:  # (a wait lets the cell's other pieces in first)
                    cell = self._cells[key] = _Cell(region, buffer)
                    break
                self._freed.wait()
        if cell.buffer is None:  # over the budget: this cell goes out stripe by stripe
            self.inner.write(rows, cols, piece)
        else:  # pieces of one cell are disjoint: copied outside the lock
            cell.buffer.put(rows[0] - r0, cols, piece)
        with self._lock:
            cell.pieces.append((rows, cols))
            cell.filled += piece.size
            done = cell.filled == (r1 - r0) * (c1 - c0)
            if done:
                del self._cells[key]
        if done and cell.buffer is not None:
            self._hand_on(region, cell.buffer, key[:2])

    def _take(self, shape, cols: tuple[int, int] | None = None):
        """A buffer of ``shape`` within the budget (under the lock): with ``cols`` (the
        array's columns of a cell) a :class:`_Band` for them, else an array; a spare one of
        that shape (its pages are mapped already), else a new one, in room that spares of
        other shapes give up; :data:`_WAIT` while the budget is held by cells being stored
        (the caller waits for one to end, and asks again); None when there is no room at
        all."""
        nbytes = shape[0] * shape[1] * self.dtype.itemsize
        edges = None if cols is None else self._edges(cols)
        want = shape if edges is None else (shape, tuple(x - edges[0] for x in edges))
        for at, spare in enumerate(self._spare):
            if (spare.shape if isinstance(spare, np.ndarray) else spare.key()) == want:
                if edges is not None:  # a band: the same shape, now of these columns
                    spare.cols = edges
                return self._spare.pop(at)
        self._drop_spares(nbytes)
        if self.held_bytes + nbytes <= self.budget:
            self.held_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)
            if edges is None:
                return np.empty(shape, dtype=self.dtype)
            return _Band(shape[0], edges, self.dtype)
        return _WAIT if self._stores else None

    def _drop_spares(self, nbytes: int) -> None:
        """(Under the lock) spare buffers let go until ``nbytes`` more fit the budget, or
        none is left."""
        while self._spare and self.held_bytes + nbytes > self.budget:
            self.held_bytes -= self._spare.pop(0).nbytes

    def wait(self, cancel: bool = False) -> None:
        """Until every cell handed to the encoders is stored; ``cancel``: those not begun
        are dropped."""
        with self._lock:
            stores = list(self._stores)
        if cancel:
            for future in stores:
                future.cancel()
        with self._lock:
            self._freed.wait_for(lambda: not self._stores)

    def flush(self) -> None:
        """Wait for the encoders, write what incomplete cells hold, piece by piece, and let
        go of the buffers."""
        self.wait()
        self._raise()
        with self._lock:
            cells, self._cells = list(self._cells.values()), {}
            self._spare.clear()
            if self._framed:  # frames cannot be stored in part, and every chunk's came
                raise OutputError(f"{self.name}: chunks {sorted(self._framed)} lack rows "
                                  f"that the run did not send")
        for cell in cells:
            if cell.buffer is None:
                continue
            (r0, _), _ = cell.region
            for rows, cols in cell.pieces:
                for part_cols, data in cell.buffer.pieces(r0, rows, cols):
                    self.inner.write(rows, part_cols, data)
        with self._lock:
            self.held_bytes = 0

    def settle(self) -> None:
        """The run failed or was interrupted: drop the stores not begun, wait for those
        under way (nothing writes into the output after this returns)."""
        self.wait(cancel=True)

    def commit(self):
        self.flush()
        return self.inner.commit()

    def abort(self) -> None:
        self.settle()
        with self._lock:
            self._cells.clear()
            self._framed.clear()
            self._spare.clear()
            self.held_bytes = 0
            self._error = None
        self.inner.abort()

    def array(self):
        return self.inner.array()

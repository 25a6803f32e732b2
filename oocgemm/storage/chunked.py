"""Reads at the grain of the storage: whole chunks, each decoded once, shared by every read
that needs part of it.

A schedule reads regions (panels, or row stripes of them through the pinned ring); a chunked
store decodes whole chunks. :class:`ChunkReader` sits between the two. Every read asks for the
chunks its region touches; a chunk that is neither in memory nor being decoded is handed to a
pool of decoder threads (so the chunks of one region decode in parallel, and the readers of
neighbouring stripes wait for the same decode instead of each decoding the chunk again), and
the read copies its part out. A chunk stays in memory until the last read of the current load
that needs it (streamed operands), or for the whole run (kept operands, ``Plan.cache``); the
plan's :func:`~oocgemm.planning.chunks.loads` say how many reads each load makes.

When a read starts a load of a streamed operand, the decodes of the whole load are queued at
once, in the load's row order: the decoders run ahead of the stripes by up to one load. A kept
operand has its whole size budgeted anyway: the first read queues every chunk's decode in the
order the schedule first needs them, so that the decoders (and the storage under them) never
wait for the executor.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..planning.chunks import Load, chunk_region, chunks_of
from .base import ChunkedSource, MatrixSource


class _Entry:
    """One chunk: its decode (a future of the array), how many reads used it so far, and
    after how many reads it may be dropped (the end of each load that touches it)."""

    __slots__ = ("future", "used", "ends")

    def __init__(self, ends: list[int]):
        self.future: Future | None = None
        self.used = 0
        self.ends = ends


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
    """

    def __init__(self, inner: ChunkedSource, load_list: list[Load], *, kept: bool,
                 decoders: int = 4):
        self.inner = inner
        self.shape = inner.shape
        self.dtype = inner.dtype
        self.chunks = inner.chunks
        self.on_disk = inner.on_disk
        self.name = inner.name
        self.path = inner.path
        self.kept = kept
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, decoders), thread_name_prefix="oocgemm-decode")
        self.prefetch = 2 * max(1, decoders)
        """Chunks ahead of the decodes started whose storage reads are hinted to the OS."""
        self._queued: list[tuple[int, int]] = []  # decodes in the order they were queued
        self._started = 0
        self._hinted = 0
        self._hint_lock = threading.Lock()
        self._loads = list(load_list)
        self._next_load = 0  # the first load whose decodes are not queued
        self._first_open = 0  # the first load with reads still to begin
        self._begun = [0] * len(self._loads)  # reads begun, per load
        self._entries: dict[tuple[int, int], _Entry] = {}
        reads_per_chunk: dict[tuple[int, int], list[int]] = {}
        for load in self._loads:
            for index, uses in zip(load.chunks, load.uses):
                reads_per_chunk.setdefault(index, []).append(uses)
        for index, reads in reads_per_chunk.items():
            ends, total = [], 0
            for count in reads:
                total += count
                ends.append(total)
            self._entries[index] = _Entry(ends[-1:] if kept else ends)
        self.decodes = 0
        """Chunks decoded so far."""
        self.decoded_bytes = 0
        """Bytes of the decoded chunks (stored dtype)."""
        self.resident_bytes = 0
        self.peak_bytes = 0
        """Most bytes of decoded chunks held at once."""
        self.copy_seconds = 0.0
        """Time the readers spent copying parts of decoded chunks into their destinations
        (the pinned ring, on a GPU), summed over reader threads."""

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
            out = shared(index)
        else:
            (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
            out = np.empty((r1 - r0, c1 - c0), dtype=self.dtype)
            self.inner.read_chunk(index, out)
        with self._lock:
            self.decodes += 1
            self.decoded_bytes += out.nbytes
            self.resident_bytes += out.nbytes
            self.peak_bytes = max(self.peak_bytes, self.resident_bytes)
        return out

    def _start(self, index: tuple[int, int]) -> Future:
        """The chunk's decode, started if it is not in memory nor under way (under the lock)."""
        entry = self._entries.get(index)
        if entry is None:  # a region the plan did not announce: decode it for this read only
            entry = self._entries[index] = _Entry([1 << 62])
        if entry.future is None:
            self._queued.append(index)
            entry.future = self._pool.submit(self._decode, index)
        return entry.future

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
        for ahead in self._loads[self._next_load:at + 1]:
            for index in ahead.chunks:
                self._start(index)
        self._next_load = max(self._next_load, at + 1)
        while (self._first_open < len(self._loads)
               and self._begun[self._first_open] >= self._loads[self._first_open].reads):
            self._first_open += 1

    # -- MatrixSource --------------------------------------------------------------------------
    def read(self, rows, cols, out) -> None:
        region = (tuple(rows), tuple(cols))
        indices = chunks_of(region, self.chunks)
        with self._lock:
            self._announce(rows, cols)
            futures = [self._start(index) for index in indices]
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
        return None

    def array(self):
        return self.inner.array()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for entry in self._entries.values():
                entry.future = None
            self.resident_bytes = 0
        self.inner.close()

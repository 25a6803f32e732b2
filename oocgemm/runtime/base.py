"""What the executors share: slot views, the per-op arithmetic contract."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, InvalidStateError

import numpy as np

from ..diagnostics.events import EventLog
from ..errors import ExecutionError, MemoryPressureError, OOCGemmError
from ..planning.planner import unframed


def block_shape(plan, key) -> tuple[int, int]:
    """Rows and columns of C block ``key``."""
    i, j = key
    rows, cols = plan.row_splits, plan.col_splits
    return rows[i + 1] - rows[i], cols[j + 1] - cols[j]


def panel_shapes(plan, op):
    """Stored shapes of the A panel, B panel and C block that a GEMM op combines."""
    i, j = op.key
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    w, h = rows[i + 1] - rows[i], cols[j + 1] - cols[j]
    r = ks[op.q + 1] - ks[op.q]
    a = (r, w) if plan.problem.trans_a else (w, r)
    b = (h, r) if plan.problem.trans_b else (r, h)
    return a, b, (w, h)


def upper_matmul(a, b, out, xp=None) -> None:
    """``out = a @ b`` for the row stripe ``a`` of a diagonal block of a symmetric product,
    ``b`` and ``out`` cut at the stripe's first row (a GEMM with ``upper``): the stripe's
    square, where ``a`` and ``b`` are one buffer (``X^T X``), is a SYRK in numpy (half the
    flops, then mirrored by numpy itself), and what lies right of it a GEMM."""
    n = a.shape[0]
    matmul = (xp or np).matmul
    matmul(a, b[:, :n], out=out[:, :n])
    if b.shape[1] > n:
        matmul(a, b[:, n:], out=out[:, n:])


#: Rows a MIRROR or TRANSPOSE moves at a time on the host: tiles that stay in cache.
HOST_TILE = 256


def mirror_lower(c: np.ndarray, x0: int, x1: int) -> None:
    """Rows ``[x0, x1)`` of the square block ``c``: every element below the diagonal := the
    one across it (an exact copy: ``c == c.T`` bitwise once every row is done)."""
    for a0 in range(x0, x1, HOST_TILE):
        a1 = min(a0 + HOST_TILE, x1)
        if a0:
            c[a0:a1, :a0] = c[:a0, a0:a1].T
        square = c[a0:a1, a0:a1]
        np.copyto(square, square.T, where=np.tri(a1 - a0, k=-1, dtype=bool))


def transpose_into(out: np.ndarray, c: np.ndarray) -> None:
    """``out = c.T``, in tiles of whole cache lines."""
    rows, cols = out.shape
    for a0 in range(0, rows, HOST_TILE):
        for b0 in range(0, cols, HOST_TILE):
            out[a0:a0 + HOST_TILE, b0:b0 + HOST_TILE] = c[b0:b0 + HOST_TILE,
                                                          a0:a0 + HOST_TILE].T


def with_c(op, block: np.ndarray, sources: dict) -> np.ndarray:
    """What a WRITE stores: ``block``, plus beta times C's region as read where the WRITE
    has a ``beta`` (a symmetric product meets C as its blocks are written; C's element is
    read right before its own is written, so C may be the output itself)."""
    if op.beta == 0:
        return block
    (r0, r1), (c0, c1) = op.region
    c_in = np.empty(op.shape, dtype=block.dtype)
    sources["C"].read((r0, r1), (c0, c1), c_in)
    c_in *= op.beta
    c_in += block
    return c_in


def framed_writes(plan, sink):
    """The :class:`~oocgemm.storage.frames.Framing` in which a run of ``plan`` may hand
    ``sink`` C's stripes as encoded frames (``sink.write_frames``), or None: a sink that
    takes frames, and a plan that can store C from them there
    (:func:`~oocgemm.planning.planner.unframed`). The CPU executor's replay of a framed run
    asks it; the CUDA executor runs the plan's choice (:attr:`Plan.io.c_frames
    <oocgemm.planning.plan.IOChoices.c_frames>`)."""
    framing = sink.framing() if hasattr(sink, "write_frames") else None
    if framing is None or unframed(plan, getattr(sink, "chunks", None)) is not None:
        return None
    return framing


#: The least bytes of a row band that :class:`Bands` gives a thread of its own.
BAND_BYTES = 1 << 20


class Bands:
    """``work(lo, hi)`` over row bands covering ``[0, rows)``, each at least `BAND_BYTES`
    (rows of ``row_bytes``), started now on up to ``threads`` threads of ``pool`` (one fewer
    with ``caller``: the calling thread takes its share in :meth:`join`). A copy of an
    in-core product's operand is a large part of a small product's time, and a few threads
    take it in less (docs/performance.md, "Figures moved from the code's docstrings").

    The bands are taken from a shared queue by whoever is free; once :meth:`join`'s thread
    finds none left it cancels the helpers that have not started (all of the pool's threads
    may be busy, some waiting on this very call) and waits only for those that have. So a
    join never waits for a queued task, and is as quick as its thread alone when the pool
    has no thread to spare. Bands started ahead (``caller=False``) let the copies of two
    operands overlap; :meth:`stop` ends them where the run fails before their join.
    """

    def __init__(self, work, rows: int, row_bytes: int, pool, threads: int, *,
                 caller: bool = True):
        step = max(1, BAND_BYTES // max(1, row_bytes), -(-rows // max(1, threads)))
        self._work = work
        self._bands = iter([(lo, min(lo + step, rows)) for lo in range(0, rows, step)])
        self._lock = threading.Lock()
        helpers = min(threads, -(-rows // step)) - (1 if caller else 0)
        self._helpers = [pool.submit(self._drain) for _ in range(max(0, helpers))]

    def _drain(self) -> None:
        while True:
            with self._lock:
                band = next(self._bands, None)
            if band is None:
                return
            self._work(*band)

    def join(self) -> None:
        """Take the bands left on the calling thread, then wait for the helpers that have
        started; the first error raises once every band started is done."""
        try:
            self._drain()
        finally:
            self._settle()
        for helper in self._helpers:
            if not helper.cancelled() and helper.exception() is not None:
                raise helper.exception()

    def stop(self) -> None:
        """Leave the bands not started and wait for those that have (a run that failed,
        before the buffers they fill go); their errors are dropped."""
        with self._lock:
            self._bands = iter(())
        self._settle()

    def _settle(self) -> None:
        for helper in self._helpers:
            if not helper.cancel():
                helper.exception()  # wait for it


def thread_lane(prefix: str) -> str:
    """The lane of the calling pool thread: ``prefix`` and the thread's number in its pool
    ('read-3'), one timeline row per thread."""
    return f"{prefix}-{threading.current_thread().name.rsplit('_', 1)[-1]}"


class Cancelled(Exception):
    """A run stops because it is cancelled: raised inside its lanes when the run is being torn
    down (:meth:`Executor.cancel`, a failed lane, an interrupt), and by the progress callable
    of an :mod:`oocgemm.dask` group whose graph was released. :func:`failure` passes over it
    to the failure that caused it."""


class Executor:
    """What every executor holds: the plan and its schedule, the sources (``{'A': ..., 'B':
    ..., 'C': ...}``, C only when beta != 0), the sink, the event log, and a flag that tells
    every lane to stop. ``run()`` replays the schedule and returns the log. ``record=False``
    keeps no events (the bytes moved are still counted), to measure what recording costs.
    ``resources``: what the device's runs keep between them (an engine's; None: the
    process's), where the executor has any."""

    def __init__(self, plan, sources, sink, *, on_event=None, record: bool = True,
                 resources=None):
        self.plan = plan
        self.resources = resources
        self.sources = sources
        self.sink = sink
        self.on_event = on_event
        """Called with each finished :class:`~oocgemm.diagnostics.Event` (progress bars)."""
        self.log = EventLog(record)
        """Events of the run (none kept with ``record=False``) and the bytes it moved."""
        sink.attach(self.log)  # a writer that stores behind the run records it here
        self._cancel = threading.Event()

    @property
    def schedule(self):
        """The plan's built schedule (built when first asked for: an executor that replays a
        :meth:`~oocgemm.planning.Plan.replay` stream never builds it)."""
        return self.plan.schedule

    def run(self) -> EventLog:  # pragma: no cover - abstract
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop the run under way (from another thread) at its next operation; its
        ``run()`` then raises."""
        self._cancel.set()

    def _report(self, op, lane: str, start: float, end: float, *, wanted: bool,
                nbytes: int | None = None) -> None:
        """Log ``op`` (the log only counts its bytes when it records nothing and the event is
        not ``wanted``) and, when ``wanted``, hand its event to ``on_event``."""
        event = self.log.add(op, lane, start, end, nbytes, wanted=wanted)
        if wanted:
            self.on_event(event)


def failure(exc: BaseException, futures) -> BaseException:
    """What a run that failed with ``exc`` raises: the first real failure among the
    ``futures`` of its operations (not a dependent's echo of it), as an OOCGemmError (an
    allocation failure as a MemoryPressureError, which the API answers with a replan);
    an interrupt as itself."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return exc
    first = exc
    for fut in futures:
        if fut is not None and fut.done() and not fut.cancelled():
            err = fut.exception()
            if err is not None and not isinstance(err, (Cancelled, CancelledError,
                                                        InvalidStateError)):
                first = err
                break
    if isinstance(first, OOCGemmError):
        return first
    where = out_of_memory(first)
    if where is not None:
        return MemoryPressureError(f"{where} memory ran out: {type(first).__name__}: {first}",
                                   where)
    return ExecutionError(f"the run failed: {type(first).__name__}: {first}")


def out_of_memory(err: BaseException) -> str | None:
    """Which memory an allocation failure ran out of: 'host' (numpy's MemoryError), 'device'
    (CuPy's OutOfMemoryError, from its GPU memory pool), 'pinned' (a CUDA allocation error:
    page-locked host memory, or a library's own GPU allocation); None for other errors."""
    if type(err).__name__ == "OutOfMemoryError":  # CuPy's is a MemoryError too
        return "device"
    if isinstance(err, MemoryError):
        return "host"
    text = str(err)
    if "cudaErrorMemoryAllocation" in text or "CUDA_ERROR_OUT_OF_MEMORY" in text:
        return "pinned"
    return None

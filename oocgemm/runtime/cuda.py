"""The CUDA executor: replays a staged schedule with CuPy streams, events and pinned buffers.

Lanes (three streams and two thread pools):

- reader threads fill the pinned ring (sR*) from the sources, many stripes at once;
- stream ``h2d`` uploads A and B stripes into the device slots A0/A1, B0/B1;
- stream ``compute`` runs the cuBLAS GEMM of each K panel into the resident C slot;
- stream ``c`` brings C in (beta != 0) and takes finished C blocks out, stripe by stripe,
  through the output ring (sO*), while the next block computes in the other C slot;
- writer threads drain the output ring into the sink.

The dispatcher (the calling thread) walks the schedule in order and enqueues each device
operation after its dependencies: a dependency on another stream becomes an event wait on the
GPU, a dependency on a host operation (a READ) is waited for on the host. Host operations wait
for the CUDA events of the device operations they depend on. No device-wide synchronisation
happens inside the loop.

Timing: a pair of CUDA events brackets every device operation; a clock thread maps them onto
the host clock of the event log as the GPU finishes each one, through a reference event
recorded (and waited for) just before the first operation, so host and device events share one
clock and little is left to convert once the last operation ends. Every operation is
also an NVTX range in the ``oocgemm`` domain while Nsight Systems is attached
(:mod:`oocgemm.diagnostics.nvtx`).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, wait

from ..diagnostics.events import EventLog
from ..kernel_catalog import is_ozaki
from ..planning.schedule import OpKind, ordered_lane
from .base import Cancelled, Executor, block_shape, failure, panel_shapes, thread_lane, with_c
from .staging import cuda_settings

#: Threads of a run's lanes: a dispatcher per stream (three), the feeder and the clock.
LANE_THREADS = 5
#: Device bytes up to which an in-core product's buffers stay in CuPy's pool for the next
#: run (larger runs give theirs back to the GPU, which a later plan's budget then sees free).
KEEP_DEVICE_BYTES = 4 << 30


def _settle(future: Future, task) -> None:
    """Run ``task`` and settle ``future`` with its outcome (unless it was cancelled)."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(task())
    except BaseException as exc:
        future.set_exception(exc)


def _on_host(op) -> bool:
    return op.kind in (OpKind.READ, OpKind.WRITE)


class _Futures(dict):
    """The futures of operations by index, each made on first use: a product has thousands
    of operations, and making all their futures before the first read delayed it by tens of
    milliseconds. :meth:`cancel_all` cancels those made so far and every one made later."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()
        self._cancelled = False

    def __missing__(self, index: int) -> Future:
        with self._lock:
            fut = self.get(index)
            if fut is None:
                fut = Future()
                if self._cancelled:
                    fut.cancel()
                self[index] = fut
            return fut

    def cancel_all(self) -> None:
        with self._lock:
            self._cancelled = True
            futures = list(self.values())
        for fut in futures:
            fut.cancel()


def _stream_of(op) -> str:
    """The stream a device operation runs on: its in-order lane (h2d: A and B uploads,
    compute: GEMM and FILL, c: C uploads and downloads). The schedule counts on each stream
    running its operations in schedule order (:func:`oocgemm.planning.schedule.ordered_lane`)."""
    return ordered_lane(op)


class CudaExecutor(Executor):
    """Replays ``plan.schedule`` (a staged plan) on GPU ``plan.device``.

    Parameters are those of :class:`oocgemm.runtime.cpu.CpuExecutor`.
    """

    #: The plan's staging settings for this executor (:mod:`oocgemm.runtime.staging`).
    staging = staticmethod(cuda_settings)

    def __init__(self, plan, sources, sink, *, on_event=None, readers: int | None = None,
                 writers: int | None = None, record: bool = True, resources=None):
        if not plan.staged:
            raise ValueError("the CUDA executor replays staged plans only")
        super().__init__(plan, sources, sink, on_event=on_event, record=record,
                         resources=resources)
        index = int(plan.device.partition(":")[2] or 0)
        from ..cuda import startup

        # The process's first run on the GPU: cuBLAS loads (its bindings with cuda.engine)
        # and makes a handle, timed as a start-up step (oocgemm info shows it).
        startup.cublas(index, self.resources)
        if self.resources is None:  # a run without an engine: the process's
            from ..cuda.engine import PROCESS

            self.resources = PROCESS
        self.readers = readers or max(2, plan.readers)
        if plan.into_ring and readers is None:  # the readers decode: one on every core
            from .. import hostinfo

            self.readers = max(self.readers, min(hostinfo.cores(), plan.n_stage))
        self.writers = writers or max(2, plan.n_out)
        self.index = index
        # Compile before the run is timed, and fail before any byte is read.
        if plan.symmetric:
            import cupy

            from ..cuda.engine import mirror_kernel

            with cupy.cuda.Device(self.index):
                mirror_kernel(plan.problem.itemsize, self.resources.kernels)
        if is_ozaki(plan.kernel):
            from ..cuda import ozaki

            ozaki.module(self.index, self.resources.kernels)
        elif plan.kernel != "cublas":
            from ..cuda import kernels

            prob = plan.problem
            for vec in (True, False):
                kernels.function(plan.kernel, prob.dtype, prob.trans_a, prob.trans_b, vec,
                                 device=self.index, cache=self.resources.kernels)

    # -- host lanes ---------------------------------------------------------------------------
    def _feed(self, ops, pools, gpu, host_futures, device_futures, submitted) -> None:
        """Hand the host operations to their pools in schedule order (``submitted``: the
        pools' futures, which the run waits for before its buffers go). (Feeding the first
        GEMM's reads first, alone, was measured twice on the H100: no gain beyond the run to
        run noise of host memory bandwidth.)"""
        for op in ops:
            if self._cancel.is_set():
                return
            if op.kind in (OpKind.READ, OpKind.WRITE):
                pool = pools["read" if op.kind is OpKind.READ else "write"]
                target = host_futures[op.index]
                task = self._host_task(op, gpu, host_futures, device_futures)
                try:
                    submitted.append(pool.submit(_settle, target, task))
                except RuntimeError:  # the pools shut down: the process is exiting
                    target.cancel()
                    return

    def _host_task(self, op, gpu, host_futures, device_futures):
        def run():
            for d in op.deps:
                if _on_host(self.schedule.ops[d]):
                    host_futures[d].result()
                else:
                    device_futures[d].result()[1].synchronize()
            if self._cancel.is_set():
                raise Cancelled()
            start = self.log.now()
            (r0, r1), (c0, c1) = op.region
            self._nvtx.push(op)
            try:
                if op.kind is OpKind.READ:
                    self.sources[op.operand].read((r0, r1), (c0, c1),
                                                  gpu.host_view(op.dst, op.shape))
                else:  # WRITE from the output ring
                    self.sink.write((r0, r1), (c0, c1),
                                    with_c(op, gpu.host_view(op.src[0], op.shape), self.sources))
            finally:
                self._nvtx.pop()
            end = self.log.now()
            lane = "read" if op.kind is OpKind.READ else "write"
            self._report(op, thread_lane(lane), start, end, wanted=self.on_event is not None)
        return run

    # -- device lanes -------------------------------------------------------------------------
    def _enqueue(self, gpu, op, waits=()) -> None:
        """Enqueue ``op`` on its stream (``waits``: the events of what it waits for on other
        streams, which an emulated GEMM's panel conversion waits for too)."""
        stream = _stream_of(op)
        trans = self.schedule.transposed
        if op.kind is OpKind.UPLOAD:
            gpu.upload(op.src[0], op.dst, op.nbytes, stream, dst_offset=op.offset)
        elif op.kind is OpKind.DOWNLOAD:
            gpu.download(op.src[0], op.dst, op.nbytes, stream, src_offset=op.offset)
        elif op.kind is OpKind.GEMM:
            _, _, (w, h) = panel_shapes(self.plan, op)
            r = self.plan.k_splits[op.q + 1] - self.plan.k_splits[op.q]
            i, j = op.key
            note = gpu.gemm(op.src[0], op.src[1], op.dst, w, h, r, trans["A"], trans["B"],
                            op.alpha, op.beta, row0=op.offset // h, rows=op.shape[0],
                            panels=(("A", i, op.q), ("B", op.q, j)), waits=waits,
                            upper=op.upper)
            if note is not None:
                self.log.note(note)
        elif op.kind is OpKind.MIRROR:
            _, h = block_shape(self.plan, op.key)
            gpu.mirror(op.dst, h, op.offset // h, op.shape[0])
        elif op.kind is OpKind.TRANSPOSE:
            gpu.transpose(op.src[0], op.dst, *op.shape[::-1])
        elif op.kind is OpKind.FILL:
            gpu.scale(op.dst, op.elements, op.beta)
        else:  # pragma: no cover
            raise AssertionError(op.kind)

    def run(self) -> EventLog:
        """Replay the schedule; device and pinned buffers are freed on return, also on error.
        The threads (readers, writers, the lanes) are the resources' kept ones."""
        from ..cuda.engine import GpuContext
        from ..diagnostics.nvtx import Ranges

        self._nvtx = Ranges()
        ops = self.schedule.ops
        host_futures, device_futures = _Futures(), _Futures()  # device: (start, end) events
        lane_futures: list[Future] = []
        submitted: list[Future] = []  # the pools' futures of this run's host tasks
        crew = self.resources.crews.acquire(self.readers, self.writers, LANE_THREADS)
        pools = {"read": crew.read, "write": crew.write}
        # (op, stream, start, end, reported) of each device operation the clock thread is to
        # time; reported: on_event hears of it (GEMMs and FILLs, for the progress bars).
        timed: queue.SimpleQueue = queue.SimpleQueue()
        clock = feeder = None
        keep = self.plan.in_core and self.plan.device_bytes <= KEEP_DEVICE_BYTES
        with GpuContext(self.index, self.plan.problem.dtype, self.plan.kernel,
                        self.resources, keep_device=keep) as gpu:
            try:
                self._allocate(gpu)
                # Host tasks are handed to their pools by a feeder, in schedule order, while
                # the dispatchers already run: thousands of submissions would otherwise
                # stand before the first GEMM.
                feeder = crew.lanes.submit(self._feed, ops, pools, gpu, host_futures,
                                           device_futures, submitted)
                reference = gpu.event("compute")
                reference.synchronize()
                origin = self.log.now()
                if self.log.record or self.on_event is not None:
                    clock = crew.lanes.submit(self._clock, timed, reference, origin, gpu)
                # One dispatcher per stream, each enqueuing its own operations in schedule
                # order: a stream held up on the host (the C stream waiting for writers to free
                # the output ring) never holds up the uploads of the next panels.
                lanes: dict[str, list] = {}
                for op in ops:
                    if not _on_host(op):
                        lanes.setdefault(_stream_of(op), []).append(op)
                try:
                    lane_futures += [crew.lanes.submit(self._dispatch, gpu, stream, lane_ops, ops,
                                                       host_futures, device_futures, timed)
                                     for stream, lane_ops in lanes.items()]
                    wait(lane_futures)  # all of them: a failed lane makes the others stop
                    for fut in lane_futures:
                        fut.result()
                except BaseException:
                    # Ctrl-C lands here, in the calling thread: stop the dispatchers before
                    # waiting for them, or they would enqueue the rest of the product first.
                    self._stop(device_futures, host_futures)
                    raise
                finally:
                    wait(lane_futures)
                feeder.result()  # every host task is in its pool: each one's future exists
                for op in ops:
                    if _on_host(op):
                        host_futures[op.index].result()
                for stream in gpu.streams.values():
                    stream.synchronize()
                if gpu.emulator is not None and gpu.emulator.timing:
                    for phase, seconds in gpu.emulator.seconds().items():
                        self.log.add_time(phase, seconds)
            except BaseException as exc:
                self._stop(device_futures, host_futures)
                raise failure(exc, list(host_futures.values()) + lane_futures) from None
            finally:
                # Nothing of this run may run on once its buffers go: the feeder has stopped,
                # and every host task it handed on is over (cancelled ones return at once).
                if feeder is not None:
                    wait([feeder])
                wait(submitted)
                if clock is not None:
                    timed.put(None)
                    wait([clock])
                self.resources.crews.give_back(crew)
        return self.log

    def _allocate(self, gpu) -> None:
        """The schedule's slots: device buffers, and the pinned ring (the first run on the
        GPU in the process times its pinning, part of the start-up)."""
        from ..cuda import startup

        pinned_bytes, begin = 0, time.perf_counter()
        for name, elements in self.schedule.slots.items():
            if name.startswith("s"):
                gpu.pinned_buffer(name, elements)
                pinned_bytes += elements * self.plan.problem.itemsize
        seconds = time.perf_counter() - begin
        for name, elements in self.schedule.slots.items():
            if not name.startswith("s"):
                gpu.device_buffer(name, elements)
        if not startup.measured(self.index, "pinned"):
            startup.pinned(self.index, seconds, pinned_bytes)
        if is_ozaki(self.plan.kernel):
            gpu.emulate(self.plan, timing=self.log.record)

    def _clock(self, timed, reference, origin, gpu) -> None:
        """Put each device operation on the log's clock as the GPU finishes it (and report it,
        when asked to), until ``None`` comes; once the run is stopped or an event fails, only
        drain (the lanes report the failure)."""
        failed = False
        while (item := timed.get()) is not None:
            op, stream, start, end, reported = item
            if failed or self._cancel.is_set():
                continue
            try:
                end.synchronize()
                t0 = origin + gpu.elapsed_ms(reference, start) / 1e3
                t1 = origin + gpu.elapsed_ms(reference, end) / 1e3
            except Exception:
                failed = True
                continue
            self._report(op, stream, t0, t1, wanted=reported)

    def _dispatch(self, gpu, stream, lane_ops, ops, host_futures, device_futures, timed) -> None:
        """Enqueue one stream's operations in order, each after its dependencies: host ones
        waited for here, other streams' ones as event waits on the GPU."""
        try:
            with gpu.on_device():
                self._dispatch_lane(gpu, stream, lane_ops, ops, host_futures, device_futures,
                                    timed)
        except BaseException:
            self._stop(device_futures, host_futures)
            raise

    def _stop(self, *futures: dict) -> None:
        """Tell every lane to stop: at its next operation, or wherever it waits for a future
        that will now never be settled (pending futures are cancelled)."""
        self._cancel.set()
        for group in futures:
            group.cancel_all()

    def _dispatch_lane(self, gpu, stream, lane_ops, ops, host_futures, device_futures, timed):
        timing = self.log.record or self.on_event is not None
        # Per other stream, the latest op this stream already waits for: streams run in
        # order, so a dependency at or before it needs no second wait. (Same-stream ones
        # need none at all; the schedule names at most one per other stream.)
        waited: dict[str, int] = {}
        emulating = gpu.emulator is not None
        for op in lane_ops:
            if self._cancel.is_set():
                raise Cancelled()
            waits = []
            for d in op.deps:
                if _on_host(ops[d]):
                    host_futures[d].result()
                    continue
                other = _stream_of(ops[d])
                if emulating and other != stream:
                    waits.append(device_futures[d].result()[1])
                if other != stream and d > waited.get(other, -1):
                    gpu.wait(stream, device_futures[d].result()[1])
                    waited[other] = d
            self._nvtx.push(op)
            try:
                # The start event times the operation (the events, progress bars); the end
                # event is what later operations wait for.
                start = gpu.event(stream) if timing else None
                self._enqueue(gpu, op, waits)
                end = gpu.event(stream)
            finally:
                self._nvtx.pop()
            device_futures[op.index].set_result((start, end))
            reported = self.on_event is not None and op.kind in (OpKind.GEMM, OpKind.FILL)
            if self.log.record or reported:
                timed.put((op, stream, start, end, reported))
            else:
                self.log.count(op)

"""The CUDA executor: replays a staged schedule with CuPy streams, events and pinned buffers.

Lanes (three streams and two thread pools):

- reader threads fill the pinned ring (sR*) from the sources, many stripes at once (and
  fetch the stored objects of panels the GPU decodes, as stored);
- stream ``h2d`` uploads A and B stripes into the device slots A0.., B0.. (and fetched
  objects into their cells of the compressed slots ZA0.., ZB0..);
- stream ``compute`` runs the GEMM of each K panel into the resident C slot (cuBLAS, a kernel
  of ``kernels/``, or Ozaki scheme II's int8 GEMMs, as the plan's kernel says), the FILLs,
  and a symmetric product's MIRRORs and TRANSPOSEs;
- stream ``c`` brings C in (beta != 0) and takes finished C blocks out, stripe by stripe,
  through the output ring (sO*), while the next block computes in the other C slot;
- writer threads drain the output ring into the sink.

One dispatcher thread per stream enqueues that stream's operations in schedule order, each
after its dependencies: a dependency on another stream becomes an event wait on the GPU, a
dependency on a host operation (a READ) is waited for on the host, so a stream held up on the
host never holds up another. A feeder thread hands the host operations (READs, FETCHes,
WRITEs) to their pools in schedule order; they wait for the CUDA events of the device
operations they depend on. The calling thread waits for the lanes. No device-wide
synchronisation happens inside the run.

Where C's chunks are zstd and stored as files a run may store them from zstd frames, a row
stripe of C at a time, as the plan says (:attr:`Plan.io.c_frames
<oocgemm.planning.plan.IOChoices.c_frames>`, which the planner's GPU encode pass chose once the
output was open: :func:`~oocgemm.planning.planner.gpu_encode_pass`): a DOWNLOAD of the
GPU's share compresses its stripe on the GPU first (:class:`oocgemm.cuda.nvcomp.StripeEncoder`,
on stream ``c``, which runs ahead of the GEMMs) and its WRITE hands the sink the frames
(:func:`gpu_framing`); the other stripes go to the host's encoders.
By default the GPU compresses every stripe where nvCOMP is found (about the time of an
uncompressed output, where the host's encoders take longer: docs/performance.md, "C
compressed on the GPU by default"); elsewhere, or with ``gpu_encode=False``, C's chunks
are gathered and encoded whole on the host.

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
from collections.abc import Callable
from concurrent.futures import Future, wait

from ..diagnostics.events import EventLog
from ..planning.schedule import POOLS, OpKind, decode_batches, ordered_lane
from ..storage.frames import Framing
from .base import (
    Bands,
    Cancelled,
    Executor,
    block_shape,
    failure,
    panel_shapes,
    thread_lane,
    with_c,
)
from .staging import cuda_settings

#: Threads of a run's lanes: a dispatcher per stream (three), the feeder and the clock.
LANE_THREADS = 5
#: Threads that an in-core product's copy of an operand from memory (or of C into memory)
#: is shared among, in row bands (:class:`~oocgemm.runtime.base.Bands`); its readers are
#: twice as many, so that the copies of B and A go at once.
BAND_THREADS = 4
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


def gpu_framing(plan, sink) -> Framing | None:
    """The :class:`~oocgemm.storage.frames.Framing` in which a run of ``plan`` hands ``sink``
    C's stripes as frames, where the plan stores C from frames (:attr:`Plan.io.c_frames
    <oocgemm.planning.plan.IOChoices.c_frames>`: which stripes the GPU compresses, as the
    planner's GPU encode pass chose for this sink's writer,
    :func:`~oocgemm.planning.planner.gpu_encode_pass`); None where it does not (C's chunks
    gathered and encoded whole)."""
    if plan.io.c_frames is None:
        return None
    framing = sink.framing() if hasattr(sink, "write_frames") else None
    if framing is None:
        raise ValueError("the plan stores C from zstd frames (plan.io.c_frames), but its sink "
                         "takes none: the GPU encode pass decided it for another writer")
    return framing


def _first_used(schedule, prefix: str) -> list[str]:
    """The schedule's slots named ``prefix``..., in the order its operations first use them
    (those it never uses last)."""
    order: dict[str, None] = {}
    for op in schedule.ops:
        for name in (op.dst, *op.src):
            if name is not None and name.startswith(prefix):
                order.setdefault(name, None)
    order.update(dict.fromkeys(n for n in schedule.slots if n.startswith(prefix)))
    return list(order)


def few_copies(plan) -> bool:
    """Whether a run of ``plan`` copies its operands in row bands (:class:`Bands`) and
    runs in the calling thread (:meth:`CudaExecutor._run_inline`): an in-core product with
    one read of each operand and one write of C, which would leave most of their pools'
    threads idle. Bands make such a product quicker; where the stripes already keep the
    threads busy (n = 2048, 4096: eight reads) they only contend, and the run is slower
    (docs/performance.md, "Who compresses C, side by side; small products")."""
    if not plan.in_core:
        return False
    reads = [op.operand for op in plan.schedule.ops if op.kind is OpKind.READ]
    writes = sum(op.kind is OpKind.WRITE for op in plan.schedule.ops)
    return len(reads) == len(set(reads)) and writes <= 1


def _on_host(op) -> bool:
    return op.kind in POOLS


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
    compute: GEMM and FILL, c: C uploads and downloads, decode: DECODE). The schedule counts
    on each stream running its operations in schedule order
    (:func:`oocgemm.planning.schedule.ordered_lane`)."""
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
        index = plan.device.index
        from ..cuda import startup

        # The process's first run on the GPU: cuBLAS loads (its bindings with cuda.context)
        # and makes a handle, timed as a start-up step (oocgemm info shows it).
        startup.cublas(index, self.resources)
        if self.resources is None:  # a run without an engine: the process's
            from ..cuda.context import PROCESS

            self.resources = PROCESS
        self.readers = readers or max(2, plan.staging.readers)
        if plan.io.into_ring and readers is None:  # the readers decode: one on every core
            from .. import machine

            self.readers = max(self.readers, min(machine.cores(), plan.staging.n_stage))
        self.writers = writers or max(2, plan.staging.n_out)
        self._few = few_copies(plan)
        if self._few:  # its copies of memory go in bands, on this many at once
            self.readers = max(self.readers, 2 * BAND_THREADS)
            self.writers = max(self.writers, BAND_THREADS)
        self.index = index
        # C stored from frames: the stripes the GPU compresses, as the plan says
        self._frames, self._framing = plan.io.c_frames, gpu_framing(plan, sink)
        self._split: dict | None = None  # a run's pools, where its copies go in bands
        if self._frames is not None and self._frames.host:
            sink.encode_frames()
        self._encoder = None  # the run's StripeEncoder (self._frames.downloads)
        # Panels decoded on the GPU (plan.io.gpu_decode): the run's PanelDecoder, the stored
        # objects a ring buffer or a Z slot's cell holds, (chunk, size, frames), and the bytes
        # each UPLOAD_STORED moves (by its index, until its event is logged)
        self._decoder = None
        self._objects: dict = {}
        self._moved: dict[int, int] = {}
        # Compile before the run is timed, and fail before any byte is read: the mirror
        # kernel where the schedule mirrors blocks, the GEMM kernel always.
        if plan.schedule.count(OpKind.MIRROR):
            import cupy

            from ..cuda.context import mirror_kernel

            with cupy.cuda.Device(self.index):
                mirror_kernel(plan.problem.itemsize, self.resources.kernels)
        from ..cuda.launch import launch_of

        self._launch = launch_of(plan.strategy)
        self._launch.compile(self.index, self.resources.kernels, plan.problem)

    # -- host lanes ---------------------------------------------------------------------------
    def _feed(self, ops, pools, gpu, host_futures, device_futures, submitted) -> None:
        """Hand the host operations to their pools in schedule order (``submitted``: the
        pools' futures, which the run waits for before its buffers go). (Feeding the first
        GEMM's reads first, alone, was measured twice on the H100: no gain beyond the run to
        run noise of host memory bandwidth.)"""
        for op in ops:
            if self._cancel.is_set():
                return
            if _on_host(op):
                pool = pools[POOLS[op.kind]]
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
            self._host_op(op, gpu)
        return run

    def _host_op(self, op, gpu, thread: str | None = None, ahead=None) -> None:
        """Run the READ, FETCH or WRITE ``op`` now (what it waits for is done) through its
        kind's host handler (:meth:`host_handlers`) and log it on the calling pool thread's
        lane ('read-3'), or on ``thread``'s of its pool ('0'); ``ahead``: (start,
        :class:`Bands`) of a READ whose bands started earlier."""
        start = self.log.now() if ahead is None else ahead[0]
        self._nvtx.push(op)
        try:
            moved = self._host_handlers[op.kind](op, gpu, ahead)
        finally:
            self._nvtx.pop()
        end = self.log.now()
        pool = POOLS[op.kind]
        lane = thread_lane(pool) if thread is None else f"{pool}-{thread}"
        self._report(op, lane, start, end, wanted=self.on_event is not None, nbytes=moved)

    # -- host operations: one handler per kind -----------------------------------------------
    def host_handlers(self) -> dict[OpKind, Callable[..., int | None]]:
        """The handler of each kind that runs on a pool thread: it runs the operation, taking
        the GPU's context, the operation and ``ahead`` (:meth:`_host_op`), and returns the
        bytes it moved where they are not the region's (else None). Made when a run
        starts."""
        return {OpKind.READ: self._read, OpKind.FETCH: self._fetch, OpKind.WRITE: self._write}

    def _read(self, op, gpu, ahead) -> None:
        """A stripe of A, B or C from its source into its ring buffer (in bands where the
        run copies in them: started ``ahead``, or now)."""
        (r0, r1), (c0, c1) = op.region
        bands = ahead[1] if ahead is not None else self._read_bands(op, gpu)
        if bands is not None:
            bands.join()
        else:
            self.sources[op.operand].read((r0, r1), (c0, c1), gpu.host_view(op.dst, op.shape))

    def _fetch(self, op, gpu, ahead) -> int:
        """A stored object of a panel the GPU decodes into its ring buffer, as stored; its
        index, size and frames kept for its UPLOAD_STORED. Returns its size."""
        (r0, _), (c0, _) = op.region
        source = self.sources[op.operand]
        index = (r0 // source.chunks[0], c0 // source.chunks[1])
        self._objects[op.dst] = (index, *source.read_object(index, gpu.pinned_bytes(op.dst)))
        return self._objects[op.dst][1]

    def _write(self, op, gpu, ahead) -> None:
        """A stripe of C from the output ring into the sink: as the frames the GPU
        compressed where the plan says so, in bands where the run copies in them."""
        (r0, r1), (c0, c1) = op.region
        if self._frames is not None and op.index in self._frames.writes:
            from ..cuda.nvcomp import read_stripe  # frames compressed on the GPU

            assert self._framing is not None
            pieces = read_stripe(self._framing, gpu.pinned_bytes(op.src[0]), (r0, r1), (c0, c1))
            self.sink.write_frames((r0, r1), (c0, c1), pieces)
        elif self._split and getattr(self.sink, "split_writes", False) and not op.beta:
            self._banded("write", self.sink.write, op.region,
                         gpu.host_view(op.src[0], op.shape)).join()
        else:  # WRITE from the output ring
            self.sink.write((r0, r1), (c0, c1),
                            with_c(op, gpu.host_view(op.src[0], op.shape), self.sources))

    def _banded(self, pool: str, move, region, buffer, caller: bool = True) -> Bands:
        """``move(rows, cols, part)`` (a source's read or the sink's write) of ``region``
        through ``buffer``, in row bands started on the run's ``pool`` (:class:`Bands`: the
        caller joins them, taking its share unless ``caller`` is False)."""
        (r0, r1), cols = region
        return Bands(lambda lo, hi: move((r0 + lo, r0 + hi), cols, buffer[lo:hi]), r1 - r0,
                     buffer[0].nbytes, self._split[pool], BAND_THREADS, caller=caller)

    def _read_bands(self, op, gpu, caller: bool = True) -> Bands | None:
        """The bands of READ ``op``, started now, where the run copies in bands and its
        source reads in them; else None."""
        source = self.sources[op.operand]
        if not (self._split and source.split_reads):
            return None
        return self._banded("read", source.read, op.region, gpu.host_view(op.dst, op.shape),
                            caller=caller)

    def _read_ahead(self, ops, i: int, gpu, ahead: dict) -> None:
        """Start the bands of the next READ after ``ops[i]`` on the read pool now, into
        ``ahead`` (index: (start, Bands)), where nothing it waits for is left (what it
        depends on are host operations before ``ops[i]``) and its source reads in bands: the
        copies of B and A then overlap, quicker than one after the other (docs/performance.md,
        "Small products in the calling thread")."""
        nxt = next((op for op in ops[i + 1:] if op.kind is OpKind.READ), None)
        if nxt is None or nxt.index in ahead or not all(
                d < i and _on_host(ops[d]) for d in nxt.deps):
            return
        start, bands = self.log.now(), self._read_bands(nxt, gpu, caller=False)
        if bands is not None:
            ahead[nxt.index] = (start, bands)

    # -- device lanes -------------------------------------------------------------------------
    # -- device operations: one handler per kind ---------------------------------------------
    def handlers(self) -> dict[OpKind, Callable[..., None]]:
        """The handler of each kind that runs on a stream: it enqueues the operation, taking
        the GPU's context, the operation, its stream, the events it waits for on other
        streams (an emulated GEMM's panel conversion waits for them too) and the DECODEs
        decoded with it as one batch (it first). Made when a run starts."""
        return {OpKind.UPLOAD: self._upload, OpKind.UPLOAD_STORED: self._upload_stored,
                OpKind.DECODE: self._decode, OpKind.DOWNLOAD: self._download,
                OpKind.GEMM: self._gemm, OpKind.MIRROR: self._mirror,
                OpKind.TRANSPOSE: self._transpose, OpKind.FILL: self._fill}

    def _enqueue(self, gpu, op, waits=(), batch=None) -> None:
        """Enqueue ``op`` on its stream (``waits``: the events of what it waits for on other
        streams; ``batch``: the DECODEs decoded with DECODE ``op`` as one, it first)."""
        self._handlers[op.kind](gpu, op, _stream_of(op), waits, batch)

    def _upload_stored(self, gpu, op, stream, waits, batch) -> None:
        """The stored object its FETCH found, into its cell of the operand's compressed
        slot."""
        found = self._objects[op.src[0]]  # (its FETCH is done: the lane waited for it)
        self._objects[(op.dst, op.offset)] = found
        self._moved[op.index] = found[1]
        gpu.upload(op.src[0], op.dst, found[1], stream, dst_offset=op.offset)

    def _decode(self, gpu, op, stream, waits, batch) -> None:
        self._decoder.decode(batch or (op,), gpu.device_ptr, self._objects,
                             gpu.streams[stream])

    def _upload(self, gpu, op, stream, waits, batch) -> None:
        gpu.upload(op.src[0], op.dst, op.nbytes, stream, dst_offset=op.offset)

    def _download(self, gpu, op, stream, waits, batch) -> None:
        """A stripe of C down into the output ring: compressed on the way where the plan's
        plan says its stripe is the GPU's to encode."""
        if self._encoder is not None and op.index in self._frames.downloads:
            self._encoder.encode(gpu.device_ptr(op.src[0]) + op.offset * gpu.dtype.itemsize,
                                 op.shape[1], *op.region, gpu.pinned_ptr(op.dst),
                                 gpu.streams[stream].ptr)
        else:
            gpu.download(op.src[0], op.dst, op.nbytes, stream, src_offset=op.offset)

    def _gemm(self, gpu, op, stream, waits, batch) -> None:
        trans = self.schedule.transposed
        _, _, (w, h) = panel_shapes(self.plan, op)
        r = self.plan.k_splits[op.q + 1] - self.plan.k_splits[op.q]
        i, j = op.key
        note = gpu.gemm(op.src[0], op.src[1], op.dst, w, h, r, trans["A"], trans["B"],
                        op.alpha, op.beta, row0=op.offset // h, rows=op.shape[0],
                        panels=(("A", i, op.q), ("B", op.q, j)), waits=waits,
                        upper=op.upper)
        if note is not None:
            self.log.note(note)

    def _mirror(self, gpu, op, stream, waits, batch) -> None:
        _, h = block_shape(self.plan, op.key)
        gpu.mirror(op.dst, h, op.offset // h, op.shape[0])

    def _transpose(self, gpu, op, stream, waits, batch) -> None:
        gpu.transpose(op.src[0], op.dst, *op.shape[::-1])

    def _fill(self, gpu, op, stream, waits, batch) -> None:
        gpu.scale(op.dst, op.elements, op.beta)

    def run(self) -> EventLog:
        """Replay the schedule; device and pinned buffers are freed on return, also on error.
        The threads (readers, writers, the lanes) are the resources' kept ones."""
        from ..cuda.context import GpuContext
        from ..diagnostics.nvtx import Ranges

        self._nvtx = Ranges()
        self._handlers = self.handlers()
        self._host_handlers = self.host_handlers()
        if self._frames is None and not self._launch.waits_across_streams \
                and self._few:
            return self._run_inline()
        ops = self.schedule.ops
        host_futures, device_futures = _Futures(), _Futures()  # device: (start, end) events
        lane_futures: list[Future] = []
        submitted: list[Future] = []  # the pools' futures of this run's host tasks
        crew = self.resources.crews.acquire(self.readers, self.writers, LANE_THREADS)
        pools = {"read": crew.read, "write": crew.write}
        self._split = pools if self._few else None
        # (op, stream, start, end, reported) of each device operation the clock thread is to
        # time; reported: on_event hears of it (GEMMs and FILLs, for the progress bars).
        timed: queue.SimpleQueue = queue.SimpleQueue()
        clock = feeder = None
        keep = self.plan.in_core and self.plan.device_bytes <= KEEP_DEVICE_BYTES
        with GpuContext(self.index, self.plan.problem.dtype, self._launch, self.resources,
                        keep_device=keep) as gpu:
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
                if self._timing:
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
                if self._decoder is not None:  # a frame nvCOMP refused fails the run
                    self._decoder.finish()
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
                if self._encoder is not None:  # its buffers go once nothing uses them
                    gpu.streams["c"].synchronize()
                    self._encoder.close()
                    self._encoder = None
                if self._decoder is not None:
                    gpu.streams["decode"].synchronize()
                    self._decoder.close()
                    self._decoder = None
                self._objects.clear()
                self._moved.clear()
        return self.log

    def _run_inline(self) -> EventLog:
        """:meth:`run` of a product of a few operations (:func:`few_copies`), in the calling
        thread: each operation in schedule order, the host's now (their copies in bands),
        the device's enqueued on their streams after event waits for what they wait for on
        the others, their times read once the streams are done. No feeder, dispatcher or
        clock thread, whose hand-offs took much of a small product's run
        (docs/performance.md, "Figures moved from the code's docstrings").
        The schedule's order is one its dependencies allow, so nothing waits out of turn."""
        from ..cuda.context import GpuContext

        ops = self.schedule.ops
        crew = self.resources.crews.acquire(self.readers, self.writers, LANE_THREADS)
        self._split = {"read": crew.read, "write": crew.write}
        ends: dict[int, object] = {}  # device operations: the event of their end
        timed = []  # (op, stream, start event, end event)
        ahead: dict[int, tuple] = {}  # READs whose bands started early: (start, Bands)
        keep = self.plan.device_bytes <= KEEP_DEVICE_BYTES
        try:
            with GpuContext(self.index, self.plan.problem.dtype, self._launch, self.resources,
                            keep_device=keep) as gpu:
                self._allocate(gpu)
                reference = gpu.event("compute")
                reference.synchronize()
                origin = self.log.now()
                try:
                    self._replay_inline(ops, gpu, ends, timed, ahead)
                finally:  # none may fill a buffer after the run lets it go
                    for _, bands in ahead.values():
                        bands.stop()
                for stream_ in gpu.streams.values():
                    stream_.synchronize()
                for op, stream, start, end in timed:
                    if self._timing:
                        self._report(op, stream,
                                     *self._clock_times(start, end, gpu, reference, origin),
                                     wanted=self._reported(op))
                    else:
                        self.log.count(op)
        except BaseException as exc:
            raise failure(exc, ()) from None
        finally:
            self.resources.crews.give_back(crew)
        return self.log

    def _replay_inline(self, ops, gpu, ends: dict, timed: list, ahead: dict) -> None:
        """:meth:`_run_inline`'s operations in schedule order: the host's run now (a READ
        whose bands started ahead on its own lane, 'read-1'), the device's enqueued."""
        timing = self._timing
        for i, op in enumerate(ops):
            if self._cancel.is_set():
                raise Cancelled()
            if _on_host(op):
                for d in op.deps:
                    if d in ends:
                        ends[d].synchronize()
                if op.kind is OpKind.READ and self._split:
                    self._read_ahead(ops, i, gpu, ahead)
                early = ahead.get(op.index)  # left in ahead until joined: stopped on error
                self._host_op(op, gpu, thread="0" if early is None else "1", ahead=early)
                ahead.pop(op.index, None)
                continue
            stream = _stream_of(op)
            for d in op.deps:  # host ones are done: they came before it
                if d in ends and _stream_of(ops[d]) != stream:
                    gpu.wait(stream, ends[d])
            start = gpu.event(stream) if timing else None
            self._nvtx.push(op)
            try:
                self._enqueue(gpu, op)
            finally:
                self._nvtx.pop()
            ends[op.index] = gpu.event(stream)
            timed.append((op, stream, start, ends[op.index]))

    def _allocate(self, gpu) -> None:
        """The schedule's slots: device buffers, and the pinned ring (the first run on the
        GPU in the process times its pinning, part of the start-up)."""
        from ..cuda import startup

        itemsize = self.plan.problem.itemsize
        begin = time.perf_counter()
        ring = _first_used(self.schedule, "s")
        sizes = {}
        for name in ring:
            sizes[name] = self.schedule.slots[name]
            if name.startswith("sO") and self._frames is not None:  # frames and sizes
                sizes[name] = max(sizes[name], -(-self._frames.ring // itemsize))
        pinned_bytes = sum(sizes.values()) * itemsize

        def timed() -> None:  # the first run's ring, all of it pinned
            startup.pinned(self.index, time.perf_counter() - begin, pinned_bytes)

        for name in ring:  # pinned behind the run, in the order it first uses them
            last = name == ring[-1] and not startup.measured(self.index, "pinned")
            gpu.pinned_buffer(name, sizes[name], later=True, then=timed if last else None)
        for name, elements in self.schedule.slots.items():
            if not name.startswith("s"):
                gpu.device_buffer(name, elements)
        gpu.start_launch(self.plan, timing=self.log.record)
        if self.plan.io.gpu_decode:
            from ..cuda.decode import PanelDecoder

            self._decoder = PanelDecoder(
                self.plan, {x: self.sources[x].name for x in self.plan.io.gpu_decode},
                {x: self.sources[x].fill_value for x in self.plan.io.gpu_decode})
        if self._frames is not None and self._frames.downloads:
            from ..cuda import nvcomp

            frames = self._frames
            self._encoder = nvcomp.StripeEncoder(self._framing, frames.stripes, itemsize)
            total = sum(1 for op in self.schedule.ops if op.kind is OpKind.DOWNLOAD)
            self.log.encoder = (f"nvCOMP {nvcomp.version()} zstd on the GPU"
                                + (f" for {len(frames.downloads)} of {total} stripes, the "
                                   f"host's encoders for the others"
                                   if len(frames.downloads) < total else ""))

    def _clock(self, timed, reference, origin, gpu) -> None:
        """Put each device operation on the log's clock as the GPU finishes it (and report it,
        when asked to), until ``None`` comes; once the run is stopped or an event fails, only
        drain (the lanes report the failure)."""
        failed = False
        while (item := timed.get()) is not None:
            if failed or self._cancel.is_set():
                continue
            op, stream, start, end = item
            try:
                end.synchronize()
                times = self._clock_times(start, end, gpu, reference, origin)
            except Exception:
                failed = True
                continue
            self._report(op, stream, *times, wanted=self._reported(op),
                         nbytes=self._moved.pop(op.index, None))

    @property
    def _timing(self) -> bool:
        """Whether device operations are timed (their start events): a log that records
        events, or a progress callable that is handed them."""
        return self.log.record or self.on_event is not None

    def _reported(self, op) -> bool:
        """Whether the device operation ``op`` is handed to ``on_event`` (the progress bar's
        GEMMs and FILLs)."""
        return self.on_event is not None and op.kind in (OpKind.GEMM, OpKind.FILL)

    @staticmethod
    def _clock_times(start, end, gpu, reference, origin) -> tuple[float, float]:
        """The times on the log's clock of a device operation's ``start`` and ``end`` events
        (done): ``origin`` is when the GPU passed the event ``reference``."""
        return (origin + gpu.elapsed_ms(reference, start) / 1e3,
                origin + gpu.elapsed_ms(reference, end) / 1e3)

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
        timing = self._timing
        # Per other stream, the latest op this stream already waits for: streams run in
        # order, so a dependency at or before it needs no second wait. (Same-stream ones
        # need none at all; the schedule names at most one per other stream.)
        waited: dict[str, int] = {}
        waits_across = gpu.launch.waits_across_streams
        # The decode lane's DECODEs go in batches (decode_batches): a batch is enqueued when
        # its first comes, after what every one of it waits for; all of them end with it.
        batches = {b[0]: tuple(ops[i] for i in b)
                   for b in (decode_batches(ops) if stream == "decode" else ()) if len(b) > 1}
        later = {op.index for b in batches.values() for op in b[1:]}
        for op in lane_ops:
            if self._cancel.is_set():
                raise Cancelled()
            if op.index in later:
                continue
            batch = batches.get(op.index, (op,))
            waits = []
            for d in (d for member in batch for d in member.deps):
                if _on_host(ops[d]):
                    host_futures[d].result()
                    continue
                other = _stream_of(ops[d])
                if waits_across and other != stream:
                    waits.append(device_futures[d].result()[1])
                if other != stream and d > waited.get(other, -1):
                    gpu.wait(stream, device_futures[d].result()[1])
                    waited[other] = d
            self._nvtx.push(op)
            try:
                # The start event times the operation (the events, progress bars); the end
                # event is what later operations wait for.
                start = gpu.event(stream) if timing else None
                self._enqueue(gpu, op, waits, batch)
                end = gpu.event(stream)
            finally:
                self._nvtx.pop()
            for member in batch:
                device_futures[member.index].set_result((start, end))
                if self.log.record or self._reported(member):
                    timed.put((member, stream, start, end))
                else:
                    self.log.count(member)

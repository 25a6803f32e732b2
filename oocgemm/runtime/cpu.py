"""The CPU executor: replays a schedule with numpy BLAS and thread pools.

Lanes: one compute thread (the caller's) runs GEMM/FILL in schedule order; a pool of reader
threads runs READs; one copy thread runs UPLOAD/DOWNLOAD of staged schedules, in schedule
order; a pool of writer threads runs WRITEs. Every operation waits for its declared
dependencies and nothing else, so the reads of the next panels overlap the current
multiplication exactly as the schedule allows (the same double buffering the CUDA executor
does with streams). The schedule names no dependency that the order of its in-order lanes
implies (:func:`oocgemm.planning.schedule.ordered_lane`): the compute thread and the single copy
thread keep that order (the copy thread runs the lanes h2d and c as one, which keeps each
one's order), so neither may become a pool.

Operands already in memory are used in place: where a source or the output is a numpy array
of the compute dtype with a layout BLAS takes, a READ binds the slot to a view of it instead
of copying, and a C slot is a view of the output, so that its WRITE has nothing left to move.
The schedule, its order and its dependencies stay the same; only the bytes do not move.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..diagnostics.events import EventLog
from ..planning.schedule import OpKind, object_cells
from ..storage.frames import encode_stripe
from ..strategies import strategy_of
from .base import (
    Cancelled,
    Executor,
    block_shape,
    failure,
    framed_writes,
    mirror_lower,
    panel_shapes,
    thread_lane,
    transpose_into,
    upper_matmul,
    with_c,
)
from .staging import cpu_settings

#: How the replay runs the operations of a panel decoded on the device (Plan.gpu_decode).
_OBJECT_OPS = {OpKind.READ: "_read_object", OpKind.UPLOAD: "_upload_object",
               OpKind.DECODE: "_decode"}

#: Seconds a lane waits on a dependency before it looks at its state again (:func:`_settled`).
LOOK_AGAIN = 0.25


def _settled(fut: Future):
    """``fut.result()``, looking at the future again every :data:`LOOK_AGAIN` seconds rather
    than trusting its wake-up alone. The compute thread is the caller's, where Ctrl-C and
    SIGTERM raise, and CPython's ``Future.set_result`` marks the future done before it wakes
    the threads waiting on it: an interrupt that lands between the two leaves them asleep for
    good (``cancel()`` does nothing to a done future), and the run's ``shutdown(wait=True)``
    with them. (That was the rare hang after SIGTERM under load: a reader asleep on a GEMM
    that was done.) ``exception(timeout)`` raises only its own timeout; an operation's error,
    a TimeoutError too, comes from ``result()``."""
    while True:
        try:
            fut.exception(timeout=LOOK_AGAIN)
        except TimeoutError:  # not done yet
            continue
        return fut.result()


class CpuExecutor(Executor):
    """Replays ``plan.schedule`` on the host.

    Parameters
    ----------
    plan
        The validated plan.
    sources
        ``{'A': MatrixSource, 'B': ..., 'C': ...}`` (C only when beta != 0).
    sink
        Where C blocks are written.
    on_event
        Called with each :class:`~oocgemm.diagnostics.Event` as it finishes (progress bars).
    record
        False to keep no events (only the bytes moved are counted).
    frames
        Replay a framed run (:func:`~oocgemm.runtime.base.framed_writes`): each stripe of C
        encoded into its chunk pieces' frames at its WRITE, on the host, as the CUDA executor
        encodes them on the GPU, and the sink handed the frames.
    """

    #: The plan's staging settings for this executor (:mod:`oocgemm.runtime.staging`).
    staging = staticmethod(cpu_settings)

    def __init__(self, plan, sources, sink, *, on_event=None, writers: int = 2,
                 record: bool = True, resources=None, frames: bool = False):
        super().__init__(plan, sources, sink, on_event=on_event, record=record,
                         resources=resources)  # keeps nothing between runs
        self.framing = framed_writes(plan, sink) if frames else None
        self.readers = max(1, plan.readers)
        self.writers = max(1, writers)
        self.dtype = np.dtype(plan.problem.dtype)
        self.strategy = strategy_of(plan.kernel)  # the product's GEMM: numpy's, or emulated
        self._buffers: dict[str, np.ndarray] = {}
        self._bound: dict[str, np.ndarray] = {}  # slot -> zero-copy view it stands for now
        self._analysed: dict[str, tuple] = {}  # 'A'/'B' -> (panel key, ozaki.Panel) last used
        self._alloc_lock = threading.Lock()
        # panels decoded on the device: a ring buffer's or a cell's object (index, size, frames)
        self._objects: dict = {}
        # A symmetric product that reads C meets it as blocks are written: its C slots are
        # scratch, never the output's region (which may be C itself, still to be read).
        self._binds = not (plan.symmetric and plan.problem.reads_c)

    # -- buffers ---------------------------------------------------------------------------
    def _buffer(self, slot: str) -> np.ndarray:
        """The slot's buffer, allocated on first use: slots that only ever stand for
        in-place operands take no memory."""
        buf = self._buffers.get(slot)
        if buf is None:
            with self._alloc_lock:
                buf = self._buffers.get(slot)
                if buf is None:
                    if slot == "accumulator":
                        capacity = self.plan.buffers.accumulator // self.dtype.itemsize
                    else:
                        capacity = self.schedule.slots[slot]
                    buf = self._buffers[slot] = np.empty(capacity, dtype=self.dtype)
        return buf

    def view(self, slot: str, shape: tuple[int, int]) -> np.ndarray:
        bound = self._bound.get(slot)
        if bound is not None:
            return bound
        return self._buffer(slot)[: shape[0] * shape[1]].reshape(shape)

    def _bind(self, slot: str, array: np.ndarray | None) -> None:
        if array is None:
            self._bound.pop(slot, None)
        else:
            self._bound[slot] = array

    def _bind_output(self, op) -> None:
        """A C (or T) slot that starts a block stands for the output's region where it can."""
        if not self._binds:
            return
        i, j = op.key
        rows, cols = self.plan.row_splits, self.plan.col_splits
        self._bind(op.dst, self.sink.view((rows[i], rows[i + 1]), (cols[j], cols[j + 1]),
                                          self.dtype))

    # -- operations ------------------------------------------------------------------------
    def _run_op(self, op) -> int:
        """Run one operation; return the bytes it actually moved (0 where a slot stands for
        the data in place)."""
        kind = op.kind
        if op.operand in self.plan.gpu_decode and kind in _OBJECT_OPS:
            return getattr(self, _OBJECT_OPS[kind])(op)
        if kind is OpKind.READ:
            (r0, r1), (c0, c1) = op.region
            source = self.sources[op.operand]
            if self.plan.staged:
                source.read((r0, r1), (c0, c1), self.view(op.dst, op.shape))
            elif op.operand == "C":
                self._bind_output(op)
                target = self.view(op.dst, op.shape)
                data = source.view((r0, r1), (c0, c1), self.dtype)
                if data is not None and np.shares_memory(data, target):
                    return 0  # c is the output itself: updated in place
                source.read((r0, r1), (c0, c1), target)
            else:
                self._bind(op.dst, source.view((r0, r1), (c0, c1), self.dtype))
                if op.dst in self._bound:
                    return 0
                source.read((r0, r1), (c0, c1), self.view(op.dst, op.shape))
        elif kind is OpKind.UPLOAD:  # a stripe into its place in the device slot
            n = op.elements
            np.copyto(self._buffer(op.dst)[op.offset:op.offset + n], self._buffer(op.src[0])[:n])
        elif kind is OpKind.DOWNLOAD:
            n = op.elements
            np.copyto(self._buffer(op.dst)[:n], self._buffer(op.src[0])[op.offset:op.offset + n])
        elif kind is OpKind.WRITE:
            (r0, r1), (c0, c1) = op.region
            if op.src[0] in self._bound:  # a bound C slot is the output's region already
                return 0
            if op.offset:  # a row stripe of its block (the run's last block, unstaged)
                w, h = block_shape(self.plan, op.key)
                x0 = op.offset // h
                data = self.view(op.src[0], (w, h))[x0:x0 + op.shape[0]]
            else:
                data = self.view(op.src[0], op.shape)
            if self.framing is not None:
                self.sink.write_frames((r0, r1), (c0, c1),
                                       encode_stripe(self.framing, data, (r0, r1), (c0, c1)))
            else:
                self.sink.write((r0, r1), (c0, c1), with_c(op, data, self.sources))
        elif kind is OpKind.MIRROR:
            w, h = block_shape(self.plan, op.key)
            x0 = op.offset // h
            mirror_lower(self.view(op.dst, (w, h)), x0, x0 + op.shape[0])
        elif kind is OpKind.TRANSPOSE:
            if not self.plan.staged:
                self._bind_output(op)
            transpose_into(self.view(op.dst, op.shape), self.view(op.src[0], op.shape[::-1]))
        elif kind is OpKind.GEMM:
            self._gemm(op)
        elif kind is OpKind.FILL:
            if op.beta == 0 and not self.plan.staged:
                self._bind_output(op)
            c = self.view(op.dst, op.shape)
            if op.beta == 0:
                c.fill(0)
            elif op.beta != 1:
                c *= op.beta
        else:  # pragma: no cover - the schedule has no other kinds
            raise AssertionError(kind)
        return op.nbytes

    # -- panels decoded on the device (Plan.gpu_decode), replayed on the host ---------------
    def _read_object(self, op) -> int:
        """A stored object into its ring buffer, as stored; its frames kept with it."""
        source, chunks = self.sources[op.operand], self.plan.problem_operand(op.operand).chunks
        index = (op.region[0][0] // chunks[0], op.region[1][0] // chunks[1])
        size, frames = source.read_object(index, self._buffer(op.dst).view(np.uint8))
        self._objects[op.dst] = (index, size, frames)
        return size

    def _upload_object(self, op) -> int:
        """An object's bytes into its cell of the Z slot."""
        index, size, frames = self._objects[op.src[0]]
        start = op.offset * self.dtype.itemsize
        cells = self._buffer(op.dst).view(np.uint8)
        cells[start:start + size] = self._buffer(op.src[0]).view(np.uint8)[:size]
        self._objects[(op.dst, op.offset)] = (index, size, frames)
        return size

    def _decode(self, op) -> int:
        """Every object of the panel decoded from its cell into its place in the slot."""
        source = self.sources[op.operand]
        (r0, _), (c0, _) = op.region
        panel = self.view(op.dst, op.shape)
        cells = self._buffer(op.src[0]).view(np.uint8)
        for index, ((s0, s1), (d0, d1)), offset in object_cells(self.plan, op.operand,
                                                                 op.region):
            got, size, frames = self._objects[(op.src[0], offset)]
            assert got == index, (got, index)
            start = offset * self.dtype.itemsize
            source.decode_object(index, cells[start:start + size], frames,
                                 panel[s0 - r0:s1 - r0, d0 - c0:d1 - c0])
        return 0

    def _gemm(self, op) -> None:
        if op.beta == 0 and not self.plan.staged:  # starts a block: C is not read
            self._bind_output(op)
        a_shape, b_shape, (w, h) = panel_shapes(self.plan, op)
        x0 = op.offset // h  # a GEMM may cover a row stripe of its block
        x1 = x0 + op.shape[0]
        panel = self.view(op.src[0], a_shape)
        b = self.view(op.src[1], b_shape)
        if self.schedule.transposed["A"]:
            panel = panel.T
        if self.schedule.transposed["B"]:
            b = b.T
        a = panel[x0:x1]
        y0 = x0 if op.upper else 0  # on and above a diagonal block's diagonal only
        b = b[:, y0:]
        c = self.view(op.dst, (w, h))[x0:x1, y0:]
        multiply = upper_matmul if op.upper else np.matmul
        if self.strategy.emulated:  # the same steps, the product emulated
            product = self._emulated(op, panel, a, b)
        elif op.beta == 0:  # BLAS: C is not read, whatever it holds
            multiply(a, b, out=c)
            if op.alpha != 1:
                c *= op.alpha
            return
        else:
            product = self.view("accumulator", c.shape)
            multiply(a, b, out=product)
        if op.beta == 0:  # C is not read
            np.copyto(c, product)
            if op.alpha != 1:
                c *= op.alpha
            return
        if op.beta != 1:
            c *= op.beta
        if op.alpha != 1:
            product *= op.alpha
        c += product

    def _emulated(self, op, panel, a, b) -> np.ndarray:
        """``a @ b`` (``a``: a row stripe of A's ``panel``) by Ozaki scheme II, or native
        where the panels need more than the scheme gives; the log notes which. How is decided
        on the whole panels, as the GPU decides it once per panel it converts."""
        from .. import ozaki

        i, j = op.key
        analysed = self._analysed
        for name, key, x, axis in (("A", (i, op.q), panel, 1), ("B", (op.q, j), b, 0)):
            if analysed.get(name, (None,))[0] != key:
                analysed[name] = (key, ozaki.analyse(x, axis))
        how = ozaki.plan_pair(analysed["A"][1], analysed["B"][1], b.shape[0],
                              self.strategy.moduli)
        product, _ = ozaki.gemm(a, b, how=how)
        self.log.note(f"native: {how.reason}" if how.native
                      else f"ozaki, {len(how.moduli)} moduli")
        return product

    # -- replay ------------------------------------------------------------------------------
    def _timed(self, op, lane: str, pooled: bool = False) -> None:
        """Run ``op`` on ``lane`` (a pool's prefix when ``pooled``: the thread names the lane)
        and record it; without recording nor a callback, only its bytes are counted."""
        if self._cancel.is_set():
            raise Cancelled()
        start = self.log.now()
        moved = self._run_op(op)
        end = self.log.now()
        self._report(op, thread_lane(lane) if pooled else lane, start, end,
                     wanted=self.on_event is not None, nbytes=moved)

    def _task(self, op, futures, lane_prefix: str):
        def run():
            for d in op.deps:
                _settled(futures[d])
            self._timed(op, lane_prefix, pooled=True)
        return run

    def run(self) -> EventLog:
        """Replay the schedule; raise :class:`ExecutionError` (or the input's own
        :class:`OOCGemmError`) when an operation fails. Buffers are freed on return."""
        ops = self.schedule.ops
        futures: list[Future] = [None] * len(ops)  # type: ignore[list-item]
        pools = {
            "read": ThreadPoolExecutor(self.readers, thread_name_prefix="oocgemm-read"),
            # One thread: it runs the in-order lanes h2d and c in schedule order.
            "copy": ThreadPoolExecutor(1, thread_name_prefix="oocgemm-copy"),
            "write": ThreadPoolExecutor(self.writers, thread_name_prefix="oocgemm-write"),
        }
        pool_of = {OpKind.READ: "read", OpKind.UPLOAD: "copy", OpKind.DOWNLOAD: "copy",
                   OpKind.DECODE: "copy", OpKind.WRITE: "write"}
        compute = []
        try:
            for op in ops:
                pool = pool_of.get(op.kind)
                if pool is None:
                    futures[op.index] = Future()
                    compute.append(op)
                else:
                    futures[op.index] = pools[pool].submit(self._task(op, futures, pool))
            for op in compute:
                fut = futures[op.index]
                try:
                    for d in op.deps:
                        futures[d].result()
                    self._timed(op, "compute")
                except BaseException as exc:
                    fut.set_exception(exc if isinstance(exc, Exception) else Cancelled())
                    raise
                fut.set_result(None)
            for fut in futures:
                fut.result()
        except BaseException as exc:
            self._cancel.set()
            for fut in futures:  # pending work, pool or compute, ends with CancelledError
                if fut is not None:
                    fut.cancel()
            for workers in pools.values():
                workers.shutdown(wait=True, cancel_futures=True)
            raise failure(exc, futures) from None
        finally:
            for workers in pools.values():
                workers.shutdown(wait=True)
            self._buffers.clear()
            self._bound.clear()
            self._objects.clear()
        return self.log

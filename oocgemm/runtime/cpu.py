"""The CPU executor: replays a schedule with numpy BLAS and threads.

Lanes: the compute thread (the caller's) runs GEMM/FILL/MIRROR/TRANSPOSE in schedule order; a
pool of reader threads runs READs and FETCHes; one copy thread runs UPLOAD/UPLOAD_STORED/
DOWNLOAD/DECODE of staged schedules, in schedule order; a pool of writer threads runs WRITEs.
Every operation waits for its declared dependencies and nothing else, so the reads of the next
panels overlap the current multiplication exactly as the schedule allows (the same double
buffering the CUDA executor does with streams). The schedule names no dependency that the order
of its in-order lanes implies (:func:`oocgemm.planning.schedule.ordered_lane`): the compute
thread and the single copy thread keep that order (the copy thread runs the lanes h2d and c as
one, which keeps each one's order), so neither may become a pool.

Operands already in memory are used in place (:attr:`Plan.in_place
<oocgemm.planning.Plan.in_place>`): a READ binds the slot to a view of the source instead of
copying, and a C slot is a view of the output, so that its WRITE has nothing left to move.
Such a READ or WRITE takes microseconds, and the compute thread runs it itself, in schedule
order, rather than handing it to a pool. The schedule, its order and its dependencies stay the
same; only the bytes do not move.

An operation costs a few microseconds of bookkeeping (a product of 4000² in 128³ blocks has
about 100,000 of them): the schedule is taken from the plan as the walk makes it
(:meth:`Plan.replay <oocgemm.planning.Plan.replay>`), the pools are handed their operations
a bounded number of compute operations ahead of the compute thread (:data:`LOOKAHEAD`), each
operation that finishes sets a flag (:class:`_Board`) instead of settling a future, and the
events are kept per thread and handed to the log at the end.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from time import perf_counter, sleep

import numpy as np

from ..diagnostics.events import EventLog
from ..planning.schedule import COMPUTE_OPS, POOLS, Op, OpKind, object_cells
from ..storage.frames import encode_stripe
from .base import (
    Cancelled,
    Executor,
    failure,
    framed_writes,
    mirror_lower,
    thread_lane,
    transpose_into,
    upper_matmul,
    with_c,
)
from .staging import cpu_settings

#: Seconds a lane waits on a dependency before it looks at its state again (:class:`_Board`):
#: the compute thread is the caller's, where Ctrl-C and SIGTERM raise, also between an
#: operation's flag and the wake-up of the lanes waiting for it; they then find the flag set
#: (or the run stopped) at their next look.
LOOK_AGAIN = 0.25

#: Compute-lane operations the compute thread takes from the schedule ahead of the one it
#: runs: the reads, copies and writes among them are handed to their lanes at once (each
#: waits there for its own dependencies). A panel's loads come right before its first GEMM
#: in the schedule, so this is how far ahead of the GEMMs they start: a few panels, whatever
#: the length of the schedule (not the whole list before the first GEMM).
LOOKAHEAD = 24

#: Each kind's value (``OpKind.value`` is a property, several times slower than a look-up).
KINDS = {kind: kind.value for kind in OpKind}

#: The lane that runs each kind of operation (None: the compute thread, in schedule order).
#: The pools' kinds run on theirs (:data:`~oocgemm.planning.schedule.POOLS`).
LANES = {**dict.fromkeys(COMPUTE_OPS), **POOLS,
         **dict.fromkeys((OpKind.UPLOAD, OpKind.UPLOAD_STORED, OpKind.DOWNLOAD, OpKind.DECODE),
                         "copy")}


class _Board:
    """Which operations have finished: a flag each (a bytearray, indexed by the operation's
    index), set by whoever ran it. A lane that needs one that has not finished sleeps on one
    condition, which each finish notifies while anyone sleeps; the sleepers look again every
    :data:`LOOK_AGAIN` seconds, and give up with :class:`Cancelled` once ``stop`` is set."""

    __slots__ = ("done", "_cond", "_sleepers", "_stop")

    def __init__(self, stop: threading.Event):
        self.done = bytearray(4096)
        self._cond = threading.Condition()
        self._sleepers = 0
        self._stop = stop

    def room(self, count: int) -> None:
        """Flags for the operations of indices below ``count``."""
        have = len(self.done)
        if count > have:
            self.done.extend(bytes(max(count, 2 * have) - have))

    def finish(self, index: int) -> None:
        self.done[index] = 1
        if self._sleepers:  # (read after the flag: a sleeper counted later sees the flag)
            with self._cond:
                self._cond.notify_all()

    def wait(self, deps) -> None:
        done = self.done
        for d in deps:
            if not done[d]:
                self.sleep(d)

    def sleep(self, index: int) -> None:
        """Wait for operation ``index`` to finish."""
        with self._cond:
            self._sleepers += 1
            try:
                while not self.done[index]:
                    if self._stop.is_set():
                        raise Cancelled()
                    self._cond.wait(LOOK_AGAIN)
            finally:
                self._sleepers -= 1

    def wake(self) -> None:
        """Wake every sleeper (the run stops)."""
        with self._cond:
            self._cond.notify_all()


class _Lane:
    """Threads that take a lane's operations from one queue, in the order they were put; a
    thread is started when an operation is put and none is idle, up to ``size``."""

    def __init__(self, name: str, size: int, serve: Callable[[_Lane, str], None]):
        self.name = name
        self.size = size
        self.queue: SimpleQueue = SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self._serve = serve

    def put(self, op: Op) -> None:
        if not self.idle and len(self.threads) < self.size:
            thread = threading.Thread(target=self._serve, args=(self, self.name),
                                      name=f"oocgemm-{self.name}_{len(self.threads)}",
                                      daemon=True)
            self.threads.append(thread)
            thread.start()
        self.queue.put(op)

    def close(self) -> None:
        """Let every thread end once the queue is empty, and wait for them (but for one whose
        start an interrupt cut short: it ends on its own, once started)."""
        for _ in self.threads:
            self.queue.put(None)
        for thread in self.threads:
            with contextlib.suppress(RuntimeError):  # "cannot join thread before it is started"
                thread.join()


class CpuExecutor(Executor):
    """Replays ``plan``'s schedule on the host.

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
        self.readers = max(1, plan.staging.readers)
        self.writers = max(1, writers)
        self.dtype = np.dtype(plan.problem.dtype)
        self.strategy = plan.strategy  # the product's GEMM: numpy's, or emulated
        self._slots: dict[str, int] = {}  # slot -> capacity in elements (the schedule's)
        self._transposed = (plan.problem.trans_a, plan.problem.trans_b)
        self._splits = (plan.row_splits, plan.col_splits, plan.k_splits)
        self._buffers: dict[str, np.ndarray] = {}
        self._bound: dict[str, np.ndarray] = {}  # slot -> zero-copy view it stands for now
        self._accumulators: dict[tuple[int, int], np.ndarray] = {}  # its views, by shape
        self._analysed: dict[str, tuple] = {}  # 'A'/'B' -> (panel key, ozaki.Panel) last used
        self._alloc_lock = threading.Lock()
        # panels decoded on the device: a ring buffer's or a cell's object (index, size, frames)
        self._objects: dict = {}
        # C slots stand for the output's regions (Plan.in_place)
        self._binds = "C" in plan.in_place
        # GEMMs that _plain_gemm may run: native BLAS on panels used as stored
        self._plain = not (self.strategy.emulated or plan.problem.trans_a
                           or plan.problem.trans_b)
        self._board = _Board(self._cancel)
        self._records: list[list] = []  # each lane thread's (op, lane, start, end, nbytes)
        self._errors: list[BaseException] = []

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
                        capacity = self._slots[slot]
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
        rows, cols, _ = self._splits
        self._bind(op.dst, self.sink.view((rows[i], rows[i + 1]), (cols[j], cols[j + 1]),
                                          self.dtype))

    def _block(self, key) -> tuple[int, int]:
        """Rows and columns of C block ``key``."""
        i, j = key
        rows, cols, _ = self._splits
        return rows[i + 1] - rows[i], cols[j + 1] - cols[j]

    # -- operations: one handler per kind --------------------------------------------------
    def handlers(self) -> dict[OpKind, Callable[[Op], int | None]]:
        """The handler of each kind: it runs the operation and returns the bytes it moved
        (None: the operation's own ``nbytes``; 0 where a slot stands for the data in place).
        Made when a run starts (a test may have replaced a method since)."""
        return {OpKind.READ: self._read, OpKind.UPLOAD: self._upload,
                OpKind.DOWNLOAD: self._download, OpKind.WRITE: self._write,
                OpKind.MIRROR: self._mirror, OpKind.TRANSPOSE: self._transpose,
                OpKind.GEMM: self._gemm, OpKind.FILL: self._fill, OpKind.FETCH: self._fetch,
                OpKind.UPLOAD_STORED: self._upload_stored, OpKind.DECODE: self._decode}

    def _read(self, op) -> int | None:
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
            view = source.view((r0, r1), (c0, c1), self.dtype)
            if view is not None:
                self._bound[op.dst] = view
                return 0
            self._bound.pop(op.dst, None)
            source.read((r0, r1), (c0, c1), self.view(op.dst, op.shape))
        return None

    def _upload(self, op) -> None:
        """A stripe into its place in the device slot."""
        n = op.elements
        np.copyto(self._buffer(op.dst)[op.offset:op.offset + n], self._buffer(op.src[0])[:n])

    def _download(self, op) -> None:
        n = op.elements
        np.copyto(self._buffer(op.dst)[:n], self._buffer(op.src[0])[op.offset:op.offset + n])

    def _write(self, op) -> int | None:
        (r0, r1), (c0, c1) = op.region
        if op.src[0] in self._bound:  # a bound C slot is the output's region already
            return 0
        if op.offset:  # a row stripe of its block (the run's last block, unstaged)
            w, h = self._block(op.key)
            x0 = op.offset // h
            data = self.view(op.src[0], (w, h))[x0:x0 + op.shape[0]]
        else:
            data = self.view(op.src[0], op.shape)
        if self.framing is not None:
            self.sink.write_frames((r0, r1), (c0, c1),
                                   encode_stripe(self.framing, data, (r0, r1), (c0, c1)))
        else:
            self.sink.write((r0, r1), (c0, c1), with_c(op, data, self.sources))
        return None

    def _mirror(self, op) -> None:
        w, h = self._block(op.key)
        x0 = op.offset // h
        mirror_lower(self.view(op.dst, (w, h)), x0, x0 + op.shape[0])

    def _transpose(self, op) -> None:
        if not self.plan.staged:
            self._bind_output(op)
        transpose_into(self.view(op.dst, op.shape), self.view(op.src[0], op.shape[::-1]))

    def _fill(self, op) -> None:
        if op.beta == 0 and not self.plan.staged:
            self._bind_output(op)
        c = self.view(op.dst, op.shape)
        if op.beta == 0:
            c.fill(0)
        elif op.beta != 1:
            c *= op.beta

    # -- panels decoded on the device (Plan.io.gpu_decode), replayed on the host ---------------
    def _fetch(self, op) -> int:
        """A stored object into its ring buffer, as stored; its frames kept with it."""
        source, chunks = self.sources[op.operand], self.plan.problem_operand(op.operand).chunks
        index = (op.region[0][0] // chunks[0], op.region[1][0] // chunks[1])
        size, frames = source.read_object(index, self._buffer(op.dst).view(np.uint8))
        self._objects[op.dst] = (index, size, frames)
        return size

    def _upload_stored(self, op) -> int:
        """A fetched object's bytes into its cell of the Z slot."""
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
        beta = op.beta
        if beta == 0 and self._binds:  # starts a block: C is not read
            self._bind_output(op)
        if self._plain and not op.offset and op.alpha == 1 and beta in (0, 1) \
                and not op.upper and self._plain_gemm(op, beta):
            return
        panel, a, b, c = self._operands(op)
        multiply = upper_matmul if op.upper else np.matmul
        if self.strategy.emulated:  # the same steps, the product emulated
            product = self._emulated(op, panel, a, b)
        elif beta == 0:  # BLAS: C is not read, whatever it holds
            multiply(a, b, out=c)
            if op.alpha != 1:
                c *= op.alpha
            return
        else:
            kept = self._accumulators.get(c.shape)
            if kept is None:
                kept = self._accumulators[c.shape] = self.view("accumulator", c.shape)
            product = kept
            multiply(a, b, out=product)
        if beta == 0:  # C is not read
            np.copyto(c, product)
            if op.alpha != 1:
                c *= op.alpha
            return
        if beta != 1:
            c *= beta
        if op.alpha != 1:
            product *= op.alpha
        c += product

    def _plain_gemm(self, op, beta) -> bool:
        """The GEMM of a whole block (alpha 1, beta 0 or 1, native, nothing transposed) whose
        panels and C slot stand for data in place, as :meth:`_gemm` runs it, with none of
        its shapes worked out (they are the views'): most GEMMs of small blocks from memory.
        False where they are not all bound, or the GEMM covers some rows only."""
        bound = self._bound
        a, b, c = bound.get(op.src[0]), bound.get(op.src[1]), bound.get(op.dst)
        (r0, r1), _ = op.region
        if a is None or b is None or c is None or r1 - r0 != c.shape[0]:
            return False
        if beta == 0:  # C is not read
            np.matmul(a, b, out=c)
            return True
        product = self._accumulators.get(c.shape)
        if product is None:
            product = self._accumulators[c.shape] = self.view("accumulator", c.shape)
        np.matmul(a, b, out=product)
        c += product
        return True

    def _operands(self, op) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What a GEMM combines: A's panel (as used: transposed where stored so), its rows
        of it, B's panel (from the stripe's first column on, in a diagonal block's GEMM with
        ``upper``), and its rows of the C slot."""
        i, j = op.key
        rows, cols, ks = self._splits
        w, h = rows[i + 1] - rows[i], cols[j + 1] - cols[j]
        r = ks[op.q + 1] - ks[op.q]
        trans_a, trans_b = self._transposed
        x0 = op.offset // h  # a GEMM may cover a row stripe of its block
        (r0, r1), _ = op.region
        x1 = x0 + r1 - r0
        src, bound = op.src, self._bound
        panel = bound.get(src[0])  # (self.view, without its call: a GEMM's costs count)
        if panel is None:
            panel = self.view(src[0], (r, w) if trans_a else (w, r))
        b = bound.get(src[1])
        if b is None:
            b = self.view(src[1], (h, r) if trans_b else (r, h))
        if trans_a:
            panel = panel.T
        if trans_b:
            b = b.T
        a = panel[x0:x1] if x0 or x1 != w else panel
        y0 = x0 if op.upper else 0  # on and above a diagonal block's diagonal only
        if y0:
            b = b[:, y0:]
        c = bound.get(op.dst)
        if c is None:
            c = self.view(op.dst, (w, h))
        if x0 or x1 != w or y0:
            c = c[x0:x1, y0:]
        return panel, a, b, c

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
    def _runner(self, records: list, lane: str, polite: bool = False,
                own: tuple[_Lane, ...] = ()) -> Callable[[Op], None]:
        """What runs one operation on ``lane`` and logs it into ``records`` (or, for a
        progress callback, hands its event over at once): wait for its dependencies, run its
        handler, set its flag; ``polite``: hand the GIL over after a block in place where
        another thread may want it (any but this one and the idle threads of the lanes
        ``own``)."""
        board, handlers, log = self._board, self._handlers, self.log
        stopped, done, wait_for, finish = (self._cancel.is_set, board.done, board.sleep,
                                           board.finish)
        wanted, origin, add, kinds = self.on_event is not None, log.origin, records.append, KINDS
        write, threads = OpKind.WRITE, threading.active_count

        def run(op: Op) -> None:
            if stopped():
                raise Cancelled()
            for d in op.deps:
                if not done[d]:
                    wait_for(d)
            start = perf_counter() - origin
            moved = handlers[op.kind](op)
            end = perf_counter() - origin
            if moved is None:
                moved = op.nbytes
            if wanted:
                self._report(op, lane, start, end, wanted=True, nbytes=moved)
            else:  # the event's fields, kept as a tuple of plain values (EventLog.extend)
                add((op.index, kinds[op.kind], op.operand, op.key, op.q, lane, start, end, moved,
                     op.flops, op.nbytes))
            finish(op.index)
            if (op.kind is write and polite
                    and threads() > 1 + sum(other.idle for other in own)):
                # A block is out (a WRITE on the compute thread: C computed in place), and
                # the threads waiting for it (a progress callable's, as oocgemm.dask hands
                # out chunks; other devices'; readers at work) get the GIL now, not at the
                # interpreter's next switch: this thread holds it between its BLAS calls.
                # Where every other thread is a lane's, idle, no one waits (a sleep(0) took
                # 80 us on the 2-core VM: 0.08 s a run of 1,024 blocks).
                sleep(0)

        return run

    def _serve(self, lane: _Lane, prefix: str) -> None:
        """A lane thread: take its operations in order and run each; after a failure (its
        own or another lane's) take the rest without running them."""
        records: list = []
        self._records.append(records)
        run = self._runner(records, thread_lane(prefix))
        queue = lane.queue
        while True:
            lane.idle += 1
            op = queue.get()
            lane.idle -= 1
            if op is None:
                return
            if self._cancel.is_set():
                continue
            try:
                run(op)
            except BaseException as exc:  # noqa: BLE001 - handed to the compute thread
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Stop the run: every lane gives up at its next operation or look."""
        self._errors.append(exc)
        self._cancel.set()
        self._board.wake()

    def run(self) -> EventLog:
        """Replay the schedule; raise :class:`ExecutionError` (or the input's own
        :class:`OOCGemmError`) when an operation fails. Buffers are freed on return."""
        stream = self.plan.replay()
        self._slots = stream.slots
        self._handlers = self.handlers()
        in_place = self.plan.in_place
        lanes = {"read": _Lane("read", self.readers, self._serve),
                 # One thread: it runs the in-order lanes h2d, c and decode in schedule order.
                 "copy": _Lane("copy", 1, self._serve),
                 "write": _Lane("write", self.writers, self._serve)}
        # Where each (kind, operand) runs: a lane's threads, or the compute thread (None).
        where = {(kind, operand): None if (kind is OpKind.READ and operand in in_place
                                           or kind is OpKind.WRITE and "C" in in_place)
                 else lanes[name] if name else None
                 for kind, name in LANES.items() for operand in ("A", "B", "C")}
        records: list = []
        self._records.append(records)
        compute = self._runner(records, "compute", polite=True, own=tuple(lanes.values()))
        board, ahead = self._board, deque[Op]()
        try:
            for batch in stream.batches:
                board.room(batch[-1].index + 1)
                for op in batch:
                    lane = where[op.kind, op.operand]
                    if lane is None:
                        ahead.append(op)
                    else:
                        lane.put(op)
                while len(ahead) > LOOKAHEAD:
                    compute(ahead.popleft())
            while ahead:
                compute(ahead.popleft())
            for lane in lanes.values():  # the lanes finish what they were handed
                lane.close()
            if self._errors:
                raise self._errors[0]
        except BaseException as exc:
            self._cancel.set()
            self._board.wake()
            for lane in lanes.values():
                lane.close()
            raise failure(self._first_failure(exc), ()) from None
        finally:
            self._buffers.clear()
            self._bound.clear()
            self._accumulators.clear()
            self._objects.clear()
        self.log.extend(record for kept in self._records for record in kept)
        return self.log

    def _first_failure(self, exc: BaseException) -> BaseException:
        """The failure that stopped the run: an interrupt as itself, else the first that a
        lane met (not a lane giving up because of it)."""
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return exc
        for err in [exc, *self._errors]:
            if not isinstance(err, Cancelled):
                return err
        return exc

"""What the tasks do in a worker process. A group task (:func:`run_group`) starts oocgemm's run of
its group in a thread, one run per device at a time in a process, and returns a
:class:`Handle` once the run has the device; the chain's links (:func:`written`) and the
chunk tasks (:func:`take_chunk`) wait on the handle for the blocks the run has written (in a
worker, outside its thread pool). A handle that reaches a process without its run (moved to
another worker, or the worker that had it lost) hands out the blocks its run had written (it
carries a copy) and, for the others, runs its group again there, the same run from the same
spec, so that every chunk has the bits of its group's run wherever it is taken. It builds no
graph, and hands a chunk out as the run wrote it (the Gram half's mirrored chunks are
:mod:`.gram`'s)."""

from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from ..planning.schedule import OpKind
from ..runtime.base import Cancelled
from .operands import resolve
from .partition import spanned
from .sharing import shared_chunks
from .traces import leave_events

#: One group's run at a time per device in a process (a GPU's memory is planned for one run).
_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()

#: The groups run again in this process for handles that came without their run, by group:
#: each run once while some such handle of its group is here.
_RERUNS: weakref.WeakValueDictionary[str, Handle] = weakref.WeakValueDictionary()
_RERUNS_LOCK = threading.Lock()


def run_group(a, b, c, alpha, beta, dtype, options, graph: str = "", chunks: int = 1,
              alone: bool = False, group: str = "") -> Handle:
    """One group task: starts the run of its group on this worker's device and returns, once
    the run has the device, a handle from which :func:`take_chunk` takes the group's ``chunks``
    chunks, each as soon as the blocks under it are written (the run goes on in a thread of
    this process; the last chunk taken waits for its end). ``alone``: the group is the whole
    product, and shares no decoded chunks with others. ``group`` names the group within
    its graph."""
    trans_a, trans_b = a[-1], b[-1]  # each spec ends with its operand's transposition
    spec = (a, b, c, alpha, beta, dtype, options, graph, alone, group)
    shared_cm, (a_src, b_src, c_src) = _sources(a, b, c, graph, alone)
    shape = (a_src.shape[1] if trans_a else a_src.shape[0],
             b_src.shape[0] if trans_b else b_src.shape[1])
    run = _Run(np.empty(shape, dtype=dtype), chunks)
    thread = threading.Thread(target=run.run, name="oocgemm-group", daemon=True, args=(
        a_src, b_src, c_src, alpha, beta, trans_a, trans_b, dict(options), shared_cm))
    thread.start()
    run.wait_started()
    return Handle(run, spec)


def store_group(a, b, c, alpha, beta, dtype, options, graph: str, alone: bool, group: str,
                target, box) -> None:
    """One group task of a store (:mod:`.stored`): the group's run writes its part of C,
    rows ``box[0]``, columns ``box[1]``, into the ``zarr.Array`` ``target``, in this task;
    run again (by dask, on another worker where this one is lost) it writes the same
    chunks with the same bits."""
    from ..api import multiply
    from ..storage.regions import ZarrRegion

    region = ZarrRegion(target, *box)
    options = dict(options)
    trace_dir = options.pop("trace_dir", None)
    shared_cm, sources = _sources(a, b, c, graph, alone)
    try:
        if 0 in region.shape:
            return
        with _device_lock(str(options.get("device", "auto"))):
            result = multiply(sources[0], sources[1], region, c=sources[2], alpha=alpha,
                              beta=beta, trans_a=a[-1], trans_b=b[-1],
                              events=trace_dir is not None, **options)
        if trace_dir is not None:
            leave_events(trace_dir, result)
    finally:
        _release(shared_cm, sources)


def mark_complete(target, groups) -> None:
    """The store's last task: every group has written its part of ``target``."""
    target.attrs["oocgemm"] = {"complete": True}


def _release(shared_cm, sources) -> None:
    """A run's sources closed, and its share of the graph's decoded chunks left."""
    shared_cm.__exit__(None, None, None)
    for src in sources:
        if src is not None:
            src.close()


def _sources(a, b, c, graph: str, alone: bool):
    """A group's sources (C's None where it is not read), opened from their specs, and the
    context that shares their decoded chunks with the graph's other groups in this process
    (entered: left when the run ends). ``alone``: the group is the whole product, read as
    ``multiply`` reads it (its own reads and cache)."""
    shared_cm = (contextlib.nullcontext() if alone
                 else shared_chunks(graph, _groups_waiting_here(graph + "-groups")))
    shared = shared_cm.__enter__()
    try:
        a_src, b_src = resolve(a, shared, "A"), resolve(b, shared, "B")
        c_src = resolve(c, shared, "C") if c is not None else None
    except BaseException:
        shared_cm.__exit__(None, None, None)
        raise
    return shared_cm, (a_src, b_src, c_src)


#: A dask.distributed worker's task states of work it holds and has not finished.
_WAITING = frozenset({"waiting", "ready", "constrained", "executing", "fetch", "flight"})


def _this_worker():
    """The ``dask.distributed`` worker this task runs in; None elsewhere (the threaded
    scheduler, the client; ``distributed`` is not imported for it)."""
    import sys

    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:  # not in a worker
        return None


def _groups_waiting_here(layer: str):
    """In a ``dask.distributed`` worker: a function that says whether the worker holds group
    tasks of ``layer`` (a graph's groups) it has not finished; None elsewhere."""
    worker = _this_worker()
    if worker is None:
        return None

    def waiting() -> bool:
        tasks = list(worker.state.tasks.values())  # (changed by the worker's own thread)
        return any(isinstance(ts.key, tuple) and ts.key[0] == layer and ts.state in _WAITING
                   for ts in tasks)

    return waiting


def written(handle: Handle, r0: int, r1: int, c0: int, c1: int) -> Handle:
    """A link of a group's chain: done (handing on the handle) when the run has written
    rows r0:r1, columns c0:c1 of the group."""
    with _seceded(handle, r0, r1, c0, c1):
        handle.wait(r0, r1, c0, c1)
    return handle


def take_chunk(handle: Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """One chunk of the result, a view of its group's product, when the run has written
    it."""
    with _seceded(handle, r0, r1, c0, c1):
        return handle.chunk(r0, r1, c0, c1)


@contextlib.contextmanager
def _seceded(handle: Handle, r0: int, r1: int, c0: int, c1: int):
    """In a ``dask.distributed`` worker, a task that waits for its group's run here (for rows
    r0:r1, columns c0:c1 of its product, or its end) leaves the worker's thread pool while
    it waits (``distributed.secede``), and takes a thread again after (``rejoin``). Waiting
    on a thread, the links and chunk tasks of a run held the worker's threads: the worker's
    next group could not start beside the run (nor share its decoded chunks), and the tasks
    queued behind them were stolen by idle workers, where a moved handle hands out only the
    blocks written before it moved."""
    run = handle.run
    if run is None or _this_worker() is None or run.ready(r0, r1, c0, c1):
        yield
        return
    from distributed import rejoin, secede

    secede()
    try:
        yield
    finally:
        rejoin()


class _Run:
    """A group's run in a thread: its product, and which of its blocks are written."""

    def __init__(self, out: np.ndarray, chunks: int):
        self.out = out
        self._left = chunks
        self._cond = threading.Condition()
        self._rows, self._cols = (0, out.shape[0]), (0, out.shape[1])
        self._written: dict = {}  # C block -> bytes of it written
        self._parts: dict = {}  # C block -> the regions of it written, where known
        self._ops: tuple = ()  # the plan's operations: a write's region, by its index
        self._one_device = True  # (on several, the events' indices are their groups' plans')
        self._started = self._finished = self.cancelled = False
        self._error: BaseException | None = None

    def run(self, a, b, c, alpha, beta, trans_a, trans_b, options, shared_cm) -> None:
        from ..api import multiply
        from ..devices import device_names

        trace_dir = options.pop("trace_dir", None)
        try:
            self._one_device = device_names(options.get("device", "auto")) is None
            if 0 in self.out.shape:
                result = None
            else:
                with _device_lock(str(options.get("device", "auto"))):
                    with self._cond:
                        self._started = True
                        self._cond.notify_all()
                    if self.cancelled:
                        raise Cancelled()  # the group's handle is gone (its graph was released)
                    result = multiply(a, b, self.out, c=c, alpha=alpha, beta=beta,
                                      trans_a=trans_a, trans_b=trans_b, progress=self,
                                      events=trace_dir is not None, **options)
            if trace_dir is not None and result is not None:
                leave_events(trace_dir, result)
        except BaseException as exc:  # handed to every chunk of the group
            with self._cond:
                self._error = exc
        finally:
            _release(shared_cm, (a, b, c))
            with self._cond:
                self._started = self._finished = True
                self._cond.notify_all()

    # the run's progress callable: planned(plan), then each finished event
    def planned(self, plan) -> None:
        """The plan the run's C blocks belong to (again after a replan: all blocks anew)."""
        with self._cond:
            self._rows, self._cols = plan.row_splits, plan.col_splits
            self._written, self._parts = {}, {}
            self._ops = plan.schedule.ops if self._one_device else ()

    def __call__(self, event) -> None:
        with self._cond:
            if event.kind == "write" and event.operand == "C":
                # A run writes a block whole, or in row stripes (staged: the run's last
                # block, and every stripe of the in-core shape), an event each; one computed
                # in place moves nothing: count the bytes its write stands for. The stripe
                # written (its operation's region) lets the chunks under it go before the
                # rest of its block is done.
                key = tuple(event.key)
                moved = event.nbytes or event.planned
                self._written[key] = self._written.get(key, 0) + moved
                op = self._ops[event.index] if 0 <= event.index < len(self._ops) else None
                if op is not None and op.kind is OpKind.WRITE and tuple(op.key) == key:
                    self._parts.setdefault(key, []).append(op.region)
                self._cond.notify_all()
            elif self.cancelled and not self._covered(0, self.out.shape[0], 0,
                                                      self.out.shape[1]):
                raise Cancelled()

    def wait_started(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._started)

    def wait(self, r0: int, r1: int, c0: int, c1: int) -> None:
        """Until rows r0:r1, columns c0:c1 of the product are written, or the run is over."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready(r0, r1, c0, c1))

    def chunk(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        """Rows r0:r1, columns c0:c1 of the product, when written; the last chunk, when the
        run is over (its events left, its sources closed), so that a graph is not done before
        its runs are."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready(r0, r1, c0, c1))
            self._left -= 1
            if self._left <= 0:
                self._cond.wait_for(lambda: self._finished)
            if self._error is not None:
                raise self._error
        return self.out[r0:r1, c0:c1]

    def ready(self, r0: int, r1: int, c0: int, c1: int) -> bool:
        """Whether rows r0:r1, columns c0:c1 are written, or the run is over (now)."""
        with self._cond:
            return self._ready(r0, r1, c0, c1)

    def _ready(self, r0, r1, c0, c1) -> bool:
        """Rows r0:r1, columns c0:c1 written, or the run over (its error for every chunk)."""
        return self._finished or self._covered(r0, r1, c0, c1)

    def written_part(self) -> _Written | None:
        """A copy of the blocks written so far (None where none is)."""
        with self._cond:
            rows, cols = self._rows, self._cols
            done = frozenset(key for key, moved in self._written.items()
                             if moved >= self._bytes(*key))
        if not done:
            return None
        (i0, j0), (i1, j1) = (min(k[d] for k in done) for d in (0, 1)), \
            (max(k[d] for k in done) + 1 for d in (0, 1))
        box = (rows[i0], rows[i1], cols[j0], cols[j1])
        # written blocks are not written again: the copy needs no lock
        return _Written(rows, cols, done, box, self.out[box[0]:box[1], box[2]:box[3]].copy())

    def _covered(self, r0, r1, c0, c1) -> bool:
        """Whether rows r0:r1, columns c0:c1 are written: every block of the plan under them
        whole, or the parts of them it lies in (the regions of its writes, which do not
        overlap: each part of C is written once)."""
        if r0 >= r1 or c0 >= c1:
            return True
        rows = spanned(self._rows, r0, r1)
        cols = spanned(self._cols, c0, c1)
        for i in rows:
            for j in cols:
                if self._written.get((i, j), 0) >= self._bytes(i, j):
                    continue
                top, bottom = max(r0, self._rows[i]), min(r1, self._rows[i + 1])
                left, right = max(c0, self._cols[j]), min(c1, self._cols[j + 1])
                done = sum(max(0, min(bottom, y1) - max(top, y0))
                           * max(0, min(right, x1) - max(left, x0))
                           for (y0, y1), (x0, x1) in self._parts.get((i, j), ()))
                if done < (bottom - top) * (right - left):
                    return False
        return True

    def _bytes(self, i: int, j: int) -> int:
        """The bytes of C block (i, j)."""
        return ((self._rows[i + 1] - self._rows[i]) * (self._cols[j + 1] - self._cols[j]) *
                self.out.itemsize)


class _Written:
    """The blocks of a group's run written when its handle was pickled: the plan's block
    bounds (``rows``, ``cols``), the blocks written (``done``), and a copy of the product's
    rows ``box[0]:box[1]``, columns ``box[2]:box[3]`` that holds them."""

    def __init__(self, rows, cols, done, box, values: np.ndarray):
        self.rows, self.cols, self.done, self.box, self.values = rows, cols, done, box, values

    def chunk(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray | None:
        """Rows r0:r1, columns c0:c1 of the product, where their blocks are all here."""
        if not all((i, j) in self.done for i in spanned(self.rows, r0, r1)
                   for j in spanned(self.cols, c0, c1)):
            return None
        top, _, left, _ = self.box
        return self.values[r0 - top:r1 - top, c0 - left:c1 - left]


class Handle:
    """What a group task returns: its run going on in this process. Released (its graph
    is done or cancelled), the run stops if it is still going. Pickled (moved to another
    worker, or spilled), it carries its group's spec and a copy of the blocks its run had
    written; a chunk taken from it elsewhere is taken from that copy, or where its blocks were
    not written yet, from the group's run made again there (:meth:`rerun`).

    Not a chunk's product by itself: that is another product, planned for its own shape (other
    K panels, another order of sums), whose bits differ from the group's in the last place.
    The same run from the same spec plans the same blocks and K panels, and BLAS gives each
    block the same bits whichever process runs it."""

    def __init__(self, run: _Run | None, spec, written: _Written | None = None):
        self.run, self.spec, self.written = run, spec, written
        self._rerun: Handle | None = None
        if run is not None:
            weakref.finalize(self, setattr, run, "cancelled", True)

    def __reduce__(self):
        written = self.run.written_part() if self.run is not None else self.written
        return (Handle, (None, self.spec, written))

    def __sizeof__(self) -> int:
        if self.run is not None:
            return self.run.out.nbytes
        return self.written.values.nbytes if self.written is not None else 0

    def wait(self, r0: int, r1: int, c0: int, c1: int) -> None:
        if self.run is not None:  # elsewhere, the group is run again when a chunk is taken
            self.run.wait(r0, r1, c0, c1)

    def chunk(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        if self.run is not None:
            return self.run.chunk(r0, r1, c0, c1)
        if self.written is not None:
            found = self.written.chunk(r0, r1, c0, c1)
            if found is not None:
                return found
        return self.rerun().chunk(r0, r1, c0, c1)

    def rerun(self) -> Handle:
        """The group's run made again in this process, from the spec: once for every handle of
        the group here (while one holds it). Each chunk taken from it waits for its end (how
        many of the group's chunks are taken here is not known)."""
        if self._rerun is None:
            a, b, c, alpha, beta, dtype, options, graph, alone, group = self.spec
            key = f"{graph}/{group}" if group else None
            with _RERUNS_LOCK:
                found = _RERUNS.get(key) if key is not None else None
                if found is None:
                    found = run_group(a, b, c, alpha, beta, dtype, options, graph, 1, alone,
                                      group)
                    if key is not None:
                        _RERUNS[key] = found
            self._rerun = found
        return self._rerun


def _device_lock(device: str) -> threading.Lock:
    """This process's lock of ``device``."""
    with _LOCKS_LOCK:
        return _DEVICE_LOCKS.setdefault(device, threading.Lock())

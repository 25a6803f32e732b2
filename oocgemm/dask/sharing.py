"""The decoded chunks of a graph's stored inputs, shared by its tasks in one process
(:class:`SharedChunks`) so that each chunk is decoded once per process, and the registry that
holds them while a task of the graph runs here. A cache of arrays by key: what a chunk is and
how it is decoded is the caller's (:class:`~oocgemm.dask.operands.Region`)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np


class SharedChunks:
    """The decoded chunks of a graph's stored inputs, shared by its tasks in one process, so
    that each chunk is decoded once per process however many blocks need it. Held while
    some task of the graph runs (or waits for its device) here, and ``GRACE`` seconds after;
    at most ``budget`` bytes (chunks beyond it are decoded by each task for itself)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self.decodes = 0
        self._chunks: dict = {}
        self._lock = threading.Lock()
        self.active = 0
        self.timer: threading.Timer | None = None

    def get(self, key, decode) -> np.ndarray:
        """The chunk ``key``, decoded by ``decode()`` by the first task that asks."""
        with self._lock:
            found = self._chunks.get(key)
            mine = found is None
            entry = self._chunks[key] = _Pending() if found is None else found
        if not mine:
            return entry.wait()
        try:
            array = decode()
        except BaseException as exc:
            with self._lock:
                del self._chunks[key]
            entry.fail(exc)
            raise
        with self._lock:
            self.decodes += 1
            if self.bytes + array.nbytes > self.budget:
                del self._chunks[key]  # over budget: not kept, the next task decodes again
            else:
                self.bytes += array.nbytes
        entry.done(array)
        return array


class _Pending:
    def __init__(self):
        self._event = threading.Event()
        self._value = self._error = None

    def done(self, value):
        self._value = value
        self._event.set()

    def fail(self, error):
        self._error = error
        self._event.set()

    def wait(self):
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


#: Seconds a graph's shared chunks outlive its last task running in a process. 0: they go
#: as soon as no task of the graph runs here, so that a graph computed again after its stored
#: inputs changed never meets chunks decoded before.
GRACE = 0.0
_SHARED: dict[str, SharedChunks] = {}
_SHARED_LOCK = threading.Lock()  # of _SHARED, and of its entries' active counts and timers


#: Seconds between looks at a worker's tasks while its shared chunks wait for its next group
#: of the same graph.
RECHECK = 0.2


@contextlib.contextmanager
def shared_chunks(graph: str, pending=None):
    """This process's shared chunks of ``graph``, held for the duration of one task, and
    after it while ``pending()`` (given by the task: whether this worker holds more groups
    of the graph to run) says so: a worker's next group of the graph, which reads the same
    rows of A or columns of B, finds them decoded even where it starts after this one ends."""
    from .. import machine

    with _SHARED_LOCK:
        shared = _SHARED.get(graph)
        if shared is None:
            shared = _SHARED[graph] = SharedChunks(machine.total_memory() // 4)
        if shared.timer is not None:
            shared.timer.cancel()
            shared.timer = None
        shared.active += 1
    try:
        yield shared
    finally:
        with _SHARED_LOCK:
            shared.active -= 1
            if shared.active == 0:
                _later(graph, shared, pending)


def _later(graph: str, shared: SharedChunks, pending) -> None:
    """(Under the lock, no task of ``graph`` active here.) Drop its chunks now, or look again
    in a while: after ``GRACE``, or while ``pending()``."""
    waiting = pending is not None and _asks(pending)
    if GRACE <= 0 and not waiting:
        del _SHARED[graph]
        return
    shared.timer = threading.Timer(RECHECK if waiting else GRACE, _drop,
                                   args=(graph, shared, pending if waiting else None))
    shared.timer.daemon = True
    shared.timer.start()


def _asks(pending) -> bool:
    try:
        return bool(pending())
    except Exception:  # the worker's state changed under the look, or the worker is gone:
        return False  # the chunks go (a later group decodes them again)


def _drop(graph: str, shared: SharedChunks, pending=None) -> None:
    with _SHARED_LOCK:
        if _SHARED.get(graph) is not shared or shared.active:
            return
        if pending is not None and _asks(pending):
            _later(graph, shared, pending)
        else:
            del _SHARED[graph]

"""What the executors share: slot views, the per-op arithmetic contract, the executor registry."""

from __future__ import annotations

import importlib
import threading

from ..diagnostics.events import EventLog
from ..errors import DeviceError

#: Executor modules by device kind, imported lazily (the CUDA one imports cupy).
_EXECUTORS = {"cpu": "oocgemm.runtime.cpu:CpuExecutor", "cuda": "oocgemm.runtime.cuda:CudaExecutor"}


def executor_class(kind: str):
    """The executor class for 'cpu' or 'cuda'."""
    try:
        target = _EXECUTORS[kind]
    except KeyError:
        known = ", ".join(sorted(_EXECUTORS))
        raise DeviceError(f"unknown executor {kind!r}; known: {known}") from None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def panel_shapes(plan, op):
    """Stored shapes of the A panel, B panel and C block that a GEMM op combines."""
    i, j = op.key
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    w, h = rows[i + 1] - rows[i], cols[j + 1] - cols[j]
    r = ks[op.q + 1] - ks[op.q]
    a = (r, w) if plan.problem.trans_a else (w, r)
    b = (h, r) if plan.problem.trans_b else (r, h)
    return a, b, (w, h)


def thread_lane(prefix: str) -> str:
    """The lane of the calling pool thread: ``prefix`` and the thread's number in its pool
    ('read-3'), one timeline row per thread."""
    return f"{prefix}-{threading.current_thread().name.rsplit('_', 1)[-1]}"


class Cancelled(Exception):
    """Raised inside lanes when the run is being torn down."""


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
        self.schedule = plan.schedule
        self.sources = sources
        self.sink = sink
        self.on_event = on_event
        """Called with each finished :class:`~oocgemm.diagnostics.Event` (progress bars)."""
        self.log = EventLog(record)
        """Events of the run (none kept with ``record=False``) and the bytes it moved."""
        self._cancel = threading.Event()

    def run(self) -> EventLog:  # pragma: no cover - abstract
        raise NotImplementedError

    def _report(self, op, lane: str, start: float, end: float, *, wanted: bool,
                nbytes: int | None = None) -> None:
        """Log ``op`` (the log only counts its bytes when it records nothing and the event is
        not ``wanted``) and, when ``wanted``, hand its event to ``on_event``."""
        event = self.log.add(op, lane, start, end, nbytes, wanted=wanted)
        if wanted:
            self.on_event(event)

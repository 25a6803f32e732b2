"""One event per executed block operation, on one clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """An executed block operation."""

    index: int
    """The operation's index in the schedule."""
    kind: str
    """'read', 'upload', 'fill', 'gemm', 'download', 'write'."""
    operand: str
    key: tuple[int, int]
    """Block key (A: (i, q); B: (q, j); C: (i, j))."""
    q: int
    lane: str
    """Where it ran: a thread ('read-0', 'compute') or a CUDA stream."""
    start: float
    """Seconds since the run started (host clock, time.perf_counter)."""
    end: float
    nbytes: int = 0
    flops: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


class EventLog:
    """Thread-safe list of events, timed from the log's creation."""

    def __init__(self):
        self.origin = time.perf_counter()
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def add(self, op, lane: str, start: float, end: float, nbytes: int | None = None) -> Event:
        """Record ``op``; ``nbytes`` overrides the bytes it moved (0 for data used in place)."""
        event = Event(index=op.index, kind=op.kind.value, operand=op.operand, key=op.key, q=op.q,
                      lane=lane, start=start, end=end,
                      nbytes=op.nbytes if nbytes is None else nbytes, flops=op.flops)
        with self._lock:
            self._events.append(event)
        return event

    def events(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda e: (e.start, e.index))


"""One event per executed block operation, on one clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..planning.schedule import LEVELS, quick_constructor


@dataclass(frozen=True, slots=True)
class Event:
    """An executed block operation."""

    index: int
    """The operation's index in the schedule."""
    kind: str
    """'read', 'upload', 'fetch', 'upload_stored', 'decode', 'fill', 'gemm', 'download',
    'write' (an operation of the schedule), or 'store': a chunk of C encoded and stored
    behind the run by the output's writer (index -1)."""
    operand: str
    """'A', 'B' or 'C': whose data the operation moved or produced."""
    key: tuple[int, int]
    """Block key (A: (i, q); B: (q, j); C: (i, j))."""
    q: int
    """K panel of a GEMM; -1 otherwise."""
    lane: str
    """Where it ran: a thread ('read-0', 'compute') or a CUDA stream."""
    start: float
    """Seconds since the run started (host clock, time.perf_counter)."""
    end: float
    """Seconds since the run started, when the operation finished."""
    nbytes: int = 0
    """Bytes the operation moved (0 for data used in place, and for GEMM/FILL)."""
    flops: int = 0
    """Floating-point operations (GEMM)."""
    planned: int = 0
    """Bytes the operation stands for (its region's), even where it moved none."""

    @property
    def seconds(self) -> float:
        return self.end - self.start


#: Event's constructor where a run's events are made by the thousand (:meth:`EventLog.extend`).
_new_event = quick_constructor(Event)

#: Kinds of operation that compute (on the compute lane: a symmetric product's mirror and
#: transpose of C blocks too) and that move data.
COMPUTE_KINDS = ("gemm", "fill", "mirror", "transpose")
COPY_KINDS = ("read", "upload", "fetch", "upload_stored", "download", "write", "store")

#: What each kind is called on a timeline: the issue's vocabulary (an UPLOAD is a host->device
#: copy, H2D; a DOWNLOAD device->host, D2H; a READ fills a staging or working buffer from the
#: source, a WRITE stores to the output; a FETCH fills a staging buffer with a stored object
#: as stored, which its UPLOAD_STORED takes up, H2D, for the device to decode).
KIND_NAMES = {"read": "read", "upload": "H2D", "fetch": "fetch", "upload_stored": "H2D stored",
              "fill": "fill", "gemm": "gemm", "download": "D2H", "write": "write",
              "mirror": "mirror", "transpose": "transpose", "store": "store"}

#: One colour per kind (plots, NVTX ranges), '#rrggbb': a FETCH and an UPLOAD_STORED in the
#: colours of the links they use, a READ's and an UPLOAD's.
KIND_COLORS = {"gemm": "#2ca02c", "fill": "#98df8a", "read": "#ff7f0e", "upload": "#1f77b4",
               "fetch": "#ff7f0e", "upload_stored": "#1f77b4",
               "download": "#9467bd", "write": "#d62728", "mirror": "#bcbd22",
               "transpose": "#17becf", "store": "#8c564b", "decode": "#e377c2"}


def op_name(kind: str, operand: str) -> str:
    """'gemm', 'H2D A', 'D2H C', 'read B', 'write C', 'fill C'."""
    return "gemm" if kind == "gemm" else f"{KIND_NAMES.get(kind, kind)} {operand}"


def op_label(kind: str, operand: str, key, q: int = -1) -> str:
    """An operation with its block: 'gemm C(1,2) q=3', 'H2D A(1,0)'."""
    block = f"({key[0]},{key[1]})"
    if kind == "gemm":
        return f"gemm C{block} q={q}"
    return f"{op_name(kind, operand)}{block}"


class EventLog:
    """Thread-safe list of events, timed from the log's creation, and the bytes that moved.

    Parameters
    ----------
    record
        False to keep no events (to measure what recording costs): :meth:`add` then only
        counts the bytes moved, and builds an :class:`Event` only when asked for one.
    """

    def __init__(self, record: bool = True):
        self.origin = time.perf_counter()
        self.started_at = time.time()
        """The wall-clock time of the events' zero (to put runs of several processes on one
        clock)."""
        self.record = bool(record)
        self._events: list[Event] = []
        self._records: list[tuple] = []  # handed over by extend(), made events when asked
        self._moved: dict[str, int] = {}
        self._lock = threading.Lock()
        self.notes: dict[str, int] = {}
        """What the run counted beside its events (how its GEMMs ran: ``kernel='ozaki'``)."""
        self.encoder: str | None = None
        """What compressed C's chunks where not the host's encoders (nvCOMP on the GPU)."""
        self.timed: dict[str, float] = {}
        """Seconds the run timed beside its events (the phases of emulated GEMMs on a GPU)."""

    def note(self, what: str) -> None:
        with self._lock:
            self.notes[what] = self.notes.get(what, 0) + 1

    def add_time(self, what: str, seconds: float) -> None:
        with self._lock:
            self.timed[what] = self.timed.get(what, 0.0) + seconds

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def add(self, op, lane: str, start: float, end: float, nbytes: int | None = None, *,
            wanted: bool = False) -> Event | None:
        """Record ``op``; ``nbytes`` overrides the bytes it moved (0 for data used in place).

        Returns the :class:`Event`, or None when the log does not record and the caller did
        not say it ``wanted`` one (for a callback)."""
        moved = op.nbytes if nbytes is None else nbytes
        if not (self.record or wanted):
            self.count(op, moved)
            return None
        event = Event(index=op.index, kind=op.kind.value, operand=op.operand, key=op.key, q=op.q,
                      lane=lane, start=start, end=end, nbytes=moved, flops=op.flops,
                      planned=op.nbytes)
        with self._lock:
            self._moved[event.kind] = self._moved.get(event.kind, 0) + moved
            if self.record:
                self._events.append(event)
        return event

    def extend(self, records) -> None:
        """Record many operations at once, each as a tuple of its :class:`Event`'s fields in
        their order (an executor that keeps its lanes' records apart and hands them over at
        the end takes no lock and makes no event per operation while it runs; and a tuple
        of plain values is soon left alone by Python's garbage collector, where a hundred
        thousand events would be walked again at each of its full collections). The events
        are made when :meth:`events` is first called: a run of 36,000 operations made them
        in 0.03 s, and their number had the collector walk every object in the process
        twice more (0.06 s), before ``multiply`` returned a result whose events few read."""
        moved: dict[str, int] = {}
        kept: list[tuple] = []
        keep = self.record
        for record in records:
            kind = record[1]
            moved[kind] = moved.get(kind, 0) + record[8]
            if keep:
                kept.append(record)
        with self._lock:
            for kind, nbytes in moved.items():
                self._moved[kind] = self._moved.get(kind, 0) + nbytes
            self._records.extend(kept)

    def add_store(self, key: tuple[int, int], lane: str, start: float, end: float,
                  nbytes: int) -> None:
        """Record a chunk of C's block ``key`` encoded and stored by the output's writer
        behind the run (a 'store' event, no operation of the schedule: index -1). Its bytes
        are the WRITE operations' already, so the traffic does not count them again."""
        if self.record:
            event = Event(index=-1, kind="store", operand="C", key=(key[0], key[1]), q=-1,
                          lane=lane, start=start, end=end, nbytes=nbytes, planned=nbytes)
            with self._lock:
                self._events.append(event)

    def count(self, op, nbytes: int | None = None) -> None:
        """Count the bytes ``op`` moved without recording an event."""
        moved = op.nbytes if nbytes is None else nbytes
        if moved:
            with self._lock:
                self._moved[op.kind.value] = self._moved.get(op.kind.value, 0) + moved

    def events(self) -> list[Event]:
        """The events recorded so far, in start order."""
        with self._lock:
            if self._records:
                event = _new_event
                self._events.extend(event(*record) for record in self._records)
                self._records = []
            return sorted(self._events, key=lambda e: (e.start, e.index))

    def traffic(self) -> dict[str, int]:
        """Bytes moved per level (read, storage_write, h2d, d2h), counted whether
        events were recorded or not (a level's kinds together: READs and FETCHes read)."""
        total = dict.fromkeys(LEVELS.values(), 0)
        with self._lock:
            for kind, level in LEVELS.items():
                total[level] += self._moved.get(kind.value, 0)
        return total

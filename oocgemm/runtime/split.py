"""One product on several devices: C block groups handed out to one executor per device.

The plan is made for one device (its budgets are each device's). Its C blocks are cut into
groups: rows of blocks, which share their A panels, or single blocks when there are too few
rows to go round. Each device takes the next group from a shared queue as soon as it is free
(dynamic load balancing: a faster device takes more), and runs the plan's own schedule with
only the group's blocks picked out (``Plan.blocks``), so that each block is computed exactly
as a single-device run computes it. The groups write disjoint regions of the one output.

The events of every run go onto one clock, each lane named after its device
(``cuda:1/compute``), so the timeline of the product shows every device.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..diagnostics.events import Event
from ..planning.schedule import LEVELS, serpentine


def groups(plan, devices: int) -> list[list[tuple[int, int]]]:
    """The C block groups, in the plan's serpentine order: rows of blocks where there are at
    least two rows per device, else single blocks."""
    p, q, _ = plan.grid
    done = set(plan.done)
    order = [block for block in serpentine(p, q) if block not in done]
    if p >= 2 * devices:
        rows: dict[int, list] = {}
        for block in order:
            rows.setdefault(block[0], []).append(block)
        return list(rows.values())
    return [[block] for block in order]


class MergedLog:
    """The event logs of several runs, on the clock of the first one to start."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.started_at = time.time()
        """The wall-clock time of the events' zero (to put runs of several processes on one
        clock)."""
        self._events: list[Event] = []
        self._moved = dict.fromkeys(LEVELS.values(), 0)
        self._lock = threading.Lock()
        self.share: dict[str, dict] = {}
        """Per device: groups and blocks it ran, its busy seconds, its flops."""

    def add(self, device: str, log, blocks: int, seconds: float) -> None:
        shift = log.origin - self.origin
        events = [dataclasses.replace(e, lane=f"{device}/{e.lane}", start=e.start + shift,
                                      end=e.end + shift) for e in log.events()]
        with self._lock:
            self._events += events
            for level, nbytes in log.traffic().items():
                self._moved[level] += nbytes
            share = self.share.setdefault(device, {"groups": 0, "blocks": 0, "seconds": 0.0,
                                                   "flops": 0})
            share["groups"] += 1
            share["blocks"] += blocks
            share["seconds"] += seconds
            share["flops"] += sum(e.flops for e in events)

    def events(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda e: (e.start, e.lane, e.index))

    def traffic(self) -> dict[str, int]:
        with self._lock:
            return dict(self._moved)


def run_split(plan, devices: list[str], run_group, stop) -> MergedLog:
    """Run ``plan``'s blocks over ``devices`` (names: a device, or 'cpu#1' for a second CPU
    executor): ``run_group(device_plan, name)`` runs one group's plan (``device`` and
    ``blocks`` set) and returns its event log. The first failure, or an interrupt, calls
    ``stop()`` (which stops the runs under way) and is raised once every device stopped."""
    merged = MergedLog()
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for group in groups(plan, len(devices)):
        todo.put(group)
    failed = threading.Event()
    first: list[BaseException] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        device = name.partition("#")[0]
        while not failed.is_set():
            try:
                group = todo.get_nowait()
            except queue.Empty:
                return
            device_plan = dataclasses.replace(plan, device=device, blocks=tuple(group))
            start = time.perf_counter()
            try:
                log = run_group(device_plan, name)
            except BaseException as exc:
                with lock:  # the first failure is the one to tell; the others were stopped
                    if not failed.is_set():
                        first.append(exc)
                        failed.set()
                stop()
                raise
            merged.add(name, log, len(group), time.perf_counter() - start)

    pool = ThreadPoolExecutor(len(devices), thread_name_prefix="oocgemm-device")
    futures = [pool.submit(worker, name) for name in devices]
    try:
        for future in futures:
            future.exception()  # waits; Ctrl-C lands here
    except BaseException:  # Ctrl-C: stop the devices too
        failed.set()
        stop()
        raise
    finally:
        pool.shutdown(wait=True)
    if first:
        raise first[0]
    return merged

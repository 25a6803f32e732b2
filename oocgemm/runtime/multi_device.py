"""One product on several devices: C block groups handed out to one executor per device.

The plan is made for one device (its budgets are each device's). Its C blocks are cut into
groups: rows of blocks, which share their A panels, or single blocks when there are too few
rows to go round. Each device takes the next group from a shared queue as soon as it is free
(dynamic load balancing: a faster device takes more), and runs the plan's own schedule with
only the group's blocks picked out (``Plan.work.blocks``), so that each block is computed exactly
as a single-device run computes it. The groups write disjoint regions of the one output.

A product of a single C block (M and N small, K long) has no blocks to share out: its K is
split instead (:func:`k_parts`), each device computing a partial C over its K range, and the
partials are summed once at the end.

A group (or part of K) that runs out of memory is planned again with smaller blocks and
goes back to the queue, while the other devices go on with theirs (:func:`again`): a group's
new blocks lie inside its old ones, so it writes the same region of the output.

The events of every run go onto one clock, each lane named after its device
(``cuda:1/compute``), so the timeline of the product shows every device.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..backends import backend_of
from ..devices import Device
from ..diagnostics.events import Event
from ..errors import MemoryPressureError
from ..planning.planner import replan
from ..planning.schedule import LEVELS, OpKind, serpentine, triangle
from .replan import MAX_REPLANS, replan_note, smaller


def groups(plan, devices: int) -> list[list[tuple[int, int]]]:
    """The C block groups, in the plan's order (serpentine, or a symmetric plan's triangle):
    rows of blocks where there are at least two rows per device (a row shares its A panels),
    else columns where there are two columns per device (a column shares its B panels), else
    one run of neighbouring blocks per device.

    Each group is one executor run, which fills its pipeline at its start and drains it at
    its end, and loads again the panels its blocks share with other groups' blocks. Groups
    of single blocks left two H200s well short of twice one on the 2 x 2 blocks of n = 65536
    (docs/performance.md, "Several GPUs, n = 65536"): every block loaded its panels afresh,
    in a burst at its start, while the other GPU did the same."""
    p, q, _ = plan.grid
    done = set(plan.work.done)
    walk = triangle(p) if plan.symmetric else serpentine(p, q)
    order = [block for block in walk if block not in done]
    if p >= 2 * devices or q >= 2 * devices:
        axis = 0 if p >= 2 * devices else 1
        lines: dict[int, list] = {}
        for block in order:
            lines.setdefault(block[axis], []).append(block)
        return list(lines.values())
    size = max(1, -(-len(order) // devices))
    return [order[at:at + size] for at in range(0, len(order), size)]


def k_parts(plan, devices: int) -> list[tuple[int, int]]:
    """Where a product of one C block (M and N small, K long: a tall-skinny Gram product)
    splits its K among ``devices`` executors, each computing a partial C over its part, the
    partials summed once at the end: contiguous ranges of whole K panels, each starting on a
    chunk edge of every chunked operand (read at its grain as a whole product's would be),
    as even as that allows; empty where the product has several blocks (they split instead)
    or K is too short to go round."""
    prob = plan.problem
    if devices < 2 or plan.n_blocks != 1 or plan.work.done or not prob.computes_product:
        return []
    grain = plan.tile[2]
    for name, operand in (("A", prob.a), ("B", prob.b)):
        if operand.chunks:
            grain = math.lcm(grain, operand.chunks[prob.k_axis(name)])
    units = prob.k // grain
    parts = min(devices, units)
    if parts < 2:
        return []
    bounds = [round(units * d / parts) * grain for d in range(parts)] + [prob.k]
    return list(zip(bounds, bounds[1:]))


class MergedLog:
    """The event logs of several runs, on the clock of the first one to start."""

    def __init__(self, replanned: list[str] | None = None) -> None:
        self.origin = time.perf_counter()
        self.started_at = time.time()
        """The wall-clock time of the events' zero (to put runs of several processes on one
        clock)."""
        self._events: list[Event] = []
        self._moved = dict.fromkeys(LEVELS.values(), 0)
        self._lock = threading.Lock()
        self.share: dict[str, dict] = {}
        """Per device: groups and blocks it ran, its busy seconds, its flops."""
        self.notes: dict[str, int] = {}
        """The runs' notes, summed."""
        self.timed: dict[str, float] = {}
        """The runs' timed phases, summed."""
        self.encoder: str | None = None
        """What compressed C's chunks where not the host (any run's)."""
        self.replanned: list[str] = [] if replanned is None else replanned
        """Each piece of work planned again after memory ran short: what ran out, what was
        planned again, how."""

    def note_replan(self, note: str) -> None:
        with self._lock:
            self.replanned.append(note)

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
            for what, count in log.notes.items():
                self.notes[what] = self.notes.get(what, 0) + count
            for what, seconds in log.timed.items():
                self.timed[what] = self.timed.get(what, 0.0) + seconds
            self.encoder = self.encoder or log.encoder

    def record(self, kind: str, lane: str, start: float, nbytes: int = 0) -> None:
        """An operation of the run itself, from ``start`` (``time.perf_counter()``) to now:
        the sum of K parts' partial C's written out."""
        end = time.perf_counter() - self.origin
        with self._lock:
            self._events.append(Event(index=-1, kind=kind, operand="C", key=(0, 0), q=-1,
                                      lane=lane, start=start - self.origin, end=end,
                                      nbytes=nbytes))
            level = LEVELS.get(OpKind(kind))
            if level is not None:
                self._moved[level] += nbytes

    def events(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda e: (e.start, e.lane, e.index))

    def traffic(self) -> dict[str, int]:
        with self._lock:
            return dict(self._moved)


@dataclasses.dataclass(frozen=True)
class Share:
    """One device's share of a product: a group of C blocks, or a part of K."""

    plan: Any
    """The plan to run (its device set by the device that takes it): a group's, with its
    ``blocks``; a part of K's, its problem that part."""
    blocks: int
    """C blocks of the product's plan it stands for (what a device's share counts)."""
    part: tuple[int, int] | None = None
    """The K range of a part of K."""
    replans: int = 0
    """Times it was planned again with smaller blocks."""

    def on(self, name: str):
        """Its plan on device ``name`` ('cpu#1': a second CPU executor)."""
        return replan(self.plan, device=Device.named(name), why=f"run on {name}")


def run_on_devices(plan, io, devices: list[str], *, on_event=None, record: bool = True,
                   resources=None, replanned: list[str] | None = None) -> MergedLog:
    """The product of ``plan`` on several executors, one per name of ``devices`` (one kind),
    into ``io``'s sink (a :class:`~oocgemm.lifecycle.run.RunIO` whose output is open): its K
    split when it has one C block (:func:`k_parts`; C written once), else its C blocks
    handed out in groups (:func:`run_split`) into ``io.writer(plan)``, the sink written at
    its grain (the groups' blocks share no chunk row band cell). Each executor reads the
    sources through ``io.readers``. A share that runs out of memory is planned again with
    smaller blocks and run again (:func:`again`), the others going on; ``replanned`` (a
    list) is told of it at once, also when the run fails later."""
    running: set = set()
    make = backend_of(plan.device).executor_class()

    def run(device_plan, sources: dict, sink) -> object:
        device_plan = io.encoded(device_plan, sink)  # who compresses C, for this sink
        opened = io.readers(device_plan, sources)
        executor = make(device_plan, opened, sink, on_event=on_event, record=record,
                        resources=resources)
        running.add(executor)
        try:
            return executor.run()
        finally:
            running.discard(executor)
            for src in opened.values():
                src.close()

    def stop() -> None:
        for executor in list(running):
            executor.cancel()

    parts = k_parts(plan, len(devices))
    if parts:  # one C block: its K split, the partials summed once
        return run_k_parts(plan, io.sources, devices, parts, io.sink, run, stop,
                           replanned=replanned)
    written = io.writer(plan)
    try:
        log = run_split(plan, devices,
                        lambda device_plan, name: run(device_plan, io.sources, written), stop,
                        replanned=replanned)
    except BaseException:
        written.settle()  # nothing stored behind the run after this
        raise
    written.flush()
    return log


def run_split(plan, devices: list[str], run_group, stop, *,
              replanned: list[str] | None = None) -> MergedLog:
    """Run ``plan``'s blocks over ``devices`` (names: a device, or 'cpu#1' for a second CPU
    executor): ``run_group(device_plan, name)`` runs one group's plan (``device`` and
    ``blocks`` set) and returns its event log. A group that runs out of memory is planned
    again (:func:`again`) and goes back to the queue. The first other failure, or an
    interrupt, calls ``stop()`` (which stops the runs under way) and is raised once every
    device stopped."""
    def run(name: str, work: Share):
        return run_group(work.on(name), name), work.blocks

    work = [Share(replan(plan, blocks=tuple(group), why=f"a group of {len(group)} C blocks"),
                 len(group))
            for group in groups(plan, len(devices))]
    return _share(work, devices, run, stop, replanned=replanned)


def run_k_parts(plan, sources: dict, devices: list[str], parts: list[tuple[int, int]], sink,
                run, stop, *, replanned: list[str] | None = None) -> MergedLog:
    """A plan of one C block with its K split (:func:`k_parts`): each device runs the plan
    over its part as a product of its own (:meth:`Problem.k_part`; A and B read through
    :class:`~oocgemm.storage.part.Part`) into a partial C in host memory, ``run(plan,
    sources, sink)`` returning its log; the partials are summed in part order, ``beta * C``
    (``sources['C']``) added, and C written to ``sink`` once. Failures as :func:`run_split`."""
    import numpy as np

    from ..storage.memory import NumpySink
    from ..storage.part import Part

    prob = plan.problem
    partials = {part: np.empty((prob.m, prob.n), dtype=prob.dtype) for part in parts}

    def run_part(name: str, work: Share):
        assert work.part is not None
        lo, hi = work.part
        a = Part(sources["A"], prob.k_axis("A"), lo, hi)
        b = a if prob.shared else Part(sources["B"], prob.k_axis("B"), lo, hi)
        return run(work.on(name), {"A": a, "B": b},
                   NumpySink(partials[work.part], "a partial C")), 1

    work = [Share(replan(plan, problem=prob.k_part(lo, hi), why=f"K {lo}:{hi}"), 1,
                 part=(lo, hi))
            for lo, hi in parts]
    log = _share(work, devices, run_part, stop, one_each=True,  # parts even, one a device
                 replanned=replanned)
    start = time.perf_counter()
    total = partials[parts[0]]
    for part in parts[1:]:
        total += partials[part]
    if prob.reads_c:
        c = np.empty_like(total)
        sources["C"].read((0, prob.m), (0, prob.n), c)
        total += prob.beta * c
    sink.write((0, prob.m), (0, prob.n), total)
    log.record("write", "write-0", start, total.nbytes)
    return log


def again(work: Share, name: str, exc: MemoryPressureError) -> tuple[Share, str]:
    """``work``, which ran out of memory on device ``name`` (``exc``), planned again with
    smaller blocks (:func:`~oocgemm.runtime.replan.smaller`: half the budget that ran
    out), and what :attr:`Result.replanned <oocgemm.result.Result.replanned>` says of it.

    A part of K writes a partial C of its own: its plan is made again whole. A group of C
    blocks writes its region of the one output beside the other devices' groups, so its
    plan keeps their edges: its tile's w and h divide the group plan's (the largest
    divisors under those the smaller budget allows), and the group becomes the blocks of
    that plan inside its own, which cover exactly its region. A symmetric plan keeps its
    blocks square (a block across the diagonal is then a sub-block of one that is)."""
    if work.replans == MAX_REPLANS:
        raise exc
    plan = work.on(name)
    if work.part is not None:
        small = smaller(plan, exc)
        what = f"part {work.part[0]}:{work.part[1]} of K on {name}"
    else:
        small = _within(plan, smaller(replan(plan, blocks=(), why="the whole product"), exc))
        first = plan.work.blocks[0]
        what = f"the group of {len(plan.work.blocks)} C blocks from {first} on {name}"
    return (dataclasses.replace(work, plan=small, replans=work.replans + 1),
            replan_note(exc, small, what))


def _within(plan, small):
    """``small`` (a whole product's plan under a smaller budget) with the largest tile under
    its own whose w and h divide ``plan``'s, computing the blocks inside ``plan.work.blocks``."""
    w, h, _ = plan.tile
    w2, h2 = _divisor(w, small.tile[0]), _divisor(h, small.tile[1])
    if plan.symmetric:
        w2 = h2 = _divisor(w, min(w2, h2))
    small = replan(small, tile=(w2, h2, small.tile[2]), blocks=(),
                   why="the group's blocks divided")
    rows, cols = small.row_splits, small.col_splits
    inside = []
    for i, j in plan.work.blocks:
        r0, r1 = rows.index(plan.row_splits[i]), rows.index(plan.row_splits[i + 1])
        c0, c1 = cols.index(plan.col_splits[j]), cols.index(plan.col_splits[j + 1])
        inside += [(a, b) for a in range(r0, r1) for b in range(c0, c1)
                   if not small.symmetric or a <= b]
    return replan(small, tile=small.tile, blocks=tuple(inside), why="inside the group")


def _divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` no larger than ``limit`` (at least 1)."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for x in (d, n // d):
                if best < x <= limit:
                    best = x
    return best


def _share(items: list, devices: list[str], run, stop, *, one_each: bool = False,
           replanned: list[str] | None = None) -> MergedLog:
    """Hand ``items`` out to ``devices``, each taking the next as soon as it is free (with
    ``one_each``: item i to device i, as many items as devices at most): ``run(name, item)``
    returns its run's event log and the C blocks it computed. An item that runs out of
    memory goes back to its queue planned again (:func:`again`), up to
    :data:`~oocgemm.runtime.replan.MAX_REPLANS` times. The first other failure, or an
    interrupt, calls ``stop()`` and is raised once every device stopped."""
    merged = MergedLog(replanned)
    shared: queue.SimpleQueue = queue.SimpleQueue()
    queues = {name: queue.SimpleQueue() if one_each else shared for name in devices}
    for at, item in enumerate(items):
        (queues[devices[at]] if one_each else shared).put(item)
    failed = threading.Event()
    first: list[BaseException] = []
    lock = threading.Lock()

    def fail(exc: BaseException) -> None:
        with lock:  # the first failure is the one to tell; the others were stopped
            if not failed.is_set():
                first.append(exc)
                failed.set()
        stop()

    def worker(name: str) -> None:
        while not failed.is_set():
            try:
                item = queues[name].get_nowait()
            except queue.Empty:
                return
            start = time.perf_counter()
            try:
                log, blocks = run(name, item)
            except MemoryPressureError as exc:  # smaller blocks, and back to the queue
                try:
                    item, note = again(item, name, exc)
                except BaseException as final:
                    fail(final)
                    raise
                merged.note_replan(note)
                queues[name].put(item)
                continue
            except BaseException as exc:
                fail(exc)
                raise
            merged.add(name, log, blocks, time.perf_counter() - start)

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

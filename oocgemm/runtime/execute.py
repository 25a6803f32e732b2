"""The runtime's one entry point: a plan run into a run's I/O, on one device or several.

:func:`execute` takes the plan, the run's I/O (:class:`~oocgemm.lifecycle.run.RunIO`: it reads
the sources and writes the sink at their grain) and the devices, and picks what replays the
schedule: the executor of the device's kind (:meth:`Backend.executor_class
<oocgemm.backends.Backend.executor_class>`),
or one executor per device (:mod:`oocgemm.runtime.multi_device`). When memory runs
short (:class:`~oocgemm.errors.MemoryPressureError`), the work is planned again with
smaller blocks (:mod:`oocgemm.runtime.replan`) and run again: on one device the whole
product, on several the group of blocks (or part of K) that ran out, while the other
devices go on.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

from ..backends import backend_of
from ..errors import MemoryPressureError
from .replan import MAX_REPLANS, replan_note, smaller


@dataclass
class Run:
    """What the executors did."""

    plan: Any
    """The plan that ran to the end (one device: smaller blocks after memory ran short;
    several devices: the product's plan, the groups planned again named in ``replanned``)."""
    log: Any
    seconds: float
    readers: dict
    """The sources as the last run read them (chunk readers: their counts)."""
    replanned: list[str]
    """Each time memory ran short: what ran out and the plan made then."""
    shares: dict
    """Several devices: what each did."""


def execute(plan, io, devices: list[str] | None = None, *, progress=None, record: bool = True,
            resources=None) -> Run:
    """Run ``plan`` into ``io``'s sink (``io``: a :class:`~oocgemm.lifecycle.run.RunIO` whose
    output is open) on ``plan.device``, or on ``devices`` (several names of one kind) with
    the C blocks shared out; plan again with smaller blocks when memory runs short.

    Parameters
    ----------
    plan
        The validated :class:`~oocgemm.planning.Plan`.
    io
        The run's I/O: ``sources``, ``sink``, ``readers(plan, sources)``, ``writer(plan)``,
        ``encoded(plan, writer)`` (the plan with who compresses C decided for that writer)
        and ``replanned(plan)`` (the output follows a plan made again).
    devices
        Several devices' names, or None for one (``plan.device``).
    progress
        The ``progress`` option of :func:`oocgemm.multiply`: a bool, None (a bar on a
        terminal for runs of more than two seconds) or an ``on_event`` callable.
    record, resources
        As for :class:`~oocgemm.runtime.base.Executor`.

    Raises
    ------
    MemoryPressureError
        When memory still runs short after
        :data:`~oocgemm.runtime.replan.MAX_REPLANS` smaller plans.
    OOCGemmError
        As the executors raise.
    """
    if devices:
        return _on_devices(plan, io, devices, progress=progress, record=record,
                           resources=resources)
    make = backend_of(plan.device).executor_class()
    start = time.perf_counter()
    replanned: list[str] = []
    while True:
        on_event, bar = progress_callback(progress, plan)
        readers = io.sources
        try:
            readers = io.readers(plan)
            writer = io.writer(plan)
            plan = io.encoded(plan, writer)  # who compresses C: the planner's, for this writer
            try:
                log = make(plan, readers, writer, on_event=on_event, record=record,
                           resources=resources).run()
            except BaseException:
                writer.settle()  # nothing stored behind the run after this
                raise
            writer.flush()
            return Run(plan, log, time.perf_counter() - start, readers, replanned, {})
        except MemoryPressureError as exc:  # less memory than planned: smaller blocks
            if len(replanned) == MAX_REPLANS:
                raise
            plan = smaller(plan, exc)
            replanned.append(replan_note(exc, plan))
            warnings.warn("oocgemm: " + replanned[-1], RuntimeWarning, stacklevel=3)
            io.replanned(plan)  # the blocks are others now
        finally:
            if bar is not None:
                bar.close()
            if readers is not io.sources:
                for src in readers.values():
                    src.close()


def _on_devices(plan, io, devices: list[str], *, progress, record: bool, resources) -> Run:
    """:func:`execute` on several devices: a group that runs out of memory is planned again
    by the runner itself (:func:`~oocgemm.runtime.multi_device.run_on_devices`); its notes
    are warned of here, in the caller's thread."""
    from .multi_device import run_on_devices

    start = time.perf_counter()
    on_event, bar = progress_callback(progress, plan)
    replanned: list[str] = []
    try:
        log = run_on_devices(plan, io, devices, on_event=on_event, record=record,
                             resources=resources, replanned=replanned)
    finally:
        if bar is not None:
            bar.close()
        for note in replanned:  # also where the run failed in the end
            warnings.warn("oocgemm: " + note, RuntimeWarning, stacklevel=4)
    return Run(plan, log, time.perf_counter() - start, io.sources, replanned, log.share)


def progress_callback(progress, plan):
    """(on_event callback, bar to close) for the ``progress`` argument."""
    if callable(progress) and not isinstance(progress, bool):
        planned = getattr(progress, "planned", None)
        if planned is not None:  # told the plan its events' blocks belong to (and a replan)
            planned(plan)
        return progress, None
    if progress is None:
        progress = sys.stderr.isatty() and plan.prediction.total > 2.0
    if not progress:
        return None, None
    from ..diagnostics.progress import ProgressBar

    bar = ProgressBar(plan)
    return bar, bar

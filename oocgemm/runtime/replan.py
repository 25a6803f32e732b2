"""What a run does when memory runs short: the plan made again with half the budget that ran
out (:func:`smaller`), at most :data:`MAX_REPLANS` times, and what the result says of it."""

from __future__ import annotations

from ..backends import backend_of
from ..errors import MemoryPressureError
from ..planning.planner import replan
from ..units import format_size

#: Times a run (or, on several devices, a group of blocks) plans again with smaller blocks
#: after running out of memory.
MAX_REPLANS = 3


def smaller(plan, exc: MemoryPressureError):
    """The plan to go on with after ``exc``: half the budget of the memory that ran out (and
    no more than the GPU has free now), every block to compute, on ``plan.device``."""
    backend = backend_of(plan.device)
    mem, host = plan.memory_limit, plan.host_memory_limit
    staging = None
    if plan.in_core:  # panels again, with the executor's staging
        staging = backend.staging(plan.problem, plan.model, plan.kernel).settings
    if exc.where == "device" or (exc.where == "host" and backend.working_memory_is_host):
        mem //= 2  # on the CPU, the working buffers are host memory
    if exc.where in ("host", "pinned"):
        host //= 2
    if exc.where == "pinned":
        mem //= 2  # a CUDA allocation of unknown kind: both
    free = backend.free_memory(plan.device.index)
    if free is not None:
        mem = min(mem, int(free * 0.9))
    return replan(plan, memory_limit=mem, host_memory_limit=host, staging=staging,
                  why=str(exc))


def replan_note(exc: MemoryPressureError, plan, what: str = "") -> str:
    """What :attr:`Result.replanned <oocgemm.result.Result.replanned>` says of a plan made
    again after ``exc`` (``what``: which part of the product, where not all of it)."""
    return (f"{exc}; planned {what + ' ' if what else ''}again with tile w={plan.tile[0]} "
            f"h={plan.tile[1]} r={plan.tile[2]} "
            f"(memory_limit={format_size(plan.memory_limit)}, "
            f"host_memory_limit={format_size(plan.host_memory_limit)}) and started again")

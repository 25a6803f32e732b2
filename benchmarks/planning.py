"""How long the planner takes to choose the tile of a large product, against the search that
predicts every depth of every block (the planner before its floors,
``oocgemm.planning.tiling._resource_floor``), on the machine it runs on.

The operands are described, not allocated: the problem of an NxN float64 product of arrays
in host memory (N = 32768 is 8.6 GB an operand), planned for the CUDA executor's model
under a GPU limit and for the CPU executor's. Both searches must pick the same tile.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

from oocgemm.backends import backend_of
from oocgemm.devices import Device
from oocgemm.kernel_catalog import check_kernel
from oocgemm.lifecycle.run import open_run
from oocgemm.planning import Problem, tiling
from oocgemm.planning.planner import Facts, plan_product

from .common import BenchError


def in_memory_problem(n: int) -> Problem:
    """The problem of an NxN float64 product of numpy arrays into a new array, as the planner
    sees it (the operands' facts, read from small arrays of the same kind)."""
    with open_run(np.empty((2, 2)), np.empty((2, 2)), None) as io:
        a, b, _, out = io.operands()
    a, b, out = (dataclasses.replace(x, shape=(n, n)) for x in (a, b, out))
    return Problem(m=n, n=n, k=n, itemsize=8, dtype="float64", a=a, b=b, c=None, out=out,
                   alpha=1.0, beta=0.0, trans_a=False, trans_b=False, shared=False)


def _plan_seconds(problem: Problem, device: str, mem: int, host: int, repeat: int,
                  floors: bool) -> tuple[float, tuple[int, int, int]]:
    backend = backend_of(device)
    model = backend.model()
    kernel = check_kernel(None, np.dtype(problem.dtype))
    facts = Facts(device=Device.named(device), kernel=kernel, model=model, memory_limit=mem,
                  host_memory_limit=host, staging=backend.staging(problem, model, kernel))
    real = tiling._resource_floor
    if not floors:
        tiling._resource_floor = lambda *args, **kwargs: 0.0
    try:
        times, tile = [], None
        for _ in range(repeat):
            start = time.perf_counter()
            plan = plan_product(problem, facts)
            times.append(time.perf_counter() - start)
            tile = plan.tile
    finally:
        tiling._resource_floor = real
    return statistics.median(times), tile


def planning_benchmark(sizes=(16384, 32768, 65536), devices=("cuda:0", "cpu"),
                       memory_limit: int = 16 << 30, host_memory_limit: int = 64 << 30,
                       repeat: int = 3) -> dict:
    """Median seconds of ``plan_product`` for each size and device, with the floors and
    without (each block's every depth predicted); raises BenchError where the two pick
    different tiles."""
    rows = []
    for n in sizes:
        problem = in_memory_problem(n)
        for device in devices:
            now, tile = _plan_seconds(problem, device, memory_limit, host_memory_limit,
                                      repeat, True)
            before, old = _plan_seconds(problem, device, memory_limit, host_memory_limit,
                                        repeat, False)
            if tile != old:
                raise BenchError(f"n = {n} on {device}: the floors chose {tile}, every "
                                 f"depth predicted {old}")
            rows.append({"n": n, "device": device, "seconds": now,
                         "every_depth_seconds": before, "tile": list(tile)})
    return {"benchmark": "planning", "memory_limit": memory_limit,
            "host_memory_limit": host_memory_limit, "repeat": repeat, "rows": rows}

"""oocgemm's products against numpy on the CPU and against cuBLAS, cuBLASXt and dask on a GPU,
as functions that return plain dicts (``python -m benchmarks cpu``, ``gpu``).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

import oocgemm
from oocgemm import machine
from oocgemm.errors import BudgetError, OptionError, OutputError
from oocgemm.info import blas_info
from oocgemm.random_matrices import random_matrix
from oocgemm.units import format_size

from .common import check_dtype, max_relative_error, tolerance

#: GFLOP/s of oocgemm over numpy's that the CPU benchmark aims at.
CPU_TARGET_RATIO = 0.80


def _operands(n: int, dtype: np.dtype, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)

    def one():
        x = rng.standard_normal((n, n)).astype(dtype)
        if dtype.kind == "c":
            x.imag = rng.standard_normal((n, n))
        return x

    return one(), one()



def cpu_benchmark(size: int = 4096, repeat: int = 3, dtype="float64", *, seed: int = 0,
                  warmup: bool = True, on_step=None) -> dict:
    """oocgemm on the CPU against ``numpy.matmul`` on in-memory ``size``x``size`` operands.

    Each of the ``repeat`` rounds times ``a @ b`` then ``oocgemm.multiply(a, b,
    device='cpu')`` (wall time of the whole call: planning, execution, a new result array,
    as numpy's). After one untimed warm-up of each (``warmup``), medians give each side's
    GFLOP/s and ``ratio`` = oocgemm GFLOP/s / numpy GFLOP/s (target ``CPU_TARGET_RATIO``).
    The last oocgemm result is checked against numpy's (``max_rel_error`` against
    ``tolerance``).

    ``on_step(round, numpy_seconds, oocgemm_seconds)`` is called after each round.
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise OptionError(f"size must be a positive integer, got {size!r}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise OptionError(f"repeat must be a positive integer, got {repeat!r}")
    dt = check_dtype(dtype)
    n = size
    matrix = n * n * dt.itemsize
    # a, b, numpy's C, oocgemm's C, and oocgemm's working buffers (at most about 3 C's more)
    need = 7 * matrix
    available = machine.available_memory()
    if need > available:
        raise BudgetError(f"size {n} ({dt.name}) needs about {format_size(need)} of memory for "
                          f"the in-memory benchmark; {format_size(available)} is available: use "
                          f"a smaller --size")
    a, b = _operands(n, dt, seed)
    flops = (8 if dt.kind == "c" else 2) * n ** 3

    def run_oocgemm():
        start = time.perf_counter()
        result = oocgemm.multiply(a, b, device="cpu", progress=False)
        return time.perf_counter() - start, result

    if warmup:
        np.matmul(a, b)
        run_oocgemm()
    numpy_times, oocgemm_times, execute_times = [], [], []
    c_numpy = result = None
    for step in range(repeat):
        c_numpy = result = None  # free the previous round's products first
        start = time.perf_counter()
        c_numpy = a @ b
        numpy_times.append(time.perf_counter() - start)
        seconds, result = run_oocgemm()
        oocgemm_times.append(seconds)
        execute_times.append(result.seconds)
        if on_step is not None:
            on_step(step, numpy_times[-1], seconds)
    error = max_relative_error(result.out, c_numpy)
    tol = tolerance(dt, n)
    numpy_median = statistics.median(numpy_times)
    oocgemm_median = statistics.median(oocgemm_times)
    numpy_gflops = flops / numpy_median / 1e9 if numpy_median > 0 else float("inf")
    oocgemm_gflops = flops / oocgemm_median / 1e9 if oocgemm_median > 0 else float("inf")
    ratio = oocgemm_gflops / numpy_gflops if numpy_gflops else 0.0
    plan = result.plan
    return {
        "benchmark": "cpu",
        "size": n,
        "dtype": dt.name,
        "repeat": repeat,
        "warmup": warmup,
        "seed": seed,
        "flops": flops,
        "numpy": {"seconds": numpy_times, "median_seconds": numpy_median,
                  "gflops": numpy_gflops},
        "oocgemm": {"seconds": oocgemm_times, "median_seconds": oocgemm_median,
                    "gflops": oocgemm_gflops,
                    "execute_seconds": execute_times,
                    "execute_median_seconds": statistics.median(execute_times),
                    "device": str(plan.device), "tile": list(plan.tile),
                    "grid": list(plan.grid), "operations": len(result.events)},
        "ratio": ratio,
        "target_ratio": CPU_TARGET_RATIO,
        "meets_target": ratio >= CPU_TARGET_RATIO,
        "max_rel_error": error,
        "tolerance": tol,
        "correct": error <= tol,
        "cores": machine.cores(),
        "blas": blas_info().get("name", "unknown"),
    }



def _sampled_error(result, a, b, rows) -> float:
    """max relative error of ``result[rows]`` against ``a[rows] @ b`` in float64 on the host."""
    reference = a[rows].astype(np.float64) @ b.astype(np.float64, copy=False)
    return max_relative_error(np.asarray(result[rows], dtype=np.float64), reference)


def gpu_benchmark(size: int = 32768, *, memory_limit="16GB", dtype="float64", seed: int = 0,
                  repeat: int = 2, workdir: str | None = None, cases=None,
                  xt_block_dims=(4096, 8192), dask_chunk: int = 8192, device: str = "cuda",
                  on_step=None) -> dict:
    """The CUDA executor against its ceilings and peers on one GPU, in one run (issue figures).

    Cases (TFLOP/s of each, ``size``³ product of in-memory float64 operands, GPU memory
    limited to ``memory_limit``):

    - ``incore``: cuBLAS on one block of the plan's shape, operands on the GPU: the ceiling
      (median of 5); ``incore_sustained``: the same GEMM back to back for the product's flops;
    - ``numpy``: oocgemm from pageable numpy arrays into a numpy array;
    - ``npy``: oocgemm from .npy memmaps in ``workdir`` (written first, so in the page cache);
    - ``cublasxt``: cuBLASXt ``cublasXtDgemm`` from pinned operands at each block dim
      (``cublasxt_pageable`` too, from the numpy arrays at the larger block dim);
    - ``dask``: dask.array with CuPy chunks of ``dask_chunk``.

    Every product is checked against a float64 reference on 8 sampled rows. ``on_step(name,
    entry)`` is called as each case finishes.
    """
    import tempfile


    known = ("incore", "numpy", "npy", "cublasxt", "dask")
    cases = tuple(cases or known)
    unknown = [c for c in cases if c not in known]
    if unknown:
        raise OptionError(f"unknown benchmark case(s) {', '.join(unknown)}; known: "
                          f"{', '.join(known)}")
    if workdir is not None and "npy" in cases:  # before any timing, not after the first case
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"workdir {workdir!r} cannot be created: {exc}") from None
    dt = check_dtype(dtype)
    n = size
    flops = (8 if dt.kind == "c" else 2) * n ** 3
    result: dict = {"benchmark": "gpu", "size": n, "dtype": dt.name, "memory_limit": memory_limit,
                    "flops": flops, "cases": {}}

    def record(name, seconds, error=None, **extra):
        entry = {"seconds": seconds, "tflops": flops / seconds / 1e12 if seconds else 0.0,
                 **extra}
        if error is not None:
            entry["max_rel_error_sampled"] = error
            entry["correct"] = error <= tolerance(dt, n)
        result["cases"][name] = entry
        if on_step is not None:
            on_step(name, entry)
        return entry

    a = random_matrix((n, n), dt, seed)
    b = random_matrix((n, n), dt, seed + 1)
    rows = np.sort(np.random.default_rng(seed + 2).choice(n, size=min(8, n), replace=False))
    out = np.zeros((n, n), dtype=dt)  # pages touched once, outside every timing
    the_plan = oocgemm.plan(a, b, out, device=device, memory_limit=memory_limit)
    w, h, r = the_plan.tile
    result["plan"] = {"tile": [w, h, r], "grid": list(the_plan.grid),
                      "predicted_seconds": the_plan.prediction.total,
                      "operations": len(the_plan.schedule.ops)}

    if "incore" in cases:
        from .baselines import incore_gemm_seconds, sustained_gemm_seconds

        seconds = incore_gemm_seconds(w, h, r, dt)
        entry = {"seconds": seconds, "tflops": 2 * w * h * r / seconds / 1e12,
                 "shape": [w, h, r]}
        result["cases"]["incore"] = entry
        if on_step is not None:
            on_step("incore", entry)
        # The same block GEMM back to back for as many flops as the whole product: the rate
        # the GPU holds over a product's length, which a burst of five overstates.
        record("incore_sustained", sustained_gemm_seconds(w, h, r, flops, dt),
               shape=[w, h, r])

    def timed_multiply(x, y, label):
        best = None
        for _ in range(repeat + 1):  # the first run warms up (pinned ring, cuBLAS handle)
            out.fill(np.nan)
            run = oocgemm.multiply(x, y, out=out, device=device, memory_limit=memory_limit,
                           progress=False)
            best = run if best is None or run.seconds < best.seconds else best
        return record(label, best.seconds, _sampled_error(out, a, b, rows),
                      tile=list(best.plan.tile), bytes=best.bytes)

    if "numpy" in cases:
        timed_multiply(a, b, "numpy")
    if "npy" in cases:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            pa, pb = os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy")
            np.save(pa, a)
            np.save(pb, b)
            timed_multiply(pa, pb, "npy")
    if "cublasxt" in cases:
        from .baselines import cublasxt_dgemm, pinned_empty

        if dt != np.float64:
            raise OptionError("the cuBLASXt baseline runs in float64 only")
        pa, owner_a = pinned_empty((n, n))
        pb, owner_b = pinned_empty((n, n))
        pc, owner_c = pinned_empty((n, n))
        np.copyto(pa, a)
        np.copyto(pb, b)
        for block in xt_block_dims:
            cublasxt_dgemm(pa[:1024, :1024], pb[:1024, :1024], pc[:1024, :1024], block)  # warm
            pc.fill(np.nan)
            seconds = cublasxt_dgemm(pa, pb, pc, block)
            record(f"cublasxt_pinned_{block}", seconds, _sampled_error(pc, a, b, rows),
                   block_dim=block)
        del pa, pb, pc, owner_a, owner_b, owner_c
        block = max(xt_block_dims)
        out.fill(np.nan)
        seconds = cublasxt_dgemm(a, b, out, block)
        record(f"cublasxt_pageable_{block}", seconds, _sampled_error(out, a, b, rows),
               block_dim=block)
    if "dask" in cases:
        from .baselines import dask_cupy_matmul

        product, seconds = dask_cupy_matmul(a, b, dask_chunk)
        record("dask", seconds, _sampled_error(product, a, b, rows), chunk=dask_chunk)
        del product

    got = result["cases"]
    xt = [v["tflops"] for k, v in got.items() if k.startswith("cublasxt_pinned")]
    if "incore" in got and "numpy" in got:
        result["numpy_vs_incore"] = got["numpy"]["tflops"] / got["incore"]["tflops"]
        result["numpy_vs_incore_sustained"] = (got["numpy"]["tflops"]
                                               / got["incore_sustained"]["tflops"])
    if "incore" in got and "npy" in got:
        result["npy_vs_incore"] = got["npy"]["tflops"] / got["incore"]["tflops"]
    if xt and "numpy" in got:
        result["numpy_vs_cublasxt"] = got["numpy"]["tflops"] / max(xt)
    return result



def gpu_big_benchmark(size: int = 61440, *, dtype="float64", seed: int = 0, device="cuda",
                      memory_limit=None) -> dict:
    """One product whose operands exceed GPU memory outright (61440: three 30 GB matrices)."""
    dt = check_dtype(dtype)
    a = random_matrix((size, size), dt, seed)
    b = random_matrix((size, size), dt, seed + 1)
    out = np.zeros((size, size), dtype=dt)
    rows = np.sort(np.random.default_rng(seed + 2).choice(size, size=4, replace=False))
    run = oocgemm.multiply(a, b, out=out, device=device, memory_limit=memory_limit, progress=False)
    error = _sampled_error(out, a, b, rows)
    return {"benchmark": "gpu-big", "size": size, "dtype": dt.name,
            "operand_bytes": 3 * size * size * dt.itemsize, "seconds": run.seconds,
            "tflops": run.tflops, "tile": list(run.plan.tile), "grid": list(run.plan.grid),
            "max_rel_error_sampled": error, "correct": error <= tolerance(dt, size)}


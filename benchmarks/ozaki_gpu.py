"""Ozaki scheme II on the GPU against cuBLAS DGEMM (issue 21): the ceilings first.

    python -m benchmarks.ozaki_gpu ceilings [--seconds 8]

The emulation's speed is bounded by what the int8 tensor cores sustain under the board's power
cap divided by the number of moduli (one int8 GEMM each); DGEMM's by its own sustained rate.
Both are measured here the same way, in one process: each GEMM repeated back to back for some
seconds (the clocks settle under the power cap within a few), the median rate of the second
half of the repeats.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def sustained(fn, ops: float, seconds: float) -> dict:
    """``fn`` (enqueues one GEMM of ``ops`` operations on the current stream) back to back for
    about ``seconds``: the median rate (ops/s) of the second half of the repeats, each timed
    with CUDA events, and the repeats' count."""
    import cupy

    fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 4:
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(begin, end) / 1e3)
    half = times[len(times) // 2:]
    return {"rate": ops / float(np.median(half)), "repeats": len(times),
            "seconds_each": float(np.median(half))}


def dgemm_rate(n: int, seconds: float) -> dict:
    """cuBLAS DGEMM on n x n x n random operands."""
    import cupy

    rng = cupy.random.default_rng(1)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    c = cupy.empty((n, n))
    return sustained(lambda: cupy.matmul(a, b, out=c), 2.0 * n ** 3, seconds)


def int8_rate(rows: int, cols: int, depth: int, batch: int, seconds: float) -> dict:
    """cuBLAS int8 x int8 -> int32, ``batch`` products of rows x depth by depth x cols on
    uniform random residues in [-128, 127] (what the emulation multiplies), in the layout
    :func:`oocgemm.cuda.ozaki.int8_gemm` uses."""
    import cupy

    from oocgemm.cuda.ozaki import int8_gemm

    rng = cupy.random.default_rng(2)
    a = rng.integers(-128, 128, (batch, rows, depth)).astype(np.int8)
    b = rng.integers(-128, 128, (batch, cols, depth)).astype(np.int8)
    c = cupy.empty((batch, rows, cols), dtype=np.int32)
    handle = cupy.cuda.device.get_cublas_handle()

    def run():
        int8_gemm(handle, a.data.ptr, b.data.ptr, c.data.ptr, rows, cols, depth, lda=depth,
                  ldb=depth, ldc=cols, stride_a=rows * depth, stride_b=cols * depth,
                  stride_c=rows * cols, batch=batch)

    run()
    want = a[0, :64].astype(np.float64) @ b[0, :64].astype(np.float64).T
    out = sustained(run, 2.0 * rows * cols * depth * batch, seconds)
    out["exact"] = bool((c[0, :64, :64].astype(np.float64) == want).all())
    return out


def ceilings(seconds: float = 8.0) -> dict:
    """DGEMM and int8 rates sustained on this GPU, and what they allow the emulation."""
    import cupy

    from oocgemm.sysinfo import gpu_info

    cases = {"dgemm_16384": lambda: dgemm_rate(16384, seconds),
             "int8_16384_batch1": lambda: int8_rate(16384, 16384, 16384, 1, seconds),
             "int8_2048x16384x8192_batch16": lambda: int8_rate(2048, 16384, 8192, 16, seconds),
             "int8_1024x16384x4096_batch16": lambda: int8_rate(1024, 16384, 4096, 16, seconds),
             "dgemm_16384_again": lambda: dgemm_rate(16384, seconds)}
    out: dict = {"gpu": gpu_info(), "date": time.strftime("%Y-%m-%d")}
    for name, case in cases.items():
        out[name] = case()
        cupy.get_default_memory_pool().free_all_blocks()
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.ozaki_gpu")
    parser.add_argument("what", choices=["ceilings"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    result = ceilings(args.seconds)
    for name, entry in result.items():
        if isinstance(entry, dict) and "rate" in entry:
            print(f"{name:32s} {entry['rate'] / 1e12:8.1f} T/s  ({entry['repeats']} repeats"
                  + (f", exact {entry['exact']}" if "exact" in entry else "") + ")")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

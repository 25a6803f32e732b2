"""One product on 1, 2, ... GPUs of one machine, in one run (issue 22).

    python -m benchmarks.scaling --n 65536 [--gpus 1,2] [--repeat 2] [--memory-limit SIZE]
        [--xt (cuBLASXt on the same GPUs, operands pinned in place)] [--xt-block 8192]
        [--trace DIR (the widest run's timeline, for oocgemm.diagnostics plots)] [--json FILE]

float64 operands of n x n in host memory (normal random numbers, made by every core), the
product into a preallocated numpy array. For each GPU count g: ``oocgemm.multiply`` with
``device=['cuda:0', ..., 'cuda:g-1']`` (one GPU: ``'cuda:0'``), its seconds, TFLOP/s, the
blocks and share of each GPU, and the parallel efficiency t(1) / (g t(g)), t the best of
``--repeat`` runs (the first of them also starts each GPU's context and pools); with ``--xt``,
``cublasXtDgemm`` on the same GPUs from the same (pinned) arrays. Every product is checked
on 8 sampled rows against a float64 reference on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import max_relative_error


def operands(n: int, seed: int = 0, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two n x n float64 arrays of normal random numbers, row bands made in parallel (each
    band from its own stream, so the result does not depend on the thread count)."""
    threads = threads or os.cpu_count() or 1
    band = 1024

    def fill(x, which, lo):
        rng = np.random.default_rng([seed, which, lo])
        rng.standard_normal(out=x[lo:lo + band])

    out = []
    for which in (0, 1):
        x = np.empty((n, n))
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda lo, x=x, which=which: fill(x, which, lo), range(0, n, band)))
        out.append(x)
    return out[0], out[1]


def _error(c, a, b, rows) -> float:
    return max_relative_error(np.asarray(c[rows]), a[rows] @ b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--memory-limit", default=None)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--xt", action="store_true")
    parser.add_argument("--xt-block", type=int, default=8192)
    parser.add_argument("--trace", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import oocgemm
    from oocgemm import cuda

    counts = [int(g) for g in args.gpus.split(",")]
    if max(counts) > cuda.device_count():
        print(f"asked for {max(counts)} GPUs, {cuda.device_count()} found", file=sys.stderr)
        return 2
    n = args.n
    flops = 2.0 * n ** 3
    start = time.perf_counter()
    a, b = operands(n)
    c = np.empty((n, n))
    c[:] = np.nan  # poisoned, and its pages mapped before any timing
    rows = np.random.default_rng(1).choice(n, 8, replace=False)
    print(f"n={n}: operands {a.nbytes / 1e9:.1f} GB each, made in "
          f"{time.perf_counter() - start:.1f} s; {cuda.device_count()} GPUs", flush=True)
    doc: dict = {"date": time.strftime("%Y-%m-%d"), "n": n, "cases": []}

    def record(name, g, seconds, **extra):
        error = _error(c, a, b, rows)
        case = {"case": name, "gpus": g, "seconds": seconds, "tflops": flops / seconds / 1e12,
                "error": error, **extra}
        base = next((x for x in doc["cases"] if x["case"] == name and x["gpus"] == 1), None)
        if base is not None:
            case["efficiency"] = base["seconds"] / (g * seconds)
        doc["cases"].append(case)
        print(f"{name:9} {g} GPU(s): {seconds:7.2f} s, {case['tflops']:6.2f} TFLOP/s"
              + (f", efficiency {case['efficiency']:.1%}" if "efficiency" in case else "")
              + f", rel. error {error:.1e}"
              + "".join(f", {k} {v}" for k, v in extra.items()), flush=True)
        c[rows] = np.nan  # the next case must write them again

    for g in counts:
        device = "cuda:0" if g == 1 else [f"cuda:{i}" for i in range(g)]
        times = []
        for _ in range(args.repeat):  # the first also starts each GPU's context and pools
            start = time.perf_counter()
            r = oocgemm.multiply(a, b, c, device=device, memory_limit=args.memory_limit,
                                 progress=False)
            times.append(time.perf_counter() - start)
        shares = {name: f"{d['blocks']} blocks" for name, d in (r.devices or {}).items()}
        record("multiply", g, min(times), times=[round(t, 2) for t in times],
               tile=list(r.plan.tile), shares=shares)
        if args.trace and g == max(counts):
            os.makedirs(args.trace, exist_ok=True)
            r.timeline.save(os.path.join(args.trace, f"multiply-{g}gpu.json"))

    if args.xt:
        from benchmarks.baselines import cublasxt_dgemm, pinned_in_place

        start = time.perf_counter()
        with pinned_in_place(a, b, c):
            print(f"  pinned in place in {time.perf_counter() - start:.1f} s", flush=True)
            for g in counts:
                times = [cublasxt_dgemm(a, b, c, args.xt_block, device=list(range(g)))
                         for _ in range(args.repeat)]
                record("cublasxt", g, min(times), times=[round(t, 2) for t in times],
                       block=args.xt_block)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The GPU benchmark product's timeline, and what recording it costs.

    python examples/timeline_gpu.py [WORKDIR] [--size N] [--memory-limit SIZE] [--repeat R]
                                    [--device cuda|cpu|auto]

Multiplies two N x N float64 numpy arrays (N = 32768 by default: case (b) of
``python -m benchmarks gpu``, 8 GB per matrix, about 26 GB of host memory in all) on the GPU under a
GPU memory limit (16 GB by default), then:

1. recording overhead: R rounds (5 by default), each one run with events recorded and one
   without (``multiply(..., events=False)``), in alternating order after a warm-up run; prints
   the median and best seconds of each and the overhead, median(on) / median(off) - 1 (the
   issue's bar: under 2%);
2. the timeline of the fastest recorded run: its summary, WORKDIR/timeline.json (Chrome trace:
   open it in https://ui.perfetto.dev) and WORKDIR/timeline.png (Gantt chart, when matplotlib
   is installed), and each recorded run's compute busy and exposed copy share against the
   issue's bars (compute busy >= 95% of the wall, exposed copy <= 5%);
3. checks 8 sampled rows of the product against a float64 reference.

WORKDIR defaults to the current directory. For Nsight Systems, profile one run instead:
``nsys profile -t cuda,nvtx -o run python examples/timeline_gpu.py --repeat 0``. The test suite
runs it small, on whatever device there is (``--device auto``).
"""

# example-test-args: --device auto --size 1024 --memory-limit 64MB --repeat 1

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import oocgemm
from oocgemm import cuda
from oocgemm.random_matrices import random_matrix, tolerance


def sampled_error(out, a, b, rows) -> float:
    reference = a[rows] @ b
    return float(np.abs(out[rows] - reference).max() / np.abs(reference).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", default=".")
    parser.add_argument("--size", type=int, default=32768)
    parser.add_argument("--memory-limit", default="16GB")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds of one run with events and one without (0: one run)")
    parser.add_argument("--device", default="cuda", help="cuda (the default), cpu or auto")
    args = parser.parse_args()
    if args.device.startswith("cuda") and cuda.device_count() == 0:
        raise SystemExit("timeline_gpu.py: no CUDA GPU (or no CuPy); --device cpu runs it on "
                         "the CPU")

    n = args.size
    a = random_matrix((n, n), "float64", seed=1)
    b = random_matrix((n, n), "float64", seed=2)
    out = np.zeros((n, n))  # pages touched once, before any timing
    rows = np.sort(np.random.default_rng(3).choice(n, size=min(8, n), replace=False))

    def run(events: bool):
        t0 = time.perf_counter()
        r = oocgemm.multiply(a, b, out=out, device=args.device, memory_limit=args.memory_limit,
                             progress=False, events=events)
        return r, time.perf_counter() - t0

    first, _ = run(True)  # warm-up: pinned ring, cuBLAS handle
    print(first.plan)
    recorded, seconds = [first], {True: [], False: []}
    for i in range(args.repeat):
        for events in ((True, False) if i % 2 == 0 else (False, True)):
            r, _ = run(events)
            seconds[events].append(r.seconds)
            if events:
                recorded.append(r)
            print(f"  round {i + 1}/{args.repeat} events={'on ' if events else 'off'} "
                  f"{r.seconds:.4f} s, {r.tflops:.2f} TFLOP/s", flush=True)
    if args.repeat:
        on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
        print(f"recording overhead: events on median {on:.4f} s (best {min(seconds[True]):.4f}),"
              f" off median {off:.4f} s (best {min(seconds[False]):.4f}): "
              f"{on / off - 1:+.2%} (bar: < 2%)")
        recorded = recorded[1:]  # the warm-up run is not a figure

    best = min(recorded, key=lambda r: r.seconds)
    timeline = best.timeline
    print(timeline)
    for r in recorded:
        t = r.timeline
        print(f"  run {r.seconds:.4f} s: compute busy {t.compute_fraction:.1%} (bar >= 95%), "
              f"exposed copy {t.exposed_fraction:.1%} (bar <= 5%)")
    os.makedirs(args.workdir, exist_ok=True)
    print(f"wrote {timeline.save(os.path.join(args.workdir, 'timeline.json'))}")
    try:
        timeline.plot(os.path.join(args.workdir, "timeline.png"))
        print(f"wrote {os.path.join(args.workdir, 'timeline.png')}")
    except oocgemm.DependencyError as exc:
        print(f"no plot: {exc}")
    error = sampled_error(out, a, b, rows)
    print(f"max relative error on {len(rows)} sampled rows: {error:.2e}")
    return 0 if error <= tolerance(np.dtype("float64"), n) else 1


if __name__ == "__main__":
    raise SystemExit(main())

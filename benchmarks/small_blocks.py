"""Small blocks on the CPU (``python -m benchmarks small-blocks``): ``oocgemm.multiply`` with a
given tile against what a user would write instead, side by side in one run.

    python -m benchmarks small-blocks [--n 4000] [--zarr-n 3000] [--tile 128]
        [--sources numpy,zarr,npy] [--repeat 3] [--workdir DIR] [--out FILE]

For each source of the operands (numpy arrays in memory; Zarr arrays as zarr-python writes
them by default, ``zarr.create_array`` with its chunks and zstd; ``.npy`` files) three cases
produce ``C = A @ B`` in memory (float64, random operands, n x n; Zarr: ``--zarr-n``):

- ``numpy``: the operands read whole (``np.asarray(zarr_array[...])``, ``np.load``), then
  ``a @ b``;
- ``loop``: the operands read whole, then the plain blocked Python loop of the same tile,
  ``c[i, j] += a[i, k] @ b[k, j]`` over the blocks into a preallocated ``c`` (zeros);
- ``multiply``: ``oocgemm.multiply(a, b, device='cpu', tile=(t, t, t), progress=False)``
  with the numpy arrays, or the paths.

Each round runs the three cases of a source one after the other (rounds interleaved, so that
the machine's drift falls on all three); medians are reported, with the ratios of multiply's
median to the loop's and numpy's, multiply's own ``result.seconds``, the operations its plan
holds and runs, the plan's prediction and notes. Every result is checked against numpy's on
sampled rows. The output is JSON (stdout, and ``--out``). Exit status 1 when a result is
wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import max_relative_error, tolerance

#: Rows of each result compared with numpy's.
SAMPLED_ROWS = 16
SOURCES = ("numpy", "zarr", "npy")
CASES = ("numpy", "loop", "multiply")


def blocked_loop(a: np.ndarray, b: np.ndarray, tile: int) -> np.ndarray:
    """``a @ b`` as the plain Python loop over ``tile``-sided blocks a user would write."""
    m, k = a.shape
    n = b.shape[1]
    c = np.zeros((m, n))
    for i in range(0, m, tile):
        for j in range(0, n, tile):
            cij = c[i:i + tile, j:j + tile]
            for q in range(0, k, tile):
                cij += a[i:i + tile, q:q + tile] @ b[q:q + tile, j:j + tile]
    return c


def _operands(source: str, n: int, workdir: str, rng: np.random.Generator):
    """(what multiply takes for A and B, a loader of both as numpy arrays, what was stored)."""
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    if source == "numpy":
        return (a, b), lambda: (a, b), {}
    if source == "npy":
        paths = [os.path.join(workdir, f"{name}-{n}.npy") for name in "ab"]
        for path, x in zip(paths, (a, b)):
            np.save(path, x)
        return tuple(paths), lambda: tuple(np.load(p) for p in paths), {"files": paths}
    import zarr

    paths = [os.path.join(workdir, f"{name}-{n}.zarr") for name in "ab"]
    chunks = None
    for path, x in zip(paths, (a, b)):
        arr = zarr.create_array(store=path, shape=x.shape, dtype=x.dtype, overwrite=True)
        arr[...] = x
        chunks = list(arr.chunks)
    return tuple(paths), lambda: tuple(np.asarray(zarr.open_array(p, mode="r")[...])
                                       for p in paths), {"files": paths, "chunks": chunks}


def _timed(call):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def one_source(source: str, n: int, tile: int, repeat: int, workdir: str,
               rng: np.random.Generator, on_round=None) -> dict:
    """The three cases of ``source``, ``repeat`` interleaved rounds."""
    import oocgemm

    inputs, load, stored = _operands(source, n, workdir, rng)
    a, b = load()
    rows = rng.choice(n, size=min(SAMPLED_ROWS, n), replace=False)
    reference = a[rows] @ b
    del a, b

    def numpy_case():
        x, y = load()
        return x @ y

    def loop_case():
        x, y = load()
        return blocked_loop(x, y, tile)

    results: dict = {}

    def multiply_case():
        r = oocgemm.multiply(*inputs, device="cpu", tile=(tile, tile, tile), progress=False)
        results["last"] = r
        return r.out

    calls = {"numpy": numpy_case, "loop": loop_case, "multiply": multiply_case}
    seconds: dict[str, list[float]] = {case: [] for case in CASES}
    run_seconds, errors = [], {}
    for round_ in range(repeat):
        for case in CASES:
            took, out = _timed(calls[case])
            seconds[case].append(took)
            errors[case] = max(errors.get(case, 0.0),
                               max_relative_error(np.asarray(out)[rows], reference))
            del out
        run_seconds.append(results["last"].seconds)
        if on_round is not None:
            on_round(source, round_, {case: seconds[case][-1] for case in CASES})
    r = results["last"]
    plan = r.plan
    medians = {case: statistics.median(seconds[case]) for case in CASES}
    limit = tolerance("float64", n)
    return {
        "source": source, "n": n, "tile": [tile] * 3, **stored,
        "cases": {case: {"seconds": seconds[case], "median_seconds": medians[case],
                         "max_rel_error": errors[case]} for case in CASES},
        "multiply_vs_loop": medians["multiply"] / medians["loop"],
        # each round's own ratio: the machine's speed moves between rounds, not within one
        "multiply_vs_loop_by_round": statistics.median(
            m / lo for m, lo in zip(seconds["multiply"], seconds["loop"])),
        "multiply_vs_numpy": medians["multiply"] / medians["numpy"],
        "loop_vs_numpy": medians["loop"] / medians["numpy"],
        "multiply_run_seconds": run_seconds,
        "operations_planned": plan.counts.total,
        "operations_run": len(r.events),
        "predicted_seconds": plan.prediction.total,
        "predicted_bound": plan.prediction.bound,
        "plan_notes": list(getattr(plan, "notes", ())),
        "tolerance": limit,
        "correct": all(e <= limit for e in errors.values()),
    }


def oocgemm_version() -> str:
    """The version of the oocgemm imported (a checkout's, where run from one), with its
    commit where it is a git checkout."""
    import subprocess

    import oocgemm

    root = os.path.dirname(os.path.dirname(os.path.abspath(oocgemm.__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return oocgemm.__version__ + (f" ({commit})" if commit else "")


def small_blocks(n: int, zarr_n: int, tile: int, sources, repeat: int, workdir: str | None,
                 on_round=None) -> dict:
    """Every source's cases (:func:`one_source`), with what describes the machine."""
    import oocgemm

    rng = np.random.default_rng(0)
    warm = rng.standard_normal((2 * tile, 2 * tile))  # the process's first product, untimed
    oocgemm.multiply(warm, warm, device="cpu", tile=(tile, tile, tile), progress=False)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        entries = [one_source(source, zarr_n if source == "zarr" else n, tile, repeat, tmp, rng,
                              on_round) for source in sources]
    return {
        "benchmark": "small-blocks",
        "machine": {"cores": os.cpu_count(), "processor": platform.processor(),
                    "python": platform.python_version(), "numpy": np.__version__,
                    "oocgemm": oocgemm_version(),
                    "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS")},
        "date": time.strftime("%Y-%m-%d"),
        "repeat": repeat,
        "sources": entries,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.small_blocks",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4000, help="n of the numpy and .npy operands")
    p.add_argument("--zarr-n", type=int, default=3000, help="n of the Zarr operands")
    p.add_argument("--tile", type=int, default=128, help="the block side t: tile=(t, t, t)")
    p.add_argument("--sources", default=",".join(SOURCES), help="numpy, zarr, npy")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--workdir", default=None, help="where the stored operands go (a temporary "
                                                   "folder inside it)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        p.error(f"--sources {args.sources!r}: expected some of {', '.join(SOURCES)}")
    if min(args.n, args.zarr_n, args.tile, args.repeat) < 1:
        p.error("--n, --zarr-n, --tile and --repeat are positive integers")

    def on_round(source, round_, seconds):
        print(f"  {source} round {round_ + 1}: " + ", ".join(
            f"{case} {s:.2f} s" for case, s in seconds.items()), file=sys.stderr, flush=True)

    res = small_blocks(args.n, args.zarr_n, args.tile, sources, args.repeat, args.workdir,
                       on_round)
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if all(e["correct"] for e in res["sources"]) else 1


if __name__ == "__main__":
    sys.exit(main())

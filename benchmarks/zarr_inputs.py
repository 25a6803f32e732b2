"""Zarr inputs read into a product whose output is a numpy array: the input side of Zarr ->
Zarr alone, per layout.

    python -m benchmarks.zarr_inputs --n 32768 --layouts v3,v3-sharded --workdir DIR
        [--repeat 3] [--memory-limit 16GB] [--device cuda] [--tile W,H,R] [--label NAME]

For each layout (``benchmarks.zarr_stores.make_store``: zstd, zarr's defaults, 4096² chunks or
shards of 512² chunks; the stores are made once under ``DIR`` and kept), it runs
``oocgemm.multiply(a.zarr, b.zarr, out=numpy array)`` ``repeat`` times in this process and
prints each run's wall and CPU seconds (the first warms up), the tile, and the error on
sampled rows and columns against zarr's reads. Run it under two versions of the code in one
command to compare them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.common import BenchError
from benchmarks.gpu_decode_product import _check
from benchmarks.zarr_stores import make_store
from oocgemm.errors import OOCGemmError


def run(layout: str, n: int, chunk: int, workdir: str, repeat: int, memory_limit: str,
        device: str, out: np.ndarray, tile=None) -> dict:
    import oocgemm

    paths = []
    for name, seed in (("a", 1), ("b", 2)):
        path = os.path.join(workdir, f"{layout}-{n}-{chunk}-{name}.zarr")
        if not os.path.exists(os.path.join(path, "zarr.json")):
            make_store(path, n=n, chunk=chunk, layout=layout, seed=seed, threads=16)
        paths.append(path)
    runs = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = oocgemm.multiply(*paths, out=out, device=device, memory_limit=memory_limit,
                                  tile=tile, progress=False)
        runs.append((time.perf_counter() - wall, time.process_time() - cpu))
    return {"layout": layout, "runs": runs, "tile": result.plan.tile,
            "decoded_on_device": result.plan.io.gpu_decode, "error": _check(out, *paths)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zarr_inputs",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--layouts", default="v3,v3-sharded")
    p.add_argument("--workdir", required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory-limit", default="16GB")
    p.add_argument("--device", default="auto")
    p.add_argument("--tile", default=None, help="W,H,R (the planner's where not given)")
    p.add_argument("--label", default="", help="a name for the lines printed")
    args = p.parse_args(argv)
    try:
        tile = tuple(int(x) for x in args.tile.split(",")) if args.tile else None
    except ValueError:
        p.error(f"--tile {args.tile!r}: three integers W,H,R")
    out = np.empty((args.n, args.n))
    out.fill(0)  # pages touched once, outside every timing
    try:
        for layout in args.layouts.split(","):
            r = run(layout, args.n, args.chunk, args.workdir, args.repeat, args.memory_limit,
                    args.device, out, tile)
            runs = " ".join(f"{w:.2f} s ({c:.0f} cpu)" for w, c in r["runs"])
            where = "+".join(r["decoded_on_device"]) or "-"
            print(f"{args.label}{r['layout']:11s} {runs}  tile {r['tile']}  decoded on the "
                  f"device: {where}  error {r['error']:.1e}", flush=True)
    except (BenchError, OOCGemmError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""oocgemm inside dask against dask's own matmul and against oocgemm.multiply, in one run.

    python -m benchmarks.dask_matmul --n 32768 --chunk 4096 --workdir DIR [--memory-limit 16GB]
        [--dask-limit 300 (0: no dask baseline)] [--cluster] [--out-compressor zstd:0|none]

On Zarr inputs written as a zarr-python user would (zstd, ``--chunk`` square chunks), warm, each
product writing the same output layout (``--chunk`` chunks; ``--out-compressor``: zarr's
default zstd, as ``to_zarr`` writes, or none, as ``multiply`` writes by default):

- ``oocgemm.multiply(a, b, c)``, paths in, path out;
- ``oocgemm.dask.matmul(da.from_zarr(a), da.from_zarr(b)).to_zarr(c)`` under the threaded
  scheduler (16 threads; with each group's run's start and end, from the tasks' events), and
  with ``--cluster`` under a ``dask.distributed.LocalCluster`` of one worker process with 16
  threads and the GPU (``resources={"GPU": 1}``);
- dask's own ``(x @ y).to_zarr(c)`` with CuPy chunks, stopped after ``--dask-limit`` seconds.

Targets (issue 19): >= 5x dask's own, within 10% of ``oocgemm.multiply``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

from benchmarks.storage_floor import read_files
from benchmarks.zarr_product import check, run_dask
from benchmarks.zarr_stores import make_store, store_files

THREADS = 16
"""Threads of the stores' writers, of dask's threaded scheduler and of the cluster's worker."""


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _phases(trace_dir: str, zero: float) -> list[tuple[float, float]]:
    """Each group task's (start, end), in seconds from ``zero`` (a ``time.time()``), from the
    events the tasks left in ``trace_dir``."""
    spans = []
    for path in glob.glob(os.path.join(trace_dir, "task-*.json")):
        with open(path) as f:
            doc = json.load(f)
        spans.append((doc["started_at"] - zero, doc["started_at"] + doc["seconds"] - zero))
    return sorted(spans)


def _decodes(chunks: dict) -> str:
    """Chunks decoded per operand, from a result's ``chunks``."""
    return ", ".join(f"{name} {doc['decodes']}" for name, doc in sorted(chunks.items())) or "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--memory-limit", default="16GB")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check this script")
    parser.add_argument("--out-compressor", choices=("zstd:0", "none"), default="zstd:0",
                        help="the outputs' compressor, the same for every product: zarr's "
                             "default for to_zarr (zstd level 0), or none (multiply's default)")
    parser.add_argument("--dask-limit", type=float, default=300)
    parser.add_argument("--cluster", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    import dask
    import dask.array as da

    import oocgemm
    import oocgemm.dask as odask

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    a, b = os.path.join(work, "a.zarr"), os.path.join(work, "b.zarr")
    for seed, path in ((1, a), (2, b)):
        made = make_store(path, n=args.n, chunk=args.chunk, layout="v3", seed=seed,
                          threads=THREADS)
        print(f"made {path}: {made['stored_bytes'] / 1e9:.2f} GB stored", flush=True)
    doc: dict = {}

    # Every product writes the same layout: chunks of --chunk, compressed alike.
    to_zarr = {"compressors": None} if args.out_compressor == "none" else {}

    def warm():
        read_files(store_files(a, b), THREADS)

    def out(name):
        path = os.path.join(work, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    warm()
    c1 = out("c-multiply.zarr")
    start = time.perf_counter()
    result = oocgemm.multiply(a, b, c1, device=args.device, memory_limit=args.memory_limit,
                              out_options={"chunks": (args.chunk, args.chunk),
                                           "compressors": args.out_compressor},
                              progress=False)
    doc["multiply"] = time.perf_counter() - start
    print(f"  its run: {result.seconds:.2f} s, tile {result.plan.tile}, kept "
          f"{result.plan.io.cache}, decodes {_decodes(result.chunks)}; {result.timeline}",
          flush=True)
    print(f"oocgemm.multiply: {doc['multiply']:.2f} s, rel. error {check(c1, a, b):.1e}",
          flush=True)

    warm()
    c2 = out("c-dask-matmul.zarr")
    trace_dir = out("trace")
    os.makedirs(trace_dir)
    z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.device,
                     memory_limit=args.memory_limit, trace_dir=trace_dir)
    doc["tasks"] = len(z.dask.layers[z.name + "-groups"])
    from dask.diagnostics import Profiler

    with dask.config.set(scheduler="threads", num_workers=THREADS), Profiler() as prof:
        zero, zero_profile = time.time(), time.perf_counter()  # the profiler's clock
        doc["dask_matmul"] = _timed(lambda: z.to_zarr(c2, **to_zarr))
    doc["blocks"] = _phases(trace_dir, zero)
    ends = sorted(t.end_time - zero_profile for t in prof.results)
    run_end = max((e for _, e in doc["blocks"]), default=0.0)
    doc["tasks_after_run"] = sum(e > run_end for e in ends)
    print(f"  {doc['tasks_after_run']} of {len(ends)} tasks end after the run, the last "
          f"at {ends[-1]:.2f} s", flush=True)
    print(f"oocgemm.dask.matmul -> to_zarr: {doc['dask_matmul']:.2f} s, {doc['tasks']} group "
          f"task(s), {len(z.dask)} tasks, result chunks {z.chunksize}, "
          f"rel. error {check(c2, a, b):.1e}", flush=True)
    print("  group runs (start, end) s: "
          + ", ".join(f"({s:.2f}, {e:.2f})" for s, e in doc["blocks"]), flush=True)
    for path in sorted(glob.glob(os.path.join(trace_dir, "task-*.json"))):
        with open(path) as f:
            task = json.load(f)
        print(f"  a group task: {task['seconds']:.2f} s, tile {tuple(task['tile'])}, kept "
              f"{tuple(task['cache'])}, decodes {_decodes(task['chunks'])}", flush=True)
    print(odask.timeline(trace_dir), flush=True)

    if args.cluster:
        import distributed

        warm()
        c3 = out("c-cluster.zarr")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=THREADS,
                                      processes=True, resources={"GPU": 1},
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster):
            z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.device,
                             memory_limit=args.memory_limit, resources={"GPU": 1})
            doc["cluster_tasks"] = len(z.dask.layers[z.name + "-groups"])
            doc["cluster"] = _timed(lambda: z.to_zarr(c3, **to_zarr))
        print(f"  the same through a LocalCluster of one worker process ({THREADS} "
              f"threads, resources GPU=1): {doc['cluster']:.2f} s, {doc['cluster_tasks']} group "
              f"tasks, rel. error {check(c3, a, b):.1e}", flush=True)

    if args.dask_limit > 0:
        warm()
        own = run_dask(a, b, out("c-dask.zarr"), THREADS, False, args.dask_limit)
        print("dask's own x @ y (CuPy chunks) -> to_zarr: "
              + (f"{own['wall']:.2f} s" if own["wall"] else
                 f"not finished after {args.dask_limit:.0f} s"), flush=True)
        base = own["wall"] or args.dask_limit
        print(f"oocgemm.dask.matmul: {base / doc['dask_matmul']:.1f}x dask's own"
              + ("" if own["wall"] else " (at least)"), flush=True)
    print(f"oocgemm.dask.matmul: {doc['dask_matmul'] / doc['multiply']:.2f} x the time of "
          f"oocgemm.multiply", flush=True)
    for p in (a, b):
        shutil.rmtree(p, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

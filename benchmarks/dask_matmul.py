"""oocgemm inside dask against dask's own matmul and against oocgemm.multiply, in one run.

    python -m benchmarks.dask_matmul --n 32768 --chunk 4096 --workdir DIR [--memory-limit 16GB]
        [--dask-limit 300] [--cluster] [--json FILE]

On Zarr inputs written as a zarr-python user would (zstd, ``--chunk`` square chunks), warm:

- ``oocgemm.multiply(a, b, c)``, paths in, path out;
- ``oocgemm.dask.matmul(da.from_zarr(a), da.from_zarr(b)).to_zarr(c)`` under the threaded
  scheduler, and with ``--cluster`` under a ``dask.distributed.LocalCluster`` of one worker
  (one thread, the GPU);
- dask's own ``(x @ y).to_zarr(c)`` with CuPy chunks, stopped after ``--dask-limit`` seconds.

Targets (issue 19): >= 5x dask's own, within 10% of ``oocgemm.multiply``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from benchmarks.zarr_io import make_store, read_files
from benchmarks.zarr_product import _chunk_files, check, run_dask


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--memory-limit", default="16GB")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--dask-limit", type=float, default=300)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--json", default=None)
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
                          threads=args.threads)
        print(f"made {path}: {made['stored_bytes'] / 1e9:.2f} GB stored", flush=True)
    doc = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "chunk": args.chunk,
           "memory_limit": args.memory_limit}

    def warm():
        read_files(_chunk_files(a) + _chunk_files(b), args.threads)

    def out(name):
        path = os.path.join(work, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    warm()
    c1 = out("c-multiply.zarr")
    doc["multiply"] = _timed(lambda: oocgemm.multiply(
        a, b, c1, device=args.device, memory_limit=args.memory_limit, progress=False))
    print(f"oocgemm.multiply: {doc['multiply']:.2f} s, rel. error {check(c1, a, b):.1e}",
          flush=True)

    warm()
    c2 = out("c-dask-matmul.zarr")
    z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.device,
                     memory_limit=args.memory_limit)
    doc["tasks"] = len(z.dask)
    with dask.config.set(scheduler="threads", num_workers=args.threads):
        doc["dask_matmul"] = _timed(lambda: z.to_zarr(c2))
    print(f"oocgemm.dask.matmul -> to_zarr: {doc['dask_matmul']:.2f} s, {doc['tasks']} tasks, "
          f"chunks {z.chunksize}, rel. error {check(c2, a, b):.1e}", flush=True)

    if args.cluster:
        import distributed

        warm()
        c3 = out("c-cluster.zarr")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster):
            z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.device,
                             memory_limit=args.memory_limit)
            doc["cluster"] = _timed(lambda: z.to_zarr(c3))
        print(f"  the same through a LocalCluster of one GPU worker: {doc['cluster']:.2f} s, "
              f"rel. error {check(c3, a, b):.1e}", flush=True)

    warm()
    own = run_dask(a, b, out("c-dask.zarr"), args.threads, False, args.dask_limit)
    doc["dask_own"] = own["wall"]
    print("dask's own x @ y (CuPy chunks) -> to_zarr: "
          + (f"{own['wall']:.2f} s" if own["wall"] else f"not finished after {args.dask_limit:.0f} s"),
          flush=True)
    base = own["wall"] or args.dask_limit
    print(f"oocgemm.dask.matmul: {base / doc['dask_matmul']:.1f}x dask's own"
          + ("" if own["wall"] else " (at least)")
          + f", {doc['dask_matmul'] / doc['multiply']:.2f} x the time of oocgemm.multiply")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    for p in (a, b):
        shutil.rmtree(p, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

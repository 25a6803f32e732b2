"""oocgemm.dask.matmul on a LocalCluster of 1, 2, 4 worker processes: what each worker decodes
and computes, beside the scaling model's bytes for the same layout (docs/scaling.md).

    python -m benchmarks.dask_scaling --workdir DIR [--n 4096] [--chunk 512] [--workers 1,2,4]
        [--threads 1] [--groups ROWS,COLS (a grid of groups forced; default: the library's)]
        [--json FILE]

Inputs: two n x n float64 Zarr v3 stores of zstd ``--chunk``² chunks (``make_store``, kept in
DIR for the next call). For each worker count p: ``distributed.LocalCluster(n_workers=p,
threads_per_worker=--threads, processes=True)``, BLAS limited to cores / p threads a worker,
and ``oocgemm.dask.matmul(da.from_zarr(a), da.from_zarr(b), device="cpu", trace_dir=...)
.to_zarr(c)``, timed, C checked on sampled rows.

Per worker (one process): its runs (groups), flops and their share, seconds busy (its runs'
seconds summed: a process runs one group at a time), the chunks its runs took and the bytes
(``Result.chunks`` in the trace files), and the chunks the process decoded (counted in
``SharedChunks``, which the runs of one process share; a run of the whole product alone
decodes for itself). Balance: mean / most of the workers' flops, idle workers counted (the
``devices`` line of ``oocgemm.dask.timeline`` uses the same definition over the workers that
ran, and is given beside). Model: each group reads its A rows and B columns once, whole
chunks (``scaling_model.group_reads``); its total against the measured decoded bytes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

import numpy as np

from benchmarks import scaling_model
from benchmarks.common import write_json

#: Per process: chunks decoded through ``SharedChunks`` and their bytes (see ``_count``).
COUNTS = {"decodes": 0, "bytes": 0}


def _count() -> bool:
    """In a worker: count every chunk ``SharedChunks`` decodes (a decode that another run of
    the process finds decoded is not one)."""
    from oocgemm.dask import sharing

    cls = sharing.SharedChunks
    if getattr(cls.get, "counted", False):
        return True
    original = cls.get

    def get(self, key, decode):
        def counted():
            array = decode()
            COUNTS["decodes"] += 1
            COUNTS["bytes"] += array.nbytes
            return array
        return original(self, key, counted)

    get.counted = True  # type: ignore[attr-defined]
    cls.get = get  # type: ignore[method-assign]
    return True


def _reset() -> bool:
    COUNTS.update(decodes=0, bytes=0)
    return True


def forced_bounds(n: int, groups: tuple[int, int]) -> list[list[int]]:
    """Row and column bounds of ``groups`` (counts along rows and columns), sizes evened
    out."""
    return [[round(i * n / g) for i in range(g + 1)] for g in groups]


def graph_bounds(z) -> list[list[int]]:
    """The row and column bounds of a ``matmul`` graph's groups, read from its group tasks
    (each holds the rows of A and the columns of B it reads: stored specs)."""
    rows, cols = {0}, {0}
    for task in z.dask.layers[z.name + "-groups"].values():
        a_spec, b_spec = task[1], task[2]
        rows.update(a_spec[2])  # ["stored", array, rows, cols, transposed]
        cols.update(b_spec[3])
    return [sorted(rows), sorted(cols)]


def _per_worker(trace_dir: str, counts: dict[str, dict], workers: list[str]) -> dict:
    """Each worker's runs from the trace files, with its process's decode counts."""
    by = {w: {"runs": 0, "flops": 0.0, "seconds": 0.0, "taken": 0, "taken_bytes": 0}
          for w in workers}
    for path in glob.glob(os.path.join(trace_dir, "task-*.json")):
        with open(path) as f:
            doc = json.load(f)
        w = by.setdefault(doc["worker"], {"runs": 0, "flops": 0.0, "seconds": 0.0,
                                          "taken": 0, "taken_bytes": 0})
        w["runs"] += 1
        w["flops"] += doc["flops"]
        w["seconds"] += doc["seconds"]
        for op in doc["chunks"].values():
            w["taken"] += op.get("decodes", 0)
            w["taken_bytes"] += op.get("decoded_bytes", 0)
    for name, w in by.items():
        c = counts.get(name, {"decodes": 0, "bytes": 0})
        w["shared_decodes"], w["shared_bytes"] = c["decodes"], c["bytes"]
        # runs that shared nothing (a group that is the whole product) decoded for themselves
        w["decoded_bytes"] = c["bytes"] if c["decodes"] else w["taken_bytes"]
    return by


def balance(values: list[float]) -> float:
    """mean / most (1: even; 1/p: one of p did everything)."""
    most = max(values) if values else 0
    return sum(values) / len(values) / most if most else 0.0


def one_count(args, p: int, a: str, b: str, work: str) -> dict:
    import logging

    import dask.array as da
    import distributed
    import zarr

    import oocgemm.dask as odask

    blas = str(max(1, (os.cpu_count() or 1) // p))
    env = {k: blas for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    trace = os.path.join(work, f"trace-{p}")
    c = os.path.join(work, f"c-{p}.zarr")
    with distributed.LocalCluster(n_workers=p, threads_per_worker=args.threads, processes=True,
                                  dashboard_address=None, silence_logs=logging.ERROR,
                                  env=env) as cluster, distributed.Client(cluster) as client:
        client.wait_for_workers(p)
        client.run(_count)
        bounds = forced_bounds(args.n, args.groups) if args.groups else None
        sizes = tuple(np.diff(x).tolist() for x in bounds) if bounds else None
        times = []
        for _ in range(args.repeat):
            shutil.rmtree(trace, ignore_errors=True)
            shutil.rmtree(c, ignore_errors=True)
            client.run(_reset)
            z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device="cpu", trace_dir=trace,
                             groups=sizes)
            start = time.perf_counter()
            z.to_zarr(c)
            times.append(time.perf_counter() - start)
        counts = {c.pop("name"): c for c in client.run(_counts_named).values()}
    tasks = len(z.dask.layers[z.name + "-groups"])
    bounds = graph_bounds(z)  # the library's layout (under this Client), or the forced one
    by = _per_worker(trace, counts, sorted(counts))
    flops = [w["flops"] for w in by.values()]
    total_flops = sum(flops) or 1
    for w in by.values():
        w["flops_share"] = w["flops"] / total_flops
    inputs = 2 * args.n * args.n * 8
    predicted = scaling_model.group_reads(bounds[0], bounds[1], args.n, args.chunk)
    decoded = sum(w["decoded_bytes"] for w in by.values())
    line = next((ln.strip() for ln in str(odask.timeline(trace)).splitlines()
                 if ln.strip().startswith("devices") or "balance" in ln), "")
    rows = np.random.default_rng(p).choice(args.n, 4, replace=False)
    want = zarr.open_array(a)[sorted(rows)] @ zarr.open_array(b)[:]
    got = zarr.open_array(c)[sorted(rows)]
    shutil.rmtree(c, ignore_errors=True)
    return {
        "workers": p, "threads": args.threads, "seconds": min(times),
        "times": [round(t, 3) for t in times],
        "groups": [len(bounds[0]) - 1, len(bounds[1]) - 1], "group_tasks": tasks,
        "group_bounds": bounds,
        "per_worker": by,
        "balance_flops": balance(flops),
        "balance_busy": balance([w["seconds"] for w in by.values()]),
        "timeline_devices": line,
        "input_bytes": inputs, "decoded_bytes": decoded,
        "decoded_over_inputs": decoded / inputs,
        "model_group_bytes": predicted, "model_total": sum(predicted),
        "measured_over_model": decoded / sum(predicted),
        "model_per_worker_even": sum(predicted) / p,
        "max_rel_error": float(np.abs(got - want).max() / np.abs(want).max()),
    }


def _counts_named() -> dict:
    """This process's counts, under the trace files' name of the worker ('host:pid')."""
    import socket

    return {**COUNTS, "name": f"{socket.gethostname()}:{os.getpid()}"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--groups", default=None,
                        help="ROWS,COLS: a grid of groups (default: the library's layout)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    args.groups = tuple(int(x) for x in args.groups.split(",")) if args.groups else None

    from benchmarks.zarr_stores import make_store

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    paths = []
    for seed, name in ((1, "a"), (2, "b")):
        path = os.path.join(work, f"{name}-{args.n}-{args.chunk}.zarr")
        if not os.path.exists(os.path.join(path, "zarr.json")):
            make_store(path, n=args.n, chunk=args.chunk, layout="v3", seed=seed,
                       threads=os.cpu_count() or 1)
        paths.append(path)
    cases = []
    for p in (int(x) for x in args.workers.split(",")):
        case = one_count(args, p, *paths, work)
        cases.append(case)
        print(f"{p} worker(s), groups {case['groups'][0]}x{case['groups'][1]}: "
              f"{case['seconds']:.2f} s; flops "
              + ", ".join(f"{w['flops_share']:.0%}" for w in case["per_worker"].values())
              + f"; balance {case['balance_flops']:.2f} (flops), {case['balance_busy']:.2f} "
              f"(busy); decoded {case['decoded_bytes'] / 1e6:.0f} MB = "
              f"{case['decoded_over_inputs']:.2f}x the inputs, model "
              f"{case['model_total'] / 1e6:.0f} MB ({case['measured_over_model']:.2f}x); "
              f"error {case['max_rel_error']:.1e}", flush=True)
    write_json(args.json, {"date": time.strftime("%Y-%m-%d"), "n": args.n,
                           "chunk": args.chunk, "cores": os.cpu_count(), "cases": cases})
    return 0


if __name__ == "__main__":
    sys.exit(main())

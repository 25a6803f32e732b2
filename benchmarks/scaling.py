"""One product on 1, 2, ... GPUs of one machine, in one run (issue 22).

    python -m benchmarks.scaling --n 65536 [--gpus 1,2,4] [--repeat 2]
        [--xt (cuBLASXt on the same GPUs, operands pinned in place, block dim 8192)]
        [--zarr DIR (the same from Zarr stores in DIR, beside the storage floor)] [--chunk 4096]
        [--dask (with --zarr: oocgemm.dask.matmul on a cluster of one worker per GPU)]
        [--trace DIR (the widest runs' timelines)] [--json FILE] [--cpu (CPU executors, a check
        of this script)]

From host memory: float64 operands of n x n (normal random numbers, made by every core), the
product into a preallocated numpy array. For each GPU count g: ``oocgemm.multiply`` with
``device=['cuda:0', ..., 'cuda:g-1']`` (one GPU: ``'cuda:0'``), its seconds, TFLOP/s, the
blocks of each GPU, and the parallel efficiency t(1) / (g t(g)), t the best of ``--repeat``
runs (the first of them also starts each GPU's context and pools); with ``--xt``,
``cublasXtDgemm`` on the same GPUs from the same arrays, pinned in place.

With ``--zarr DIR``: the operands as Zarr v3 stores of zstd ``--chunk``² chunks (as a
zarr-python user writes them), Zarr -> Zarr with the same GPU counts, warm, beside the
storage floor measured in the same run (every chunk file read cold, and the output's bytes
written, by plain file I/O from every core). With ``--dask`` too: ``oocgemm.dask.matmul(
da.from_zarr(a), da.from_zarr(b)).to_zarr(c)`` on a ``dask.distributed`` cluster of g worker
processes, each seeing only its own GPU (``CUDA_VISIBLE_DEVICES``) with ``resources={"GPU":
1}``, as the README's recipe starts them.

Every product is checked on sampled rows against a float64 reference on the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import max_relative_error, write_json
from oocgemm import machine

XT_BLOCK = 8192
"""cuBLASXt's block dim."""


def operands(n: int, seed: int = 0, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two n x n float64 arrays of normal random numbers, row bands made in parallel (each
    band from its own stream, so the result does not depend on the thread count)."""
    threads = threads or machine.cores()
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


def devices(kind: str, g: int):
    """What ``device=`` names g devices of ``kind``: one device, or a list of them."""
    if kind == "cpu":
        return "cpu" if g == 1 else ["cpu"] * g
    return "cuda:0" if g == 1 else [f"cuda:{i}" for i in range(g)]


def worker_cluster(g: int, threads: int, kind: str):
    """A ``dask.distributed`` cluster of g worker processes, each seeing only its own GPU and
    offering one unit of the ``GPU`` resource (on the CPU: g plain workers)."""
    import logging

    from distributed import Nanny, Scheduler, SpecCluster

    def options(i):
        extra = {"env": {"CUDA_VISIBLE_DEVICES": str(i)}} if kind == "cuda" else {}
        return {"nthreads": threads, "resources": {"GPU": 1}, "silence_logs": logging.ERROR,
                **extra}

    workers = {f"worker-{i}": {"cls": Nanny, "options": options(i)} for i in range(g)}
    return SpecCluster(workers=workers, silence_logs=logging.ERROR,
                       scheduler={"cls": Scheduler, "options": {"dashboard_address": None}})


class Table:
    """The cases measured, each printed as it comes, with its efficiency against the same
    case on one device."""

    def __init__(self, flops: float):
        self.flops = flops
        self.cases: list[dict] = []

    def add(self, name: str, g: int, times: list[float], error: float, **extra) -> dict:
        seconds = min(times)
        case = {"case": name, "gpus": g, "seconds": seconds,
                "tflops": self.flops / seconds / 1e12, "times": [round(t, 2) for t in times],
                "error": error, **extra}
        base = next((x for x in self.cases if x["case"] == name and x["gpus"] == 1), None)
        if base is not None:
            case["efficiency"] = base["seconds"] / (g * seconds)
        self.cases.append(case)
        print(f"{name:13} {g} device(s): {seconds:7.2f} s, {case['tflops']:6.2f} TFLOP/s"
              + (f", efficiency {case['efficiency']:.1%}" if "efficiency" in case else "")
              + f", rel. error {error:.1e}"
              + "".join(f", {k} {v:.3g}" if isinstance(v, float) else f", {k} {v}"
                        for k, v in extra.items()), flush=True)
        return case


def _shares(result) -> dict:
    return {name: f"{d['blocks']} blocks" for name, d in (result.devices or {}).items()}


def _save_trace(result, trace: str | None, name: str) -> None:
    if trace:
        os.makedirs(trace, exist_ok=True)
        result.timeline.save(os.path.join(trace, f"{name}.json"))


def from_host(args, table: Table, counts: list[int]) -> None:
    import oocgemm

    n = args.n
    start = time.perf_counter()
    a, b = operands(n)
    c = np.empty((n, n))
    c[:] = np.nan  # poisoned, and its pages mapped before any timing
    rows = np.random.default_rng(1).choice(n, 8, replace=False)
    print(f"n={n}: operands {a.nbytes / 1e9:.1f} GB each in host memory, made in "
          f"{time.perf_counter() - start:.1f} s", flush=True)

    def error():
        got = max_relative_error(np.asarray(c[rows]), a[rows] @ b)
        c[rows] = np.nan  # the next case must write them again
        return got

    for g in counts:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            r = oocgemm.multiply(a, b, c, device=devices(args.kind, g), progress=False)
            times.append(time.perf_counter() - start)
        table.add("multiply", g, times, error(), tile=list(r.plan.tile), shares=_shares(r))
        if g == max(counts):
            _save_trace(r, args.trace, f"multiply-{g}")

    if args.xt:
        from benchmarks.baselines import cublasxt_dgemm, pinned_in_place

        start = time.perf_counter()
        with pinned_in_place(a, b, c):
            print(f"  pinned in place in {time.perf_counter() - start:.1f} s", flush=True)
            for g in counts:
                times = [cublasxt_dgemm(a, b, c, XT_BLOCK, device=list(range(g)))
                         for _ in range(args.repeat)]
                table.add("cublasxt", g, times, error(), block=XT_BLOCK)


def from_zarr(args, table: Table, counts: list[int]) -> dict:
    import oocgemm
    from benchmarks.storage_floor import product_floor, read_files
    from benchmarks.zarr_product import check
    from benchmarks.zarr_stores import make_store, store_files

    work = os.path.abspath(args.zarr)
    os.makedirs(work, exist_ok=True)
    a, b = os.path.join(work, "a.zarr"), os.path.join(work, "b.zarr")
    threads = machine.cores()
    for seed, path in ((1, a), (2, b)):
        made = make_store(path, n=args.n, chunk=args.chunk, layout="v3", seed=seed,
                          threads=threads)
        print(f"made {path}: {made['stored_bytes'] / 1e9:.2f} GB stored", flush=True)
    floor = product_floor([a, b], args.n * args.n * 8, work, threads)
    print(f"storage floor ({floor['cold'] or 'not cold'}): reads {floor['read_rate'] / 1e9:.2f} "
          f"GB/s, writes {floor['write_rate'] / 1e9:.2f} GB/s: {floor['seconds']:.2f} s for "
          f"the inputs' {floor['stored_bytes'] / 1e9:.1f} GB and the output's "
          f"{args.n * args.n * 8 / 1e9:.1f} GB", flush=True)
    files = store_files(a, b)
    out_options = {"chunks": (args.chunk, args.chunk), "compressors": "zstd:0"}

    def output(name):
        path = os.path.join(work, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    for g in counts:
        times = []
        for _ in range(args.repeat):
            read_files(files, threads)  # warm
            c = output(f"c-{g}.zarr")
            start = time.perf_counter()
            r = oocgemm.multiply(a, b, c, device=devices(args.kind, g),
                                 out_options=out_options, progress=False)
            times.append(time.perf_counter() - start)
        table.add("zarr", g, times, check(c, a, b), floor=floor["seconds"],
                  shares=_shares(r))
        shutil.rmtree(c, ignore_errors=True)
        if g == max(counts):
            _save_trace(r, args.trace, f"zarr-{g}")

    if args.dask:
        import dask.array as da
        import distributed

        import oocgemm.dask as odask

        for g in counts:
            times = []
            with worker_cluster(g, max(1, threads // g), args.kind) as cluster, \
                    distributed.Client(cluster) as client:
                client.wait_for_workers(g)
                for _ in range(args.repeat):
                    read_files(files, threads)
                    c = output(f"c-dask-{g}.zarr")
                    z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.kind,
                                     resources={"GPU": 1})
                    start = time.perf_counter()
                    z.to_zarr(c)
                    times.append(time.perf_counter() - start)
            table.add("dask cluster", g, times, check(c, a, b),
                      tasks=len(z.dask.layers[z.name + "-groups"]))
            shutil.rmtree(c, ignore_errors=True)
    for p in (a, b):
        shutil.rmtree(p, ignore_errors=True)
    return floor


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--xt", action="store_true")
    parser.add_argument("--zarr", default=None)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--dask", action="store_true")
    parser.add_argument("--cpu", dest="kind", action="store_const", const="cpu", default="cuda")
    parser.add_argument("--trace", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    counts = [int(g) for g in args.gpus.split(",")]
    if args.kind == "cuda":
        from oocgemm import cuda

        if max(counts) > cuda.device_count():
            print(f"asked for {max(counts)} GPUs, {cuda.device_count()} found", file=sys.stderr)
            return 2
    table = Table(2.0 * args.n ** 3)
    doc: dict = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "kind": args.kind}
    from_host(args, table, counts)
    if args.zarr:
        doc["floor"] = from_zarr(args, table, counts)
    doc["cases"] = table.cases
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One product on 1, 2, ... GPUs of one machine, in one run: one GPU, several in one process
(``device=[...]``) and dask workers, side by side (issues 22 and 50).

    python -m benchmarks scaling --n 49152 [--gpus 1,2,4] [--repeat 2]
        [--xt (cuBLASXt on the same GPUs, operands pinned in place, block dim 8192)]
        [--zarr DIR (the same from Zarr stores in DIR, beside the storage and decode floors)]
        [--chunk 4096] [--dask (with --zarr: oocgemm.dask.matmul in one process and on a
        cluster of one worker per GPU)] [--npy DIR (docs/dask.md's recipe from .npy inputs)]
        [--no-host (skip the products from host memory)] [--memory-limit SIZE (of the
        products from Zarr)] [--trace DIR (the widest runs' timelines)] [--json FILE]
        [--cpu (CPU executors, a check of this script)]

From host memory: float64 operands of n x n (normal random numbers, made by every core), the
product into a preallocated numpy array. For each GPU count g: ``oocgemm.multiply`` with
``device=['cuda:0', ..., 'cuda:g-1']`` (one GPU: ``'cuda:0'``), its seconds, TFLOP/s, the
blocks of each GPU, and the parallel efficiency t(1) / (g t(g)), t the best of ``--repeat``
runs (the first of them also starts each GPU's context and pools); with ``--xt``,
``cublasXtDgemm`` on the same GPUs from the same arrays, pinned in place.

With ``--zarr DIR``: the operands as Zarr v3 stores of zstd ``--chunk``² chunks (as a
zarr-python user writes them), Zarr -> Zarr (C in the same layout) with the same GPU counts,
warm, beside two floors measured in the same run: the storage's (every chunk file read cold,
and C's bytes written, by plain file I/O from every core) and the host's decode floor (every
chunk decoded once by the engine's own reader on every core, plus writing C). With ``--dask``
too: ``oocgemm.dask.matmul(da.from_zarr(a), da.from_zarr(b)).to_zarr(c)`` in one process
(threaded scheduler, one device) beside ``multiply`` into the same layout (C compared bit for
bit), and on a ``dask.distributed`` cluster of g worker processes, each seeing only its own
GPU (``CUDA_VISIBLE_DEVICES``) with ``resources={"GPU": 1}``, warmed as they start
(``oocgemm.dask.WarmUp``), as docs/dask.md's recipe starts them: its first run and the later
ones, the workers' balance (mean over most of their flops), the bytes they decoded over the
inputs', and that work's own floor (those decodes at the host's decode rate, plus writing
C). ``--npy DIR``: the recipe from ``.npy`` inputs, C into an uncompressed Zarr store.

Every product is checked on sampled rows against a float64 reference on the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import max_relative_error, run_parallel, write_json
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


def decode_floor(paths: list[str], threads: int) -> dict:
    """The host's decode floor: every chunk of each store decoded once by the engine's own
    reader (``ZarrSource.read_chunk``, decoding straight into a buffer), on ``threads``
    threads, each into a buffer of its own faulted in before the clock starts."""
    from oocgemm.storage import open_source

    sources = [open_source(p, "input") for p in paths]
    items = [(src, (i, j)) for src in sources
             for i in range(-(-src.shape[0] // src.chunks[0]))
             for j in range(-(-src.shape[1] // src.chunks[1]))]
    local = threading.local()

    def decode(item) -> None:
        src, (i, j) = item
        rows = min(src.chunks[0], src.shape[0] - i * src.chunks[0])
        cols = min(src.chunks[1], src.shape[1] - j * src.chunks[1])
        buffer = getattr(local, "buffer", None)
        if buffer is None or buffer.size < rows * cols:
            buffer = local.buffer = np.ones(src.chunks[0] * src.chunks[1], dtype=src.dtype)
        src.read_chunk((i, j), buffer[:rows * cols].reshape(rows, cols))

    decoded = sum(src.shape[0] * src.shape[1] * src.dtype.itemsize for src in sources)
    start = time.perf_counter()
    run_parallel(decode, items, threads)
    seconds = time.perf_counter() - start
    for src in sources:
        src.close()
    return {"decoded_bytes": decoded, "seconds": seconds, "rate": decoded / seconds,
            "threads": threads}


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
    c_bytes = args.n * args.n * 8
    floor = product_floor([a, b], c_bytes, work, threads)
    print(f"storage floor ({floor['cold'] or 'not cold'}): reads {floor['read_rate'] / 1e9:.2f} "
          f"GB/s, writes {floor['write_rate'] / 1e9:.2f} GB/s: {floor['seconds']:.2f} s for "
          f"the inputs' {floor['stored_bytes'] / 1e9:.1f} GB and the output's "
          f"{c_bytes / 1e9:.1f} GB", flush=True)
    files = store_files(a, b)
    read_files(files, threads)  # warm
    decode = decode_floor([a, b], threads)
    write = c_bytes / floor["write_rate"]
    floor["decode"] = decode
    floor["host"] = decode["seconds"] + write
    print(f"host decode floor: A and B decoded once by the engine's reader on {threads} "
          f"threads in {decode['seconds']:.2f} s ({decode['rate'] / 1e9:.2f} GB/s), C written "
          f"in {write:.2f} s: {floor['host']:.2f} s", flush=True)
    # the output as the inputs are (zarr's defaults: zstd), multiply's and to_zarr's alike
    import zarr

    default = zarr.create_array(store=zarr.storage.MemoryStore(), shape=(1, 1), dtype="f8")
    out_options = {"chunks": (args.chunk, args.chunk), "compressors": default.compressors}

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
                                 out_options=out_options, progress=False, events=True,
                                 **_limit(args))
            times.append(time.perf_counter() - start)
        table.add("zarr", g, times, check(c, a, b), floor=floor["seconds"],
                  host_floor=floor["host"], of_host_floor=min(times) / floor["host"],
                  shares=_shares(r), decoded=r.bytes.get("decoded", 0))
        shutil.rmtree(c, ignore_errors=True)
        if g == max(counts):
            _save_trace(r, args.trace, f"zarr-{g}")
    if args.dask:
        in_one_process(args, table, a, b, files, threads, out_options, output)
        on_workers(args, table, counts, a, b, files, threads, decode, write, output)
    for p in (a, b):
        shutil.rmtree(p, ignore_errors=True)
    return floor


def in_one_process(args, table, a, b, files, threads, out_options, output):
    """``oocgemm.dask.matmul(...).to_zarr`` under the threaded scheduler on one device,
    beside ``multiply`` into the same layout, alternately: their times, and whether C is
    bitwise the same."""
    import dask
    import dask.array as da
    import zarr

    import oocgemm
    import oocgemm.dask as odask
    from benchmarks.storage_floor import read_files

    times, base, by_chunks = [], [], []
    for _ in range(args.repeat):
        read_files(files, threads)
        c = output("c-multiply.zarr")
        start = time.perf_counter()
        oocgemm.multiply(a, b, c, device=devices(args.kind, 1), out_options=out_options,
                         progress=False, **_limit(args))
        base.append(time.perf_counter() - start)
        for way, into in ((times, "c-dask-local.zarr"), (by_chunks, "c-dask-chunks.zarr")):
            read_files(files, threads)
            z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=devices(args.kind, 1),
                             **_limit(args))
            if way is by_chunks:  # the graph as a plain dask array: chunk tasks, dask's store
                z = da.Array(z.dask, z.name, z.chunks, dtype=z.dtype)
            d = output(into)
            start = time.perf_counter()
            with dask.config.set(scheduler="threads"):
                z.to_zarr(d)
            way.append(time.perf_counter() - start)
    d, e = (os.path.join(os.path.dirname(c), name)
            for name in ("c-dask-local.zarr", "c-dask-chunks.zarr"))
    want = zarr.open_array(c, mode="r")[...]
    same = bool(np.array_equal(want, zarr.open_array(d, mode="r")[...]))
    same_chunks = bool(np.array_equal(want, zarr.open_array(e, mode="r")[...]))
    table.add("dask local", 1, times, 0.0, multiply=min(base), multiply_times=[
        round(t, 2) for t in base], of_multiply=min(times) / min(base), bitwise=same,
        by_chunks=[round(t, 2) for t in by_chunks],
        by_chunks_of_multiply=min(by_chunks) / min(base), by_chunks_bitwise=same_chunks)
    for path in (c, d, e):
        shutil.rmtree(path, ignore_errors=True)


def on_workers(args, table, counts, a, b, files, threads, decode, write, output):
    """docs/dask.md's recipe: a scheduler and one worker process per device (``resources={"GPU":
    1}``), warmed as they start (``oocgemm.dask.WarmUp``); per device count its first run on
    fresh workers and its later runs, the balance of the workers' flops, and what they
    decoded against the inputs and against that work's own floor on this host (those
    decodes at the host's decode rate, plus writing C)."""
    import dask.array as da
    import distributed

    import oocgemm.dask as odask
    from benchmarks.storage_floor import read_files
    from benchmarks.zarr_product import check

    inputs = decode["decoded_bytes"]
    for g in counts:
        times, reports = [], []
        with worker_cluster(g, max(1, threads // g), args.kind) as cluster, \
                distributed.Client(cluster) as client:
            client.wait_for_workers(g)
            start = time.perf_counter()
            client.register_plugin(odask.WarmUp(device=args.kind, **_limit(args)))
            warmed = time.perf_counter() - start
            for at in range(args.repeat + 1):
                read_files(files, threads)
                c = output(f"c-dask-{g}.zarr")
                trace = output(f"trace-dask-{g}-{at}")
                z = odask.matmul(da.from_zarr(a), da.from_zarr(b), device=args.kind,
                                 resources={"GPU": 1}, trace_dir=trace, **_limit(args))
                start = time.perf_counter()
                z.to_zarr(c)
                times.append(time.perf_counter() - start)
                reports.append(_worker_report(odask.timeline(trace), inputs, decode, write))
        later = min(times[1:]) if len(times) > 1 else times[0]
        best = reports[times.index(later)]
        table.add("dask cluster", g, times[1:] or times, check(c, a, b), first=times[0],
                  first_of_later=times[0] / later, warm_up=warmed,
                  of_work_floor=later / best["work_floor"],
                  tasks=len(z.dask.layers[z.name + "-groups"]), **best)
        if args.trace:
            os.makedirs(args.trace, exist_ok=True)
            odask.timeline(trace).save(os.path.join(args.trace, f"dask-{g}.json"))
        shutil.rmtree(c, ignore_errors=True)


def from_npy(args, table: Table, counts: list[int]) -> None:
    """docs/dask.md's recipe from ``.npy`` inputs (a compute-bound product): one worker per device,
    each warmed as it starts, C into an uncompressed Zarr store; per device count the first
    run and the later ones."""
    import dask.array as da
    import distributed
    import zarr

    import oocgemm.dask as odask
    from benchmarks.storage_floor import read_files

    work = os.path.abspath(args.npy)
    os.makedirs(work, exist_ok=True)
    paths = [os.path.join(work, f"{name}.npy") for name in "ab"]
    x, y = operands(args.n)
    for path, value in zip(paths, (x, y)):
        np.save(path, value)
    rows = np.random.default_rng(1).choice(args.n, 8, replace=False)
    want = x[rows] @ y
    del x, y
    threads = machine.cores()
    for g in counts:
        times = []
        with worker_cluster(g, max(1, threads // g), args.kind) as cluster, \
                distributed.Client(cluster) as client:
            client.wait_for_workers(g)
            client.register_plugin(odask.WarmUp(device=args.kind))
            for _ in range(args.repeat + 1):
                read_files(paths, threads)
                c = os.path.join(work, f"c-{g}.zarr")
                shutil.rmtree(c, ignore_errors=True)
                z = odask.matmul(*paths, device=args.kind, resources={"GPU": 1})
                start = time.perf_counter()
                da.to_zarr(z, c, compressors=None)
                times.append(time.perf_counter() - start)
        got = zarr.open_array(c, mode="r").get_orthogonal_selection((rows, slice(None)))
        table.add("npy cluster", g, times[1:] or times, max_relative_error(got, want),
                  first=times[0], tasks=len(z.dask.layers[z.name + "-groups"]))
        shutil.rmtree(c, ignore_errors=True)
    for path in paths:
        os.remove(path)


def _limit(args) -> dict:
    """The products' ``memory_limit`` where ``--memory-limit`` gives one."""
    return {"memory_limit": args.memory_limit} if args.memory_limit else {}


def _worker_report(timeline, inputs: int, decode: dict, write: float) -> dict:
    """A graph's merged timeline as figures: balance (mean over most of the workers'
    flops), bytes decoded over the inputs' bytes, and the floor of that work here."""
    workers = timeline.meta["workers"]
    flops = [w["flops"] for w in workers.values()]
    decoded = sum(w["decoded"] for w in workers.values())
    own_floor = decoded / decode["rate"] + write
    return {"balance": sum(flops) / len(flops) / max(max(flops), 1), "workers": len(workers),
            "decoded_over_inputs": decoded / inputs, "work_floor": own_floor,
            "per_worker": {name: {k: w[k] for k in ("tasks", "decodes", "decoded", "seconds")}
                           for name, w in workers.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--xt", action="store_true")
    parser.add_argument("--zarr", default=None)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--dask", action="store_true")
    parser.add_argument("--npy", default=None)
    parser.add_argument("--no-host", action="store_true")
    parser.add_argument("--memory-limit", default=None)
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
    if not args.no_host:
        from_host(args, table, counts)
    if args.npy:
        from_npy(args, table, counts)
    if args.zarr:
        doc["floor"] = from_zarr(args, table, counts)
    doc["cases"] = table.cases
    write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``.npy`` inputs into a ``.npy`` output (issue 51), beside its two floors measured in the same
run: the product's compute (the same operands in memory, C into memory) and C's bytes stored at
the disk's rate (written from memory by several threads, fsynced); and the ways a C can reach a
file (written into a memmap, or with ``pwrite``) timed alone, so that the gap has a measured
cause.

    python -m benchmarks npy-product --workdir /tmp/npy --n 49152 [--repeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from benchmarks.common import max_relative_error, report, run_parallel
from benchmarks.storage_floor import read_files, write_files
from oocgemm import machine

#: Rows of C compared with numpy's.
SAMPLED_ROWS = 8


def remove(*paths: str) -> None:
    """The files a benchmark made, gone."""
    for path in paths:
        if os.path.exists(path):
            os.remove(path)


def make_npy(path: str, n: int, seed: int, threads: int) -> None:
    """An n x n float64 .npy of uniform random numbers, written in row bands by ``threads``."""
    if os.path.exists(path) and np.load(path, mmap_mode="r").shape == (n, n):
        return
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, n))
    band = max(1, -(-n // (threads * 4)))

    def fill(start: int) -> None:
        rng = np.random.default_rng([seed, start])
        out[start:start + band] = rng.random((min(band, n - start), n))

    run_parallel(fill, range(0, n, band), threads)
    out.flush()  # the map closes as make_npy returns (fill holds the name: no del here)


def write_ways(path: str, c: np.ndarray, threads: int) -> dict:
    """C's bytes into a new file two ways, each from ``threads`` threads in row bands, timed to
    the last write returning (the page cache holds them) and then to the fsync."""
    n = c.shape[0]
    band = max(1, -(-n // (threads * 4)))
    header = 128
    ways = {}

    def memmap_way():
        out = np.lib.format.open_memmap(path, mode="w+", dtype=c.dtype, shape=c.shape)

        def one(start):
            out[start:start + band] = c[start:start + band]

        return out, one

    def pwrite_way():
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, header + c.nbytes)

        def one(start):
            rows = c[start:start + band]
            os.pwrite(fd, memoryview(rows).cast("B"), header + start * n * c.itemsize)

        return fd, one

    for name, way in (("memmap", memmap_way), ("pwrite", pwrite_way)):
        begun = time.perf_counter()
        handle, one = way()
        run_parallel(one, range(0, n, band), threads)
        written = time.perf_counter() - begun
        if isinstance(handle, int):
            os.fsync(handle)
            os.close(handle)
        else:
            handle.flush()
            del handle
        ways[name] = {"to_page_cache": written, "to_disk": time.perf_counter() - begun}
        os.remove(path)
    return ways


def product(a: str, b: str, c: str, options: dict) -> dict:
    """``multiply`` of the two files into ``c``, timed: the call's wall, the run's seconds,
    and each kind of event's busy seconds."""
    import oocgemm

    remove(c)
    os.sync()
    begun = time.perf_counter()
    r = oocgemm.multiply(a, b, c, progress=False, events=True, **options)
    wall = time.perf_counter() - begun
    busy: dict[str, float] = {}
    for e in r.events:
        busy[e.kind] = busy.get(e.kind, 0.0) + (e.end - e.start)
    return {"wall": wall, "seconds": r.seconds, "tile": list(r.plan.tile),
            "predicted": r.plan.prediction.total, "predicted_parts": r.plan.prediction.parts(),
            "decisions": list(r.plan.decisions), "busy": busy}


def main(argv=None) -> int:
    import oocgemm

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--n", type=int, default=49152)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--memory-limit", default=None)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", action="store_true", help="leave the inputs for a later run")
    args = parser.parse_args(argv)

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    a, b, c = (os.path.join(work, f"{name}.npy") for name in "abc")
    threads = machine.cores()
    for seed, path in ((1, a), (2, b)):
        make_npy(path, args.n, seed, threads)
    options = {"device": args.device}
    if args.memory_limit:
        options["memory_limit"] = args.memory_limit
    c_bytes = args.n * args.n * 8
    doc: dict = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "options": options,
                 "threads": threads}

    written, seconds = write_files(work, c_bytes, threads)
    doc["store_floor"] = {"seconds": seconds, "GB/s": written / seconds / 1e9}
    read_files([a, b], threads)

    a_mem, b_mem = np.load(a), np.load(b)
    oocgemm.multiply(a_mem[:4096, :4096], b_mem[:4096, :4096], progress=False, **options)
    computed = []
    for _ in range(args.repeat):
        begun = time.perf_counter()
        c_mem = np.asarray(oocgemm.multiply(a_mem, b_mem, progress=False, **options))
        computed.append(time.perf_counter() - begun)
    doc["compute"] = min(computed)
    doc["write_ways"] = write_ways(os.path.join(work, "ways.npy"), c_mem, threads)

    runs = [product(a, b, c, options) for _ in range(args.repeat)]
    best = min(runs, key=lambda r: r["wall"])
    doc["npy_product"] = best
    doc["npy_product_all"] = [r["wall"] for r in runs]
    rows = np.random.default_rng(0).choice(args.n, SAMPLED_ROWS, replace=False)
    doc["max_relative_error"] = max_relative_error(np.load(c, mmap_mode="r")[rows],
                                                   a_mem[rows] @ b_mem)
    bound = max(doc["compute"], doc["store_floor"]["seconds"])
    doc["of_bound"] = best["wall"] / bound
    del a_mem, b_mem, c_mem
    report(doc, args.json)
    remove(c)
    if not args.keep:
        remove(a, b)
    return 0 if doc["max_relative_error"] < 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())

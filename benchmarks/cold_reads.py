"""Chunk files read cold (issue 51): by method, nothing else running (decoded from an mmap of
the file, as a warm run does; the whole file read first, then decoded), beside the disk's raw
parallel rate; and a whole cold product in one warm process by the size of the disk queue's
window (``oocgemm.storage.chunked.COLD_WINDOW``), beside the storage floor.

    python -m benchmarks cold-reads --zarr /tmp/cold --n 32768 --chunk 4096 \\
        --methods mmap:4,mmap:16,pieces:1,read:16,read:32 --windows 256,512,1024
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import BenchError, remove_all, report, zarr_product_parser
from oocgemm import machine

#: How a chunk file is read: decoded from an mmap of it; read whole (one read) into a buffer,
#: then decoded; read whole in pieces at once (``DiskQueue.read``, as a cold run does), then
#: decoded; or only asked of the OS (``hint:KIB``: ``posix_fadvise(WILLNEED)`` KIB KiB a call,
#: 0 for one call a file, every file in turn on one thread as the head start does), the page
#: cache watched until it holds them.
METHODS = ("mmap", "read", "pieces", "hint")

#: How long the page cache is watched after the last hint (seconds).
HINT_PATIENCE = 10.0


def hint_by(step_kib: int, files: list[str]) -> dict:
    """Seconds until the page cache holds 99% of ``files`` after they are hinted in turn,
    ``step_kib`` KiB a call (0: one call a file), and the share it holds then."""
    from benchmarks.storage_floor import drop_caches
    from oocgemm.headstart import will_need
    from oocgemm.storage.files import cached_fraction

    drop_caches(files)
    begun = time.perf_counter()
    for path in files:
        if step_kib:
            will_need(path, step_kib << 10)
        else:
            will_need(path, max(os.path.getsize(path), 1))
    hinted = time.perf_counter() - begun
    held = cached_fraction(files) or 0.0
    while held < 0.99 and time.perf_counter() - begun < hinted + HINT_PATIENCE:
        time.sleep(0.05)
        held = cached_fraction(files) or 0.0
    return {"seconds": time.perf_counter() - begun, "hinted": hinted, "held": held}


def read_by(method: str, threads: int, jobs: list, files: list[str]) -> float:
    """Seconds to decode every chunk of ``jobs`` ((reader, index) pairs) cold, ``threads``
    at once, each into a buffer of its thread's."""
    from benchmarks.storage_floor import drop_caches
    from oocgemm.storage.chunked import DiskQueue

    shape = jobs[0][0].chunks
    local, count, lock = threading.local(), [0], threading.Lock()

    def buffers():
        if not hasattr(local, "out"):
            local.out = np.ones(shape)
            local.raw = bytearray(local.out.nbytes + 4096)
        return local.out, local.raw

    def one(job) -> None:
        reader, index = job
        out, raw = buffers()
        if method == "mmap":
            reader.read(index, out)
        elif method == "pieces":
            reader.read(index, out, DiskQueue.read)
        else:
            with open(reader.path(index), "rb") as f:
                got = f.readinto(raw)
            reader.codec.decode(memoryview(raw)[:got], out=out)
        with lock:
            count[0] += 1

    drop_caches(files)
    begun = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, jobs))
    if count[0] != len(jobs):
        raise BenchError(f"{count[0]} of {len(jobs)} chunks decoded")
    return time.perf_counter() - begun


def main(argv=None) -> int:
    import zarr

    import oocgemm
    import oocgemm.storage.chunked as chunked
    from benchmarks.storage_floor import drop_caches, product_floor, read_files
    from benchmarks.zarr_stores import product_stores, store_files
    from oocgemm.storage.zarr_store import direct_reader

    parser = zarr_product_parser(__doc__, n=32768, chunk=4096, device="auto",
                                 memory_limit="16GB")
    parser.add_argument("--methods", default="mmap:4,mmap:16,pieces:1,pieces:4,read:16,read:32",
                        help="METHOD:THREADS,... (methods: mmap, read, pieces; hint:KIB)")
    parser.add_argument("--windows", default="512",
                        help="MiB,...: a cold product for each window of the disk queue")
    args = parser.parse_args(argv)

    threads = machine.cores()
    a, b, c = product_stores(args.zarr, args.n, args.chunk, threads)
    work = os.path.dirname(a)
    files = store_files(a, b)
    stored = sum(os.path.getsize(f) for f in files)
    doc: dict = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "chunk": args.chunk,
                 "stored_bytes": stored}

    readers = [direct_reader(zarr.open_array(p, mode="r")) for p in (a, b)]
    if any(r is None or r.codec is None for r in readers):
        raise BenchError("the inputs are not compressed chunk files")
    grid = -(-args.n // args.chunk)
    jobs = [(r, (i, j)) for i in range(grid) for r in readers for j in range(grid)]

    def raw() -> float:
        drop_caches(files)
        nbytes, seconds = read_files(files, threads)
        return nbytes / seconds

    doc["raw_before"] = raw()
    doc["methods"] = []
    for spec in filter(None, args.methods.split(",")):
        method, _, count = spec.partition(":")
        if method not in METHODS:
            raise BenchError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
        if method == "hint":
            got = hint_by(int(count or 0), files)
            doc["methods"].append({"method": method, "step_kib": int(count or 0), **got,
                                   "rate": stored * got["held"] / got["seconds"]})
        else:
            seconds = read_by(method, int(count or 1), jobs, files)
            doc["methods"].append({"method": method, "threads": int(count or 1),
                                   "seconds": seconds, "rate": stored / seconds})
        print(doc["methods"][-1], flush=True)
    doc["raw_after"] = raw()

    floor = product_floor([a, b], args.n * args.n * 8, work, threads)
    doc["floor"] = floor
    options = dict(device=args.device, memory_limit=args.memory_limit, progress=False)
    remove_all(c)
    oocgemm.multiply(a, b, c, **options)  # the process's first run: not timed
    doc["windows"] = []
    default = chunked.COLD_WINDOW
    try:
        for mib in filter(None, args.windows.split(",")):
            chunked.COLD_WINDOW = int(mib) << 20
            remove_all(c)
            drop_caches(files)
            begun = time.perf_counter()
            r = oocgemm.multiply(a, b, c, **options)
            seconds = time.perf_counter() - begun
            events = r.events
            gemms = [e.start for e in events if e.kind == "gemm"]
            reads = [e.end for e in events if e.kind in ("read", "fetch")]
            doc["windows"].append({
                "window_mib": int(mib), "seconds": seconds, "of_floor": seconds / floor["seconds"],
                "first_gemm": min(gemms), "reads_done": max(reads)})
            print(doc["windows"][-1], flush=True)
    finally:
        chunked.COLD_WINDOW = default
    report(doc, args.json)
    remove_all(a, b, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The storage floor: how fast the disk under the stores reads their chunk files and writes C's
bytes, with no decoding at all; no Zarr reader or writer can beat it.

Parallel os-level reads of every chunk file, cold (after dropping the page cache) and warm, and
parallel writes with fsync of as many files as threads. ``python -m benchmarks.zarr_io floor``
prints them per store; `product_floor` is the floor of one Zarr -> Zarr product (zarr_product,
scaling). The other benchmarks warm the page cache, or drop it, with `read_files` and
`drop_caches` before their timed runs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import GB, gbps, markdown_table, run_parallel
from benchmarks.zarr_stores import StoreInfo, store_files


def drop_caches(files: Iterable[str]) -> str:
    """Evict ``files`` from the page cache before a cold measurement.

    Returns how: ``drop_caches`` (``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root),
    ``fadvise`` (``POSIX_FADV_DONTNEED`` on each file, where the former is not permitted), or ``""``
    when neither worked and the measurement is not cold.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"
    except (OSError, AttributeError):
        return ""


def read_files(files: Sequence[str], threads: int, block: int = 16 << 20) -> tuple[int, float]:
    """Read every file once on ``threads`` threads: os-level reads of ``block`` bytes into one
    buffer per thread, allocated and faulted in before the clock starts.

    Returns
    -------
    (bytes read, seconds)
    """
    order = sorted(files, key=os.path.getsize, reverse=True)
    threads = max(1, min(threads, len(order)))
    buffers = [np.ones(block, dtype=np.uint8) for _ in range(threads)]
    counts = [0] * threads
    lock = threading.Lock()
    todo = iter(order)

    def work(t: int) -> None:
        mv = memoryview(buffers[t])
        while True:
            with lock:
                p = next(todo, None)
            if p is None:
                return
            fd = os.open(p, os.O_RDONLY)
            try:
                while n := os.readv(fd, [mv]):
                    counts[t] += n
            finally:
                os.close(fd)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts), time.perf_counter() - t0


def write_files(folder: str, total: int, threads: int) -> tuple[int, float]:
    """Write ``total`` bytes as ``threads`` files of equal size into ``folder``, each fsynced.

    The files are removed afterwards. Returns (bytes written, seconds to the last fsync).
    """
    os.makedirs(folder, exist_ok=True)
    per = max(1, -(-total // threads))
    block = np.random.default_rng(0).integers(0, 256, size=min(per, 16 << 20), dtype=np.uint8)
    paths = [
        os.path.join(folder, f".zarr_io_write_floor_{os.getpid()}_{i}") for i in range(threads)
    ]

    def one(p: str) -> None:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = per
            while left:
                left -= os.write(fd, block[: min(left, len(block))])
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        t0 = time.perf_counter()
        run_parallel(one, paths, threads)
        seconds = time.perf_counter() - t0
    finally:
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
    return per * threads, seconds


def read_floor(infos: Sequence[StoreInfo], thread_counts: Sequence[int], cold: bool) -> list[dict]:
    """Each store's chunk files read at each thread count: warm (after a first read), and cold
    too with ``cold`` where the page cache can be dropped (``cold_how`` says how)."""
    records = []
    for threads in thread_counts:
        for info in infos:
            rec = {"path": info.path, "label": info.label, "files": len(info.files),
                   "stored_bytes": info.stored_bytes, "threads": threads}
            if cold and (how := drop_caches(info.files)):
                n, s = read_files(info.files, threads)
                rec.update(cold_bytes=n, cold_seconds=s, cold_how=how)
            else:
                read_files(info.files, threads)  # bring the files into the cache
            n, s = read_files(info.files, threads)
            rec.update(warm_bytes=n, warm_seconds=s)
            records.append(rec)
    return records


def read_table(records: list[dict]) -> str:
    """`read_floor`'s records as a Markdown table, GB/s of file bytes."""
    rows = [[Path(r["path"]).name, r["label"], r["files"], f"{r['stored_bytes'] / GB:.3f}",
             r["threads"],
             gbps(r.get("cold_bytes", 0), r.get("cold_seconds"))
             + (f" ({r['cold_how']})" if r.get("cold_how") else ""),
             gbps(r["warm_bytes"], r["warm_seconds"])] for r in records]
    return markdown_table(rows, ["store", "layout", "files", "stored GB", "threads",
                                 "cold read GB/s", "warm read GB/s"])


def write_floor(folder: str, total: int, thread_counts: Sequence[int]) -> list[dict]:
    """``total`` bytes written into ``folder`` at each thread count (`write_files`)."""
    records = []
    for threads in thread_counts:
        n, s = write_files(folder, total, threads)
        records.append({"folder": folder, "bytes": n, "threads": threads, "seconds": s})
    return records


def write_table(records: list[dict]) -> str:
    """`write_floor`'s records as a Markdown table."""
    rows = [[w["folder"], f"{w['bytes'] / GB:.3f}", w["threads"], f"{w['seconds']:.2f}",
             gbps(w["bytes"], w["seconds"])] for w in records]
    return markdown_table(rows, ["write folder", "GB", "files = threads", "s (to last fsync)",
                                 "write GB/s"])


def product_floor(stores: Sequence[str], c_bytes: int, workdir: str, threads: int) -> dict:
    """The storage floor of one product: the inputs' chunk files read cold, plus C's bytes
    written with fsync, each at its raw parallel rate."""
    files = store_files(*stores)
    how = drop_caches(files)
    nbytes, seconds = read_files(files, threads)
    read_rate = nbytes / seconds
    wrote, wseconds = write_files(os.path.join(workdir, "write-floor"), c_bytes, threads)
    write_rate = wrote / wseconds
    return {
        "cold": how,
        "stored_bytes": nbytes,
        "read_rate": read_rate,
        "write_rate": write_rate,
        "seconds": nbytes / read_rate + c_bytes / write_rate,
    }

"""Zarr -> Zarr at the speed of storage: oocgemm against its floors and against dask, in one run.

    python -m benchmarks.zarr_product --n 32768 --layout v3 --workdir DIR [--cold] [--dask]
        [--dask-limit 540] [--write-codecs none,zstd] [--plot FILE] [--trace FILE]

For one layout of float64 n x n inputs written the way a zarr-python user with its defaults
would (zstd; ``v3``: 4096² chunks; ``v3-sharded``: 4096² shards of 512² chunks), 16 threads
wherever threads are used and a GPU memory limit of 16 GB, it measures in this order:

- the storage floor: the stored input bytes over the raw parallel cold read rate of their
  files, plus C's bytes over the raw parallel write rate (fsync);
- the decode floor, warm: both inputs read and decoded whole, every chunk once, on 16 threads
  into memory with zarr-python (the decoder oocgemm uses), plus C written with the output's
  layout (oocgemm's default: uncompressed, chunks tiling the C blocks);
- the product's time at the device's sustained in-core GEMM rate (measured here, 16384^3);
- oocgemm ``multiply(a, b, c.zarr, memory_limit=...)``, cold (page cache dropped) and warm;
- with ``--dask``: dask's ``from_zarr`` -> CuPy blocks -> ``a @ b`` -> ``to_zarr`` on 16 threads,
  warm (and cold with ``--cold``).

Targets (issue 17): cold <= 1.15 x storage floor; warm <= 1.25 x max(decode floor, GEMM time);
oocgemm >= 5x faster than dask.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, BenchError
from benchmarks.storage_floor import drop_caches, product_floor, read_files
from benchmarks.zarr_stores import LAYOUTS, make_store, store_files
from oocgemm import machine

CHUNK = 4096
"""Side of the inputs' chunks (or shards), elements."""
THREADS = 16
"""Threads of every parallel read, decode, write and of dask's scheduler."""
MEMORY_LIMIT = "16GB"
"""GPU memory oocgemm may use."""


def read_whole(path: str, threads: int) -> tuple[int, float]:
    """Every chunk (inner chunk of a shard) decoded once, in parallel, into one array."""
    import zarr

    from oocgemm.storage.zarr_store import fast_reader

    arr = fast_reader(zarr.open_array(path, mode="r"), threads)  # the pipeline oocgemm uses
    out = np.empty(arr.shape, dtype=arr.dtype)
    out.fill(0)  # fault the pages in before the clock
    rows, cols = getattr(arr, "shards", None) or arr.chunks
    jobs = [(i, j) for i in range(0, arr.shape[0], rows) for j in range(0, arr.shape[1], cols)]

    def one(corner):
        i, j = corner
        out[i : i + rows, j : j + cols] = arr[i : i + rows, j : j + cols]

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, jobs))
    return out.nbytes, time.perf_counter() - start


def cpu_floor(a: str, b: str, work: str, n: int, codec: str, threads: int) -> dict:
    """The host's share of the product with an output of ``codec`` in CHUNK² chunks, on
    ``threads`` threads and nothing else: every input chunk decoded once from its file into
    memory (as oocgemm's readers do), then every chunk of an n x n C of random normal values
    encoded and written as its file (as oocgemm's encoders do). Warm: no product can end
    before its host has done this work. Also one chunk encoded alone (a core's rate)."""
    import zarr

    from oocgemm.storage.zarr_store import compressor, direct

    readers = [direct(zarr.open_array(p, mode="r")) for p in (a, b)]
    if any(r is None for r in readers):
        return {}
    grid = [(r, (i, j)) for r in readers for i in range(-(-n // r.chunks[0]))
            for j in range(-(-n // r.chunks[1]))]
    path = os.path.join(work, "cpu-floor.zarr")
    out = zarr.create_array(path, shape=(n, n), dtype="f8", chunks=(CHUNK, CHUNK),
                            compressors=compressor(codec), overwrite=True)
    writer = direct(out)
    block = np.random.default_rng(1).standard_normal((CHUNK, CHUNK))
    cells = [(i, j) for i in range(-(-n // CHUNK)) for j in range(-(-n // CHUNK))]
    buffers = threading.local()

    def decode(job):
        reader, index = job
        if getattr(buffers, "chunk", None) is None or buffers.chunk.shape != reader.chunks:
            buffers.chunk = np.empty(reader.chunks)
        reader.read(index, buffers.chunk)

    start = time.perf_counter()
    writer.write((0, 0), block)
    one = time.perf_counter() - start
    start, times = time.perf_counter(), os.times()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decode, grid))
        decoded = time.perf_counter() - start
        list(pool.map(lambda index: writer.write(index, block), cells))
    seconds, after = time.perf_counter() - start, os.times()
    shutil.rmtree(path, ignore_errors=True)
    return {"seconds": seconds, "decode": decoded, "encode": seconds - decoded,
            "cpu": after.user + after.system - times.user - times.system,
            "chunk_encode": one, "core_rate": block.nbytes / one}


def write_like_output(path: str, n: int, tile: tuple[int, int], threads: int,
                      codec: str = "none") -> tuple[float, int]:
    """(seconds, stored bytes) to write an n x n float64 array of random normal values (what a
    product of random inputs looks like to a codec) with oocgemm's default chunks and
    ``codec``, each writer thread taking whole chunk rows, synced to disk."""
    import zarr

    from oocgemm.storage.zarr_store import compressor, output_chunks

    chunks = output_chunks(tile, 8)
    arr = zarr.create_array(path, shape=(n, n), dtype="f8", chunks=chunks,
                            compressors=compressor(codec), overwrite=True)
    block = np.random.default_rng(1).standard_normal((chunks[0], n))
    starts = list(range(0, n, chunks[0]))

    def one(i):
        arr[i:i + chunks[0]] = block[:min(chunks[0], n - i)]

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, starts))
    os.sync()
    seconds = time.perf_counter() - start
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    shutil.rmtree(path, ignore_errors=True)
    return seconds, stored


def gemm_rate(size: int = 16384) -> float:
    """Sustained cuBLAS DGEMM rate in core, flop/s (best of three after a warm-up)."""
    import cupy

    a = cupy.random.standard_normal((size, size))
    b = cupy.random.standard_normal((size, size))
    c = a @ b
    best = float("inf")
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        c = cupy.matmul(a, b, out=c)
        cupy.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - start)
    del a, b, c
    cupy.get_default_memory_pool().free_all_blocks()
    return 2 * size**3 / best


def out_options(codec: str | None) -> dict | None:
    """The output layout of ``--out-codecs``: None for oocgemm's default (uncompressed,
    chunks tiling the C blocks), else CHUNK² chunks with ``codec`` ('none': uncompressed),
    what a dask user's ``to_zarr`` output looks like."""
    if codec is None:
        return None
    return {"chunks": (CHUNK, CHUNK), "compressors": None if codec == "none" else codec}


#: ``--out-codecs`` suffixes: who compresses C (``OOCGEMM_GPU_ENCODE``); none: oocgemm's
#: default (the GPU, where nvCOMP is found).
ENCODERS = {"gpu": "1", "host": "0", "last": "last", "frames": "frames"}

#: ``--out-codecs`` ending: the inputs decoded on the GPU (``OOCGEMM_GPU_DECODE=1``).
GPU_INPUTS = "+gpuin"


def split_codec(codec: str | None) -> tuple[str | None, dict]:
    """'zstd@last+gpuin' -> ('zstd', {'OOCGEMM_GPU_ENCODE': 'last', 'OOCGEMM_GPU_DECODE':
    '1'}): the codec and the environment it runs with (what is not named stays unset)."""
    env = {}
    if codec is not None and codec.endswith(GPU_INPUTS):
        codec, env["OOCGEMM_GPU_DECODE"] = codec[:-len(GPU_INPUTS)], "1"
    if codec is None or "@" not in codec:
        return codec, env
    codec, _, suffix = codec.partition("@")
    if suffix not in ENCODERS:
        raise BenchError(f"unknown encoder @{suffix}: expected one of "
                         f"{', '.join('@' + e for e in ENCODERS)}")
    return codec, {"OOCGEMM_GPU_ENCODE": ENCODERS[suffix], **env}


def stored_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
               for f in files)


def run_oocgemm(a: str, b: str, c: str, memory_limit: str, device: str, cold: bool,
                codec: str | None = None) -> dict:
    import oocgemm

    shutil.rmtree(c, ignore_errors=True)  # a new output, as a user's run writes: replacing
    os.sync()  # one deletes the old after the rename, which is not the product's time
    how = drop_caches(store_files(a, b)) if cold else ""
    codec, env = split_codec(codec)
    kept = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    start, times = time.perf_counter(), os.times()
    try:
        r = oocgemm.multiply(
            a, b, c, device=device, memory_limit=memory_limit, overwrite=True, progress=False,
            out_options=out_options(codec),
        )
    finally:
        for name, value in kept.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    wall, after = time.perf_counter() - start, os.times()
    return {
        "cold": how,
        "wall": wall,
        "cpu": after.user + after.system - times.user - times.system,
        "run": r.seconds,
        "tflops": r.flops / wall / 1e12,
        "tile": list(r.plan.tile),
        "chunks": r.chunks,
        "bytes": r.bytes,
        "predicted": r.plan.prediction.total,
        "stored": stored_bytes(c),
        "bound": r.plan.prediction.bound,
        "encoder": r.out_encoder or "host",
        "result": r,
    }


def _dask_product(a: str, b: str, c: str, threads: int) -> None:
    """The baseline in this process: prints ``start`` when its clock starts, then its seconds."""
    import cupy
    import dask
    import dask.array as da

    x = da.from_zarr(a).map_blocks(cupy.asarray, dtype="f8")
    y = da.from_zarr(b).map_blocks(cupy.asarray, dtype="f8")
    z = (x @ y).map_blocks(cupy.asnumpy, dtype="f8")
    print("start", flush=True)
    start = time.perf_counter()
    with dask.config.set(scheduler="threads", num_workers=threads):
        z.to_zarr(c, overwrite=True)
    print(time.perf_counter() - start, flush=True)


def run_dask(a: str, b: str, c: str, threads: int, cold: bool, limit: float) -> dict:
    """dask's ``from_zarr`` -> CuPy -> ``@`` -> ``to_zarr`` in a child process, stopped after
    ``limit`` seconds of its clock (then ``wall`` is None: it took longer than ``limit``)."""
    shutil.rmtree(c, ignore_errors=True)
    os.sync()
    how = drop_caches(store_files(a, b)) if cold else ""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.zarr_product", "_dask", a, b, c, str(threads)],
        stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "start":
            raise RuntimeError(f"the dask baseline failed to start (exit {child.wait()})")
        timer = threading.Timer(limit, child.kill)
        timer.start()
        line = child.stdout.readline().strip()
        timer.cancel()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    shutil.rmtree(c, ignore_errors=True)
    return {"cold": how, "wall": float(line) if line else None, "limit": limit}


def check(c: str, a: str, b: str, rows: int = 64) -> float:
    """Max relative error of a few rows of C against numpy."""
    import zarr

    za, zb, zc = (zarr.open_array(p, mode="r") for p in (a, b, c))
    sample = np.random.default_rng(7).choice(za.shape[0], size=rows, replace=False)
    sample.sort()
    want = za.get_orthogonal_selection((sample, slice(None))) @ zb[:]
    got = zc.get_orthogonal_selection((sample, slice(None)))
    return float(np.abs(got - want).max() / np.abs(want).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--layout", choices=LAYOUTS, default="v3")
    parser.add_argument("--chunk", type=int, default=CHUNK,
                        help=f"side of the inputs' chunks (or shards), default {CHUNK}")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check this script")
    parser.add_argument("--cold", action="store_true", help="also run cold (drops caches)")
    parser.add_argument("--dask", action="store_true", help="also run the dask baseline")
    parser.add_argument("--dask-limit", type=float, default=540,
                        help="seconds after which a dask run is stopped and reported as "
                             "taking longer (default 540)")
    parser.add_argument("--write-codecs", default="none",
                        help="output codecs whose write of C to time, comma list; the first "
                             "is the decode floor's (oocgemm's default output: none)")
    parser.add_argument("--out-codecs", default=None,
                        help="comma list of output codecs (none, zstd, blosc, ...) to run "
                             "oocgemm with, each into 4096² chunks; a suffix says who "
                             "compresses C (OOCGEMM_GPU_ENCODE): @gpu the GPU (=1, the "
                             "default), @host the host whole chunks (=0), @last the GPU most "
                             "of the last block, @frames the host a stripe at a time; ending "
                             "+gpuin: the inputs decoded on the GPU "
                             "(OOCGEMM_GPU_DECODE=1); default: oocgemm's default output only")
    parser.add_argument("--plot", default=None, help="PNG of the warm run's timeline")
    parser.add_argument("--trace", default=None, help="Perfetto JSON of the warm run")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_dask"]:  # internal: the dask baseline in its own process
        _dask_product(*argv[1:4], int(argv[4]))
        return 0
    args = parser.parse_args(argv)

    work = os.path.abspath(args.workdir)
    os.makedirs(work, exist_ok=True)
    a, b = os.path.join(work, "a.zarr"), os.path.join(work, "b.zarr")
    c, cd = os.path.join(work, "c.zarr"), os.path.join(work, "c-dask.zarr")
    try:
        for seed, path in ((1, a), (2, b)):
            made = make_store(path, n=args.n, chunk=args.chunk, layout=args.layout, seed=seed,
                              threads=THREADS)
            say(f"made {path}: {made['stored_bytes'] / GB:.2f} GB stored in "
                f"{made['seconds']:.1f} s")
        floors(a, b, c, work, args)
        oocgemm_runs(a, b, c, args)
        if args.dask:
            dask_runs(a, b, cd, args)
    finally:
        for p in (a, b, c, cd):
            shutil.rmtree(p, ignore_errors=True)
    return 0


def say(text: str) -> None:
    print(text, flush=True)


def floors(a: str, b: str, c: str, work: str, args) -> None:
    """The storage floor, the decode floor and (on a GPU) the in-core GEMM time, printed."""
    c_bytes = args.n * args.n * 8
    floor = product_floor([a, b], c_bytes, work, THREADS)
    args.floor = {"read": floor["stored_bytes"] / floor["read_rate"],
                  "write_rate": floor["write_rate"]}
    say(f"storage floor ({floor['cold'] or 'NOT cold'}): read {floor['read_rate'] / GB:.2f} "
        f"GB/s, write {floor['write_rate'] / GB:.2f} GB/s -> {floor['seconds']:.2f} s")
    decoded = [read_whole(p, THREADS) for p in (a, b)]
    decode_s = sum(s for _, s in decoded)
    probe = None
    if args.device != "cpu":
        import oocgemm

        probe = oocgemm.plan(a, b, c, device=args.device, memory_limit=MEMORY_LIMIT)
    tile = probe.tile[:2] if probe else (CHUNK, CHUNK)
    writes = {codec: write_like_output(os.path.join(work, "write-probe.zarr"), args.n, tile,
                                       THREADS, codec)
              for codec in args.write_codecs.split(",")}
    for codec, (seconds, stored) in writes.items():
        say(f"write C with {codec}: {seconds:.2f} s, {stored / GB:.2f} GB stored "
            f"({c_bytes / seconds / GB:.2f} GB/s of data)")
    write_s = next(iter(writes.values()))[0]
    say(f"decode floor (warm): read+decode {decode_s:.2f} s "
        f"({sum(x for x, _ in decoded) / decode_s / GB:.2f} GB/s), write C {write_s:.2f} s "
        f"-> {decode_s + write_s:.2f} s")
    for codec in dict.fromkeys(split_codec(c)[0] for c in (args.out_codecs or "").split(",")):
        if codec:
            f = cpu_floor(a, b, work, args.n, codec, THREADS)
            if f:
                say(f"host floor, out {codec} (warm, {THREADS} threads): decode inputs "
                    f"{f['decode']:.2f} s + encode and write C {f['encode']:.2f} s = "
                    f"{f['seconds']:.2f} s (host CPU {f['cpu']:.1f} s); one chunk encoded "
                    f"alone {f['chunk_encode']:.3f} s "
                    f"({f['core_rate'] / GB:.2f} GB/s a core)")
    if probe is not None:
        rate = gemm_rate()
        say(f"in-core DGEMM {rate / 1e12:.1f} TFLOP/s -> {2 * args.n**3 / rate:.2f} s")
        say(str(probe))


def oocgemm_runs(a: str, b: str, c: str, args) -> None:
    """oocgemm cold (with ``--cold``) and warm, each checked, for each output codec; the
    warm run's timeline (its trace and plot for the first codec, the file name suffixed by
    the codec for the others). Cold runs say their storage floor counted with C's stored
    bytes."""
    codecs = args.out_codecs.split(",") if args.out_codecs else [None]
    for n, codec in enumerate(codecs):
        for cold in (True, False) if args.cold else (False,):
            if not cold:  # warm the page cache the way a user's second run would find it
                read_files(store_files(a, b), THREADS)
            r = run_oocgemm(a, b, c, MEMORY_LIMIT, args.device, cold, codec)
            result = r.pop("result")
            label = "oocgemm" + (f" out {codec}" if codec else "")
            cores = machine.cores()
            say(f"{label} {'cold' if cold else 'warm'}: {r['wall']:.2f} s (run {r['run']:.2f} "
                f"s, {r['tflops']:.2f} TFLOP/s, host CPU {r['cpu']:.1f} s = "
                f"{r['cpu'] / r['wall'] / cores:.0%} of {cores} cores, predicted "
                f"{r['predicted']:.2f} s "
                f"{r['bound']}-bound), C stored {r['stored'] / GB:.2f} GB, rel. error "
                f"{check(c, a, b):.1e}, tile {r['tile']}, C encoded by {r['encoder']}, chunks "
                f"{r['chunks']}")
            if cold and codec and args.floor:
                floor = args.floor["read"] + r["stored"] / args.floor["write_rate"]
                say(f"  storage floor with C's stored bytes: {floor:.2f} s -> "
                    f"{r['wall'] / floor:.2f}x")
            if not cold:
                tl = result.timeline
                stores = [e for e in tl.events if e.kind == "store"]
                last = max((e.end for e in tl.events if e.kind == "gemm"), default=0.0)
                say(str(tl))
                say(f"  stores: {len(stores)}, after the last GEMM {tl.end - last:.3f} s")
                suffix = "" if n == 0 else f"-{codec}"
                if args.trace:
                    tl.save(_suffixed(args.trace, suffix))
                if args.plot:
                    tl.plot(_suffixed(args.plot, suffix))


def _suffixed(path: str, suffix: str) -> str:
    root, ext = os.path.splitext(path)
    return root + suffix + ext


def dask_runs(a: str, b: str, c: str, args) -> None:
    """dask's own product cold (with ``--cold``) and warm, each stopped after ``--dask-limit``."""
    for cold in (True, False) if args.cold else (False,):
        if not cold:
            read_files(store_files(a, b), THREADS)
        d = run_dask(a, b, c, THREADS, cold, args.dask_limit)
        took = (f"{d['wall']:.2f} s" if d["wall"] is not None else
                f"not finished after {d['limit']:.0f} s")
        say(f"dask {'cold' if cold else 'warm'}: {took}")


if __name__ == "__main__":
    sys.exit(main())

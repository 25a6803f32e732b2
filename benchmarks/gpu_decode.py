"""GPU decompression (nvCOMP) of a Zarr store's zstd chunks, against the CPU decoders.

    python -m benchmarks.gpu_decode DIR... [--threads 16] [--repeat 3]

One measurement for the question of issue 17: would decoding the inputs on the GPU, which needs
the decoded data anyway, beat decoding them on the host? For each store (Zarr v3, zstd chunks, or
zstd inner chunks of shards, as ``benchmarks.zarr_io make`` writes them) it times, warm:

- ``read``: every chunk file read whole into host memory (``threads`` threads, os-level reads);
- ``h2d``: the compressed bytes copied to the GPU from pinned memory;
- ``decode``: one nvCOMP batch decode of every zstd frame into device memory (the frames are
  zarr's own: ``BitstreamKind.RAW``);

and prints decoded GB/s for the decode alone and for the three in a row (no overlap: an upper
bound on what a pipelined reader would lose). Each frame is checked against numcodecs' decode
of the same bytes (a sample), and the whole decode against ``make``'s generated data where the
store records it. Needs CuPy and ``nvidia-nvcomp-cu12`` or ``-cu13`` (matching CuPy's CUDA).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, BenchError
from benchmarks.zarr_stores import StoreInfo, checksum, describe_store, expected_checksum
from oocgemm import machine

_MISSING = (1 << 64) - 1


def zstd_frames(info: StoreInfo) -> list[tuple[str, int, int, tuple[slice, ...]]]:
    """(file, offset, size, region) of every zstd frame of the store, innermost chunks in C order
    of the stored objects; refuses stores whose chunks are not ``bytes`` (little-endian) +
    ``zstd``."""
    if info.zarr_format != 3:
        raise BenchError(f"{info.path}: Zarr v3 stores only")
    codecs = info.meta["codecs"]
    if info.sharded:
        conf = codecs[0]["configuration"]
        codecs = conf["codecs"]
        cps = tuple(u // c for u, c in zip(info.unit, info.inner))
        index_codecs = [c["name"] for c in conf.get("index_codecs", [])]
        index_size = 16 * math.prod(cps) + 4 * index_codecs.count("crc32c")
        at_end = conf.get("index_location", "end") == "end"
    names = [c["name"] for c in codecs]
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    if names != ["bytes", "zstd"] or endian != "little":
        raise BenchError(f"{info.path}: chunks coded {names}, expected bytes (little) + zstd")
    frames = []
    for idx, region in info.units():
        path = info.key(idx)
        if not os.path.exists(path):
            raise BenchError(f"{path}: missing chunk (fill value); the benchmark wants full stores")
        if not info.sharded:
            frames.append((path, 0, os.path.getsize(path), region))
            continue
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(size - index_size if at_end else 0)
            table = np.frombuffer(f.read(16 * math.prod(cps)), dtype="<u8").reshape(cps + (2,))
        for j in np.ndindex(*cps):
            start = tuple(r.start + k * c for r, k, c in zip(region, j, info.inner))
            if any(s >= n for s, n in zip(start, info.shape)):
                continue  # entirely past the array's edge
            off, nb = (int(v) for v in table[j])
            if off == _MISSING:
                raise BenchError(f"{path}: missing inner chunk {j}")
            inner = tuple(slice(s, min(s + c, n)) for s, c, n in zip(start, info.inner, info.shape))
            frames.append((path, off, nb, inner))
    return frames


def _timed(frames, offsets, host, packed, stream, codec, src, dst, threads: int,
           repeat: int) -> dict[str, list[float]]:
    """Seconds of each step (read, h2d, decode) in each of ``repeat`` rounds after a first."""

    def read_one(i: int) -> None:
        path, off, nb, _ = frames[i]
        view = host[offsets[i]:offsets[i] + nb]
        with open(path, "rb", buffering=0) as f:
            f.seek(off)
            got = f.readinto(memoryview(view))
        if got != nb:
            raise BenchError(f"{path}: read {got} of {nb} bytes")

    times: dict[str, list[float]] = {"read": [], "h2d": [], "decode": []}
    for _ in range(repeat + 1):  # the first round warms nvCOMP, CuPy and the page cache
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read_one, range(len(frames))))
        t1 = time.perf_counter()
        packed.set(host, stream=stream)
        stream.synchronize()
        t2 = time.perf_counter()
        codec.decode(src, out=dst)
        stream.synchronize()
        t3 = time.perf_counter()
        for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[name].append(seconds)
    for samples in times.values():
        del samples[0]
    return times


def measure(info: StoreInfo, threads: int, repeat: int) -> dict:
    import cupy as cp
    from nvidia import nvcomp

    frames = zstd_frames(info)
    offsets = np.zeros(len(frames) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([-(-nb // 16) * 16 for _, _, nb, _ in frames])  # 16-byte aligned
    chunk_bytes = math.prod(info.inner) * np.dtype(info.dtype).itemsize
    pinned = cp.cuda.alloc_pinned_memory(int(offsets[-1]))
    host = np.frombuffer(pinned, dtype=np.uint8, count=int(offsets[-1]))
    packed = cp.empty(int(offsets[-1]), dtype=cp.uint8)
    out = cp.empty(len(frames) * chunk_bytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                         cuda_stream=stream.ptr)
    src = nvcomp.as_arrays(packed, [int(o) for o in offsets[:-1]], [nb for _, _, nb, _ in frames],
                           stream.ptr)
    dst = nvcomp.as_arrays(out, [i * chunk_bytes for i in range(len(frames))],
                           [chunk_bytes] * len(frames), stream.ptr)
    try:
        times = _timed(frames, offsets, host, packed, stream, codec, src, dst, threads, repeat)
    finally:  # nvCOMP's objects go before the stream and buffers they use (else a segfault)
        stream.synchronize()
        del codec, src, dst

    # Correctness: a sample of frames against numcodecs, and the whole array against make's data.
    import numcodecs

    zstd = numcodecs.Zstd()
    decoded = out.reshape(len(frames), chunk_bytes)
    for i in sorted({0, len(frames) // 2, len(frames) - 1}):
        path, _, nb, _ = frames[i]
        want = np.frombuffer(zstd.decode(host[offsets[i]:offsets[i] + nb].tobytes()), np.uint8)
        if not np.array_equal(cp.asnumpy(decoded[i]), want):
            raise BenchError(f"nvCOMP decoded frame {i} of {path} differently from numcodecs")
    checked = "sampled frames equal numcodecs"
    if info.seed is not None:
        array = np.empty(info.shape, dtype=info.dtype)
        for i, (_, _, _, region) in enumerate(frames):
            chunk = cp.asnumpy(decoded[i]).view(info.dtype).reshape(info.inner)
            array[region] = chunk[tuple(slice(0, s.stop - s.start) for s in region)]
        if checksum(array) != expected_checksum(info, threads):
            raise BenchError(f"{info.path}: the GPU-decoded array differs from the data make wrote")
        checked += "; whole array equals make's data"

    med = {name: statistics.median(v) for name, v in times.items()}
    total = sum(med.values())
    return {
        "store": info.label,
        "path": info.path,
        "frames": len(frames),
        "frame_bytes": chunk_bytes,
        "stored_bytes": info.stored_bytes,
        "decoded_bytes": info.decoded_bytes,
        "seconds": med,
        "decode_gbps": info.decoded_bytes / med["decode"] / GB,
        "end_to_end_gbps": info.decoded_bytes / total / GB,
        "checked": checked,
        "nvcomp": nvcomp.__version__,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_decode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.add_argument("--threads", type=int, default=machine.cores())
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    try:
        rows = [measure(describe_store(d), args.threads, args.repeat) for d in args.dirs]
    except (BenchError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| store | frames | read s | H2D s | nvCOMP decode s | decode GB/s | all three GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        s = r["seconds"]
        print(f"| {r['store']} | {r['frames']} | {s['read']:.3f} | {s['h2d']:.3f} | "
              f"{s['decode']:.3f} | {r['decode_gbps']:.2f} | {r['end_to_end_gbps']:.2f} |")
    for r in rows:
        print(f"{r['store']}: {r['checked']} (nvCOMP {r['nvcomp']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU compression (nvCOMP) of C's chunks before they go down, against the host's encoders.

    python -m benchmarks.gpu_encode [--chunk 4096] [--chunks 8] [--frames-mib 1,4,16]
                                    [--threads 16] [--repeat 3]

The question of issue 34: C's zstd chunks cost a run from Zarr 24 core-seconds of host CPU at
n = 32768 (1.5 s of the whole 16-core host), and the host is what bounds that run. Could the
GPU, 70% idle there, compress each chunk before it goes down? A chunk of zarr's zstd is one
zstd stream; nvCOMP compresses pieces of at most 16 MiB, one frame each, so a chunk becomes
several frames back to back, which is still one valid zstd stream.

For ``--chunks`` chunks of ``--chunk``² float64 (random normal values scaled as a product of
random inputs, on the GPU), warm, median of ``--repeat``:

- ``gpu``: nvCOMP's batch compression of every piece (``BitstreamKind.RAW``), for each frame
  size of ``--frames-mib``;
- ``gpu + d2h``: the same, then every frame copied into pinned host memory;
- ``host``: the same chunks encoded by numcodecs (zarr's zstd, level 0) on ``--threads``
  threads, the way oocgemm's encoders do now.

Each chunk's frames are checked: numcodecs decodes them back to the chunk, and zarr reads a
chunk written that way as the array's chunk (v2 and v3). Needs CuPy and ``nvidia-nvcomp-cu12``
or ``-cu13`` (matching CuPy's CUDA).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, BenchError
from oocgemm import machine

MiB = 1 << 20


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):  # the first round warms nvCOMP, CuPy and the allocators
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def gpu_rows(chunks, frame_bytes: int, repeat: int) -> tuple[dict, list[bytes]]:
    """nvCOMP's compression of ``chunks`` (device arrays) in pieces of ``frame_bytes``: the
    seconds with and without the copy down, and each chunk's frames as host bytes."""
    import cupy as cp
    from nvidia import nvcomp

    stream = cp.cuda.Stream(non_blocking=True)
    packed = cp.stack(chunks).reshape(-1).view(cp.uint8)  # one buffer, chunk after chunk
    size = chunks[0].nbytes
    pieces = [(i, lo) for i in range(len(chunks)) for lo in range(0, size, frame_bytes)]
    nv = {"codec": nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                cuda_stream=stream.ptr),
          "src": nvcomp.as_arrays(packed, [i * size + lo for i, lo in pieces],
                                  [min(frame_bytes, size - lo) for _, lo in pieces], stream.ptr),
          "result": []}
    pinned = cp.cuda.alloc_pinned_memory(packed.size * 2)
    host = np.frombuffer(pinned, np.uint8)

    def encode():
        nv["result"] = nv["codec"].encode(nv["src"])
        stream.synchronize()

    def encode_down():
        encode()
        at = 0
        for frame in _items(nv["result"]):
            view = cp.asarray(frame).view(cp.uint8).reshape(-1)
            view.get(out=host[at:at + view.size], stream=stream)
            at += view.size
        stream.synchronize()

    try:
        with stream:
            gpu = _median(encode, repeat)
            down = _median(encode_down, repeat)
            sizes = [cp.asarray(f).view(cp.uint8).size for f in _items(nv["result"])]
            frames: list[list[bytes]] = [[] for _ in chunks]
            at = 0
            for (i, _), nbytes in zip(pieces, sizes):
                frames[i].append(host[at:at + nbytes].tobytes())
                at += nbytes
    finally:  # nvCOMP's objects go before the stream and buffers they use
        stream.synchronize()
        nv.clear()
    return ({"gpu": gpu, "down": down, "stored": sum(sizes), "frames": len(pieces)},
            [b"".join(f) for f in frames])


def _items(batch) -> list:
    """The arrays of an nvCOMP batch (a list, or a BatchArray)."""
    if isinstance(batch, list):
        return batch
    try:
        return [batch[i] for i in range(len(batch))]
    except TypeError:
        try:
            return list(batch)
        except TypeError:
            raise BenchError(f"cannot take the arrays out of {type(batch)}: "
                             f"{[x for x in dir(batch) if not x.startswith('__')]}") from None


def host_row(chunks: list[np.ndarray], threads: int, repeat: int) -> dict:
    import numcodecs

    zstd = numcodecs.Zstd(level=0)
    out: list = []

    def run():
        with ThreadPoolExecutor(threads) as pool:
            out[:] = list(pool.map(zstd.encode, chunks))

    seconds = _median(run, repeat)
    return {"seconds": seconds, "stored": sum(len(b) for b in out)}


def check(chunk: np.ndarray, stream: bytes) -> str:
    """The frames of one chunk read back by numcodecs and by zarr (v2 and v3), or raise."""
    import numcodecs
    import zarr

    back = np.frombuffer(numcodecs.Zstd().decode(stream), chunk.dtype).reshape(chunk.shape)
    if not np.array_equal(back, chunk):
        raise BenchError("numcodecs decoded nvCOMP's frames to other values")
    with tempfile.TemporaryDirectory() as work:
        for fmt in (2, 3):
            path = os.path.join(work, f"v{fmt}.zarr")
            if fmt == 2:
                arr = zarr.create_array(path, shape=chunk.shape, chunks=chunk.shape, dtype="f8",
                                        compressors=numcodecs.Zstd(level=0), zarr_format=2)
                key = os.path.join(path, "0.0")
            else:
                arr = zarr.create_array(path, shape=chunk.shape, chunks=chunk.shape, dtype="f8",
                                        compressors=zarr.codecs.ZstdCodec(level=0))
                key = os.path.join(path, "c", "0", "0")
            arr[:] = 1.0  # the chunk file exists (a fill-value chunk would not be stored)
            with open(key, "wb") as f:
                f.write(stream)
            if not np.array_equal(zarr.open_array(path, mode="r")[:], chunk):
                raise BenchError(f"zarr (v{fmt}) read nvCOMP's frames to other values")
    return "numcodecs and zarr v2/v3 read the frames back exactly"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_encode",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--chunks", type=int, default=8, help="chunks compressed together (a "
                   "C block's chunk row band)")
    p.add_argument("--frames-mib", default="1,4,16")
    p.add_argument("--threads", type=int, default=machine.cores())
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    try:
        import cupy as cp
        from nvidia import nvcomp

        rng = cp.random.default_rng(1)
        scale = float(np.sqrt(32768))  # a product of random normal inputs, K = 32768
        dev = [rng.standard_normal((args.chunk, args.chunk)) * scale for _ in range(args.chunks)]
        chunks = [cp.asnumpy(c) for c in dev]
        data = sum(c.nbytes for c in chunks)
        host = host_row(chunks, args.threads, args.repeat)
        print(f"{args.chunks} chunks of {args.chunk}² float64 ({data / GB:.2f} GB), nvCOMP "
              f"{nvcomp.__version__}")
        print("| encoder | frames | seconds | GB/s | + copy down s | GB/s | stored / data |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print(f"| host, numcodecs zstd level 0, {args.threads} threads | {args.chunks} | "
              f"{host['seconds']:.3f} | {data / host['seconds'] / GB:.2f} | | | "
              f"{host['stored'] / data:.3f} |")
        for mib in (int(x) for x in args.frames_mib.split(",")):
            try:
                row, streams = gpu_rows(dev, mib * MiB, args.repeat)
            except Exception as e:  # noqa: BLE001 - a frame size nvCOMP refuses is a result
                print(f"| nvCOMP zstd, {mib} MiB frames | refused: {str(e)[:300]} | | | | | |")
                continue
            print(f"| nvCOMP zstd, {mib} MiB frames | {row['frames']} | {row['gpu']:.3f} | "
                  f"{data / row['gpu'] / GB:.2f} | {row['down']:.3f} | "
                  f"{data / row['down'] / GB:.2f} | {row['stored'] / data:.3f} |")
            print(f"  {mib} MiB frames: {check(chunks[0], streams[0])}")
    except (BenchError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

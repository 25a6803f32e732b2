"""How fast oocgemm's Zarr sink stores whole chunks, under zarr's settings and under the
settings oocgemm reads with, beside the disk's own write rate.

    python -m benchmarks.zarr_write --n 32768 --chunk 4096 --band-width 16384 --workdir DIR
        [--threads 8]

Each case (compressor none, then zstd:0, each under the settings ``default``, ``oocgemm`` and
``zarrs``) writes an n x n float64 array (normal random numbers, as a product's output looks)
through ``ZarrSink.write`` from ``--threads`` threads, one cell at a time: a chunk row band of
``--band-width`` columns, whole chunks, as ``ChunkWriter`` hands them on. ``default`` creates
the array under zarr's own settings (what the sink does today); ``oocgemm`` under
``pipeline_config`` (the fused codec pipeline on zarr 3.4+, else zarrs where installed);
``zarrs`` under the zarrs pipeline. Every case runs in a fresh interpreter, so that zarr's
event loop and pools start from its settings.
The floor: the same bytes written as plain files from the same threads (no fsync).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

COMPRESSORS = ("none", "zstd:0")
"""The output compressors of the cases: multiply's default, and zarr's default for to_zarr."""
CONFIGS = ("default", "oocgemm", "zarrs")
"""The zarr settings of the cases (the module's docstring says what each is)."""


def _case(n: int, chunk: int, width: int, threads: int, compressor: str, config: str,
          path: str) -> dict:
    import zarr

    from oocgemm.storage.zarr_store import ZarrSink, pipeline_config
    from oocgemm.storage.zarr_store import compressor as make_compressor

    if config == "oocgemm":
        zarr.config.set(pipeline_config(threads))
    elif config == "zarrs":
        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
                         "codec_pipeline.strict": False})
    shutil.rmtree(path, ignore_errors=True)
    band = np.random.default_rng(0).standard_normal((chunk, width))
    sink = ZarrSink(shape=(n, n), dtype="float64", name="c", path=path,
                    options={"chunks": (chunk, chunk),
                             "compressors": make_compressor(compressor)})
    cells = [(r, c) for r in range(0, n, chunk) for c in range(0, n, width)]

    def write(cell):
        r, c = cell
        rows, cols = (r, min(r + chunk, n)), (c, min(c + width, n))
        sink.write(rows, cols, band[:rows[1] - rows[0], :cols[1] - cols[0]])

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, cells))
    seconds = time.perf_counter() - start
    pipeline = type(sink.array().async_array.codec_pipeline).__name__
    sink.commit()
    stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    shutil.rmtree(path, ignore_errors=True)
    return {"seconds": seconds, "gbps": n * n * 8 / seconds / 1e9, "stored": stored,
            "pipeline": pipeline}


def _floor(n: int, chunk: int, threads: int, folder: str) -> dict:
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    data = np.random.default_rng(0).standard_normal((chunk, chunk)).tobytes()
    count = (-(-n // chunk)) ** 2

    def put(i):
        with open(os.path.join(folder, str(i)), "wb") as f:
            f.write(data)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(count)))
    seconds = time.perf_counter() - start
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": seconds, "gbps": count * len(data) / seconds / 1e9}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--band-width", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    path = os.path.join(os.path.abspath(args.workdir), "c.zarr")
    if args.case:
        compressor, config = args.case.split("@")
        print(json.dumps(_case(args.n, args.chunk, args.band_width, args.threads, compressor,
                               config, path)))
        return 0
    floor = _floor(args.n, args.chunk, args.threads, os.path.join(args.workdir, "files"))
    print(f"n={args.n}, chunks {args.chunk}², cells of {args.chunk}x{args.band_width}, "
          f"{args.threads} threads; plain files: {floor['gbps']:.2f} GB/s", flush=True)
    for compressor in COMPRESSORS:
        for config in CONFIGS:
            child = subprocess.run(
                [sys.executable, "-m", "benchmarks.zarr_write", "--n", str(args.n), "--chunk",
                 str(args.chunk), "--band-width", str(args.band_width), "--threads",
                 str(args.threads), "--workdir", args.workdir, "--case",
                 f"{compressor}@{config}"], capture_output=True, text=True)
            if child.returncode:
                print(f"{compressor:8} {config:8} failed: {child.stderr.strip()[-400:]}")
                continue
            case = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"{compressor:8} {config:8} {case['pipeline']:28} {case['seconds']:7.2f} s "
                  f"{case['gbps']:6.2f} GB/s  stored {case['stored'] / 1e9:.2f} GB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reading a Zarr array from an S3 server: oocgemm's readers beside zarr-python's, on one server.

    python -m benchmarks.s3 [--n 4096] [--chunk 1024] [--cols 64] [--threads 1,4]
        [--repeat 3] [--json FILE]

Starts moto's S3 server (``python -m moto.server``, its own process, on 127.0.0.1 and a free
port; stopped at the end), writes an n x n float64 standard-normal array into a bucket with
zarr-python (format 3, zstd level 1, chunks of chunk x chunk), then times, best of
``--repeat`` (the server holds the objects in memory: warm):

- ``zarr``: ``zarr.open_array(url, storage_options=...)[:]``, zarr-python's defaults;
- ``decode/T``: the engine's own source (``oocgemm.storage.open_source``, a ``ZarrSource``),
  ``read_chunk`` of every chunk into preallocated buffers from T threads, as the chunk
  readers of a run decode (4 is a CPU plan's ``readers``);
- ``multiply``: ``oocgemm.multiply(url, b, device="cpu")`` with b an n x ``--cols`` numpy
  array, into a new numpy array: reading A is most of the run; its chunk decodes beside it.

Rates are GB/s of decoded bytes (n² x 8, 1e9 bytes per second); the stored bytes are shown
beside them. A moto server is far slower than a real object store and shares this machine's
cores with the readers: the figures compare the readers with each other, not with S3.
Needs moto[server] and s3fs (the ``test`` extra). A result that differs from numpy exits with
status 1; a bad option with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, BenchError, gbps, max_relative_error, write_json
from oocgemm import machine

KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def moto_server(timeout: float = 30.0):
    """The endpoint URL of a moto S3 server on 127.0.0.1, in a process of its own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise BenchError("moto's S3 server did not start (pip install "
                                     "'moto[server]')") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def best(fn, repeat: int) -> tuple[float, object]:
    """The shortest of ``repeat`` timed calls, and the last call's value."""
    times, value = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return min(times), value


def decode_all(url: str, options: dict, threads: int) -> np.ndarray:
    """Every chunk through the engine's source, ``read_chunk`` from ``threads`` threads."""
    from oocgemm.planning.chunks import chunk_region
    from oocgemm.storage import open_source

    src = open_source(url, "a", options)
    try:
        out = np.empty(src.shape, dtype=src.dtype)
        rows, cols = (-(-e // c) for e, c in zip(src.shape, src.chunks))

        def one(index):
            (r0, r1), (c0, c1) = chunk_region(index, src.chunks, src.shape)
            part = np.empty((r1 - r0, c1 - c0), dtype=src.dtype)
            src.read_chunk(index, part)
            out[r0:r1, c0:c1] = part

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, [(i, j) for i in range(rows) for j in range(cols)]))
        return out
    finally:
        src.close()


def run(n: int, chunk: int, cols: int, threads: list[int], repeat: int) -> dict:
    import s3fs
    import zarr

    import oocgemm

    os.environ.update(KEYS)  # nothing looks further for credentials
    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, cols))
    nbytes = a.nbytes
    rows = []
    with moto_server() as endpoint:
        options = {"endpoint_url": endpoint, "key": KEYS["AWS_ACCESS_KEY_ID"],
                   "secret": KEYS["AWS_SECRET_ACCESS_KEY"]}
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        bucket = f"oocgemm-bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        url = f"s3://{bucket}/a.zarr"
        t0 = time.perf_counter()
        zarr.create_array(url, shape=a.shape, dtype="f8", chunks=(chunk, chunk),
                          compressors=zarr.codecs.ZstdCodec(level=1),
                          storage_options=options)[:] = a
        written = time.perf_counter() - t0
        stored = sum(fs.du(f"{bucket}/a.zarr", total=False).values())
        print(f"{url}: {n}x{n} float64, {chunk}² zstd chunks, {stored / GB:.3f} GB stored of "
              f"{nbytes / GB:.3f} GB, written in {written:.2f} s")

        def record(name, seconds, error, **extra):
            rows.append({"case": name, "seconds": seconds, "gbps": nbytes / seconds / GB,
                         "error": error, **extra})
            print(f"  {name:<12} {seconds:8.3f} s  {gbps(nbytes, seconds):>6} GB/s  "
                  f"error {error:.1e}")

        seconds, got = best(lambda: zarr.open_array(url, mode="r", storage_options=options)[:],
                            repeat)
        record("zarr", seconds, max_relative_error(got, a))
        for t in threads:
            seconds, got = best(lambda t=t: decode_all(url, options, t), repeat)
            record(f"decode/{t}", seconds, max_relative_error(got, a), threads=t)
        seconds, result = best(lambda: oocgemm.multiply(url, b, device="cpu",
                                                        storage_options=options), repeat)
        record("multiply", seconds, max_relative_error(result.out, a @ b),
               decodes=result.chunks["A"]["decodes"], tile=list(result.plan.tile))
        fs.rm(bucket, recursive=True)
    return {"date": datetime.date.today().isoformat(), "host": socket.gethostname(),
            "cores": machine.cores(), "n": n, "chunk": chunk, "cols": cols,
            "stored_bytes": stored, "decoded_bytes": nbytes, "repeat": repeat, "cases": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096, help="rows and columns of A (default 4096)")
    p.add_argument("--chunk", type=int, default=1024, help="chunk side (default 1024)")
    p.add_argument("--cols", type=int, default=64, help="columns of B (default 64)")
    p.add_argument("--threads", default="1,4",
                   help="decode threads, a comma list (default 1,4)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per case (default 3)")
    p.add_argument("--json", metavar="FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
        if min(args.n, args.chunk, args.cols, args.repeat, *threads) < 1:
            raise BenchError("--n, --chunk, --cols, --repeat and --threads must be at least 1")
        doc = run(args.n, args.chunk, args.cols, threads, args.repeat)
    except (BenchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_json(args.json, doc)
    if args.json:
        print(f"wrote {args.json}")
    return 1 if any(r["error"] > 1e-12 for r in doc["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())

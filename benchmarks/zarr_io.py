"""Zarr storage floors and chunk decode rates: how fast can a store's chunks reach host memory?

Three subcommands (``python -m benchmarks.zarr_io SUBCOMMAND --help`` for the options)::

    python -m benchmarks.zarr_io make --n 8192 --chunk 4096 --layout v3|v3-sharded|v2 DIR
    python -m benchmarks.zarr_io floor DIR... [--threads 16] [--drop-caches]
    python -m benchmarks.zarr_io decode DIR... [--threads 16] [--decoders
    zarr,zarrs,tensorstore,numcodecs]

``make`` writes a test store the way a user with zarr-python's defaults would
(``zarr_stores``); ``floor`` measures the disk under the stores, cold and warm reads of their
chunk files and fsynced writes (``storage_floor``); ``decode`` reads each whole store with each
decoder that imports here, zarr-python's pipelines, tensorstore and chunk files + numcodecs,
and checks each against the data ``make`` wrote (``decode_rates``).

Rates are GB/s, 1e9 bytes per second. ``decode`` divides the decoded bytes (the array in
memory) by the median time of ``--repeat`` reads, and shows the stored bytes beside them.
``floor`` needs only numpy; ``make`` needs zarr; each decoder is imported only in its own cases.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from benchmarks.common import GB, BenchError, gbps, write_json
from benchmarks.decode_rates import DECODERS, VARIANTS, decode_stores, decode_table, environment
from benchmarks.storage_floor import read_floor, read_table, write_floor, write_table
from benchmarks.zarr_stores import INNER, LAYOUTS, describe_store, make_store
from oocgemm import machine


def cmd_make(args) -> None:
    rec = make_store(args.dir, n=args.n, chunk=args.chunk, layout=args.layout,
                     threads=machine.cores())
    print(f"{rec['path']}: {rec['label']}, {rec['n']}x{rec['n']} float64, {rec['files']} files, "
          f"{rec['stored_bytes'] / GB:.3f} GB stored of {rec['decoded_bytes'] / GB:.3f} GB, "
          f"written in {rec['seconds']:.2f} s on {rec['threads']} threads "
          f"({gbps(rec['decoded_bytes'], rec['seconds'])} GB/s)")


def cmd_floor(args) -> None:
    infos = [describe_store(d) for d in args.dirs]
    thread_counts = _threads_list(args.threads)
    reads = read_floor(infos, thread_counts, args.drop_caches)
    print(read_table(reads))
    print()
    folder = os.path.dirname(infos[0].path)
    print(write_table(write_floor(folder, max(i.stored_bytes for i in infos), thread_counts)))
    if args.drop_caches and not any("cold_how" in r for r in reads):
        print("note: page cache could not be dropped (not root, no fadvise): no cold figures")


def cmd_decode(args) -> None:
    records, skipped = decode_stores(
        [describe_store(d) for d in args.dirs], _names(args.decoders), _names(args.variants),
        _threads_list(args.threads), args.zarr_configs, args.repeat, args.drop_caches)
    print()
    print(decode_table(records))
    if args.drop_caches and any(r.get("cache") == "warm" for r in records):
        print("note: page cache could not be dropped: figures marked warm")
    write_json(args.json, {"environment": environment(), "decode": records, "skipped": skipped})
    if args.json:
        print(f"wrote {args.json}")


def _names(spec: str) -> list[str]:
    """A comma list as its names, blanks dropped."""
    return [s.strip() for s in spec.split(",") if s.strip()]


def _threads_list(spec: str) -> list[int]:
    """``--threads``: a number or a comma list like 1,4,16."""
    try:
        vals = [int(s) for s in _names(spec)]
    except ValueError:
        raise BenchError(
            f"--threads {spec!r}: expected a number or a comma list like 1,4,16"
        ) from None
    if not vals or min(vals) < 1:
        raise BenchError(f"--threads {spec!r}: expected numbers of at least 1")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.zarr_io",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    cpus = machine.cores()

    m = sub.add_parser("make", help="write a test store of random float64 with zarr-python's "
                                    "defaults, on every core")
    m.add_argument("dir")
    m.add_argument("--n", type=int, default=8192, help="rows and columns (default 8192)")
    m.add_argument("--chunk", type=int, default=4096,
                   help=f"chunk side; the shard side for v3-sharded, whose chunks are {INNER}² "
                        f"(default 4096)")
    m.add_argument("--layout", choices=LAYOUTS, default="v3")

    f = sub.add_parser("floor", help="raw parallel read rate of the stores' chunk files, and a "
                                     "write rate")
    f.add_argument("dirs", nargs="+", metavar="DIR")
    f.add_argument("--threads", default=str(cpus),
                   help=f"a number or a comma list like 1,4,16 (default {cpus})")
    f.add_argument("--drop-caches", action="store_true",
                   help="also a cold read, after dropping the page cache")

    d = sub.add_parser("decode", help="whole-store parallel read + decode into memory, per "
                                      "decoder (stores make wrote)")
    d.add_argument("dirs", nargs="+", metavar="DIR")
    d.add_argument("--threads", default=str(cpus),
                   help=f"a number or a comma list (default {cpus})")
    d.add_argument("--decoders", default=",".join(DECODERS),
                   help=f"comma list of {', '.join(DECODERS)} (default all; those not installed "
                        f"are skipped)")
    d.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (default all)")
    d.add_argument("--zarr-configs", default="default,tuned",
                   help="zarr-python settings to try: default, tuned (async.concurrency 4 x "
                        "threads, threading.max_workers threads) (default default,tuned)")
    d.add_argument("--repeat", type=int, default=3,
                   help="timed reads per case; the table shows the median (default 3)")
    d.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before every timed read (cold)")
    d.add_argument("--json", metavar="FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        {"make": cmd_make, "floor": cmd_floor, "decode": cmd_decode}[args.command](args)
        return 0
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""A small tile on the GPU (issue 51): Zarr inputs (uncompressed, as ``oocgemm random`` writes
them) into a default Zarr C, beside the same tile into memory and the planner's own tile, with
the operations run against those planned and the rate C was stored at.

    python -m benchmarks gpu-small-blocks --zarr /tmp/small --n 8192 --chunk 2048 \\
        --tile 2048,2048,2048 --memory-limit 2GB
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.common import remove_all, report, zarr_product_parser


def run(a: str, b: str, out: str | None, **options) -> dict:
    """One product, timed: wall, the run's seconds, operations run and planned, chunks
    stored and the rate C was stored at."""
    import oocgemm

    begun = time.perf_counter()
    r = oocgemm.multiply(a, b, out, overwrite=True, progress=False, events=True, **options)
    wall = time.perf_counter() - begun
    stores = [e for e in r.events if e.kind == "store"]
    stored = r.bytes.get("storage_write", 0)
    return {"wall": wall, "seconds": r.seconds, "tile": list(r.plan.tile),
            "planned": len(r.plan.schedule.ops), "ran": len(r.events) - len(stores),
            "chunks_stored": len(stores), "stored_bytes": stored,
            "store_rate": stored / r.seconds if out and r.seconds else None,
            "predicted": r.plan.prediction.total}


def main(argv=None) -> int:
    parser = zarr_product_parser(__doc__, n=8192, chunk=2048, device="cuda",
                                 memory_limit="2GB")
    parser.add_argument("--tile", default="2048,2048,2048")
    args = parser.parse_args(argv)

    work = os.path.abspath(args.zarr)
    os.makedirs(work, exist_ok=True)
    a, b, c = (os.path.join(work, name) for name in ("a.zarr", "b.zarr", "c.zarr"))
    for seed, path in ((1, a), (2, b)):
        subprocess.run([sys.executable, "-m", "oocgemm", "random", path, "--shape",
                        f"{args.n}x{args.n}", "--chunks", f"{args.chunk}x{args.chunk}",
                        "--seed", str(seed), "--overwrite", "-q"], check=True)
    tile = tuple(int(x) for x in args.tile.split(","))
    options = {"device": args.device, "memory_limit": args.memory_limit}
    run(a, b, None, **options)  # the process's first run: its start-up
    doc = {"date": time.strftime("%Y-%m-%d"), "n": args.n, "chunk": args.chunk,
           "options": options, "tile": list(tile),
           "tile_to_zarr": run(a, b, c, tile=tile, **options),
           "tile_to_memory": run(a, b, None, tile=tile, **options),
           "planner_to_zarr": run(a, b, c, **options)}
    doc["of_memory"] = doc["tile_to_zarr"]["wall"] / doc["tile_to_memory"]["wall"]
    report(doc, args.json)
    remove_all(a, b, c)
    return 0


if __name__ == "__main__":
    sys.exit(main())

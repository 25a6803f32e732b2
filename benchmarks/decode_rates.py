"""Decode rates: how fast each decoder brings a whole Zarr store into host memory, every stored
chunk decoded once, beside the others on the same store.

``decode_stores`` runs every (decoder, variant, settings) case on each store that ``make`` wrote,
each case in a fresh interpreter (``python -m benchmarks.decode_rates CASE``) so that zarr's event
loop and thread pools, and the zarrs and tensorstore pools, start from that case's own settings.
Each case times ``repeat`` reads into a poisoned destination and checks the result against
``make``'s regenerated data: a checksum of the whole array and three whole stored objects
compared exactly. ``python -m benchmarks.zarr_io decode`` is its command line.

Variants (each fills one preallocated row-major array, timed from the first read): ``whole`` one
call for the whole array into it; ``chunks`` N threads share the stored objects (chunks, or
shards), each read into its place; ``bands`` N threads share row bands of whole stored objects
(C-contiguous places); ``inner`` N threads share the inner chunks of a sharded array (a partial
read of a shard each); ``direct`` (numcodecs) decodes each chunk straight into a chunk-major
destination, no copy.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import util as importlib_util
from pathlib import Path

import numpy as np

from benchmarks.common import GB, BenchError, gbps, markdown_table, package_version
from benchmarks.direct_decode import NumcodecsReader
from benchmarks.storage_floor import drop_caches, read_files
from benchmarks.zarr_decoders import Reader, TensorstoreReader, ZarrReader
from benchmarks.zarr_stores import StoreInfo, describe_store, expected_checksum, unit_data

CASE_TIMEOUT = 600
"""Seconds one case may take in its own interpreter."""

DECODERS = ("zarr", "zarr-fused", "zarrs", "tensorstore", "numcodecs")
VARIANTS = ("whole", "chunks", "bands", "inner", "direct")
_VARIANTS_OF = {
    "zarr": ("whole", "chunks", "bands", "inner"),
    "zarr-fused": ("whole", "chunks", "bands", "inner"),
    "zarrs": ("whole", "chunks", "bands", "inner"),
    "tensorstore": ("whole", "chunks", "bands", "inner"),
    "numcodecs": ("chunks", "inner", "direct"),
}
_INSTALL_HINT = {
    "zarr": "pip install zarr",
    "zarr-fused": "needs zarr-python with zarr.core.codec_pipeline.FusedCodecPipeline (3.4 has it)",
    "zarrs": "pip install zarrs",
    "tensorstore": "pip install tensorstore",
    "numcodecs": "pip install numcodecs",
}


_PIPELINE_OF = {"zarr": "BatchedCodecPipeline", "zarr-fused": "FusedCodecPipeline",
                "zarrs": "ZarrsCodecPipeline"}
"""The codec pipeline each zarr-python decoder must open its array under."""


def make_reader(info: StoreInfo, decoder: str, variant: str, threads: int, config: dict) -> Reader:
    """The reader of one case of `build_cases` (imports its decoder)."""
    if decoder in _PIPELINE_OF:
        return ZarrReader(info, variant, threads, config, _PIPELINE_OF[decoder])
    if decoder == "tensorstore":
        return TensorstoreReader(info, variant, threads)
    return NumcodecsReader(info, variant, threads)


def zarr_configs(spec: str, threads: int) -> list[tuple[str, dict]]:
    """Parse ``--zarr-configs``: ``default`` (zarr's own settings) and ``tuned``
    (async.concurrency = 4 x threads, threading.max_workers = threads), as a label and the
    settings of each."""
    known = {"default": ("default", {}),
             "tuned": (f"c={4 * threads} w={threads}",
                       {"async.concurrency": 4 * threads, "threading.max_workers": threads})}
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise BenchError(f"zarr config {name!r}: expected default or tuned")
    return [known[name] for name in names]


def _available(decoder: str) -> str:
    """Empty when ``decoder`` can run here, else why not with the install hint."""
    need = "zarr" if decoder == "zarr-fused" else decoder
    if importlib_util.find_spec(need) is None:
        return f"not installed ({_INSTALL_HINT[decoder]})"
    if decoder == "zarr-fused":
        import zarr.core.codec_pipeline as cp

        if not hasattr(cp, "FusedCodecPipeline"):
            return f"zarr {package_version('zarr')} has no FusedCodecPipeline"
    return ""


#: zarr settings that select each non-default codec pipeline, for ``threads`` threads.
_PIPELINES = {
    "zarr-fused": lambda threads: {
        "codec_pipeline.path": "zarr.core.codec_pipeline.FusedCodecPipeline",
        "codec_pipeline.max_workers": threads},
    "zarrs": lambda threads: {
        "codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True},
}


def build_cases(
    info: StoreInfo,
    decoders: Sequence[str],
    threads: int,
    variants: Sequence[str],
    configs: str,
    repeat: int,
    cold: bool,
) -> list[dict]:
    """Every (decoder, variant, config) case to run on one store at one thread count."""
    cases = []
    for dec in decoders:
        for var in variants:
            if var not in _VARIANTS_OF[dec] or (var == "inner" and not info.sharded):
                continue
            if var == "direct" and any(s % c for s, c in zip(info.shape, info.inner)):
                continue  # a blocked destination needs whole chunks
            if dec == "zarr":
                settings = zarr_configs(configs, threads)
            elif dec in _PIPELINES:
                settings = [(f"w={threads}", {**_PIPELINES[dec](threads),
                                              "threading.max_workers": threads,
                                              "async.concurrency": 4 * threads})]
            elif dec == "tensorstore":
                settings = [(f"io={threads}", {})]
            else:
                settings = [("", {})]
            for label, conf in settings:
                cases.append(
                    {
                        "path": info.path,
                        "decoder": dec,
                        "variant": var,
                        "threads": threads,
                        "config": conf,
                        "config_label": label,
                        "repeat": repeat,
                        "cold": cold,
                    }
                )
    return cases


def _sample_units(info: StoreInfo) -> list[tuple[slice, ...]]:
    units = info.units()
    picks = {0, len(units) // 2, len(units) - 1}
    return [units[i][1] for i in sorted(picks)]


def _expected_region(info: StoreInfo, sl: tuple[slice, ...]) -> np.ndarray:
    """The data ``make`` wrote into the stored object whose region is ``sl``, regenerated."""
    idx = tuple(s.start // u for s, u in zip(sl, info.unit))
    return unit_data(info.seed, idx, [s.stop - s.start for s in sl])


def run_case(case: dict) -> dict:
    """Run one case here (in this interpreter): time ``repeat`` reads, then check the result."""
    info = describe_store(case["path"])
    result = {k: case[k] for k in ("decoder", "variant", "threads", "config_label", "repeat")}
    result["config"] = dict(case["config"])
    reader = make_reader(info, case["decoder"], case["variant"], case["threads"], case["config"])
    times, evicted = [], []
    for _ in range(case["repeat"]):
        reader.poison()
        if case["cold"]:
            evicted.append(drop_caches(info.files))
        t0 = time.perf_counter()
        reader.run()
        times.append(time.perf_counter() - t0)
    result["seconds"] = times
    result["cache"] = (
        ("cold (" + evicted[0] + ")" if evicted and all(evicted) else "warm")
        if case["cold"]
        else "warm"
    )
    result["note"] = reader.note
    result["checksum"] = reader.checksum()
    result["samples_bad"] = [[[s.start, s.stop] for s in sl] for sl in _sample_units(info)
                             if not np.array_equal(reader.region(sl), _expected_region(info, sl))]
    return result


def _run_case_subprocess(case: dict) -> dict:
    """`run_case` in a fresh interpreter: its record, or the error that ended it."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "benchmarks.decode_rates", json.dumps(case)]
    base = {k: case[k] for k in ("decoder", "variant", "threads", "config_label", "repeat")}
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=CASE_TIMEOUT, cwd=root, env=env,
            check=False
        )
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {CASE_TIMEOUT} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return {**base, "error": tail.removeprefix("error: ")[-300:]}
    return json.loads(lines[-1])


def decode_stores(infos: Sequence[StoreInfo], decoders: Sequence[str], variants: Sequence[str],
                  thread_counts: Sequence[int], configs: str, repeat: int,
                  cold: bool) -> tuple[list[dict], dict[str, str]]:
    """Every case on every store, printing each as it ends: the records, and the decoders
    skipped (not installed here) with why."""
    for info in infos:
        if info.seed is None:
            raise BenchError(f"{info.path} was not written by make: decode checks every decoder "
                             f"against make's regenerated data")
    for d in decoders:
        if d not in DECODERS:
            raise BenchError(f"unknown decoder {d!r}: expected one of {', '.join(DECODERS)}")
    for v in variants:
        if v not in VARIANTS:
            raise BenchError(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS)}")
    skipped = {d: why for d in decoders if (why := _available(d))}
    for d, why in skipped.items():
        print(f"skipping {d}: {why}", flush=True)
    run_decoders = [d for d in decoders if d not in skipped]
    records = []
    for info in infos:
        expected = expected_checksum(info, max(thread_counts))
        print(f"{info.path}: {info.label}, {'x'.join(map(str, info.shape))} {info.dtype}, "
              f"{len(info.files)} files, {info.stored_bytes / GB:.3f} GB stored of "
              f"{info.decoded_bytes / GB:.3f} GB; checked against regenerated data", flush=True)
        if not cold:
            read_files(info.files, max(thread_counts))  # warm: the files start in the page cache
        if "direct" in variants and any(n % c for n, c in zip(info.shape, info.inner)):
            print(f"  direct skipped: the shape is not a multiple of the chunk {info.inner}")
        for threads in thread_counts:
            for case in build_cases(info, run_decoders, threads, variants, configs, repeat, cold):
                res = _run_case_subprocess(case)
                res.update(path=info.path, label=info.label, decoded_bytes=info.decoded_bytes,
                           stored_bytes=info.stored_bytes)
                if "error" not in res:
                    res["ok"] = not res["samples_bad"] and res["checksum"] == expected
                    res["median_seconds"] = statistics.median(res["seconds"])
                    res["best_seconds"] = min(res["seconds"])
                records.append(res)
                _print_progress(res)
    return records, skipped


def _print_progress(r: dict) -> None:
    name = (f"{Path(r['path']).name} {r['decoder']} {r['variant']} t={r['threads']} "
            f"{r.get('config_label', '')}")
    if "error" in r:
        print(f"  {name}: error: {r['error']}", flush=True)
    else:
        print(
            f"  {name}: {gbps(r['decoded_bytes'], r['median_seconds'])} GB/s, "
            f"{'ok' if r['ok'] else 'WRONG'}",
            flush=True,
        )


def decode_table(records: list[dict]) -> str:
    """The decode results as a Markdown table (median of the repeats)."""
    rows = []
    for r in records:
        store = Path(r["path"]).name
        if "error" in r:
            rows.append(
                [
                    store,
                    r["decoder"],
                    r["variant"],
                    r["threads"],
                    r.get("config_label", ""),
                    "-",
                    "-",
                    "-",
                    "-",
                    "error: " + r["error"][:80],
                ]
            )
            continue
        rows.append(
            [
                store,
                r["decoder"],
                r["variant"] + (f" ({r['note']})" if r.get("note") else ""),
                r["threads"],
                r["config_label"],
                r["cache"],
                f"{r['median_seconds']:.3f}",
                gbps(r["decoded_bytes"], r["median_seconds"]),
                gbps(r["stored_bytes"], r["median_seconds"]),
                "ok" if r["ok"] else "WRONG",
            ]
        )
    return markdown_table(
        rows,
        [
            "store",
            "decoder",
            "variant",
            "threads",
            "config",
            "cache",
            "median s",
            "decoded GB/s",
            "stored GB/s",
            "check",
        ],
    )


def environment() -> dict:
    """Where and with what the figures were taken."""
    return {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": {
            n: package_version(n) for n in ("numpy", "zarr", "numcodecs", "zarrs", "tensorstore")
        },
    }


if __name__ == "__main__":  # one case, in the fresh interpreter of _run_case_subprocess
    print(json.dumps(run_case(json.loads(sys.argv[1]))))

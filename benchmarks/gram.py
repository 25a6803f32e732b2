"""The Gram product ``X^T X`` of a tall-skinny X stored as Zarr, beside its floors and baselines,
in one run.

    python -m benchmarks.gram [--rows 400000] [--cols 1024] [--chunk-rows 16384]
        [--device auto|cpu|cuda] [--memory-limit 16GB] [--host-memory-limit SIZE] [--repeat N]
        [--cold] [--skip decode,memory,oocgemm,dask] [--transpose-side a|b] [--dir DIR]
        [--json FILE]
    python -m benchmarks.gram --square N [--device cuda] [--memory-limit 16GB] [--repeat N]

X (rows x cols, float64, standard normal) is written once the way a zarr-python user with its
defaults would (``zarr.create_array``: format 3, zstd) with chunks of ``(chunk_rows, cols)``;
with ``--transpose-side b`` X^T is stored instead, chunks ``(cols, chunk_rows)``, and the
product is ``X^T X`` written as ``Y Y^T`` (``trans_b=True``). Each measurement is the best
of ``--repeat`` runs, warm (every chunk file read once before each run) or, with ``--cold``,
after ``sync; echo 3 > /proc/sys/vm/drop_caches``:

- ``decode``: every chunk decoded once, no GEMM, by the engine's own readers: a fresh
  ``oocgemm.storage.open_source`` (a ``ZarrSource``, opened under the codec pipeline of
  ``zarr_store.fast_reader``), ``read_chunk`` into preallocated numpy buffers on
  ``machine.cores()`` threads, each hinting the storage ahead as ``ChunkReader`` does;
- ``memory``: X already in memory, the product alone: numpy ``X.T @ X`` (SYRK) on the CPU;
  on a GPU CuPy's upload, ``X.T @ X`` and download, synchronised;
- ``oocgemm``: ``oocgemm.multiply(path, path, trans_a=True, device=...)`` into a new numpy
  array (wall time of the call, and ``result.seconds``), its chunk decodes, whether C is
  bitwise symmetric, and its error against the in-memory product;
- ``dask``: ``da.from_zarr(path)``, ``(x.T @ x).compute()`` under the threaded scheduler (on a
  GPU with CuPy blocks, ``x.map_blocks(cupy.asarray)``, as ``zarr_product``'s baseline).

The ratios the targets are judged by (oocgemm's wall time): oocgemm / decode,
oocgemm / max(decode, memory), dask / oocgemm.

``--square N``: from host memory, N x N float64 numpy operands, ``multiply(x, x,
trans_a=True)`` (the Gram product) against ``multiply(x, y, trans_a=True)`` (a general product
of the same shape, y another random matrix), both into new numpy arrays with the same options,
and their ratio gram / general.

A result whose error is over the tolerance exits with status 1; a bad option with status 2.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, max_relative_error, write_json
from oocgemm import machine
from oocgemm.errors import OOCGemmError, OptionError

MEASUREMENTS = ("decode", "memory", "oocgemm", "dask")
"""What one run measures, in this order; ``--skip`` leaves some out."""

TOLERANCE = 1e-10
"""Largest ``max|C - C_memory| / max|C_memory|`` accepted for float64."""

SEED = 0
"""Seed of X (and, with ``--square``, of y and the sampled rows)."""

DROP_CACHES = "/proc/sys/vm/drop_caches"


# ------------------------------------------------------------------------------------------
# Where and when
# ------------------------------------------------------------------------------------------
def describe_machine() -> dict:
    """Host name, CPU, cores, memory, BLAS, GPUs and versions (``oocgemm info``'s facts), with
    the date and time of the run."""
    from oocgemm.info import system_info

    info = system_info()
    gpus = [d.get("name") for d in info["gpus"].get("devices", [])]
    return {
        "hostname": socket.gethostname(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": info["host"]["cpu"],
        "cores": info["host"]["cores"],
        "cpu_count": info["host"]["logical_cpus"],
        "memory_total": info["host"]["memory_total"],
        "gpu": gpus[0] if gpus else None,
        "gpus": gpus,
        "blas": info["blas"].get("name"),
        "versions": info["versions"],
    }


def _machine_line(m: dict) -> str:
    gpu = m["gpu"] or "none"
    if len(m["gpus"]) > 1:
        gpu += f" (x{len(m['gpus'])})"
    return (f"{m['hostname']}: {m['cpu'] or 'unknown CPU'}, {m['cores']} cores "
            f"({m['cpu_count']} logical), {m['memory_total'] / 2**30:.0f} GiB, BLAS "
            f"{m['blas']}, GPU {gpu}; {m['date']}")


# ------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------
def resolve_device(device: str) -> str:
    """'cpu' or 'cuda[:N]'; 'auto' is a GPU where CuPy sees one."""
    from oocgemm import cuda

    if device == "auto":
        return "cuda" if cuda.device_count() > 0 else "cpu"
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if cuda.device_count() == 0:
            raise OptionError(f"--device {device}: no GPU found (CuPy installed: "
                              f"{cuda.cupy_installed()}); use --device cpu")
        return device
    raise OptionError(f"--device must be auto, cpu or cuda[:N], got {device!r}")


def parse_skip(text: str | None) -> frozenset[str]:
    names = frozenset(s.strip() for s in (text or "").split(",") if s.strip())
    unknown = sorted(names - set(MEASUREMENTS))
    if unknown:
        raise OptionError(f"--skip: unknown measurement(s) {', '.join(unknown)}; known: "
                          f"{', '.join(MEASUREMENTS)}")
    return names


def drop_page_cache() -> None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``, or an OptionError that says why not."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        raise OptionError(f"--cold drops the page cache by writing 3 to {DROP_CACHES}, which "
                          f"is not permitted here ({exc.strerror or exc}); run as root on a "
                          f"machine whose /proc/sys is writable, or leave out --cold") from None


def _is_gpu(device: str) -> bool:
    return device.startswith("cuda")


def _free_gpu(device: str) -> None:
    """Give CuPy's cached blocks back, so that the next measurement finds the GPU empty."""
    if _is_gpu(device):
        import cupy

        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def _gpu_index(device: str) -> int:
    """The GPU of the CuPy baselines: N of 'cuda:N', else the first."""
    index = device.partition(":")[2]
    return int(index) if index.isdigit() else 0


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


# ------------------------------------------------------------------------------------------
# X on disk
# ------------------------------------------------------------------------------------------
def write_x(path: str, stored: np.ndarray, chunks: tuple[int, int], threads: int) -> dict:
    """``stored`` written as a new Zarr array at ``path`` with zarr's defaults (format 3,
    zstd) and ``chunks``, one whole chunk per write, on ``threads`` threads."""
    import zarr

    from benchmarks.zarr_stores import describe_store

    arr = zarr.create_array(store=path, shape=stored.shape, dtype=stored.dtype, chunks=chunks,
                            overwrite=True)
    corners = [(i, j) for i in range(0, stored.shape[0], chunks[0])
               for j in range(0, stored.shape[1], chunks[1])]

    def one(corner):
        i, j = corner
        arr[i:i + chunks[0], j:j + chunks[1]] = stored[i:i + chunks[0], j:j + chunks[1]]

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, corners))
    os.sync()
    seconds = time.perf_counter() - start
    info = describe_store(path)
    return {"seconds": seconds, "stored_bytes": info.stored_bytes, "files": list(info.files),
            "codecs": list(info.codecs), "chunks": len(corners)}


def prepare(files: list[str], cold: bool, threads: int) -> None:
    """Before a timed run: the page cache dropped (``cold``), or every chunk file read once."""
    from benchmarks.storage_floor import read_files

    if cold:
        drop_page_cache()
    else:
        read_files(files, threads)


# ------------------------------------------------------------------------------------------
# The measurements
# ------------------------------------------------------------------------------------------
def _regions(shape, chunks) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    return [((i, min(i + chunks[0], shape[0])), (j, min(j + chunks[1], shape[1])))
            for i in range(0, shape[0], chunks[0]) for j in range(0, shape[1], chunks[1])]


def measure_decode(path: str, role: str, stored: np.ndarray, files: list[str], *, repeat: int,
                   cold: bool, threads: int) -> dict:
    """Every chunk decoded once with the engine's reader, into buffers allocated (and their
    pages touched) before the clock; best of ``repeat``. The decoded chunks are checked
    against ``stored`` after the last run."""
    from oocgemm.storage import open_source
    from oocgemm.storage.zarr_store import pipeline_config

    pipeline = pipeline_config(machine.cores()).get("codec_pipeline.path", "zarr's default")
    probe = open_source(path, role)
    chunks, shape = probe.chunks, probe.shape
    probe.close()
    regions = _regions(shape, chunks)
    order = [(r0 // chunks[0], c0 // chunks[1]) for (r0, _), (c0, _) in regions]
    buffers = [np.zeros((r1 - r0, c1 - c0), dtype=stored.dtype) for (r0, r1), (c0, c1) in regions]
    prefetch = 2 * threads  # ChunkReader hints the storage this many decodes ahead
    times = []
    for _ in range(repeat):
        prepare(files, cold, threads)
        source = open_source(path, role)  # fresh: its storage hints are per source
        hint = getattr(source, "prefetch_chunk", None)

        def one(at, source=source, hint=hint):
            if hint is not None:
                for index in order[at:at + 1 + prefetch]:
                    hint(index)
            source.read_chunk(order[at], buffers[at])

        with ThreadPoolExecutor(threads, thread_name_prefix="gram-decode") as pool:
            start = time.perf_counter()
            list(pool.map(one, range(len(order))))
            times.append(time.perf_counter() - start)
        source.close()
    correct = all(np.array_equal(buf, stored[r0:r1, c0:c1])
                  for buf, ((r0, r1), (c0, c1)) in zip(buffers, regions))
    best = min(times)
    return {"seconds": best, "times": times, "chunks": len(order), "chunk_shape": list(chunks),
            "threads": threads, "pipeline": pipeline, "decoded_bytes": stored.nbytes,
            "gbps": stored.nbytes / best / GB, "correct": correct}


def measure_memory(stored: np.ndarray, side: str, device: str, *, repeat: int) -> dict:
    """The in-memory product alone, best of ``repeat``; returns the product as ``"c"`` (the
    reference of the others)."""
    flops = 2 * max(stored.shape) * min(stored.shape) ** 2

    def gram(x):
        return x.T @ x if side == "a" else x @ x.T

    times, parts, c = [], [], None
    if not _is_gpu(device):
        gram(np.ones((64, 64)))  # the BLAS's threads started outside the clock
        for _ in range(repeat):
            c = None
            start = time.perf_counter()
            c = gram(stored)
            times.append(time.perf_counter() - start)
        how = "numpy X.T @ X (SYRK)" if side == "a" else "numpy Y @ Y.T (SYRK)"
    else:
        import cupy

        from benchmarks.common import check_room

        with cupy.cuda.Device(_gpu_index(device)):
            m = min(stored.shape)
            check_room(stored.nbytes + 2 * m * m * stored.itemsize, "the in-memory product")
            gram(cupy.ones((64, 64)))  # cuBLAS handle and kernels outside the clock
            for _ in range(repeat):
                c = None
                cupy.cuda.Device().synchronize()
                start = time.perf_counter()
                x = cupy.asarray(stored)
                cupy.cuda.Device().synchronize()
                uploaded = time.perf_counter()
                cd = gram(x)
                cupy.cuda.Device().synchronize()
                multiplied = time.perf_counter()
                c = cupy.asnumpy(cd)
                end = time.perf_counter()
                times.append(end - start)
                parts.append({"upload": uploaded - start, "product": multiplied - uploaded,
                              "download": end - multiplied})
                del x, cd
                _free_gpu(device)
        how = ("CuPy upload + X.T @ X + download" if side == "a"
               else "CuPy upload + Y @ Y.T + download")
    best = min(times)
    out = {"seconds": best, "times": times, "how": how, "tflops": flops / best / 1e12, "c": c}
    if parts:
        out["parts"] = parts[times.index(best)]
    return out


def _chunk_counts(chunks: dict) -> dict:
    """Per operand: stored chunks and the run's decodes."""
    return {name: {"chunks": doc.get("chunks"), "decodes": doc.get("decodes")}
            for name, doc in sorted(chunks.items()) if name in ("A", "B")}


def measure_oocgemm(path: str, side: str, device: str, files: list[str], *, repeat: int,
                    cold: bool, threads: int, memory_limit, host_memory_limit,
                    n_chunks: int) -> dict:
    """``oocgemm.multiply(path, path, trans_a=True)`` (``trans_b`` for side b) into a new
    numpy array; best of ``repeat``; returns the last product as ``"c"``."""
    import oocgemm

    options = {"trans_a": True} if side == "a" else {"trans_b": True}
    runs, result, c = [], None, None
    for _ in range(repeat):
        result = c = None
        prepare(files, cold, threads)
        start = time.perf_counter()
        result = oocgemm.multiply(path, path, device=device, memory_limit=memory_limit,
                                  host_memory_limit=host_memory_limit, progress=False,
                                  **options)
        wall = time.perf_counter() - start
        c = result.out
        runs.append({"wall": wall, "run": result.seconds, "tflops": result.tflops,
                     "flops": result.flops, "chunks": _chunk_counts(result.chunks)})
    assert result is not None and c is not None
    best = min(runs, key=lambda r: r["wall"])
    decodes = sum(d["decodes"] or 0 for d in best["chunks"].values())
    return {"seconds": best["wall"], "run_seconds": best["run"], "times": [r["wall"] for r in runs],
            "run_times": [r["run"] for r in runs], "tflops_result": best["tflops"],
            "flops_result": best["flops"], "chunks": best["chunks"], "decodes": decodes,
            "decodes_per_chunk": decodes / n_chunks, "stored_chunks": n_chunks,
            "tile": list(result.plan.tile), "symmetric": bool(np.array_equal(c, c.T)),
            "c": np.asarray(c)}


def measure_dask(path: str, side: str, device: str, files: list[str], *, repeat: int,
                 cold: bool, threads: int) -> dict:
    """dask's own ``x.T @ x`` of ``da.from_zarr(path)`` under the threaded scheduler, CuPy
    blocks on a GPU; best of ``repeat``; returns the product as ``"c"``. ``{"skipped": why}``
    when dask (or, on a GPU, CuPy) is missing."""
    try:
        import dask
        import dask.array as da
    except ImportError:
        return {"skipped": "dask is not installed (pip install 'dask[array]')"}
    cupy = None
    if _is_gpu(device):
        try:
            import cupy
        except ImportError:
            return {"skipped": "CuPy is not installed: no dask + CuPy baseline"}
    times, c = [], None
    for _ in range(repeat):
        c = None
        prepare(files, cold, threads)
        start = time.perf_counter()
        x = da.from_zarr(path)
        if cupy is not None:
            x = x.map_blocks(cupy.asarray, dtype=x.dtype)
        z = x.T @ x if side == "a" else x @ x.T
        with dask.config.set(scheduler="threads", num_workers=threads):
            c = z.compute()
        if cupy is not None:
            c = cupy.asnumpy(c)
        times.append(time.perf_counter() - start)
        _free_gpu(device)
    how = "da.from_zarr, " + ("map_blocks(cupy.asarray), " if cupy is not None else "") + (
        "(x.T @ x).compute()" if side == "a" else "(x @ x.T).compute()")
    return {"seconds": min(times), "times": times, "how": how, "threads": threads,
            "c": np.asarray(c)}


# ------------------------------------------------------------------------------------------
# The Zarr run
# ------------------------------------------------------------------------------------------
def run_zarr(args, device: str, skip: frozenset[str], say) -> dict:
    from oocgemm.random_matrices import random_matrix

    rows, cols, chunk_rows = args.rows, args.cols, args.chunk_rows
    threads = machine.cores()
    side = args.transpose_side
    shape = (rows, cols) if side == "a" else (cols, rows)
    chunks = (chunk_rows, cols) if side == "a" else (cols, chunk_rows)
    x_bytes = rows * cols * 8
    copies = 2 + ("decode" not in skip) + ("dask" not in skip)  # X, its decode, oocgemm, dask
    need = copies * x_bytes
    if need > machine.available_memory():
        raise OptionError(f"X of {rows} x {cols} float64 ({x_bytes / GB:.1f} GB) needs about "
                          f"{need / GB:.1f} GB of host memory here; "
                          f"{machine.available_memory() / GB:.1f} GB is available: choose "
                          f"smaller --rows or --cols, or --skip some measurements")
    if args.cold:
        drop_page_cache()  # fails now, before X is made, where it is not permitted

    made_dir = args.dir is None
    folder = tempfile.mkdtemp(prefix="oocgemm-gram-") if made_dir else os.path.abspath(args.dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"x-{rows}x{cols}{'-t' if side == 'b' else ''}.zarr")
    doc: dict = {"benchmark": "gram", "machine": describe_machine(), "device": device,
                 "rows": rows, "cols": cols, "chunk_rows": chunk_rows, "dtype": "float64",
                 "transpose_side": side, "stored_shape": list(shape), "chunks": list(chunks),
                 "product": "X^T X" + (" (trans_a=True)" if side == "a"
                                       else " as Y Y^T, Y = X^T stored (trans_b=True)"),
                 "flops": 2 * rows * cols * cols, "repeat": args.repeat,
                 "cache": "cold" if args.cold else "warm", "memory_limit": args.memory_limit,
                 "host_memory_limit": args.host_memory_limit, "path": path,
                 "tolerance": TOLERANCE, "measurements": {}}
    say(f"Gram product: X {rows} x {cols} float64 ({x_bytes / GB:.2f} GB), "
        + ("X^T X, trans_a=True" if side == "a" else "stored as X^T, X^T X as Y Y^T, "
           "trans_b=True") + f", device {device}")
    say(f"machine: {_machine_line(doc['machine'])}")
    try:
        stored = random_matrix(shape, "float64", seed=SEED)
        written = write_x(path, stored, chunks, threads)
        files = written.pop("files")
        doc["stored_bytes"] = written["stored_bytes"]
        doc["write"] = written
        say(f"wrote {path}: chunks {chunks[0]} x {chunks[1]} ({written['chunks']} of them), "
            f"{'+'.join(written['codecs']) or 'raw'}, {written['stored_bytes'] / GB:.2f} GB "
            f"stored in {written['seconds']:.1f} s")
        doc["measurements"] = measure_all(args, doc, path, stored, files, device, skip,
                                          threads, written["chunks"], say)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if made_dir:
            shutil.rmtree(folder, ignore_errors=True)
    doc["ratios"] = ratios(doc["measurements"])
    return doc


def measure_all(args, doc, path, stored, files, device, skip, threads, n_chunks, say) -> dict:
    side, repeat, cold = args.transpose_side, args.repeat, args.cold
    found: dict = {}
    reference = None
    if "decode" not in skip:
        found["decode"] = measure_decode(path, side, stored, files, repeat=repeat, cold=cold,
                                         threads=threads)
        say(f"  decode   {_seconds(found['decode']['seconds'])}")
    if "memory" not in skip:
        memory = measure_memory(stored, side, device, repeat=repeat)
        reference = memory.pop("c")
        found["memory"] = memory
        say(f"  memory   {_seconds(memory['seconds'])}")
    if reference is None and not {"oocgemm", "dask"} <= skip:
        reference = stored.T @ stored if side == "a" else stored @ stored.T  # untimed
    if "oocgemm" not in skip:
        if _is_gpu(device):  # a CUDA context and cuBLAS handles made outside the clock
            import oocgemm

            small = np.ones((64, 64))
            oocgemm.multiply(small, small, trans_a=True, device=device, progress=False)
        ooc = measure_oocgemm(path, side, device, files, repeat=repeat, cold=cold,
                              threads=threads, memory_limit=args.memory_limit,
                              host_memory_limit=args.host_memory_limit, n_chunks=n_chunks)
        ooc["error"] = max_relative_error(ooc.pop("c"), reference)
        ooc["correct"] = ooc["error"] < TOLERANCE
        ooc["tflops"] = doc["flops"] / ooc["seconds"] / 1e12
        found["oocgemm"] = ooc
        say(f"  oocgemm  {_seconds(ooc['seconds'])}")
    if "dask" not in skip:
        dsk = measure_dask(path, side, device, files, repeat=repeat, cold=cold, threads=threads)
        if "skipped" not in dsk:
            dsk["error"] = max_relative_error(dsk.pop("c"), reference)
            dsk["correct"] = dsk["error"] < TOLERANCE
            dsk["tflops"] = doc["flops"] / dsk["seconds"] / 1e12
        found["dask"] = dsk
        say(f"  dask     {_seconds(dsk.get('seconds'))}" + (
            f" (skipped: {dsk['skipped']})" if "skipped" in dsk else ""))
    return found


def ratios(found: dict) -> dict:
    """oocgemm / decode, oocgemm / max(decode, memory), dask / oocgemm (None where a side is
    missing); oocgemm's wall time."""

    def t(name):
        return found.get(name, {}).get("seconds")

    ooc, dec, mem, dsk = t("oocgemm"), t("decode"), t("memory"), t("dask")
    floor = max(dec, mem) if dec is not None and mem is not None else None
    return {"oocgemm/decode": ooc / dec if ooc and dec else None,
            "oocgemm/max(decode,memory)": ooc / floor if ooc and floor else None,
            "dask/oocgemm": dsk / ooc if dsk and ooc else None}


def zarr_table(doc: dict) -> str:
    found = doc["measurements"]
    lines = [f"Gram {doc['product']}: X {doc['rows']} x {doc['cols']} float64, stored "
             f"{doc['stored_shape'][0]} x {doc['stored_shape'][1]} in chunks of "
             f"{doc['chunks'][0]} x {doc['chunks'][1]} ({'+'.join(doc['write']['codecs'])}, "
             f"{doc['stored_bytes'] / GB:.2f} GB stored); {doc['cache']}, best of "
             f"{doc['repeat']}, device {doc['device']}",
             f"machine: {_machine_line(doc['machine'])}",
             f"  {'measurement':<12}{'seconds':>10}{'TFLOP/s':>9}  notes"]
    flops = doc["flops"]
    if "decode" in found:
        d = found["decode"]
        lines.append(f"  {'decode':<12}{_seconds(d['seconds']):>10}{'-':>9}  {d['chunks']} "
                     f"chunks read_chunk on {d['threads']} threads, {d['gbps']:.2f} GB/s "
                     f"decoded, codec pipeline {d['pipeline'].rpartition('.')[2]}"
                     + ("" if d["correct"] else "  WRONG DATA"))
    if "memory" in found:
        m = found["memory"]
        note = m["how"]
        if "parts" in m:
            note += " (" + ", ".join(f"{k} {_seconds(v)}" for k, v in m["parts"].items()) + ")"
        lines.append(f"  {'memory':<12}{_seconds(m['seconds']):>10}"
                     f"{flops / m['seconds'] / 1e12:9.3f}  {note}")
    if "oocgemm" in found:
        o = found["oocgemm"]
        counts = ", ".join(f"{k} {v['decodes']}/{v['chunks']}" for k, v in o["chunks"].items())
        lines.append(f"  {'oocgemm':<12}{_seconds(o['seconds']):>10}{o['tflops']:9.3f}  "
                     f"run {_seconds(o['run_seconds'])} ({o['tflops_result']:.3f} TFLOP/s by "
                     f"result.tflops); decodes {counts} ({o['decodes_per_chunk']:.2f} per "
                     f"stored chunk); tile {tuple(o['tile'])}")
        lines.append(f"  {'':<12}{'':>10}{'':>9}  bitwise symmetric: "
                     f"{'yes' if o['symmetric'] else 'no'}; rel. error {o['error']:.2e} "
                     f"({'ok' if o['correct'] else 'FAILED'}, tolerance {TOLERANCE:g})")
    if "dask" in found:
        k = found["dask"]
        if "skipped" in k:
            lines.append(f"  {'dask':<12}{'-':>10}{'-':>9}  skipped: {k['skipped']}")
        else:
            lines.append(f"  {'dask':<12}{_seconds(k['seconds']):>10}{k['tflops']:9.3f}  "
                         f"{k['how']}, {k['threads']} threads; rel. error {k['error']:.2e} "
                         f"({'ok' if k['correct'] else 'FAILED'})")
    lines.append("  ratios (oocgemm's wall time):")
    for name, value in doc["ratios"].items():
        lines.append(f"    {name:<28}{'-' if value is None else f'{value:.3f}'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# --square N
# ------------------------------------------------------------------------------------------
def run_square(args, device: str, say) -> dict:
    """``multiply(x, x, trans_a=True)`` against ``multiply(x, y, trans_a=True)``, N x N
    float64 numpy operands, both into new arrays; interleaved, best of ``repeat`` each."""
    import oocgemm
    from oocgemm.random_matrices import random_matrix

    n = args.square
    need = 4 * n * n * 8  # x, y, one C, its check
    if need > machine.available_memory():
        raise OptionError(f"--square {n} needs about {need / GB:.1f} GB of host memory; "
                          f"{machine.available_memory() / GB:.1f} GB is available")
    doc: dict = {"benchmark": "gram-square", "machine": describe_machine(), "device": device,
                 "n": n, "dtype": "float64", "flops": 2 * n ** 3, "repeat": args.repeat,
                 "memory_limit": args.memory_limit,
                 "host_memory_limit": args.host_memory_limit, "tolerance": TOLERANCE}
    say(f"Gram against general product: {n} x {n} float64 in host memory, device {device}")
    say(f"machine: {_machine_line(doc['machine'])}")
    x = random_matrix((n, n), "float64", seed=SEED)
    y = random_matrix((n, n), "float64", seed=SEED + 1)
    options = {"trans_a": True, "device": device, "memory_limit": args.memory_limit,
               "host_memory_limit": args.host_memory_limit, "progress": False}
    small = np.ones((64, 64))
    oocgemm.multiply(small, small, **options)  # a CUDA context and handles outside the clock
    sample = np.sort(np.random.default_rng(SEED + 2).choice(n, size=min(n, 16),
                                                                 replace=False))
    found: dict = {name: {"times": [], "run_times": []} for name in ("gram", "general")}
    for _ in range(args.repeat):
        for name, other in (("gram", x), ("general", y)):
            start = time.perf_counter()
            result = oocgemm.multiply(x, other, **options)
            wall = time.perf_counter() - start
            entry = found[name]
            entry["times"].append(wall)
            entry["run_times"].append(result.seconds)
            c = np.asarray(result.out)
            entry["error"] = max_relative_error(c[sample], x[:, sample].T @ other)
            entry["correct"] = entry["error"] < TOLERANCE
            entry["tile"] = list(result.plan.tile)
            entry["flops_result"] = result.flops
            if name == "gram":
                entry["symmetric"] = bool(np.array_equal(c, c.T))
            del result, c
            say(f"  {name:<8} {_seconds(wall)}")
    for entry in found.values():
        best = min(entry["times"])
        entry["seconds"] = best
        entry["run_seconds"] = entry["run_times"][entry["times"].index(best)]
        entry["tflops"] = doc["flops"] / best / 1e12
    doc["measurements"] = found
    doc["ratio"] = found["gram"]["seconds"] / found["general"]["seconds"]
    return doc


def square_table(doc: dict) -> str:
    n = doc["n"]
    lines = [f"Gram x^T x against general x^T y: {n} x {n} float64 numpy operands, out=None, "
             f"device {doc['device']}, memory limit {doc['memory_limit']}, best of "
             f"{doc['repeat']}",
             f"machine: {_machine_line(doc['machine'])}",
             f"  {'product':<10}{'seconds':>10}{'TFLOP/s':>9}  notes"]
    for name, e in doc["measurements"].items():
        sym = (f"; bitwise symmetric: {'yes' if e['symmetric'] else 'no'}"
               if "symmetric" in e else "")
        lines.append(f"  {name:<10}{_seconds(e['seconds']):>10}{e['tflops']:9.3f}  run "
                     f"{_seconds(e['run_seconds'])}, tile {tuple(e['tile'])}; sampled rel. "
                     f"error {e['error']:.2e} ({'ok' if e['correct'] else 'FAILED'}){sym}")
    lines.append(f"  ratio gram / general: {doc['ratio']:.3f}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gram",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=_positive, default=400_000, help="rows of X (default 400000)")
    p.add_argument("--cols", type=_positive, default=1024, help="columns of X (default 1024)")
    p.add_argument("--chunk-rows", type=_positive, default=16384,
                   help="rows of X per Zarr chunk; a chunk holds every column (default 16384)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N] (default auto)")
    p.add_argument("--memory-limit", default=None,
                   help="oocgemm's memory_limit (default: oocgemm's own)")
    p.add_argument("--host-memory-limit", default=None,
                   help="oocgemm's host_memory_limit (default: oocgemm's own)")
    p.add_argument("--repeat", type=_positive, default=1,
                   help="timed runs of each measurement; the best is reported (default 1)")
    p.add_argument("--cold", action="store_true",
                   help="drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches) before "
                        "each timed run; needs root")
    p.add_argument("--skip", default=None,
                   help=f"comma list of measurements to leave out: {', '.join(MEASUREMENTS)}")
    p.add_argument("--transpose-side", choices=("a", "b"), default="a",
                   help="a: X stored, X^T X with trans_a=True; b: X^T stored (chunks "
                        "cols x chunk-rows), the same product as Y Y^T with trans_b=True")
    p.add_argument("--dir", default=None, help="where the Zarr store goes (default a temp dir)")
    p.add_argument("--square", type=_positive, default=None, metavar="N",
                   help="instead: gram against general product of N x N numpy operands")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))

    def say(text):
        print(text, flush=True)

    try:
        device = resolve_device(args.device)
        if args.square:
            doc = run_square(args, device, say)
            say(square_table(doc))
            ok = all(e["correct"] for e in doc["measurements"].values())
        else:
            skip = parse_skip(args.skip)
            doc = run_zarr(args, device, skip, say)
            say(zarr_table(doc))
            ok = all(m.get("correct", True) for m in doc["measurements"].values())
    except OOCGemmError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    write_json(args.json, doc)
    if not ok:
        print("error: a result differs from the in-memory product beyond the tolerance "
              f"{TOLERANCE:g}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

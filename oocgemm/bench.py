"""Benchmarks, system facts and test matrices, as functions that return plain dicts.

The command line (:mod:`oocgemm.cli`) only prints what these return, so that scripts and
notebooks can call them too:

* :func:`system_info` -- versions, host cores and memory, the numpy BLAS, GPUs;
* :func:`measure_bandwidth` -- host memcpy bandwidth, and per GPU the hook
  :func:`gpu_transfer_bandwidth` (H2D/D2H, to be filled in by the CUDA runtime);
* :func:`cpu_benchmark` -- oocgemm on the CPU against ``numpy.matmul``, in memory;
  :func:`gpu_benchmark` is its GPU counterpart (a hook, not written yet);
* :func:`write_random` and :class:`NormalStream` -- standard-normal matrices of any size,
  written band by band to ``.zarr`` or ``.npy``, identical for one seed whatever the chunking.

Nothing here imports CuPy unless :func:`oocgemm.cuda.device_count` found a GPU (which itself
imports CuPy only where CuPy is installed and an NVIDIA driver is present).
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import math
import os
import platform
import shutil
import statistics
import sys
import time
from datetime import timedelta

import numpy as np

from . import __version__, cuda, hostinfo
from .errors import BudgetError, OptionError, OutputError
from .storage import _files

#: The dtypes oocgemm multiplies (and ``random`` writes).
DTYPES = ("float32", "float64", "complex64", "complex128")

#: GFLOP/s of oocgemm over numpy's that the CPU benchmark aims at.
CPU_TARGET_RATIO = 0.80

#: Default chunk edge of ``random`` .zarr outputs (chunks are min(shape, 2048x2048)).
DEFAULT_CHUNK = 2048

#: Bytes of matrix that ``write_random`` generates at a time (its memory use is a few times this).
RANDOM_BLOCK_BYTES = 64 << 20


# ==========================================================================================
# System facts
# ==========================================================================================
def _version(module: str) -> str | None:
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        try:
            return getattr(importlib.import_module(module), "__version__", "unknown")
        except ImportError:
            return None


def _cupy_distribution_version() -> str | None:
    """CuPy's version from its installed distribution (cupy, cupy-cuda12x...), without
    importing it."""
    try:
        names = importlib.metadata.packages_distributions().get("cupy", [])
    except Exception:  # pragma: no cover - broken metadata
        names = []
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover
            continue
    return "unknown" if cuda.cupy_installed() else None


def blas_info() -> dict:
    """The BLAS that numpy was built with (name, version, configuration) and the thread
    settings from the environment."""
    info: dict = {"name": "unknown"}
    try:
        config = np.show_config(mode="dicts")  # numpy >= 1.26
        blas = config.get("Build Dependencies", {}).get("blas", {})
        info = {"name": blas.get("name", "unknown"), "version": blas.get("version"),
                "configuration": blas.get("openblas configuration")}
    except Exception:  # older numpy: no dict mode
        pass
    threads = {var: os.environ[var] for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                "MKL_NUM_THREADS") if var in os.environ}
    if threads:
        info["threads_env"] = threads
    try:  # optional: the BLAS actually loaded, with its thread count
        from threadpoolctl import threadpool_info

        info["runtime"] = [{k: lib.get(k) for k in ("internal_api", "version", "num_threads",
                                                     "architecture")}
                           for lib in threadpool_info() if lib.get("user_api") == "blas"]
    except ImportError:
        pass
    return {k: v for k, v in info.items() if v is not None}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_info() -> dict:
    """CuPy and the GPUs it sees: ``{"cupy": version or None, "driver": bool, "devices": [...]}``.

    CuPy is imported only through :func:`oocgemm.cuda.device_count`, i.e. only when it is
    installed and an NVIDIA driver is present.
    """
    installed = cuda.cupy_installed()
    driver = cuda.driver_present()
    info: dict = {"cupy": _cupy_distribution_version() if installed else None,
                  "driver": driver, "devices": []}
    count = cuda.device_count()
    if count == 0:
        if not installed:
            info["note"] = "CuPy is not installed (pip install 'oocgemm[cuda12]' or '[cuda13]')"
        elif not driver:
            info["note"] = "no NVIDIA driver found"
        else:
            info["note"] = "CuPy found no CUDA GPU"
        return info
    try:
        import cupy

        info["cupy"] = cupy.__version__
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        for index in range(count):
            props = cupy.cuda.runtime.getDeviceProperties(index)
            name = props.get("name", b"")
            free, total = cuda.memory_info(index)
            info["devices"].append({
                "device": f"cuda:{index}",
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "compute_capability": f"{props.get('major')}.{props.get('minor')}",
                "memory_total": int(total), "memory_free": int(free)})
    except Exception as exc:  # report, do not crash `oocgemm info`
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def system_info() -> dict:
    """Versions, host, BLAS and GPUs, as plain data (``oocgemm info --json``)."""
    versions = {"oocgemm": __version__,
                "python": f"{platform.python_version()} ({platform.python_implementation()})"}
    for name in ("numpy", "zarr", "dask", "click", "tqdm"):
        versions[name] = _version(name)
    gpus = gpu_info()
    versions["cupy"] = gpus["cupy"]
    return {
        "versions": versions,
        "host": {"platform": platform.platform(), "cpu": _cpu_model(),
                 "cores": hostinfo.cores(), "logical_cpus": os.cpu_count(),
                 "memory_total": hostinfo.total_memory(),
                 "memory_available": hostinfo.available_memory()},
        "blas": blas_info(),
        "gpus": gpus,
    }


# ==========================================================================================
# Bandwidth
# ==========================================================================================
def host_memcpy_bandwidth(nbytes: int | None = None, repeat: int = 5) -> dict:
    """Copy one host buffer into another ``repeat`` times (numpy.copyto) and report the rate
    in bytes copied per second (each copy reads and writes ``nbytes``).

    ``nbytes`` defaults to 256 MiB, or an eighth of available memory if that is less.
    """
    if nbytes is None:
        nbytes = min(256 << 20, hostinfo.available_memory() // 8)
    nbytes = max(1 << 20, int(nbytes))
    src = np.ones(nbytes, dtype=np.uint8)  # touched: no first-touch page faults when timed
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(1, repeat)):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return {"bytes": nbytes, "repeat": len(times), "seconds": times,
            "best_gbps": nbytes / min(times) / 1e9,
            "median_gbps": nbytes / statistics.median(times) / 1e9}


def gpu_transfer_bandwidth(index: int, nbytes: int | None = None, repeat: int = 5) -> dict | None:
    """Host<->device bandwidth of GPU ``index`` from pinned and pageable host memory, 1e9
    bytes per second (``oocgemm info --bandwidth``); None where no GPU is usable."""
    if cuda.device_count() <= index:
        return None
    from .cuda.baselines import h2d_d2h_bandwidth

    nbytes = nbytes or (1 << 30)
    measured = h2d_d2h_bandwidth(nbytes, device=index)
    return {f"{key[:-5]}_gbps": value for key, value in measured.items()} | {
        "bytes": nbytes, "repeat": repeat}


def measure_bandwidth(*, gpus: bool = True, nbytes: int | None = None, repeat: int = 5) -> dict:
    """``{"host_memcpy": {...}, "gpus": [{"device": "cuda:0", ...}]}`` (``info --bandwidth``)."""
    result: dict = {"host_memcpy": host_memcpy_bandwidth(nbytes, repeat)}
    result["gpus"] = []
    if gpus:
        for index in range(cuda.device_count()):
            measured = gpu_transfer_bandwidth(index, nbytes, repeat)
            result["gpus"].append({"device": f"cuda:{index}", "measured": measured is not None,
                                   **(measured or {})})
    return result


# ==========================================================================================
# Benchmarks
# ==========================================================================================
def _check_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in DTYPES:
        raise OptionError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    return dt


def _operands(n: int, dtype: np.dtype, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)

    def one():
        x = rng.standard_normal((n, n)).astype(dtype)
        if dtype.kind == "c":
            x.imag = rng.standard_normal((n, n))
        return x

    return one(), one()


def tolerance(dtype, k: int) -> float:
    """Largest acceptable ``max|C - C_numpy| / max|C_numpy|`` for a product of depth ``k``:
    both results sum the same k products in different orders."""
    return 100 * float(np.finfo(np.dtype(dtype)).eps) * math.sqrt(max(k, 1))


def max_relative_error(result, reference) -> float:
    """``max|result - reference| / max|reference|`` (0 when the reference is all zeros)."""
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    diff = float(np.max(np.abs(np.asarray(result) - reference))) if reference.size else 0.0
    return diff / scale if scale else diff


def cpu_benchmark(size: int = 4096, repeat: int = 3, dtype="float64", *, seed: int = 0,
                  warmup: bool = True, on_step=None) -> dict:
    """oocgemm on the CPU against ``numpy.matmul`` on in-memory ``size``x``size`` operands.

    Each of the ``repeat`` rounds times ``a @ b`` then ``oocgemm.multiply(a, b,
    device='cpu')`` (wall time of the whole call: planning, execution, a new result array,
    as numpy's). After one untimed warm-up of each (``warmup``), medians give each side's
    GFLOP/s and ``ratio`` = oocgemm GFLOP/s / numpy GFLOP/s (target ``CPU_TARGET_RATIO``).
    The last oocgemm result is checked against numpy's (``max_rel_error`` against
    ``tolerance``).

    ``on_step(round, numpy_seconds, oocgemm_seconds)`` is called after each round.
    """
    from .api import multiply

    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise OptionError(f"size must be a positive integer, got {size!r}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise OptionError(f"repeat must be a positive integer, got {repeat!r}")
    dt = _check_dtype(dtype)
    n = size
    matrix = n * n * dt.itemsize
    # a, b, numpy's C, oocgemm's C, and oocgemm's working buffers (at most about 3 C's more)
    need = 7 * matrix
    available = hostinfo.available_memory()
    if need > available:
        raise BudgetError(f"size {n} ({dt.name}) needs about {_gib(need)} of memory for the "
                          f"in-memory benchmark; {_gib(available)} is available: use a smaller "
                          f"--size")
    a, b = _operands(n, dt, seed)
    flops = (8 if dt.kind == "c" else 2) * n ** 3

    def run_oocgemm():
        start = time.perf_counter()
        result = multiply(a, b, device="cpu", progress=False)
        return time.perf_counter() - start, result

    if warmup:
        np.matmul(a, b)
        run_oocgemm()
    numpy_times, oocgemm_times, execute_times = [], [], []
    c_numpy = result = None
    for step in range(repeat):
        c_numpy = result = None  # free the previous round's products first
        start = time.perf_counter()
        c_numpy = a @ b
        numpy_times.append(time.perf_counter() - start)
        seconds, result = run_oocgemm()
        oocgemm_times.append(seconds)
        execute_times.append(result.seconds)
        if on_step is not None:
            on_step(step, numpy_times[-1], seconds)
    error = max_relative_error(result.out, c_numpy)
    tol = tolerance(dt, n)
    numpy_median = statistics.median(numpy_times)
    oocgemm_median = statistics.median(oocgemm_times)
    numpy_gflops = flops / numpy_median / 1e9 if numpy_median > 0 else float("inf")
    oocgemm_gflops = flops / oocgemm_median / 1e9 if oocgemm_median > 0 else float("inf")
    ratio = oocgemm_gflops / numpy_gflops if numpy_gflops else 0.0
    plan = result.plan
    return {
        "benchmark": "cpu",
        "size": n,
        "dtype": dt.name,
        "repeat": repeat,
        "warmup": warmup,
        "seed": seed,
        "flops": flops,
        "numpy": {"seconds": numpy_times, "median_seconds": numpy_median,
                  "gflops": numpy_gflops},
        "oocgemm": {"seconds": oocgemm_times, "median_seconds": oocgemm_median,
                    "gflops": oocgemm_gflops,
                    "execute_seconds": execute_times,
                    "execute_median_seconds": statistics.median(execute_times),
                    "device": plan.device, "tile": list(plan.tile),
                    "grid": list(plan.grid), "operations": len(result.events)},
        "ratio": ratio,
        "target_ratio": CPU_TARGET_RATIO,
        "meets_target": ratio >= CPU_TARGET_RATIO,
        "max_rel_error": error,
        "tolerance": tol,
        "correct": error <= tol,
        "cores": hostinfo.cores(),
        "blas": blas_info().get("name", "unknown"),
    }


def random_matrix(shape, dtype="float64", seed: int = 0, threads: int | None = None
                  ) -> np.ndarray:
    """A standard-normal matrix filled by several threads (one generator per row band): the
    GPU benchmark's operands are tens of GB, too many for one thread."""
    from concurrent.futures import ThreadPoolExecutor

    out = np.empty(shape, dtype=dtype)
    threads = threads or hostinfo.cores()
    bands = np.array_split(np.arange(shape[0]), max(1, min(threads * 4, shape[0])))
    seeds = np.random.SeedSequence(seed).spawn(len(bands))

    def fill(band, seq):
        if len(band):
            rng = np.random.default_rng(seq)
            rows = out[band[0]:band[-1] + 1]
            if rows.dtype == np.float64:
                rng.standard_normal(out=rows)
            else:
                rows[...] = rng.standard_normal(rows.shape)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, bands, seeds))
    return out


def _sampled_error(result, a, b, rows) -> float:
    """max relative error of ``result[rows]`` against ``a[rows] @ b`` in float64 on the host."""
    reference = a[rows].astype(np.float64) @ b.astype(np.float64, copy=False)
    return max_relative_error(np.asarray(result[rows], dtype=np.float64), reference)


def gpu_benchmark(size: int = 32768, *, memory_limit="16GB", dtype="float64", seed: int = 0,
                  repeat: int = 2, workdir: str | None = None, cases=None,
                  xt_block_dims=(4096, 8192), dask_chunk: int = 8192, device: str = "cuda",
                  on_step=None) -> dict:
    """The CUDA executor against its ceilings and peers on one GPU, in one run (issue figures).

    Cases (TFLOP/s of each, ``size``³ product of in-memory float64 operands, GPU memory
    limited to ``memory_limit``):

    - ``incore``: cuBLAS on one block of the plan's shape, operands on the GPU: the ceiling
      (median of 5); ``incore_sustained``: the same GEMM back to back for the product's flops;
    - ``numpy``: oocgemm from pageable numpy arrays into a numpy array;
    - ``npy``: oocgemm from .npy memmaps in ``workdir`` (written first, so in the page cache);
    - ``cublasxt``: cuBLASXt ``cublasXtDgemm`` from pinned operands at each block dim
      (``cublasxt_pageable`` too, from the numpy arrays at the larger block dim);
    - ``dask``: dask.array with CuPy chunks of ``dask_chunk``.

    Every product is checked against a float64 reference on 8 sampled rows. ``on_step(name,
    entry)`` is called as each case finishes.
    """
    import tempfile

    from .api import multiply, plan as make_plan

    known = ("incore", "numpy", "npy", "cublasxt", "dask")
    cases = tuple(cases or known)
    unknown = [c for c in cases if c not in known]
    if unknown:
        raise OptionError(f"unknown benchmark case(s) {', '.join(unknown)}; known: "
                          f"{', '.join(known)}")
    if workdir is not None and "npy" in cases:  # before any timing, not after the first case
        try:
            os.makedirs(workdir, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"workdir {workdir!r} cannot be created: {exc}") from None
    dt = _check_dtype(dtype)
    n = size
    flops = (8 if dt.kind == "c" else 2) * n ** 3
    result: dict = {"benchmark": "gpu", "size": n, "dtype": dt.name, "memory_limit": memory_limit,
                    "flops": flops, "cases": {}}

    def record(name, seconds, error=None, **extra):
        entry = {"seconds": seconds, "tflops": flops / seconds / 1e12 if seconds else 0.0,
                 **extra}
        if error is not None:
            entry["max_rel_error_sampled"] = error
            entry["correct"] = error <= tolerance(dt, n)
        result["cases"][name] = entry
        if on_step is not None:
            on_step(name, entry)
        return entry

    a = random_matrix((n, n), dt, seed)
    b = random_matrix((n, n), dt, seed + 1)
    rows = np.sort(np.random.default_rng(seed + 2).choice(n, size=min(8, n), replace=False))
    out = np.zeros((n, n), dtype=dt)  # pages touched once, outside every timing
    the_plan = make_plan(a, b, out, device=device, memory_limit=memory_limit)
    w, h, r = the_plan.tile
    result["plan"] = {"tile": [w, h, r], "grid": list(the_plan.grid),
                      "predicted_seconds": the_plan.prediction.total,
                      "operations": len(the_plan.schedule.ops)}

    if "incore" in cases:
        from .cuda.baselines import incore_gemm_seconds, sustained_gemm_seconds

        seconds = incore_gemm_seconds(w, h, r, dt)
        entry = {"seconds": seconds, "tflops": 2 * w * h * r / seconds / 1e12,
                 "shape": [w, h, r]}
        result["cases"]["incore"] = entry
        if on_step is not None:
            on_step("incore", entry)
        # The same block GEMM back to back for as many flops as the whole product: the rate
        # the GPU holds over a product's length, which a burst of five overstates.
        record("incore_sustained", sustained_gemm_seconds(w, h, r, flops, dt),
               shape=[w, h, r])

    def timed_multiply(x, y, label):
        best = None
        for _ in range(repeat + 1):  # the first run warms up (pinned ring, cuBLAS handle)
            out.fill(np.nan)
            run = multiply(x, y, out=out, device=device, memory_limit=memory_limit,
                           progress=False)
            best = run if best is None or run.seconds < best.seconds else best
        return record(label, best.seconds, _sampled_error(out, a, b, rows),
                      tile=list(best.plan.tile), bytes=best.bytes)

    if "numpy" in cases:
        timed_multiply(a, b, "numpy")
    if "npy" in cases:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            pa, pb = os.path.join(tmp, "a.npy"), os.path.join(tmp, "b.npy")
            np.save(pa, a)
            np.save(pb, b)
            timed_multiply(pa, pb, "npy")
    if "cublasxt" in cases:
        from .cuda.baselines import cublasxt_dgemm, pinned_empty

        if dt != np.float64:
            raise OptionError("the cuBLASXt baseline runs in float64 only")
        pa, owner_a = pinned_empty((n, n))
        pb, owner_b = pinned_empty((n, n))
        pc, owner_c = pinned_empty((n, n))
        np.copyto(pa, a)
        np.copyto(pb, b)
        for block in xt_block_dims:
            cublasxt_dgemm(pa[:1024, :1024], pb[:1024, :1024], pc[:1024, :1024], block)  # warm
            pc.fill(np.nan)
            seconds = cublasxt_dgemm(pa, pb, pc, block)
            record(f"cublasxt_pinned_{block}", seconds, _sampled_error(pc, a, b, rows),
                   block_dim=block)
        del pa, pb, pc, owner_a, owner_b, owner_c
        block = max(xt_block_dims)
        out.fill(np.nan)
        seconds = cublasxt_dgemm(a, b, out, block)
        record(f"cublasxt_pageable_{block}", seconds, _sampled_error(out, a, b, rows),
               block_dim=block)
    if "dask" in cases:
        from .cuda.baselines import dask_cupy_matmul

        product, seconds = dask_cupy_matmul(a, b, dask_chunk)
        record("dask", seconds, _sampled_error(product, a, b, rows), chunk=dask_chunk)
        del product

    got = result["cases"]
    xt = [v["tflops"] for k, v in got.items() if k.startswith("cublasxt_pinned")]
    if "incore" in got and "numpy" in got:
        result["numpy_vs_incore"] = got["numpy"]["tflops"] / got["incore"]["tflops"]
        result["numpy_vs_incore_sustained"] = (got["numpy"]["tflops"]
                                               / got["incore_sustained"]["tflops"])
    if "incore" in got and "npy" in got:
        result["npy_vs_incore"] = got["npy"]["tflops"] / got["incore"]["tflops"]
    if xt and "numpy" in got:
        result["numpy_vs_cublasxt"] = got["numpy"]["tflops"] / max(xt)
    return result


def gpu_big_benchmark(size: int = 61440, *, dtype="float64", seed: int = 0, device="cuda",
                      memory_limit=None) -> dict:
    """One product whose operands exceed GPU memory outright (61440: three 30 GB matrices)."""
    from .api import multiply

    dt = _check_dtype(dtype)
    a = random_matrix((size, size), dt, seed)
    b = random_matrix((size, size), dt, seed + 1)
    out = np.zeros((size, size), dtype=dt)
    rows = np.sort(np.random.default_rng(seed + 2).choice(size, size=4, replace=False))
    run = multiply(a, b, out=out, device=device, memory_limit=memory_limit, progress=False)
    error = _sampled_error(out, a, b, rows)
    return {"benchmark": "gpu-big", "size": size, "dtype": dt.name,
            "operand_bytes": 3 * size * size * dt.itemsize, "seconds": run.seconds,
            "tflops": run.tflops, "tile": list(run.plan.tile), "grid": list(run.plan.grid),
            "max_rel_error_sampled": error, "correct": error <= tolerance(dt, size)}


def _gib(nbytes: float) -> str:
    from .plan.units import format_size

    return format_size(nbytes)


# ==========================================================================================
# Random matrices
# ==========================================================================================
class NormalStream:
    """An endless, seekable stream of standard-normal float64 values for one seed.

    Value ``i`` of the stream depends only on the seed and ``i``: it is computed from the
    uniforms ``2*(i//2)`` and ``2*(i//2)+1`` of a PCG64 generator seeded with
    ``SeedSequence(seed)`` (Box-Muller: ``sqrt(-2 log(1 - u0)) * cos/sin(2 pi u1)``), and the
    generator jumps straight to any position (``PCG64.advance``). A matrix element (i, j) of an
    M x N real matrix is value ``i*N + j``; of a complex one, values ``2*(i*N + j)`` (real) and
    ``+1`` (imaginary). So the data are the same for one seed whatever the chunks, the bands
    written at a time or the file format, and an m-row matrix is the first m rows of a taller
    one with the same seed and columns. float32/complex64 are the float64 values rounded.

    ``seed=None`` draws fresh entropy; ``stream.seed`` is then the number to pass to get the
    same data again.
    """

    def __init__(self, seed: int | None = None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise OptionError(f"seed must be a non-negative integer, got {seed!r}")
        sequence = np.random.SeedSequence(seed)
        self.seed = int(sequence.entropy)
        self._base = np.random.PCG64(sequence)

    def values(self, start: int, count: int) -> np.ndarray:
        """Stream values ``start .. start+count-1`` (float64)."""
        if count <= 0:
            return np.empty(0)
        p0, p1 = start // 2, (start + count + 1) // 2
        bits = copy.copy(self._base)
        bits.advance(2 * p0)
        u = np.random.Generator(bits).random(2 * (p1 - p0)).reshape(-1, 2)
        radius = np.subtract(1.0, u[:, 0])  # exact, in (0, 1]: the log is finite
        np.log(radius, out=radius)
        radius *= -2.0
        np.sqrt(radius, out=radius)
        angle = u[:, 1] * (2 * np.pi)
        z = np.empty((p1 - p0, 2))
        np.multiply(radius, np.cos(angle), out=z[:, 0])
        np.multiply(radius, np.sin(angle), out=z[:, 1])
        offset = start - 2 * p0
        return z.reshape(-1)[offset:offset + count]

    def block(self, n_cols: int, rows: tuple[int, int], cols: tuple[int, int], dtype
              ) -> np.ndarray:
        """Rows ``rows[0]:rows[1]``, columns ``cols[0]:cols[1]`` of the matrix with ``n_cols``
        columns, as ``dtype``."""
        dt = np.dtype(dtype)
        per = 2 if dt.kind == "c" else 1  # stream values per element
        (r0, r1), (c0, c1) = rows, cols
        width = (c1 - c0) * per
        if c0 == 0 and c1 == n_cols:
            flat = self.values(r0 * n_cols * per, (r1 - r0) * width).reshape(r1 - r0, width)
        else:
            flat = np.empty((r1 - r0, width))
            for i in range(r0, r1):
                flat[i - r0] = self.values((i * n_cols + c0) * per, width)
        if per == 2:
            flat = np.ascontiguousarray(flat).view(np.complex128)
        return flat.astype(dt, copy=False)


def random_kind(path: str) -> str:
    """'zarr' or 'npy' from the name; anything else is an error."""
    lower = os.fspath(path).lower().rstrip("/\\")
    if lower.endswith(".zarr"):
        return "zarr"
    if lower.endswith(".npy"):
        return "npy"
    raise OptionError(f"{path!r}: the output name must end in .zarr (a Zarr v3 directory) or "
                      f".npy")


def _write_blocks(m: int, n: int, itemsize: int, align: tuple[int, int], target: int):
    """Blocks (rows, cols) in row-major order: whole rows when a band of ``align[0]`` rows fits
    in ``target`` bytes, else ``align[0]`` rows by a multiple of ``align[1]`` columns. Block
    edges fall on multiples of ``align`` (the Zarr chunks): no chunk is written twice."""
    cr, cc = align
    rows = (target // max(n * itemsize, 1)) // cr * cr
    if rows >= cr:
        cols = n
    else:
        rows = cr
        cols = min(n, max(cc, (target // max(cr * itemsize, 1)) // cc * cc))
    rows = min(rows, m)
    for r0 in range(0, m, rows):
        for c0 in range(0, n, cols):
            yield (r0, min(r0 + rows, m)), (c0, min(c0 + cols, n))


def write_random(path, shape, dtype="float64", *, chunks=None, seed: int | None = None,
                 overwrite: bool = False, progress: bool | None = None,
                 block_bytes: int = RANDOM_BLOCK_BYTES) -> dict:
    """Write a standard-normal matrix (see :class:`NormalStream`) to a ``.zarr`` or ``.npy``.

    Generated block by block (bands of whole chunk rows, at most about ``block_bytes`` each),
    so it works for matrices larger than memory. Written under a temporary name beside
    ``path`` and renamed at the end; nothing is left behind on failure or interruption.

    Parameters
    ----------
    path
        Ends in ``.zarr`` (Zarr v3, uncompressed, chunks ``chunks``) or ``.npy``.
    shape
        (rows, cols), positive.
    dtype
        float32, float64, complex64 or complex128.
    chunks
        Zarr chunk shape; default ``min(shape, (2048, 2048))``. Not allowed for ``.npy``.
    seed
        Non-negative integer; None draws one (returned as ``"seed"``).
    overwrite
        Replace an existing ``path``.
    progress
        True/False for a progress bar on stderr; None for one only when stderr is a terminal.

    Returns
    -------
    dict
        path, format, shape, dtype, chunks, seed, bytes, seconds.
    """
    path = os.fspath(path)
    kind = random_kind(path)
    shape = _positive_pair(shape, "shape")
    dt = _check_dtype(dtype)
    if chunks is not None:
        if kind == "npy":
            raise OptionError("chunks apply to .zarr outputs only (a .npy file has no chunks)")
        chunks = _positive_pair(chunks, "chunks")
    elif kind == "zarr":
        chunks = (min(shape[0], DEFAULT_CHUNK), min(shape[1], DEFAULT_CHUNK))
    stream = NormalStream(seed)
    if os.path.lexists(path) and not overwrite:
        raise OutputError(f"{path!r} exists; pass --overwrite (overwrite=True) to replace it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"the directory {parent!r} does not exist")
    m, n = shape
    nbytes = m * n * dt.itemsize
    free = shutil.disk_usage(parent).free
    if nbytes > free:
        raise OutputError(f"{path!r}: the matrix needs {_gib(nbytes)}; only {_gib(free)} is free "
                          f"on that file system")

    temporary = _files.temporary_sibling(path)
    start = time.perf_counter()
    bar = None
    try:
        if kind == "zarr":
            import zarr

            array = zarr.create_array(
                store=temporary, shape=shape, dtype=dt, chunks=chunks, compressors=None,
                fill_value=0, zarr_format=3,
                attributes={"random": {"distribution": "standard_normal", "seed": stream.seed,
                                       "generator": "oocgemm.bench.NormalStream"}})
            align = chunks
        else:
            from numpy.lib import format as npy_format

            array = npy_format.open_memmap(temporary, mode="w+", dtype=dt, shape=shape)
            align = (1, 1)
        if progress is None or progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=nbytes, unit="B", unit_scale=True, unit_divisor=1024,
                       desc=os.path.basename(path.rstrip("/\\")), leave=False,
                       disable=None if progress is None else False, file=sys.stderr)
        for rows, cols in _write_blocks(m, n, dt.itemsize, align, block_bytes):
            block = stream.block(n, rows, cols, dt)
            array[rows[0]:rows[1], cols[0]:cols[1]] = block
            if bar is not None:
                bar.update(block.nbytes)
        if kind == "npy":
            array.flush()
        del array
        _files.replace(temporary, path)
    except BaseException:
        _files.remove(temporary)
        raise
    finally:
        if bar is not None:
            bar.close()
    return {"path": path, "format": kind, "shape": list(shape), "dtype": dt.name,
            "chunks": list(chunks) if chunks else None, "seed": stream.seed, "bytes": nbytes,
            "seconds": time.perf_counter() - start}


def _positive_pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, (str, bytes)):
        raise OptionError(f"{name} must be two positive integers, got {value!r}")
    try:
        pair = tuple(int(v) for v in value)
        ok = len(pair) == 2 and all(int(v) == v for v in value) and min(pair) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionError(f"{name} must be two positive integers, got {value!r}")
    return pair


#: Issue targets of ``oocgemm bench --kernels`` (H100): SIMT kernels against the FMA peak,
#: the tensor-core kernel against cuBLAS at the largest size.
KERNEL_TARGETS = {"opt": ("fma_peak", 0.80), "regblock": ("fma_peak", 0.80),
                  "dmma": ("cublas", 0.90)}


#: FMA units of one SM by compute capability (major * 10 + minor) and precision, from NVIDIA's
#: architecture whitepapers; chips not listed get no nominal peak.
FMA_UNITS_PER_SM = {"float64": {60: 32, 70: 32, 80: 32, 90: 64},
                    "float32": {60: 64, 70: 64, 80: 64, 86: 128, 89: 128, 90: 128}}


def nominal_fma_rate(capability: int, sms: int, clock_khz: int, dtype="float64") -> float | None:
    """FLOP/s of every FMA unit busy every cycle at ``clock_khz`` (the SM's top clock), or None
    for a chip :data:`FMA_UNITS_PER_SM` does not list: the yardstick for the measured peak."""
    units = FMA_UNITS_PER_SM[np.dtype(dtype).name].get(capability)
    return None if units is None else 2.0 * units * sms * clock_khz * 1e3


def _nominal_fma_gflops(dt) -> float | None:
    import cupy

    from .cuda import kernels as kmod

    dev = cupy.cuda.Device()
    rate = nominal_fma_rate(kmod.capability(dev.id), dev.attributes["MultiProcessorCount"],
                            dev.attributes["ClockRate"], dt)
    return None if rate is None else rate / 1e9


def kernel_benchmark(sizes=(1024, 2048, 4096, 8192), *, kernels=None, dtype="float64",
                     repeat: int = 5, seed: int = 0, on_step=None) -> dict:
    """GFLOP/s of each kernel of ``kernels/`` and of cuBLAS on n³ products (random operands,
    CUDA events, medians of ``repeat``), the FMA peak of the CUDA cores (measured, and nominal
    where :data:`FMA_UNITS_PER_SM` knows the chip), and each kernel's registers, shared memory
    and local memory (spills).

    ``on_step(size, rates)`` is called after each size. Relative errors are against cuBLAS.
    """
    from .cuda import catalog

    dt = _check_dtype(dtype)
    names = _kernel_names(kernels, catalog.KERNELS, dt)
    if not cuda.device_count():
        raise OptionError("bench --kernels needs a GPU (none found)")
    from .cuda import kernels as kmod

    result: dict = {"benchmark": "kernels", "dtype": dt.name, "gpu": gpu_info(),
                    "fma_peak_gflops": kmod.fma_peak(dt) / 1e9,
                    "fma_nominal_gflops": _nominal_fma_gflops(dt), "sizes": {},
                    "resources": {k: kmod.resources(k, dt) for k in names}}
    for n in sizes:
        _check_room(4 * n * n * dt.itemsize, f"a {n}^3 product")  # a, b, c and the reference
        rates = kmod.square_rates(names, n, dt, repeat=repeat, seed=seed)
        for entry in rates.values():
            entry["gflops"] = 2 * n ** 3 / entry["seconds"] / 1e9
            entry["correct"] = entry["max_rel_error"] <= tolerance(dt, n)
        result["sizes"][n] = rates
        if on_step is not None:
            on_step(n, rates)
    largest = result["sizes"][max(sizes)]
    result["targets"] = {}
    for name, (against, ratio) in KERNEL_TARGETS.items():
        if name not in largest:
            continue
        base = result["fma_peak_gflops"] if against == "fma_peak" else largest["cublas"]["gflops"]
        got = largest[name]["gflops"] / base
        result["targets"][name] = {"against": against, "ratio": got, "target": ratio,
                                   "met": got >= ratio}
    return result


def _kernel_names(kernels, default, dt) -> list[str]:
    """The kernels of ``kernels/`` asked for (``default`` when none are) that run in ``dt``;
    OptionError for a name the catalog does not know."""
    from .cuda import catalog

    names = list(kernels or default)
    unknown = [k for k in names if k not in catalog.KERNELS]
    if unknown:
        raise OptionError(f"unknown kernel(s) {', '.join(unknown)}; known: "
                          f"{', '.join(catalog.KERNELS)}")
    return [k for k in names if dt.name in catalog.KERNELS[k].dtypes]


def _check_room(nbytes: int, what: str) -> None:
    """OptionError unless the current GPU has ``nbytes`` free for ``what``."""
    import cupy

    free, _ = cuda.memory_info(cupy.cuda.Device().id)
    if nbytes > free:
        raise OptionError(f"{what} needs {_gib(nbytes)} of GPU memory; "
                          f"{_gib(free)} is free (choose a smaller --size)")


#: The measuring builds of ``bench --kernels --power``: what the CUDA-core kernels reach when
#: their operands cost less to move. Their products are wrong on purpose (kernels/*.cu).
KERNEL_BOUNDS = {"l1": ("OOCGEMM_STAGING", 1, "operand loads hit in L1 (no L2 or HBM traffic)"),
                 "loop": ("OOCGEMM_STAGING", 2, "the multiply loop alone (nothing staged)")}
BOUNDED_KERNELS = ("opt", "regblock")
#: The CUDA cores' own rows of ``bench --kernels --power`` (``kernels/fma_peak.cu``): name ->
#: (operands of ``fma_outer``, or None for the FMA-peak kernel; what it measures).
THROUGHPUT_ROWS = {
    "fma_peak": (None, "the FMA peak: independent chains whose operands settle (little toggling)"),
    "fma_outer": ("random", "a GEMM's inner-loop FMAs kept in registers, random operands"),
    "fma_outer:const": ("constant", "the same instructions on constant operands"),
}
POWER_KERNELS = ("opt", "regblock", "dmma")


def kernel_power(size: int = 8192, *, kernels=None, seconds: float = 2.5, dtype="float64",
                 seed: int = 0, bounds: bool = True, on_entry=None) -> dict:
    """Rate, SM clock and board power of each kernel run alone, back to back on one size³
    product for about ``seconds``, while ``nvidia-smi`` samples the GPU; likewise cuBLAS and the
    CUDA cores' throughput kernels (:data:`THROUGHPUT_ROWS`: the FMA peak, and a GEMM's FMAs in
    registers on random and on constant operands, which shows what the data costs). With
    ``bounds``, also the measuring builds of opt and regblock (:data:`KERNEL_BOUNDS`): how fast
    they run when their operands cost less or nothing to move.

    Each entry: TFLOP/s, its fraction of the FMA peak, median SM clock and board power over the
    run (its first 0.6 s left out, while the clock settles), the fraction of samples under the power
    cap, and the energy per flop above the idle board's power. A kernel at the power limit runs
    at (limit - idle) / (energy per flop). ``on_entry(name, entry)`` is called after each.
    """
    dt = _check_dtype(dtype)
    names = _kernel_names(kernels, POWER_KERNELS, dt)
    if seconds <= 0:
        raise OptionError(f"seconds must be positive, got {seconds!r}")
    if not cuda.device_count():
        raise OptionError("bench --kernels --power needs a GPU (none found)")
    import cupy

    from .cuda import kernels as kmod
    from .cuda.power import PowerSampler

    _check_room(4 * size * size * dt.itemsize, f"a {size}^3 product")  # a, b, c, reference
    cases, bound_of = {}, {}
    for name in names:
        cases[name] = (name, ())
        if bounds and name in BOUNDED_KERNELS:
            for tag, (macro, value, _) in KERNEL_BOUNDS.items():
                cases[f"{name}:{tag}"] = (name, ((macro, value),))
                bound_of[f"{name}:{tag}"] = tag
    launches, errors = kmod.square_launches(cases, size, dt, seed)
    cupy.cuda.Device().synchronize()

    def run_alone(fn) -> float:
        fn()
        cupy.cuda.Device().synchronize()
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            fn()
            cupy.cuda.Device().synchronize()
            count += 1
        return 2 * size ** 3 * count / (time.perf_counter() - start)

    settle, rest = min(0.6, seconds / 4), min(1.0, seconds / 2)  # short runs in the tests
    entries: dict = {}
    gpu = cupy.cuda.Device().pci_bus_id
    with PowerSampler(gpu) as sampler:
        time.sleep(rest)
        t0 = sampler.now()
        time.sleep(min(1.5, seconds))
        idle = sampler.window(t0, sampler.now())
        # The throughput kernels make ~4 launches of seconds / 3 (a sizing one, then 3 timed).
        throughput = {
            name: (functools.partial(kmod.fma_peak, dt, seconds=seconds / 3) if operands is None
                   else functools.partial(kmod.fma_outer, dt, seconds=seconds / 3,
                                          operands=operands, seed=seed))
            for name, (operands, _) in THROUGHPUT_ROWS.items()}
        for name, launch in [*throughput.items(), *launches.items()]:
            t0 = sampler.now()
            rate = launch() if name in throughput else run_alone(launch)
            t1 = sampler.now()
            time.sleep(rest)  # the next one starts on a cooler board
            window = sampler.window(t0 + timedelta(seconds=settle), t1)
            entry = {"tflops": rate / 1e12, **window}
            if name in bound_of:  # a measuring build: its product is wrong on purpose
                entry["bound"] = KERNEL_BOUNDS[bound_of[name]][2]
            elif name in errors:
                entry["max_rel_error"] = errors[name]
                entry["correct"] = errors[name] <= tolerance(dt, size)
            entries[name] = entry
            if on_entry is not None:
                on_entry(name, entry)
    peak = entries["fma_peak"]["tflops"]
    for entry in entries.values():
        entry["of_fma_peak"] = entry["tflops"] / peak
        if idle.get("samples") and entry.get("samples"):
            entry["pj_per_flop"] = (entry["power_w"] - idle["power_w"]) / entry["tflops"]
    return {"benchmark": "kernel power", "dtype": dt.name, "size": size, "seconds": seconds,
            "gpu": gpu_info(), "idle": idle, "entries": entries}

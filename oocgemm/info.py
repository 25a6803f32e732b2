"""What ``oocgemm info`` reports, as plain data: versions, host cores and memory (read through
:mod:`oocgemm.machine`), the numpy BLAS, GPUs and CUDA's start-up.

Nothing here imports CuPy unless :func:`oocgemm.cuda.device_count` found a GPU (which itself
imports CuPy only where CuPy is installed and an NVIDIA driver is present).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform

import numpy as np

from . import cuda, machine
from .version import __version__


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
                  "driver": driver, "devices": [], "startup": None}
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
        info["startup"] = startup_info(0)
    except Exception as exc:  # report, do not crash `oocgemm info`
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def startup_info(index: int) -> dict:
    """What CUDA's start-up took on GPU ``index`` in this process (taking what is not taken
    yet now): ``{"device": "cuda:N", "seconds": {step: s, ..., "total": s}, "pinned_bytes":
    n}``; the steps are ``driver`` (CuPy imported, the driver initialised), ``context``,
    ``cublas`` (the library loaded, a handle made) and ``pinned`` (the first pinned ring, or
    a probe of :data:`oocgemm.cuda.startup.PINNED_PROBE` bytes)."""
    from .cuda import startup

    steps = startup.times(index, start=True)
    pinned = int(steps.pop("pinned_bytes", 0))
    return {"device": f"cuda:{index}", "seconds": steps, "pinned_bytes": pinned}


def describe_startup(gpus: dict) -> str:
    """``gpu_info()``'s start-up in words: 'cuda:0 412 ms (driver ..., context ..., ...)',
    or why there is none."""
    from .units import format_seconds, format_size

    found = gpus.get("startup")
    if not found:
        return "none (no GPU)" if not gpus.get("devices") else "not measured"
    seconds = dict(found["seconds"])
    total = seconds.pop("total")
    names = {"driver_early": "driver (beside the imports)",
             "context_early": "context (beside the imports)",
             "driver": "CuPy and driver", "context": "context", "cublas": "cuBLAS",
             "pinned": f"pinned {format_size(found.get('pinned_bytes', 0))}"}
    parts = ", ".join(f"{names.get(k, k)} {format_seconds(v)}" for k, v in seconds.items())
    return f"{found['device']} {format_seconds(total)} ({parts})"


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
                 "cores": machine.cores(), "logical_cpus": os.cpu_count(),
                 "memory_total": machine.total_memory(),
                 "memory_available": machine.available_memory()},
        "blas": blas_info(),
        "gpus": gpus,
    }

"""What runs on the GPU. Its modules context, kernels and ozaki are the only ones of oocgemm
that import CuPy at their top; importing this package itself does not (it, startup,
:mod:`oocgemm.diagnostics.nvtx`, :mod:`oocgemm.info` and
:mod:`oocgemm.runtime.cuda_executor` import CuPy inside the functions that need it).
The kernels one can name are listed outside it, in :mod:`oocgemm.kernel_catalog`."""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import time


@functools.cache
def cupy_installed() -> bool:
    """Whether CuPy can be imported (asked once per process)."""
    return importlib.util.find_spec("cupy") is not None


@functools.cache
def driver_present() -> bool:
    """An NVIDIA driver with at least one device node, checked without importing CuPy (once
    per process, not a listing of /dev on every call)."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.isdir("/proc/driver/nvidia/gpus")


def device_count() -> int:
    """GPUs that CuPy sees; 0 without importing CuPy where no driver or no CuPy is found."""
    if not (cupy_installed() and driver_present()):
        return 0
    from . import startup

    try:
        begin = time.perf_counter()
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        startup.record(-1, "driver", time.perf_counter() - begin)  # the first call's: CuPy
        return count  # imported, the driver initialised
    except Exception:
        return 0


def memory_info(index: int) -> tuple[int, int]:
    """(free, total) bytes of GPU ``index`` (its context created first, where the process has
    none yet: the first product's start-up, :mod:`oocgemm.cuda.startup`)."""
    import cupy

    from . import startup

    startup.context(index)
    with cupy.cuda.Device(index):
        return cupy.cuda.runtime.memGetInfo()

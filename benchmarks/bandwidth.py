"""Host memcpy bandwidth, and per GPU host<->device bandwidth from pinned and pageable memory
(``python -m benchmarks bandwidth``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from oocgemm import cuda, machine


def host_memcpy_bandwidth(nbytes: int | None = None, repeat: int = 5) -> dict:
    """Copy one host buffer into another ``repeat`` times (numpy.copyto) and report the rate
    in bytes copied per second (each copy reads and writes ``nbytes``).

    ``nbytes`` defaults to 256 MiB, or an eighth of available memory if that is less.
    """
    if nbytes is None:
        nbytes = min(256 << 20, machine.available_memory() // 8)
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
    bytes per second; None where no GPU is usable."""
    if cuda.device_count() <= index:
        return None
    from .baselines import h2d_d2h_bandwidth

    nbytes = nbytes or (1 << 30)
    measured = h2d_d2h_bandwidth(nbytes, device=index)
    return {f"{key[:-5]}_gbps": value for key, value in measured.items()} | {
        "bytes": nbytes, "repeat": repeat}


def measure_bandwidth() -> dict:
    """``{"host_memcpy": {...}, "gpus": [{"device": "cuda:0", ...}]}``, each at its default
    size and count of copies."""
    result: dict = {"host_memcpy": host_memcpy_bandwidth(), "gpus": []}
    for index in range(cuda.device_count()):
        measured = gpu_transfer_bandwidth(index)
        result["gpus"].append({"device": f"cuda:{index}", "measured": measured is not None,
                               **(measured or {})})
    return result

"""The CUDA cores' throughput kernels of ``benchmarks/kernels/fma_peak.cu``: the FMA peak that
the SIMT kernels are measured against, and a GEMM's inner-loop FMAs kept in registers
(``python -m benchmarks kernels`` and ``power``). Not GEMMs: the library never loads them.
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy
import numpy as np

from oocgemm.errors import KernelError

from .baselines import timed_events

#: The source of the throughput kernels.
SOURCE = Path(__file__).resolve().parent / "kernels" / "fma_peak.cu"


@functools.cache
def _fma_module(device: int) -> cupy.RawModule:
    """``fma_peak.cu`` as one module per device, loaded once (its kernels and their shape
    queries are asked for several times a benchmark)."""
    with cupy.cuda.Device(device):
        return cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",))


def _fma_function(name: str) -> cupy.RawKernel:
    """A kernel of ``fma_peak.cu`` for the current device."""
    module = _fma_module(cupy.cuda.Device().id)
    try:
        return module.get_function(name)
    except cupy.cuda.compiler.CompileException as exc:
        raise KernelError(f"kernel fma_peak failed to compile:\n{exc}") from exc


def _fma_constants(name: str, count: int) -> list[int]:
    """Integers a kernel of ``fma_peak.cu`` writes about itself (so callers read them from
    the source rather than repeat them)."""
    out = cupy.zeros(count, dtype=np.int32)
    _fma_function(name)((1,), (1,), (out,))
    return [int(v) for v in out.get()]


def _suffix(dtype) -> str:
    return {"float64": "f64", "float32": "f32"}[np.dtype(dtype).name]


def _throughput(launch, flops_per_iter: int, seconds: float) -> float:
    """FLOP/s of ``launch(iters)`` (a callable that runs ``iters`` iterations), sized so that
    one launch takes about ``seconds``: a warm-up, one timed sizing launch, then the median of 3."""
    iters = 1 << 12
    once = timed_events(launch(iters), repeat=1)
    iters = max(iters, int(iters * seconds / max(once, 1e-6)))
    return flops_per_iter * iters / timed_events(launch(iters), repeat=3)


def _fill_grid() -> tuple[int, int]:
    """Blocks and threads that fill every SM several times over."""
    return cupy.cuda.Device().attributes["MultiProcessorCount"] * 8, 256


def fma_peak(dtype="float64", seconds: float = 0.2) -> float:
    """Measured FMA throughput of the CUDA cores (no tensor cores), FLOP/s, from
    ``fma_peak.cu``: enough independent FMA chains per thread to fill every SM."""
    kernel = _fma_function(f"fma_peak_{_suffix(dtype)}")
    (chains,) = _fma_constants("fma_peak_chains", 1)
    blocks, threads = _fill_grid()
    out = cupy.empty(blocks * threads, dtype=dtype)

    def launch(iters: int):
        return lambda: kernel((blocks,), (threads,), (out, np.int32(iters)))

    return _throughput(launch, 2 * chains * blocks * threads, seconds)


def fma_outer_shape() -> tuple[int, int]:
    """``fma_outer``'s a (and b) values a thread, and the values of ``src`` a thread."""
    rows, values = _fma_constants("fma_outer_shape", 2)
    return rows, values


#: Operands of :func:`fma_outer`.
OUTER_OPERANDS = ("random", "constant")


def fma_outer_operands(threads: int, operands: str = "random", dtype="float64", seed: int = 0):
    """The ``src`` of ``fma_outer`` for ``threads`` threads: standard normal values
    (``"random"``), or a = b = 1 with the accumulators from 0 (``"constant"``)."""
    if operands not in OUTER_OPERANDS:
        raise ValueError(f"operands must be one of {OUTER_OPERANDS}, got {operands!r}")
    rows, values = fma_outer_shape()
    if operands == "random":
        return cupy.random.default_rng(seed).standard_normal((threads, values), dtype=dtype)
    src = cupy.zeros((threads, values), dtype=dtype)
    src[:, :2 * rows] = 1
    return src


def fma_outer_run(src, iters: int, threads: int = 256):
    """Runs ``fma_outer`` once on ``src`` (one row a thread) and returns each thread's sum of
    its accumulators (tests check it against numpy)."""
    _, values = fma_outer_shape()
    if src.ndim != 2 or src.shape[0] % threads or src.shape[1] != values:
        raise ValueError(f"src must hold whole blocks of {threads} rows of {values} values, "
                         f"got shape {src.shape}")
    kernel = _fma_function(f"fma_outer_{_suffix(src.dtype)}")
    out = cupy.empty(src.shape[0], dtype=src.dtype)
    kernel((src.shape[0] // threads,), (threads,), (src, out, np.int32(iters)))
    return out


def fma_outer(dtype="float64", seconds: float = 0.2, operands: str = "random",
              seed: int = 0) -> float:
    """FMA throughput of the CUDA cores fed as a GEMM's inner loop feeds them, FLOP/s: each
    thread adds outer products of register values into a block of accumulators, no loads in
    the loop (``fma_outer`` in ``fma_peak.cu``). With ``operands="random"`` every FMA's
    operands differ from the last one's as in a product of random matrices; with
    ``"constant"`` they do not. The same instructions either way: what differs is the power."""
    kernel = _fma_function(f"fma_outer_{_suffix(dtype)}")
    rows, _ = fma_outer_shape()
    blocks, threads = _fill_grid()
    src = fma_outer_operands(blocks * threads, operands, dtype, seed)
    out = cupy.empty(blocks * threads, dtype=dtype)

    def launch(iters: int):
        return lambda: kernel((blocks,), (threads,), (src, out, np.int32(iters)))

    return _throughput(launch, 2 * 2 * (rows // 2) ** 2 * blocks * threads, seconds)

"""Compiles the kernels of ``kernels/`` with NVRTC (through ``cupy.RawModule``) and launches them.

Each (kernel, dtype, transposes, vector access) instance is compiled once per device, when first
used; CuPy also keeps the binary in its on-disk cache, so a later process skips NVRTC.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

import cupy

from ..errors import KernelError
from .baselines import interleaved_medians, timed_events
from .catalog import KERNELS, KernelSpec, kernels_dir, source_text

_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()
_compiled: dict[tuple, cupy.RawKernel] = {}


def capability(device: int) -> int:
    """Compute capability of GPU ``device`` as major * 10 + minor (90 for an H100)."""
    return int(cupy.cuda.Device(device).compute_capability)


def function(name: str, dtype, trans_a: bool, trans_b: bool, vec: bool,
             device: int | None = None, defines: tuple = ()) -> cupy.RawKernel:
    """The compiled instance of kernel ``name`` for the current (or given) device.

    ``defines``: (macro, value) pairs passed to NVRTC as ``-Dmacro=value`` (the measuring
    builds of ``bench --kernels --power``; a product never needs them).

    Raises
    ------
    KernelError
        The source does not compile (the NVRTC log is in the message), or the GPU is too old
        for the kernel.
    """
    spec = KERNELS[name]
    dev = cupy.cuda.Device().id if device is None else device
    expr = spec.expression(np.dtype(dtype).name, trans_a, trans_b, vec)
    defines = tuple(defines)
    key = (dev, expr, kernels_dir(), defines)  # a different source folder compiles anew
    with _lock:
        fn = _compiled.get(key)
        if fn is None:
            fn = _compiled[key] = _compile(spec, expr, dev, defines)
    return fn


def _compile(spec: KernelSpec, expr: str, device: int, defines: tuple = ()) -> cupy.RawKernel:
    cc = capability(device)
    if cc < spec.min_capability:
        raise KernelError(f"kernel {spec.name!r} needs compute capability "
                          f"{spec.min_capability / 10:.1f} or newer; GPU {device} has {cc / 10:.1f}")
    with cupy.cuda.Device(device):
        options = _OPTIONS + tuple(f"-D{macro}={value}" for macro, value in defines)
        module = cupy.RawModule(code=source_text(spec), options=options, name_expressions=[expr])
        try:
            fn = module.get_function(expr)
        except cupy.cuda.compiler.CompileException as exc:
            raise KernelError(f"kernel {spec.name!r} ({expr}) failed to compile for "
                              f"sm_{cc}:\n{exc}") from exc
        if spec.dynamic_shared > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = spec.dynamic_shared
    return fn


def resources(name: str, dtype="float64", device: int | None = None) -> dict:
    """Registers, static shared memory, local memory (spills) of the plain (NN, vector) instance."""
    fn = function(name, dtype, False, False, True, device)
    return {"registers": fn.num_regs, "shared_bytes": fn.shared_size_bytes + KERNELS[name].dynamic_shared,
            "local_bytes": fn.local_size_bytes}


def _aligned(ptr: int, ld: int, itemsize: int) -> bool:
    return ptr % 16 == 0 and (ld * itemsize) % 16 == 0


def gemm(name: str, m: int, n: int, k: int, alpha, a_ptr: int, lda: int, b_ptr: int, ldb: int,
         beta, c_ptr: int, ldc: int, *, dtype, trans_a: bool = False, trans_b: bool = False,
         stream=None, defines: tuple = ()) -> None:
    """Row-major ``C = alpha * op(A) @ op(B) + beta * C`` with kernel ``name`` on ``stream``.

    ``op(A)`` is m x k (``trans_a``: A is stored k x m), ``op(B)`` k x n (``trans_b``: stored
    n x k); leading dimensions are in elements. Raw device pointers, so that the executor can
    pass offsets into its slots. 16-byte vector access is used where every pointer and leading
    dimension allows it.
    """
    if m == 0 or n == 0:
        return
    dtype = np.dtype(dtype)
    spec = KERNELS[name]
    vec = all(_aligned(p, ld, dtype.itemsize) for p, ld in ((a_ptr, lda), (b_ptr, ldb), (c_ptr, ldc)))
    fn = function(name, dtype, trans_a, trans_b, vec, defines=defines)
    rows, cols = spec.tile
    grid = ((n + cols - 1) // cols, (m + rows - 1) // rows, 1)
    block = (*spec.threads, 1)
    scalar = dtype.type
    args = (np.int32(m), np.int32(n), np.int32(k), scalar(alpha), np.uint64(a_ptr), np.int32(lda),
            np.uint64(b_ptr), np.int32(ldb), scalar(beta), np.uint64(c_ptr), np.int32(ldc))
    fn(grid, block, args, shared_mem=spec.dynamic_shared, stream=stream)


def gemm_arrays(name: str, a, b, c, alpha=1.0, beta=0.0, stream=None, defines: tuple = ()) -> None:
    """``c = alpha * a @ b + beta * c`` for C-contiguous CuPy matrices (benchmarks and tests)."""
    m, k = a.shape
    n = b.shape[1]
    gemm(name, m, n, k, alpha, a.data.ptr, k, b.data.ptr, n, beta, c.data.ptr, n,
         dtype=c.dtype, stream=stream, defines=defines)


@functools.lru_cache(maxsize=None)
def _fma_module(device: int, folder) -> cupy.RawModule:
    """``fma_peak.cu`` as one module per device and source folder, loaded once (its kernels
    and their shape queries are asked for several times a benchmark)."""
    with cupy.cuda.Device(device):
        return cupy.RawModule(code=(folder / "fma_peak.cu").read_text(), options=_OPTIONS)


def _fma_function(name: str) -> cupy.RawKernel:
    """A kernel of ``kernels/fma_peak.cu`` (the throughput kernels, not GEMMs) for the current
    device."""
    module = _fma_module(cupy.cuda.Device().id, kernels_dir())
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
    ``kernels/fma_peak.cu``: enough independent FMA chains per thread to fill every SM."""
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
    the loop (``fma_outer`` in ``kernels/fma_peak.cu``). With ``operands="random"`` every FMA's
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


def square_launches(cases: dict, n: int, dtype="float64", seed: int = 0) -> tuple[dict, dict]:
    """Launches of cuBLAS and of each case on one n³ product of random operands with alpha = 1,
    beta = 0, and each one's relative error against cuBLAS, checked once into a NaN-poisoned C
    (which also compiles it before anything is timed).

    ``cases``: label -> (kernel name, defines for :func:`function`). Returns (launches, errors),
    both keyed by "cublas" and the labels, in that order.
    """
    dtype = np.dtype(dtype)
    rng = cupy.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=dtype)
    b = rng.standard_normal((n, n), dtype=dtype)
    ref = cupy.matmul(a, b)
    scale = float(cupy.abs(ref).max())
    c = cupy.empty((n, n), dtype=dtype)
    launches = {"cublas": lambda: cupy.matmul(a, b, out=c)}
    errors = {"cublas": 0.0}
    for label, (name, defines) in cases.items():
        launch = launches[label] = functools.partial(gemm_arrays, name, a, b, c, defines=defines)
        c.fill(cupy.nan)  # poisoned: a tile the kernel skips shows up
        launch()
        error = float(cupy.abs(c - ref).max()) / scale
        errors[label] = error if np.isfinite(error) else float("inf")
    return launches, errors


def square_rates(names, n: int, dtype="float64", repeat: int = 5, seed: int = 0) -> dict:
    """Seconds and relative error (against cuBLAS) of each kernel and of cuBLAS on one n³
    product (:func:`square_launches`), timed in interleaved rounds
    (``baselines.interleaved_medians``), so that cuBLAS and the kernels see the same clocks."""
    launches, errors = square_launches({name: (name, ()) for name in names}, n, dtype, seed)
    seconds = interleaved_medians(launches, repeat)
    return {name: {"seconds": seconds[name], "max_rel_error": errors[name]} for name in launches}

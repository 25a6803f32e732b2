"""Compiles the kernels of ``kernels/`` with NVRTC (through ``cupy.RawModule``) and launches them.

Each (kernel, dtype, transposes, vector access) instance is compiled once per device, when first
used; CuPy also keeps the binary in its on-disk cache, so a later process skips NVRTC.
"""

from __future__ import annotations

import threading

import cupy
import numpy as np

from ..errors import KernelError
from ..kernel_catalog import KERNELS, KernelSpec, kernels_dir, source_text

_OPTIONS = ("-std=c++17",)
_lock = threading.Lock()
_compiled: dict[tuple, cupy.RawKernel] = {}


def capability(device: int) -> int:
    """Compute capability of GPU ``device`` as major * 10 + minor (90 for an H100)."""
    return int(cupy.cuda.Device(device).compute_capability)


def function(name: str, dtype, trans_a: bool, trans_b: bool, vec: bool,
             device: int | None = None, defines: tuple = (), cache: dict | None = None
             ) -> cupy.RawKernel:
    """The compiled instance of kernel ``name`` for the current (or given) device.

    ``defines``: (macro, value) pairs passed to NVRTC as ``-Dmacro=value`` (the measuring
    builds that ``benchmarks/`` times; a product never needs them). ``cache``: where the
    compiled instances are kept (an engine's; else the process's).

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
    key = (dev, expr, str(kernels_dir()), defines)  # a different source folder compiles anew
    cache = _compiled if cache is None else cache
    with _lock:
        fn = cache.get(key)
        if fn is None:
            fn = cache[key] = _compile(spec, expr, dev, defines)
    return fn


def _compile(spec: KernelSpec, expr: str, device: int, defines: tuple = ()) -> cupy.RawKernel:
    cc = capability(device)
    if cc < spec.min_capability:
        raise KernelError(f"kernel {spec.name!r} needs compute capability "
                          f"{spec.min_capability / 10:.1f} or newer; GPU {device} has "
                          f"{cc / 10:.1f}")
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
    return {"registers": fn.num_regs,
            "shared_bytes": fn.shared_size_bytes + KERNELS[name].dynamic_shared,
            "local_bytes": fn.local_size_bytes}


def _aligned(ptr: int, ld: int, itemsize: int) -> bool:
    return ptr % 16 == 0 and (ld * itemsize) % 16 == 0


def gemm(name: str, m: int, n: int, k: int, alpha, a_ptr: int, lda: int, b_ptr: int, ldb: int,
         beta, c_ptr: int, ldc: int, *, dtype, trans_a: bool = False, trans_b: bool = False,
         stream=None, defines: tuple = (), cache: dict | None = None) -> None:
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
    vec = all(_aligned(p, ld, dtype.itemsize) for p, ld in ((a_ptr, lda), (b_ptr, ldb), (c_ptr,
    ldc)))
    fn = function(name, dtype, trans_a, trans_b, vec, defines=defines, cache=cache)
    rows, cols = spec.tile
    grid = ((n + cols - 1) // cols, (m + rows - 1) // rows, 1)
    block = (*spec.threads, 1)
    scalar = dtype.type
    args = (np.int32(m), np.int32(n), np.int32(k), scalar(alpha), np.uint64(a_ptr), np.int32(lda),
            np.uint64(b_ptr), np.int32(ldb), scalar(beta), np.uint64(c_ptr), np.int32(ldc))
    fn(grid, block, args, shared_mem=spec.dynamic_shared, stream=stream)

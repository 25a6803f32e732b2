"""What oocgemm's CUDA executor and kernels are measured against (``python -m benchmarks gpu``,
``kernels``, ``bandwidth``).

- in-core cuBLAS on one block of the plan's shape (the ceiling per block);
- cuBLASXt ``cublasXtDgemm``, NVIDIA's own out-of-core GEMM, through ctypes (it ships in
  libcublas), with pinned or pageable host operands;
- dask.array with CuPy chunks;
- cuBLAS on square products, timed with the kernels of ``kernels/`` in interleaved rounds;
- host<->device copies from pinned and pageable memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas into the process)

from benchmarks.in_core import gemm_arrays


def timed_events(fn, repeat: int = 3) -> float:
    """Median seconds of ``fn`` on the current stream, timed with CUDA events after a warm-up."""
    return interleaved_medians({"fn": fn}, repeat)["fn"]


def interleaved_medians(fns: dict, repeat: int = 3) -> dict:
    """Median seconds of each of ``fns`` (name: callable), timed with CUDA events after a
    warm-up of each, in ``repeat`` rounds that run every one of them in turn: so each meets
    the clocks and temperature of the whole run, not only those of its turn (under DGEMM
    power the clocks drift by several percent within seconds)."""
    for fn in fns.values():
        fn()
    cupy.cuda.get_current_stream().synchronize()
    times: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return {name: float(np.median(t)) for name, t in times.items()}


@contextlib.contextmanager
def _block_gemm(w: int, h: int, r: int, dtype):
    """A callable running the in-core cuBLAS GEMM ``C[w,h] = A[w,r] @ B[r,h]`` on random
    operands; on exit they go back to the pool, and the pool to the driver."""
    rng = cupy.random.default_rng(7)
    a = rng.standard_normal((w, r), dtype=np.float64).astype(dtype)
    b = rng.standard_normal((r, h), dtype=np.float64).astype(dtype)
    c = cupy.empty((w, h), dtype=dtype)
    try:
        yield lambda: cupy.matmul(a, b, out=c)
    finally:
        a = b = c = None
        cupy.get_default_memory_pool().free_all_blocks()


def incore_gemm_seconds(w: int, h: int, r: int, dtype="float64", repeat: int = 5) -> float:
    """Median seconds of one in-core cuBLAS GEMM ``C[w,h] += A[w,r] @ B[r,h]``."""
    with _block_gemm(w, h, r, dtype) as gemm:
        return timed_events(gemm, repeat)


def sustained_gemm_seconds(w: int, h: int, r: int, total_flops: float, dtype="float64") -> float:
    """Seconds of in-core cuBLAS GEMMs of the block shape run back to back until they add up
    to ``total_flops``: the rate the GPU sustains over a whole product (clocks settle lower
    than in a burst of a few GEMMs)."""
    count = max(1, round(total_flops / (2 * w * h * r)))
    with _block_gemm(w, h, r, dtype) as gemm:
        gemm()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(count):
            gemm()
        end.record()
        end.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3
    return seconds * total_flops / (count * 2 * w * h * r)


def _libcublas() -> ctypes.CDLL:
    """The libcublas that CuPy loaded (so that both use one library), found in the process map."""
    with open("/proc/self/maps") as fh:
        paths = {line.split()[-1] for line in fh if "libcublas.so" in line and "Lt" not in line}
    for path in sorted(paths):
        return ctypes.CDLL(path)
    for name in ("libcublas.so", "libcublas.so.13", "libcublas.so.12"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublas not found")


def cublasxt_dgemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, block_dim: int,
                   device: int | list[int] = 0, pin_memory: bool = False) -> float:
    """``c = a @ b`` with cuBLASXt on one GPU (or the GPUs of a list); returns wall seconds.
    Row-major operands: in column-major terms this is C^T = B^T A^T, so B goes first."""
    lib = _libcublas()
    handle = ctypes.c_void_p()
    check = _checker("cublasXt")
    check(lib.cublasXtCreate(ctypes.byref(handle)))
    try:
        chosen = [device] if isinstance(device, int) else list(device)
        devices = (ctypes.c_int * len(chosen))(*chosen)
        check(lib.cublasXtDeviceSelect(handle, len(chosen), devices))
        check(lib.cublasXtSetBlockDim(handle, ctypes.c_int(block_dim)))
        if pin_memory:  # CUBLASXT_PINNING_ENABLED: let cuBLASXt pin pageable operands itself
            check(lib.cublasXtSetPinningMemMode(handle, 1))
        m, k = a.shape
        n = b.shape[1]
        alpha, beta = ctypes.c_double(1.0), ctypes.c_double(0.0)
        size_t = ctypes.c_size_t
        lib.cublasXtDgemm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, size_t, size_t,
                                      size_t, ctypes.c_void_p, ctypes.c_void_p, size_t,
                                      ctypes.c_void_p, size_t, ctypes.c_void_p, ctypes.c_void_p,
                                      size_t]
        start = time.perf_counter()
        check(lib.cublasXtDgemm(handle, 0, 0, n, m, k, ctypes.byref(alpha), b.ctypes.data, n,
                                a.ctypes.data, k, ctypes.byref(beta), c.ctypes.data, n))
        for index in chosen:
            with cupy.cuda.Device(index):
                cupy.cuda.runtime.deviceSynchronize()
        return time.perf_counter() - start
    finally:
        lib.cublasXtDestroy(handle)


@contextlib.contextmanager
def pinned_in_place(*arrays: np.ndarray):
    """The arrays page-locked where they are (``cudaHostRegister``, portable to every GPU) for
    the block: no second copy of operands of tens of GB."""
    registered = []
    try:
        for x in arrays:
            cupy.cuda.runtime.hostRegister(x.ctypes.data, x.nbytes, 1)  # cudaHostRegisterPortable
            registered.append(x)
        yield
    finally:
        for x in registered:
            cupy.cuda.runtime.hostUnregister(x.ctypes.data)


def _checker(what: str):
    def check(status: int) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with status {status}")
    return check


def pinned_empty(shape, dtype="float64") -> tuple[np.ndarray, object]:
    """A page-locked numpy array (and the CuPy memory that owns it: keep it alive)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    memory = cupy.cuda.alloc_pinned_memory(nbytes)
    return np.frombuffer(memory, dtype=dtype, count=int(np.prod(shape))).reshape(shape), memory


def dask_cupy_matmul(a: np.ndarray, b: np.ndarray, chunk: int) -> tuple[np.ndarray, float]:
    """``a @ b`` as dask.array with CuPy chunks, threaded scheduler, result stored to numpy."""
    import dask
    import dask.array as da

    x = da.from_array(a, chunks=chunk, asarray=False).map_blocks(cupy.asarray)
    y = da.from_array(b, chunks=chunk, asarray=False).map_blocks(cupy.asarray)
    product = (x @ y).map_blocks(cupy.asnumpy)
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))
    start = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        da.store(product, out, lock=False)
    return out, time.perf_counter() - start


def h2d_d2h_bandwidth(nbytes: int = 1 << 30, device: int = 0) -> dict:
    """Measured host<->device bandwidth (GB/s) from pinned and pageable host memory."""
    with cupy.cuda.Device(device):
        dev = cupy.empty(nbytes, dtype=np.uint8)
        pinned, _owner = pinned_empty((nbytes,), np.uint8)
        pageable = np.ones(nbytes, dtype=np.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        result = {}
        for name, host in (("pinned", pinned), ("pageable", pageable)):
            for direction in ("h2d", "d2h"):
                def copy(direction=direction, host=host):
                    if direction == "h2d":
                        cupy.cuda.runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, nbytes, 1,
                                                      stream.ptr)
                    else:
                        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, nbytes, 2,
                                                      stream.ptr)
                with stream:
                    seconds = timed_events(copy, repeat=3)
                result[f"{direction}_{name}_GBps"] = nbytes / seconds / 1e9
        dev = None
        return result


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
    (:func:`interleaved_medians`), so that cuBLAS and the kernels see the same clocks."""
    launches, errors = square_launches({name: (name, ()) for name in names}, n, dtype, seed)
    seconds = interleaved_medians(launches, repeat)
    return {name: {"seconds": seconds[name], "max_rel_error": errors[name]} for name in launches}

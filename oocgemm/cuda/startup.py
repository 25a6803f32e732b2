"""CUDA's start-up, paid once per process and GPU, and how long each step took.

The first product on a GPU pays for steps that later ones do not: CuPy imported and the
driver initialised (:func:`oocgemm.cuda.device_count`), the GPU's primary context (created
by the planner's first question, :func:`oocgemm.cuda.memory_info`), cuBLAS loaded and a
handle made (left in the run's handle pool, so the run takes it), and the first run's pinned
ring (page-locked host buffers, kept for later runs). Each step is timed where it happens, once,
and kept here for ``oocgemm info`` (:func:`oocgemm.info.gpu_info`).
"""

from __future__ import annotations

import threading
import time

#: GPU index -> step -> seconds; "driver" under -1 (one per process, not per GPU).
_TIMES: dict[int, dict[str, float]] = {}
_LOCK = threading.RLock()
#: The thread of :func:`early`, once started.
_EARLY: threading.Thread | None = None
#: What ``oocgemm info`` pins when no run has pinned a ring yet in the process (bytes).
PINNED_PROBE = 64 << 20


def record(index: int, step: str, seconds: float) -> None:
    """Keep the first measurement of ``step`` on GPU ``index``."""
    with _LOCK:
        _TIMES.setdefault(index, {}).setdefault(step, seconds)


def measured(index: int, step: str) -> bool:
    with _LOCK:
        return step in _TIMES.get(index, {})


def context(index: int) -> None:
    """Create GPU ``index``'s primary context, timed, once (``cudaFree(0)``: the idiom that
    makes the runtime create it; instant where it exists)."""
    if measured(index, "context"):
        return
    import cupy

    with _LOCK:
        if measured(index, "context"):
            return
        start = time.perf_counter()
        with cupy.cuda.Device(index):
            cupy.cuda.runtime.free(0)
        record(index, "context", time.perf_counter() - start)


def cublas(index: int, resources=None) -> None:
    """Load cuBLAS and make GPU ``index``'s first handle, timed, once; the handle goes to
    ``resources``' pool (the process's by default), where the first run takes it."""
    if measured(index, "cublas"):
        return
    with _LOCK:
        if measured(index, "cublas"):
            return
        context(index)
        import cupy

        start = time.perf_counter()
        from .context import PROCESS  # imports cuBLAS's bindings: the library loads

        pool = (resources or PROCESS).handles
        with cupy.cuda.Device(index):
            pool.give_back(index, pool.acquire(index))
        record(index, "cublas", time.perf_counter() - start)


def early(indices) -> threading.Thread | None:
    """Initialise the CUDA driver and retain the primary contexts of GPUs ``indices`` (all
    it sees where None) in a thread of its own, through the driver's C API called with
    ctypes, which lets go of the interpreter's lock for each call: a fresh process's imports
    (numpy, zarr, CuPy: most of a second) go on beside it, and CuPy's first calls then find
    the driver up and the contexts made (CUDA's runtime uses a GPU's primary context). The
    retained contexts live as long as the process. None where no NVIDIA driver is found;
    what fails here is left for CuPy to say where the run needs the GPU. Started once per
    process (a later call gets the thread of the first)."""
    import ctypes

    global _EARLY
    with _LOCK:
        if _EARLY is not None:
            return _EARLY

    try:
        lib = ctypes.CDLL("libcuda.so.1")  # the driver's library: where none is, no GPU
    except OSError:
        return None

    def start() -> None:
        begin = time.perf_counter()
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return
        record(-1, "driver_early", time.perf_counter() - begin)
        for index in range(count.value) if indices is None else indices:
            if not 0 <= index < count.value:
                continue
            begin = time.perf_counter()
            dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
            if lib.cuDeviceGet(ctypes.byref(dev), index) == 0 and \
                    lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0:
                record(index, "context_early", time.perf_counter() - begin)

    thread = threading.Thread(target=start, name="oocgemm-cuda-early", daemon=True)
    with _LOCK:
        if _EARLY is None:
            _EARLY = thread
            thread.start()
        return _EARLY


def ahead(indices) -> threading.Thread | None:
    """Start the contexts and cuBLAS of GPUs ``indices`` in a thread of their own, while the
    caller opens its inputs and plans (a fresh process's first product: the planner's first
    question then finds the context made); None where they are started. What fails there
    fails again, and is raised, where the run needs it."""
    indices = [i for i in indices if not measured(i, "cublas")]
    if not indices:
        return None
    first = early(indices) if not measured(-1, "driver") else None

    def start() -> None:
        if first is not None:  # the driver's calls first, beside the caller's work
            first.join()
        try:
            for index in indices:
                cublas(index)
        except Exception:  # raised again on the caller's path, with its context
            pass

    thread = threading.Thread(target=start, name="oocgemm-cuda-start", daemon=True)
    thread.start()
    return thread


def pinned(index: int, seconds: float, nbytes: int) -> None:
    """The first run's pinned ring on GPU ``index``: ``nbytes`` pinned in ``seconds``."""
    record(index, "pinned", seconds)
    record(index, "pinned_bytes", float(nbytes))


def times(index: int, *, start: bool = False) -> dict[str, float]:
    """What start-up took on GPU ``index`` in this process, step by step (seconds; bytes
    for ``pinned_bytes``), with ``total``. ``start``: take the steps not taken yet now (the
    context, cuBLAS, and a pinned buffer of :data:`PINNED_PROBE` when no run pinned one)."""
    if start:
        context(index)
        cublas(index)
        if not measured(index, "pinned"):
            from .context import PROCESS

            begin = time.perf_counter()
            ptr, _ = PROCESS.pinned.acquire(PINNED_PROBE)
            PROCESS.pinned.give_back(ptr)
            pinned(index, time.perf_counter() - begin, PINNED_PROBE)
    with _LOCK:
        steps = dict(_TIMES.get(-1, {}))
        steps.update(_TIMES.get(index, {}))
    steps["total"] = sum(v for k, v in steps.items() if k != "pinned_bytes")  # (the early
    # steps ran beside the imports: the later ones took what was left)
    return steps

"""Small products from numpy operands (``python -m benchmarks small``): oocgemm's whole call
against the baseline a user would write.

On a GPU the baseline is CuPy's upload, matmul and download, ``(cupy.asarray(a) @
cupy.asarray(b)).get()`` (and ``.get(out=out)``); on the CPU it is ``a @ b`` (and
``numpy.matmul(a, b, out=out)``). oocgemm's side is ``oocgemm.multiply(a, b,
device=..., progress=False)``, numpy in and numpy out (and with ``out=`` a preallocated
array). Each size takes fresh random operands, one untimed warm-up of each case, then
``repeat`` interleaved rounds; medians are reported. The process's first product (the first
size's first oocgemm call) is timed apart: it pays for CUDA's start-up, which
``oocgemm.cuda.startup`` breaks down. The warm-up's and the last round's results are checked
against numpy on sampled rows, after the timed rounds.

On a GPU a fifth case, ``staged`` (:class:`Staged`), times the moves of a product staged
through pinned memory one after another, with nothing else: for a product that oocgemm
moves in one stripe each (n = 1024) that is its floor, and what it takes beyond is its own
bookkeeping; larger products overlap the moves, and go below it.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

import oocgemm
from oocgemm.api import resolve_device
from oocgemm.errors import OptionError

from .common import max_relative_error, tolerance

#: Rows of each result compared with numpy's.
SAMPLED_ROWS = 16
CASES = ("oocgemm", "oocgemm_out", "baseline", "baseline_out")
#: Threads that :class:`Staged` copies A and B (at once) and C on, in row bands: 8 moved
#: two 8 MB operands fastest on the H200's host (0.76 ms; the engine copies A and B on as
#: many, C on four).
STAGED_THREADS = 8


class Staged:
    """A product staged through pinned memory on a GPU, one move after another: A and B
    copied into pinned buffers at once, in row bands on :data:`STAGED_THREADS` threads; both
    uploaded on one stream; ``cupy.matmul``; C downloaded into a pinned buffer and copied
    out in bands. The buffers, the stream and the threads are made once, so a call is only
    these moves: oocgemm's in-core run of one stripe each (n = 1024) makes the same ones,
    and plans, checks and times them besides."""

    def __init__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray):
        from concurrent.futures import ThreadPoolExecutor

        import cupy

        self._cupy = cupy
        self._pool = ThreadPoolExecutor(STAGED_THREADS)
        ready = threading.Barrier(STAGED_THREADS + 1)  # every thread started: none queues
        started = [self._pool.submit(ready.wait) for _ in range(STAGED_THREADS)]
        ready.wait()
        for fut in started:
            fut.result()
        self._a, self._b, self._out = a, b, out
        self._memory = [cupy.cuda.alloc_pinned_memory(x.nbytes) for x in (a, b, out)]
        self._pa, self._pb, self._pc = (
            np.frombuffer(mem, x.dtype, x.size).reshape(x.shape)
            for mem, x in zip(self._memory, (a, b, out)))
        self._da, self._db = cupy.empty(a.shape, a.dtype), cupy.empty(b.shape, b.dtype)
        self._dc = cupy.empty(out.shape, out.dtype)
        self._stream = cupy.cuda.Stream(non_blocking=True)

    def _bands(self, pairs, per: int) -> None:
        futures = []
        for dst, src in pairs:
            step = -(-len(src) // per)
            futures += [self._pool.submit(np.copyto, dst[i:i + step], src[i:i + step])
                        for i in range(0, len(src), step)]
        for fut in futures:
            fut.result()

    def __call__(self) -> np.ndarray:
        half = STAGED_THREADS // 2
        self._bands([(self._pa, self._a), (self._pb, self._b)], half)
        with self._stream:
            self._da.set(self._pa, stream=self._stream)
            self._db.set(self._pb, stream=self._stream)
            self._cupy.matmul(self._da, self._db, out=self._dc)
            self._dc.get(stream=self._stream, out=self._pc)
        self._stream.synchronize()
        self._bands([(self._out, self._pc)], STAGED_THREADS)
        return self._out

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _cases(device: str, a: np.ndarray, b: np.ndarray, out: np.ndarray, spare: np.ndarray):
    """The four timed calls, each returning its product as a numpy array."""
    def ours():
        return oocgemm.multiply(a, b, device=device, progress=False).out

    def ours_out():
        oocgemm.multiply(a, b, out, device=device, progress=False)
        return out

    if device == "cpu":
        def base():
            return a @ b

        def base_out():
            return np.matmul(a, b, out=spare)
    else:
        import cupy

        def base():
            return (cupy.asarray(a) @ cupy.asarray(b)).get()

        def base_out():
            return (cupy.asarray(a) @ cupy.asarray(b)).get(out=spare)

    return dict(zip(CASES, (ours, ours_out, base, base_out)))


def _check(result: np.ndarray, a: np.ndarray, b: np.ndarray, rows: np.ndarray) -> float:
    return max_relative_error(np.asarray(result)[rows], a[rows] @ b)


def _one_size(n: int, repeat: int, device: str, rng: np.random.Generator, first: dict
              ) -> dict:
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    out, spare = np.empty((n, n)), np.empty((n, n))
    rows = rng.choice(n, size=min(SAMPLED_ROWS, n), replace=False)
    calls = _cases(device, a, b, out, spare)
    errors = {}
    if not first:  # the process's first product: start-up included
        begin = time.perf_counter()
        result = calls["oocgemm"]()
        first["seconds"] = time.perf_counter() - begin
        errors["first"] = _check(result, a, b, rows)
    staged = None if device == "cpu" else Staged(a, b, np.empty((n, n)))
    if staged is not None:
        calls["staged"] = staged
    try:
        entry = _timed(calls, n, repeat, device, a, b, rows, errors)
    finally:
        if staged is not None:
            staged.close()
    if staged is not None:
        entry["staged_ratio"] = (entry["staged"]["median_seconds"]
                                 / entry["baseline"]["median_seconds"])
    return entry


def _timed(calls: dict, n: int, repeat: int, device: str, a: np.ndarray, b: np.ndarray,
           rows: np.ndarray, errors: dict) -> dict:
    """The rounds of ``calls`` (interleaved), their results checked after them (``errors``:
    those checked before)."""
    for name, call in calls.items():  # warm-up, checked
        errors[name] = _check(call(), a, b, rows)
    times: dict[str, list[float]] = {name: [] for name in calls}
    last = {}
    for _ in range(repeat):  # no check between timed calls: numpy's BLAS threads it wakes
        for name, call in calls.items():  # spin on after it, beside the next call's threads
            begin = time.perf_counter()
            last[name] = call()
            times[name].append(time.perf_counter() - begin)
    for name, result in last.items():  # each case's own result (out=: its own buffer)
        errors[name] = max(errors[name], _check(result, a, b, rows))
    plan = oocgemm.plan(a, b, device=device)
    worst = max(errors.values())
    entry = {"n": n, "in_core": plan.in_core, "operations": plan.counts.total,
             "max_rel_error": worst, "tolerance": tolerance(np.float64, n),
             "correct": worst <= tolerance(np.float64, n)}
    for name, seconds in times.items():
        entry[name] = {"median_seconds": statistics.median(seconds), "seconds": seconds}
    entry["ratio"] = entry["oocgemm"]["median_seconds"] / entry["baseline"]["median_seconds"]
    entry["ratio_out"] = (entry["oocgemm_out"]["median_seconds"]
                          / entry["baseline_out"]["median_seconds"])
    return entry


def small_benchmark(sizes=(1024, 2048, 4096), repeat: int = 7, device: str = "cuda", *,
                    seed: int = 0, on_size=None) -> dict:
    """oocgemm against the baseline (CuPy on a GPU, numpy on the CPU) on n x n float64
    products from numpy operands, for each n of ``sizes``, in this process.

    Returns plain data: per size the median wall time of each case (``oocgemm``,
    ``oocgemm_out``, ``baseline``, ``baseline_out``; on a GPU ``staged`` too, with
    ``staged_ratio``: :class:`Staged` / baseline), the ratios (oocgemm / baseline: under
    1 is faster), whether the plan was in core, and the sampled check; the first call's time
    and, on a GPU, CUDA's start-up steps. ``on_size(entry)`` hears of each size.
    """
    sizes = tuple(sizes)
    if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise OptionError(f"sizes must be positive integers, got {sizes!r}")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise OptionError(f"repeat must be a positive integer, got {repeat!r}")
    dev = resolve_device(device)
    name = str(dev)
    rng = np.random.default_rng(seed)
    first: dict = {}
    results = []
    for n in sizes:
        entry = _one_size(n, repeat, name, rng, first)
        results.append(entry)
        if on_size is not None:
            on_size(entry)
    doc = {"device": name, "baseline": "numpy" if dev.kind == "cpu" else "cupy",
           "dtype": "float64", "repeat": repeat, "first_call_seconds": first.get("seconds"),
           "startup": None, "sizes": results}
    if dev.kind == "cuda":
        from oocgemm.info import startup_info

        doc["startup"] = startup_info(dev.index)
    return doc

"""The GPU's side of a CUDA run, and what runs keep between them.

A run's streams, events, device buffers and pinned slots, and the block operations on its
row-major slots (the GEMM through cuBLAS, a kernel of ``kernels/`` or the Ozaki emulator;
mirror, transpose, scale), are owned by a :class:`GpuContext`, a context manager that
synchronises and frees them on exit, also on error. What runs keep for the next (pinned
memory, cuBLAS handles, compiled kernels, threads) is a :class:`Resources`: an
:class:`oocgemm.Engine`'s, freed when it closes, or the process's (:data:`PROCESS`)."""

from __future__ import annotations

import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import cupy
import numpy as np
from cupy.cuda import runtime
from cupy_backends.cuda.libs import cublas

from ..strategies import Native
from .launch import Block, Cublas

_H2D, _D2H = 1, 2

_GEMM = {
    np.dtype("float32"): cublas.sgemm,
    np.dtype("float64"): cublas.dgemm,
    np.dtype("complex64"): cublas.cgemm,
    np.dtype("complex128"): cublas.zgemm,
}
#: SYRK: the symmetric (not Hermitian) rank-k update, complex ones included.
_SYRK = {
    np.dtype("float32"): cublas.ssyrk,
    np.dtype("float64"): cublas.dsyrk,
    np.dtype("complex64"): cublas.csyrk,
    np.dtype("complex128"): cublas.zsyrk,
}

#: Rows of a diagonal block's SYRK at a time: the rest of its upper triangle is GEMMs, which
#: run faster than one SYRK of the whole block (a quarter of its flops left to SYRK).
SYRK_ROWS = 4096

#: ``cudaHostRegisterPortable``: pinned for every GPU's context, as ``hostAlloc`` memory is.
_PORTABLE = 1
_PAGE = mmap.PAGESIZE
_FAULTERS: ThreadPoolExecutor | None = None
_FAULTERS_LOCK = threading.Lock()


def _fault_in(raw: np.ndarray) -> None:
    """Touch every page of ``raw`` from the process's faulting threads (a page fault is the
    kernel's work, and it runs on every core at once)."""
    global _FAULTERS
    from .. import machine

    workers = machine.cores()
    with _FAULTERS_LOCK:
        if _FAULTERS is None:
            _FAULTERS = ThreadPoolExecutor(workers, thread_name_prefix="oocgemm-pin")
    pages = raw[::_PAGE]
    step = -(-len(pages) // workers)
    parts = [pages[i:i + step] for i in range(0, len(pages), step)]
    list(_FAULTERS.map(lambda part: part.fill(0), parts))


def _area(nbytes: int) -> tuple[int, np.ndarray]:
    """``nbytes`` of anonymous host memory, not faulted in nor pinned yet (:func:`_register`)."""
    area = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(area, dtype=np.uint8)[:nbytes]
    return raw.ctypes.data, raw


def _register(ptr: int, raw: np.ndarray) -> None:
    """Pin ``raw`` where it lies (its pages faulted in by the registration itself)."""
    runtime.hostRegister(ptr, max(raw.nbytes, 1), _PORTABLE)


def _pin(nbytes: int) -> tuple[int, np.ndarray]:
    """``nbytes`` of page-locked host memory: anonymous pages faulted in by many threads, then
    registered with CUDA: several times quicker than ``cudaHostAlloc``, which faults and
    locks on one thread, no faster from many (docs/performance.md, "Gram products"). (A ring
    pinned behind its run does without the faulting threads: while the run's readers and
    decoders keep every core busy, a buffer waited on the slowest of them.)"""
    ptr, raw = _area(nbytes)
    _fault_in(raw)
    _register(ptr, raw)
    return ptr, raw


class PinnedPool:
    """Page-locked host buffers, kept for reuse between runs (pinning them again would cost
    every run time, :func:`_pin`).

    A buffer asked for ``later`` is handed out at once and pinned behind the caller, one
    after another in the order asked (a run asks its ring's buffers in the order it first
    uses them): its users wait for it with :meth:`ready`. A fresh process's first run then
    starts reading into its first buffers while the others are pinned (about 1.7 GB/s).
    ``in_use()`` is what runs hold now (for leak checks); ``release()`` unpins what is idle.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: dict[int, list[tuple[int, np.ndarray]]] = {}
        self._busy: dict[int, tuple[int, np.ndarray]] = {}
        self._pending: dict[int, Future] = {}
        self._pinner: ThreadPoolExecutor | None = None

    def acquire(self, nbytes: int, later: bool = False, then=None) -> tuple[int, np.ndarray]:
        """A buffer of ``nbytes``: an idle one, else a new one pinned now or (``later``)
        behind the caller; ``then()`` is called once it is pinned, before it is ready."""
        with self._lock:
            idle = self._idle.get(nbytes)
            held = idle.pop() if idle else None
        pending = None
        if held is None and later:
            held = _area(nbytes)

            def pin(ptr: int = held[0], raw: np.ndarray = held[1]) -> None:
                _register(ptr, raw)
                if then is not None:
                    then()

            with self._lock:
                if self._pinner is None:
                    self._pinner = ThreadPoolExecutor(1, thread_name_prefix="oocgemm-pinner")
                pending = self._pinner.submit(pin)
        elif held is None:
            held = _pin(nbytes)
        if pending is None and then is not None:
            then()
        with self._lock:
            self._busy[held[0]] = held
            if pending is not None:
                self._pending[held[0]] = pending
        return held

    def ready(self, ptr: int) -> None:
        """Wait until buffer ``ptr`` is pinned (at once where it was); what pinning it
        raised is raised here."""
        with self._lock:
            pending = self._pending.get(ptr)
        if pending is not None:
            pending.result()
            with self._lock:
                self._pending.pop(ptr, None)

    def give_back(self, ptr: int) -> None:
        with self._lock:
            pending = self._pending.pop(ptr, None)
        pinned = True
        if pending is not None:  # one not begun is never pinned; else wait for it
            pinned = not pending.cancel() and pending.exception() is None
        with self._lock:
            held = self._busy.pop(ptr)
            if pinned:
                self._idle.setdefault(held[1].nbytes, []).append(held)

    def in_use(self) -> int:
        with self._lock:
            return sum(raw.nbytes for _, raw in self._busy.values())

    def cached(self) -> int:
        with self._lock:
            return sum(raw.nbytes for held in self._idle.values() for _, raw in held)

    def release(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for held in idle.values():
            for ptr, _ in held:
                runtime.hostUnregister(ptr)  # the pages go with the last reference


#: CUDA events a handle's :class:`Lanes` keep for the next run: a small product records
#: nine, and making each cost it a few microseconds.
KEEP_EVENTS = 64


class Lanes(NamedTuple):
    """A run's cuBLAS handle and its streams ('h2d', 'compute', 'c', 'decode'), the handle on
    the compute stream, and the idle events that runs on them record (at most
    :data:`KEEP_EVENTS`)."""

    handle: int
    streams: dict
    events: list


class HandlePool:
    """cuBLAS handles per GPU with their streams (:class:`Lanes`), kept for reuse between
    runs (creating and destroying a handle cost every run time; new streams cost a small
    product's run time too, its first GEMM on them the most: docs/performance.md, "Figures
    moved from the code's docstrings"); a run holds its own, so that
    concurrent runs never share a stream."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: dict[int, list[Lanes]] = {}

    def acquire(self, index: int) -> Lanes:
        """A handle and its streams for GPU ``index``, which must be the current device."""
        with self._lock:
            idle = self._idle.get(index)
            if idle:
                return idle.pop()
        # C's stream first: what runs there (C's compression on the GPU, when it is
        # compressed there) holds up the output's writers, and the GEMMs can wait.
        # (CUDA clamps a priority beyond its range to the highest it has.)
        # The decode stream too: the GEMMs wait for the panels it decodes.
        streams = {"h2d": cupy.cuda.Stream(non_blocking=True),
                   "compute": cupy.cuda.Stream(non_blocking=True),
                   "c": cupy.cuda.Stream(non_blocking=True, priority=-1024),
                   "decode": cupy.cuda.Stream(non_blocking=True, priority=-1024)}
        handle = cublas.create()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.setStream(handle, streams["compute"].ptr)
        return Lanes(handle, streams, [])

    def give_back(self, index: int, lanes: Lanes) -> None:
        """``lanes`` for the next run (nothing may be in flight on their streams)."""
        with self._lock:
            self._idle.setdefault(index, []).append(lanes)

    def release(self) -> None:
        """Destroy the idle handles (and drop their streams)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for index, kept in idle.items():
            with cupy.cuda.Device(index):
                for lanes in kept:
                    cublas.setStream(lanes.handle, 0)
                    cublas.destroy(lanes.handle)


class Crew:
    """The threads of one run, kept for the next: readers and writers (pools fed in schedule
    order), and the lanes (a dispatcher per stream, the feeder, the clock). Starting and
    joining them took a product of n = 2048 over a millisecond a run (23 threads)."""

    def __init__(self, readers: int, writers: int, lanes: int):
        self.size = (readers, writers, lanes)
        self.read = ThreadPoolExecutor(readers, thread_name_prefix="oocgemm-read")
        self.write = ThreadPoolExecutor(writers, thread_name_prefix="oocgemm-write")
        self.lanes = ThreadPoolExecutor(lanes, thread_name_prefix="oocgemm-lane")

    def shutdown(self) -> None:
        for pool in (self.read, self.write, self.lanes):
            pool.shutdown(wait=True, cancel_futures=True)


class CrewPool:
    """Idle :class:`Crew` s by size; a run takes one (a new one when none is idle, so that
    concurrent runs never share threads) and gives it back once none of its tasks runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: dict[tuple[int, int, int], list[Crew]] = {}

    def acquire(self, readers: int, writers: int, lanes: int) -> Crew:
        with self._lock:
            idle = self._idle.get((readers, writers, lanes))
            if idle:
                return idle.pop()
        return Crew(readers, writers, lanes)

    def give_back(self, crew: Crew) -> None:
        with self._lock:
            self._idle.setdefault(crew.size, []).append(crew)

    def release(self) -> None:
        """Stop the idle crews' threads."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for crews in idle.values():
            for crew in crews:
                crew.shutdown()


class Resources:
    """What CUDA runs keep for the next: pinned host buffers, cuBLAS handles, the compiled
    kernels of ``kernels/``, the runs' threads, and the device buffers of small (in-core)
    products in CuPy's pool. An :class:`oocgemm.Engine` owns one and frees it on close; runs
    without an engine share the process's (:data:`PROCESS`), kept until exit."""

    def __init__(self):
        self.pinned = PinnedPool()
        self.handles = HandlePool()
        self.kernels: dict = {}
        self.crews = CrewPool()

    def in_use(self) -> int:
        """Pinned bytes that runs hold now."""
        return self.pinned.in_use()

    def close(self) -> None:
        """Free what no run holds: the idle pinned buffers and handles, the kernels."""
        self.pinned.release()
        self.handles.release()
        self.kernels.clear()
        self.crews.release()


PROCESS = Resources()
"""The resources of runs without an engine."""


class GpuContext:
    """Streams (h2d, compute, c for C in/out), a cuBLAS handle, and the buffers of one run."""

    def __init__(self, index: int, dtype, launch: Cublas | None = None,
                 resources: Resources | None = None, keep_device: bool = False):
        self.index = index
        self.keep_device = keep_device
        """Leave the freed device buffers in CuPy's pool for the next run (small products:
        their allocation would cost each run a cudaMalloc and a synchronising cudaFree per
        buffer); else return them to the GPU."""
        self.resources = resources or PROCESS
        self.dtype = np.dtype(dtype)
        self.launch = launch or Cublas(Native())
        """How :meth:`gemm` launches the run's kernel (:mod:`oocgemm.cuda.launch`); set up
        with :meth:`start_launch` once the slots are allocated."""
        self.device = cupy.cuda.Device(index)
        self._device_buffers: dict[str, cupy.ndarray] = {}
        self._pinned: dict[str, tuple] = {}
        self._lanes: Lanes | None = None
        self.streams: dict[str, cupy.cuda.Stream] = {}
        self._events: list = []  # those the run recorded: its lanes' again once it is done

    # -- lifetime ----------------------------------------------------------------------------
    def __enter__(self) -> GpuContext:
        self.device.__enter__()
        try:
            self._lanes = self.resources.handles.acquire(self.index)
            self.streams = self._lanes.streams
        except BaseException:
            self.device.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            for stream in self.streams.values():
                stream.synchronize()  # nothing in flight may touch memory freed below
            self.launch.close()
            if self._lanes is not None:  # every event passed: they may be recorded again
                kept = self._lanes.events
                kept.extend(self._events[:max(0, KEEP_EVENTS - len(kept))])
        finally:
            self._events = []
            self._device_buffers.clear()
            for ptr, _ in self._pinned.values():
                self.resources.pinned.give_back(ptr)
            self._pinned.clear()
            if self._lanes is not None:
                self.resources.handles.give_back(self.index, self._lanes)
                self._lanes = None
            self.streams = {}
            if not self.keep_device:
                cupy.get_default_memory_pool().free_all_blocks()
            self.device.__exit__(None, None, None)

    @property
    def handle(self) -> int:
        """The run's cuBLAS handle, on the compute stream."""
        return self._lanes.handle if self._lanes is not None else None

    @property
    def emulator(self):
        """The :class:`oocgemm.cuda.ozaki.Emulator` of an emulating run, else None."""
        return self.launch.emulator

    def start_launch(self, plan, timing: bool = False) -> None:
        """Set up what the launch of ``plan``'s GEMMs needs beside the slots (the emulator's
        buffers); call once the slots are allocated."""
        self.launch.start(self, plan, timing)

    def on_device(self):
        """Make this GPU current in the calling thread (CuPy's current device is per thread)."""
        return cupy.cuda.Device(self.index)

    # -- buffers -----------------------------------------------------------------------------
    def device_buffer(self, name: str, elements: int) -> None:
        self._device_buffers[name] = cupy.empty(max(elements, 1), dtype=self.dtype)

    def pinned_buffer(self, name: str, elements: int, later: bool = False, then=None) -> None:
        """A pinned buffer named ``name``; ``later``: pinned behind the caller (in the order
        asked), each use below waiting for it, and ``then()`` called once it is pinned
        (:meth:`PinnedPool.acquire`)."""
        nbytes = max(elements, 1) * self.dtype.itemsize
        ptr, raw = self.resources.pinned.acquire(nbytes, later=later, then=then)
        self._pinned[name] = (ptr, raw.view(self.dtype))

    def _ready(self, name: str) -> tuple[int, np.ndarray]:
        held = self._pinned[name]
        self.resources.pinned.ready(held[0])
        return held

    def host_view(self, name: str, shape) -> np.ndarray:
        return self._ready(name)[1][: shape[0] * shape[1]].reshape(shape)

    def pinned_ptr(self, name: str) -> int:
        return self._ready(name)[0]

    def pinned_bytes(self, name: str) -> np.ndarray:
        """The pinned buffer ``name`` as bytes."""
        return self._ready(name)[1].view(np.uint8)

    def device_ptr(self, name: str) -> int:
        return self._device_buffers[name].data.ptr

    # -- copies, events ------------------------------------------------------------------------
    def upload(self, stage: str, slot: str, nbytes: int, stream: str, dst_offset: int = 0
               ) -> None:
        """Pinned ring buffer -> device slot at ``dst_offset`` elements, asynchronously."""
        dst = self.device_ptr(slot) + dst_offset * self.dtype.itemsize
        runtime.memcpyAsync(dst, self.pinned_ptr(stage), nbytes, _H2D, self.streams[stream].ptr)

    def download(self, slot: str, stage: str, nbytes: int, stream: str, src_offset: int = 0
                 ) -> None:
        """Device slot at ``src_offset`` elements -> pinned ring buffer, asynchronously."""
        src = self.device_ptr(slot) + src_offset * self.dtype.itemsize
        runtime.memcpyAsync(self.pinned_ptr(stage), src, nbytes, _D2H, self.streams[stream].ptr)

    def event(self, stream: str):
        """A timing event recorded on ``stream`` now (one the lanes kept, or a new one)."""
        try:
            ev = self._lanes.events.pop()
        except (IndexError, AttributeError):  # none kept (or no lanes: not entered)
            ev = cupy.cuda.Event(block=False, disable_timing=False)
        ev.record(self.streams[stream])
        self._events.append(ev)
        return ev

    def wait(self, stream: str, event) -> None:
        self.streams[stream].wait_event(event)

    @staticmethod
    def elapsed_ms(start, end) -> float:
        return cupy.cuda.get_elapsed_time(start, end)

    # -- arithmetic ----------------------------------------------------------------------------
    def gemm(self, a_slot: str, b_slot: str, c_slot: str, w: int, h: int, r: int,
             trans_a: bool, trans_b: bool, alpha, beta, row0: int = 0, rows: int | None = None,
             *, panels=None, waits=(), upper: bool = False) -> str | None:
        """Row-major ``C[row0:row0+rows, :h] = alpha * op(A)[row0:...] @ op(B) + beta * C[...]``
        on the compute stream, for a C block of ``w`` rows.

        cuBLAS is column-major: the row-major C buffer is C^T there, and
        C^T = op(B)^T @ op(A)^T, so B comes first. A row-major B (r×h) read column-major is
        B^T with leading dimension h (no transpose needed); a stored-transposed B (h×r) is
        op(B) itself there, so it takes CUBLAS_OP_T with leading dimension r. Likewise for A,
        whose row stripe starts ``row0`` rows in (``row0`` columns in when stored transposed).
        The run's launch (:mod:`oocgemm.cuda.launch`) takes the block first where its kernel
        is not cuBLAS: a kernel of ``kernels/``, which takes the row-major operands as they
        are, or the emulator (``panels``: the keys of the panels the slots hold; ``waits``:
        the events of what it waits for on other streams), which leaves to cuBLAS the blocks
        whose panels need native DGEMM. Returns the note for the run's log.
        """
        rows = w - row0 if rows is None else rows
        size = self.dtype.itemsize
        a_ptr = self.device_ptr(a_slot) + (row0 if trans_a else row0 * r) * size
        c_ptr = self.device_ptr(c_slot) + row0 * h * size
        block = Block(a_slot, b_slot, c_slot, w, h, r, trans_a, trans_b, alpha, beta, row0,
                      rows)
        launched, note = self.launch.gemm(self, block, a_ptr, c_ptr, panels, waits)
        if launched:
            return note
        scalars = np.array([alpha, beta], dtype=self.dtype)
        op_b = cublas.CUBLAS_OP_T if trans_b else cublas.CUBLAS_OP_N
        op_a = cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N
        with self.streams["compute"]:
            if upper:  # a diagonal block's rows: in pieces, each its square, then right of it
                for lo in range(row0, row0 + rows, SYRK_ROWS):
                    self._upper_part(a_slot, b_slot, c_slot, w, h, r, trans_a, trans_b,
                                     scalars, lo, min(SYRK_ROWS, row0 + rows - lo))
                return note
            _GEMM[self.dtype](
                self.handle, op_b, op_a, h, rows, r,
                scalars[0:1].ctypes.data, self.device_ptr(b_slot), r if trans_b else h,
                a_ptr, w if trans_a else r,
                scalars[1:2].ctypes.data, c_ptr, h)
        return note

    def _upper_part(self, a_slot, b_slot, c_slot, w, h, r, trans_a, trans_b, scalars, row0,
                    rows) -> None:
        """Rows ``[row0, row0 + rows)`` of a diagonal block, on and above its diagonal: the
        square of those rows by SYRK (half its flops), the columns right of it by GEMM."""
        size = self.dtype.itemsize
        lda = w if trans_a else r
        a_ptr = self.device_ptr(a_slot) + (row0 if trans_a else row0 * r) * size
        c_ptr = self.device_ptr(c_slot) + (row0 * h + row0) * size
        # Row-major upper is column-major lower; op(A)'s stripe is A's column-major matrix
        # itself when A is stored transposed (N), its transpose otherwise (T).
        _SYRK[self.dtype](
            self.handle, cublas.CUBLAS_FILL_MODE_LOWER,
            cublas.CUBLAS_OP_N if trans_a else cublas.CUBLAS_OP_T, rows, r,
            scalars[0:1].ctypes.data, a_ptr, lda, scalars[1:2].ctypes.data, c_ptr, h)
        col0 = row0 + rows
        if col0 < h:
            b_ptr = self.device_ptr(b_slot) + (col0 * r if trans_b else col0) * size
            _GEMM[self.dtype](
                self.handle, cublas.CUBLAS_OP_T if trans_b else cublas.CUBLAS_OP_N,
                cublas.CUBLAS_OP_T if trans_a else cublas.CUBLAS_OP_N, h - col0, rows, r,
                scalars[0:1].ctypes.data, b_ptr, r if trans_b else h, a_ptr, lda,
                scalars[1:2].ctypes.data, c_ptr + rows * size, h)

    def mirror(self, c_slot: str, h: int, row0: int, rows: int) -> None:
        """Rows ``[row0, row0 + rows)`` of a square block in ``c_slot`` (rows of ``h``):
        below the diagonal := the transpose of above it, on the compute stream."""
        kernel = mirror_kernel(self.dtype.itemsize, self.resources.kernels)
        count = rows * (row0 + rows)
        blocks = max(1, min(-(-count // 256), 65535))
        with self.streams["compute"]:
            kernel((blocks,), (256,), (self._device_buffers[c_slot], np.int64(h),
                                       np.int64(row0), np.int64(row0 + rows)))

    def transpose(self, src_slot: str, dst_slot: str, w: int, h: int) -> None:
        """``dst_slot`` (h x w) := ``src_slot`` (w x h) transposed, on the compute stream."""
        src = self._device_buffers[src_slot][:w * h].reshape(w, h)
        dst = self._device_buffers[dst_slot][:w * h].reshape(h, w)
        with self.streams["compute"]:
            cupy.copyto(dst, src.T)

    def scale(self, c_slot: str, elements: int, beta) -> None:
        """C = beta * C (or zero, C unread, for beta == 0) on the compute stream."""
        view = self._device_buffers[c_slot][:elements]
        with self.streams["compute"]:
            if beta == 0:
                view.fill(0)
            elif beta != 1:
                view *= beta


def mirror_kernel(itemsize: int, cache: dict):
    """``kernels/symmetric.cu``'s MIRROR for elements of ``itemsize`` bytes, compiled for the
    current GPU once (kept in ``cache``: an engine's or the process's compiled kernels; the
    CUDA executor asks for it before a symmetric run starts, so that no run times a
    compilation)."""
    from ..errors import KernelError
    from ..kernel_catalog import kernels_dir

    key = ("symmetric", cupy.cuda.runtime.getDevice())
    module = cache.get(key)
    if module is None:
        path = kernels_dir() / "symmetric.cu"
        try:
            module = cupy.RawModule(code=path.read_text(), options=("--std=c++17",))
        except OSError as exc:
            raise KernelError(f"cannot read {path} ({exc}); set OOCGEMM_KERNELS to the folder "
                              f"holding the .cu files") from exc
        cache[key] = module
    return module.get_function(f"mirror_lower_{itemsize}")


def memory_in_use(index: int, resources: Resources | None = None) -> tuple[int, int]:
    """(device bytes CuPy's pool hands out, pinned bytes runs hold) now: for leak checks."""
    with cupy.cuda.Device(index):
        return cupy.get_default_memory_pool().used_bytes(), (resources or PROCESS).in_use()

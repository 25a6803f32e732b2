"""Ozaki scheme II on the GPU: float64 products from int8 tensor-core GEMMs (issue 21).

The steps of :mod:`oocgemm.ozaki` (the CPU reference), run by the kernels of
``kernels/ozaki.cu`` and cuBLAS's int8 GEMM, so that a block's product has the CPU
reference's bits:

1. ``ozaki_stats_rows`` / ``ozaki_stats_cols``: each row of an A panel (column of a B panel),
   its largest exponent, and the panel's exponent spread and whether it holds infinities or
   NaN (read back: the host decides the bits and moduli, or native DGEMM);
2. ``ozaki_residues``: the panel scaled to integers and reduced modulo each modulus, int8,
   laid out K-contiguous (A as rows x K, B as columns x K) with K padded to 16, which is
   the layout cuBLAS's fastest int8 kernels take (``T``, ``N``);
3. one batched cuBLAS ``GemmStridedBatchedEx`` (int8 x int8 -> int32), a product per
   modulus, for a chunk of C's rows;
4. ``ozaki_finish``: per element of C, Garner's digits from the int32 products, the one
   rounding, and ``alpha``/``beta`` applied as the CPU executor applies them.

Converted panels are kept per device slot while the slot holds the same panel, so an A or B
panel is converted once for every GEMM that reads it (:class:`Emulator`).
"""

from __future__ import annotations

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas

from ..ozaki import K_ALIGN, N_ALIGN, padded

#: cudaDataType and cublasComputeType_t values of the int8 GEMM.
CUDA_R_8I, CUDA_R_32I = 3, 10
COMPUTE_32I = 72
GEMM_DEFAULT = -1

_ONE, _ZERO = np.ones(1, np.int32), np.zeros(1, np.int32)


def int8_gemm(handle: int, a_ptr: int, b_ptr: int, c_ptr: int, rows: int, cols: int, depth: int,
              *, lda: int, ldb: int, ldc: int, stride_a: int, stride_b: int, stride_c: int,
              batch: int) -> None:
    """``batch`` exact products ``C[l] = A[l] @ B[l]^T`` in int32, on the handle's stream.

    Row-major int8 ``A[l]`` is ``rows x depth`` (leading dimension ``lda``), ``B[l]`` is
    stored ``cols x depth`` (its K contiguous, ``ldb``), and int32 ``C[l]`` is ``rows x cols``
    (``ldc``); ``stride_*`` are elements between consecutive ``l``. Column-major, cuBLAS sees
    ``C^T = B A^T``: its ``T, N`` form, with B first.
    """
    cublas.gemmStridedBatchedEx(
        handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, cols, rows, depth,
        _ONE.ctypes.data, b_ptr, CUDA_R_8I, ldb, stride_b,
        a_ptr, CUDA_R_8I, lda, stride_a,
        _ZERO.ctypes.data, c_ptr, CUDA_R_32I, ldc, stride_c, batch, COMPUTE_32I, GEMM_DEFAULT)


# -- the kernels -------------------------------------------------------------------------------

#: Instances of ``ozaki_finishN``: the most moduli each takes (its registers grow with it).
FINISH = (16, 24, 32, 36)  # the last: ozaki.MAX_MODULI

_THREADS = 256


def module(device: int, cache: dict):
    """``kernels/ozaki.cu`` compiled for GPU ``device`` (kept in ``cache``: an engine's or the
    process's compiled kernels)."""
    from ..errors import KernelError
    from ..kernel_catalog import kernels_dir

    folder = kernels_dir()
    key = ("ozaki", device, str(folder))
    mod = cache.get(key)
    if mod is None:
        try:
            source = (folder / "ozaki.cu").read_text()
        except OSError as exc:
            raise KernelError(f"cannot read {folder / 'ozaki.cu'} ({exc}); set OOCGEMM_KERNELS "
                              "to the folder holding the .cu files") from exc
        with cupy.cuda.Device(device):
            mod = cupy.RawModule(code=source, options=("-std=c++17",))
            try:
                mod.compile()
            except cupy.cuda.compiler.CompileException as exc:
                raise KernelError(f"kernels/ozaki.cu failed to compile:\n{exc}") from exc
        cache[key] = mod
    return mod


def _grid(count: int, per_block: int = _THREADS) -> tuple[int, int, int]:
    """Blocks for a grid-stride loop over ``count`` items, ``per_block`` a block."""
    return (max(1, min(-(-count // per_block), 65535)), 1, 1)


def _recorded(stream):
    """An event recorded on ``stream`` now (no timing)."""
    event = cupy.cuda.Event(block=False, disable_timing=True)
    event.record(stream)
    return event


# -- converted panels --------------------------------------------------------------------------

class _Converted:
    """An A or B panel in a device slot, read as ``outer`` rows (A's rows, B's columns) of
    ``depth``: its stats (read back), and its residues for the first ``done`` moduli."""

    def __init__(self, key, source: tuple[int, int, int], outer: int, depth: int, residues,
                 emax, summary, host):
        self.key = key
        self.source = source  # (the slot's address, so, sk): element (o, k) at o*so + k*sk
        self.outer, self.depth = outer, depth
        self.depth_pad = padded(depth, K_ALIGN)
        self.residues, self.emax, self.summary, self.host = residues, emax, summary, host
        self.read_back = None  # the event after the stats' copy to the host
        self.range = None  # (spread, finite) once read back
        self.bits: int | None = None
        self.done = 0
        self.ready: list = []  # (end row, the event after the residues of the rows before it)

    def ready_for(self, row: int):
        """The event after which the residues of rows ``[0, row)`` are there."""
        return next(event for end, event in self.ready if end >= row)

    def stats(self) -> tuple[int, bool]:
        """(spread, finite), waiting for the read-back the first time."""
        if self.range is None:
            self.read_back.synchronize()
            self.range = (int(self.host[0]), not self.host[1])
        return self.range


class Emulator:
    """The emulated block products of one run on one GPU: Ozaki scheme II as
    :class:`oocgemm.runtime.cpu.CpuExecutor` runs it, with the CPU reference's bits.

    Each A and B slot of the schedule keeps its panel's conversion (stats, residues) while it
    holds that panel, so that a panel is converted once for every GEMM that reads it. Panels
    are converted on a stream of their own, after the uploads the GEMM waits for, so that
    they convert while the previous GEMMs compute; the host reads each new panel's stats back
    (a few bytes) to choose the moduli or native DGEMM. The int8 GEMMs run on the compute
    stream, a chunk of C's rows at a time, into one of two buffers; each chunk's finish runs
    on a stream of its own while the next chunk's GEMMs compute, and the compute stream waits
    for a GEMM's last finish before the GEMM is done.

    ``gpu``: what the run's :class:`~oocgemm.cuda.context.GpuContext` gives (``index``,
    ``resources``, ``device_ptr(slot)``, ``streams['compute']``, ``handle``); ``kernel``:
    'ozaki' or 'ozaki:N'; ``tile``: the largest (w, h, r) of the blocks; ``slots``: the names
    of the A and B slots. ``timing``: time the phases with CUDA events (:meth:`seconds`).
    """

    def __init__(self, gpu, kernel: str, tile: tuple[int, int, int], slots, *,
                 timing: bool = False):
        from .. import ozaki
        from ..kernel_catalog import ozaki_moduli

        self.gpu = gpu
        self.moduli = ozaki_moduli(kernel)
        w, h, r = tile
        self.capacity = ozaki.reserved_moduli(self.moduli)
        self.sizes = ozaki.footprint(w, h, r, self.moduli)
        self.module = module(gpu.index, gpu.resources.kernels)
        self.stream = cupy.cuda.Stream(non_blocking=True)  # conversions
        self.finishing = cupy.cuda.Stream(non_blocking=True)
        self.kernels = {name: self.module.get_function(name) for name in
                        ("ozaki_stats_rows", "ozaki_stats_cols", "ozaki_residues")}
        self.finish = {n: self.module.get_function(f"ozaki_finish{n}") for n in FINISH}
        # Per slot: residues (capacity planes of the largest panel), the rows' exponents,
        # the stats on the device and their pinned copy on the host.
        self.buffers: dict[str, tuple] = {}
        for name in slots:
            outer = w if name[0] == "A" else h
            pinned = cupy.cuda.alloc_pinned_memory(8)
            self.buffers[name] = (
                cupy.empty(self.capacity * outer * padded(r, K_ALIGN), dtype=np.int8),
                cupy.empty(outer, dtype=np.int32), cupy.empty(2, dtype=np.int32),
                np.frombuffer(pinned, dtype=np.int32, count=2), pinned)
        half = self.capacity * self.sizes.rows * padded(h, N_ALIGN)
        scratch = cupy.empty(2 * half, dtype=np.int32)
        self.scratch = (scratch[:half], scratch[half:])
        self._free: list = [None, None]  # per buffer: the event after its last finish
        self._turn = 0
        self.panels: dict[str, _Converted] = {}
        self.timing = timing
        self._timed: dict[str, list] = {"convert": [], "int8 gemm": [], "finish": []}

    # -- timing ----------------------------------------------------------------------------
    def _start(self, stream):
        if not self.timing:
            return None
        ev = cupy.cuda.Event()
        ev.record(stream)
        return ev

    def _stop(self, phase: str, start, stream) -> None:
        if start is not None:
            end = cupy.cuda.Event()
            end.record(stream)
            self._timed[phase].append((start, end))

    def seconds(self) -> dict[str, float]:
        """GPU seconds each phase took (with ``timing``), once what is in flight is done."""
        self.stream.synchronize()
        self.finishing.synchronize()
        return {phase: sum(cupy.cuda.get_elapsed_time(a, b) for a, b in pairs) / 1e3
                for phase, pairs in self._timed.items() if pairs}

    # -- panels ----------------------------------------------------------------------------
    def _panel(self, slot: str, key, outer: int, depth: int, so: int, sk: int, waits
               ) -> _Converted:
        """The conversion of the panel (``key``) that ``slot`` holds: kept, or started now
        (its stats, read back asynchronously) after ``waits``, the events of what the GEMM
        waits for on other streams (the uploads of its panels among them)."""
        panel = self.panels.get(slot)
        if panel is not None and panel.key == key and (panel.outer, panel.depth) == (outer,
                                                                                     depth):
            return panel
        residues, emax, summary, host, _ = self.buffers[slot]
        x = self.gpu.device_ptr(slot)
        panel = self.panels[slot] = _Converted(key, (x, so, sk), outer, depth, residues, emax,
                                               summary, host)
        stream = self.stream
        for event in waits:
            stream.wait_event(event)
        start = self._start(stream)
        summary.data.memset_async(0, 8, stream)
        args_tail = (emax, summary)
        with stream:
            if sk == 1:  # K contiguous: a warp a row
                self.kernels["ozaki_stats_rows"](
                    _grid(outer, _THREADS // 32), (_THREADS, 1, 1),
                    (np.int32(outer), np.int32(depth), np.uint64(x), np.int64(so), *args_tail))
            else:  # the rows contiguous: 32 rows a block, read 8 K at a time
                self.kernels["ozaki_stats_cols"](
                    _grid(outer, 32), (32, 8, 1),
                    (np.int32(outer), np.int32(depth), np.uint64(x), np.int64(sk), *args_tail))
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, summary.data.ptr, 8, 2, stream.ptr)
        panel.read_back = _recorded(stream)
        self._stop("convert", start, stream)
        return panel

    def _convert(self, panel: _Converted, bits: int, n: int, chunk: int) -> None:
        """Residues of ``panel`` for the first ``n`` moduli with ``bits`` (those it lacks),
        ``chunk`` rows at a time, each chunk's event in ``panel.ready``: the GEMMs of a chunk
        of C's rows wait for A's rows of that chunk only."""
        stream = self.stream
        if panel.bits != bits:
            if panel.done:  # its residues may still be read: rewrite them after those GEMMs
                stream.wait_event(_recorded(self.gpu.streams["compute"]))
            panel.bits, panel.done = bits, 0
        if panel.done >= n:
            return
        start = self._start(stream)
        x, so, sk = panel.source
        plane = panel.outer * panel.depth_pad
        panel.ready = []
        for o0 in range(0, panel.outer, chunk):
            rows = min(chunk, panel.outer - o0)
            with stream:
                self.kernels["ozaki_residues"](
                    (-(-panel.depth_pad // 32), -(-rows // 32), 1), (32, 8, 1),
                    (np.int32(rows), np.int32(panel.depth), np.int32(panel.depth_pad),
                     np.uint64(x + 8 * o0 * so), np.int64(so), np.int64(sk),
                     np.uint64(panel.emax.data.ptr + 4 * o0), np.int32(bits),
                     np.int32(panel.done), np.int32(n - panel.done),
                     np.uint64(panel.residues.data.ptr + o0 * panel.depth_pad),
                     np.int64(plane)))
            panel.ready.append((o0 + rows, _recorded(stream)))
        panel.done = n
        self._stop("convert", start, stream)

    # -- the product -----------------------------------------------------------------------
    def gemm(self, panels, a_slot: str, b_slot: str, c_ptr: int, w: int, h: int, r: int,
             trans_a: bool, trans_b: bool, alpha: float, beta: float, row0: int, rows: int,
             waits=()) -> tuple[bool, str]:
        """Rows ``row0 .. row0 + rows`` of the C block at ``c_ptr`` (its first row; w x h,
        row-major) ``= alpha * A @ B + beta * C`` emulated, on the compute stream; or nothing,
        where the panels need native DGEMM. Returns (emulated, the note for the run's log).
        ``panels``: what the slots hold (keys: the same key, the same panel).
        """
        from .. import ozaki

        # A as w rows of r (stored w x r, or r x w transposed); B as h columns of r.
        pa = self._panel(a_slot, panels[0], w, r, *((1, w) if trans_a else (r, 1)), waits)
        pb = self._panel(b_slot, panels[1], h, r, *((r, 1) if trans_b else (1, h)), waits)
        how = ozaki.plan_pair(ozaki.Panel(None, *pa.stats()), ozaki.Panel(None, *pb.stats()), r,
                              self.moduli)
        if how.native:
            return False, f"native: {how.reason}"
        n = len(how.moduli)
        assert n <= self.capacity, (n, self.capacity)
        self._convert(pb, how.bits_b, n, pb.outer)  # every chunk of C needs all of B
        self._convert(pa, how.bits_a, n, self.sizes.rows)
        compute = self.gpu.streams["compute"]
        compute.wait_event(pb.ready_for(pb.outer))
        finish = self.finish[next(f for f in FINISH if f >= n)]
        h_pad, depth = padded(h, N_ALIGN), pa.depth_pad
        finishing = self.finishing
        for x0 in range(row0, row0 + rows, self.sizes.rows):
            x1 = min(x0 + self.sizes.rows, row0 + rows)
            turn, self._turn = self._turn, 1 - self._turn
            products = self.scratch[turn]
            if self._free[turn] is not None:  # its last chunk finished
                compute.wait_event(self._free[turn])
            compute.wait_event(pa.ready_for(x1))
            start = self._start(compute)
            with compute:  # CuPy's cuBLAS calls put the handle on the current stream
                int8_gemm(self.gpu.handle, pa.residues.data.ptr + x0 * depth,
                          pb.residues.data.ptr, products.data.ptr, x1 - x0, h, depth,
                          lda=depth, ldb=depth, ldc=h_pad, stride_a=w * depth,
                          stride_b=h * depth, stride_c=(x1 - x0) * h_pad, batch=n)
            self._stop("int8 gemm", start, compute)
            finishing.wait_event(_recorded(compute))
            start = self._start(finishing)
            with finishing:
                finish(_grid((x1 - x0) * h), (_THREADS, 1, 1),
                       (np.int32(x1 - x0), np.int32(h), products, np.int64(h_pad),
                        np.int64((x1 - x0) * h_pad), np.int32(n),
                        np.uint64(pa.emax.data.ptr + 4 * x0), np.int32(how.bits_a), pb.emax,
                        np.int32(how.bits_b), np.float64(alpha), np.float64(beta),
                        np.uint64(c_ptr + 8 * x0 * h), np.int64(h)))
            self._stop("finish", start, finishing)
            self._free[turn] = _recorded(finishing)
        compute.wait_event(self._free[1 - self._turn])  # the last finish: C is written
        return True, f"ozaki, {n} moduli"

    def close(self) -> None:
        self.stream.synchronize()
        self.finishing.synchronize()
        self.buffers.clear()
        self.panels.clear()
        self.scratch = ()

"""Products of whole CuPy matrices already on the GPU, what the benchmarks time the library's
GPU pieces with against cuBLAS in core: a kernel of ``kernels/`` (:func:`gemm_arrays`, over
:func:`oocgemm.cuda.kernels.gemm`) and the Ozaki emulation with the whole K one panel
(:class:`InCore`, over :class:`oocgemm.cuda.ozaki.Emulator`). A product run never needs them.
"""

from __future__ import annotations

import types

import cupy

from oocgemm.cuda import kernels
from oocgemm.cuda.ozaki import Emulator
from oocgemm.errors import OptionError, ShapeError
from oocgemm.ozaki import MAX_DEPTH


def gemm_arrays(name: str, a, b, c, alpha=1.0, beta=0.0, stream=None, defines: tuple = ()) -> None:
    """``c = alpha * a @ b + beta * c`` with kernel ``name`` for C-contiguous CuPy matrices;
    ``defines``: as :func:`oocgemm.cuda.kernels.function`'s (a measuring build)."""
    m, k = a.shape
    n = b.shape[1]
    kernels.gemm(name, m, n, k, alpha, a.data.ptr, k, b.data.ptr, n, beta, c.data.ptr, n,
                 dtype=c.dtype, stream=stream, defines=defines)


class SerialEmulator(Emulator):
    """An :class:`~oocgemm.cuda.ozaki.Emulator` that runs every phase on the compute stream,
    one after another: timed, what each phase costs on a GPU of its own."""

    def __init__(self, gpu, *args, **kwargs):
        super().__init__(gpu, *args, **kwargs)
        self.stream = self.finishing = gpu.streams["compute"]


class InCore:
    """Emulated products ``out = a @ b`` of C-contiguous float64 CuPy matrices already on the
    current GPU (a: m x k, b: k x n), the whole K one panel (``k <= MAX_DEPTH``), on the
    current stream. Each call converts its operands afresh. Returns the note of how the
    product ran; where the operands need native DGEMM, cuBLAS runs it.

    It stands in for the run's :class:`~oocgemm.cuda.context.GpuContext` that an
    :class:`~oocgemm.cuda.ozaki.Emulator` takes (``index``, ``resources``, ``streams``,
    ``handle``, ``device_ptr``), its two slots the operands of the call. ``timing``: time
    the phases (``self.emulator.seconds()``); ``serial``: every phase on the compute stream
    (:class:`SerialEmulator`). ``resources``: whose compiled kernels to use (an
    :class:`~oocgemm.cuda.context.Resources`; default: its own).
    """

    def __init__(self, m: int, n: int, k: int, kernel: str = "ozaki", *, timing: bool = False,
                 serial: bool = False, resources=None):
        if k > MAX_DEPTH:
            raise OptionError(f"k={k}: in core, the whole K is one panel of at most "
                              f"{MAX_DEPTH}")
        self.shape = (m, n, k)
        self.index = cupy.cuda.Device().id
        self.resources = resources or types.SimpleNamespace(kernels={})
        self.streams = {"compute": cupy.cuda.get_current_stream()}
        self.handle = cupy.cuda.device.get_cublas_handle()
        self._arrays: dict = {}
        self._calls = 0
        emulator = SerialEmulator if serial else Emulator
        self.emulator = emulator(self, kernel, (m, n, k), ("A0", "B0"), timing=timing)

    def device_ptr(self, name: str) -> int:
        return self._arrays[name].data.ptr

    def __call__(self, a, b, out) -> str:
        m, n, k = self.shape
        if a.shape != (m, k) or b.shape != (k, n) or out.shape != (m, n):
            raise ShapeError(f"shapes {a.shape} @ {b.shape} -> {out.shape}, planned for "
                             f"{(m, k)} @ {(k, n)}")
        self._arrays = {"A0": a, "B0": b}
        self._calls += 1
        keys = (("A", self._calls), ("B", self._calls))
        now = cupy.cuda.Event(block=False, disable_timing=True)
        now.record(self.streams["compute"])
        emulated, note = self.emulator.gemm(keys, "A0", "B0", out.data.ptr, m, n, k, False,
                                            False, 1.0, 0.0, 0, m, waits=(now,))
        if not emulated:
            cupy.matmul(a, b, out=out)
        return note

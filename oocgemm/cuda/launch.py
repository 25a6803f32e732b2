"""How a GPU launches each strategy's block GEMMs: :mod:`oocgemm.strategies` says what each
kernel is (its memory, staging and cost, pure Python); a :class:`Launch` here says what a
run on the GPU does for it: what to compile before the run is timed, what to set up once
the slots exist, and how one block's GEMM is launched. :func:`launch_of` finds a
strategy's.

- :class:`Cublas` (:class:`~oocgemm.strategies.Native`): the run's own cuBLAS GEMM, which
  :meth:`oocgemm.cuda.context.GpuContext.gemm` calls where a launch does not take the block;
- :class:`Kernel` (:class:`~oocgemm.strategies.CudaKernel`): a kernel of ``kernels/``;
- :class:`Emulated` (:class:`~oocgemm.strategies.Ozaki`): Ozaki scheme II
  (:class:`oocgemm.cuda.ozaki.Emulator`), cuBLAS where a block's panels need native DGEMM.
"""

from __future__ import annotations

from typing import NamedTuple

from ..strategies import CudaKernel, Native, Ozaki


class Block(NamedTuple):
    """One GEMM on a run's row-major slots: ``C[row0:row0+rows, :h] = alpha * op(A)[row0:...]
    @ op(B) + beta * C[...]`` for a C block of ``w`` rows and K panels of depth ``r``."""

    a_slot: str
    b_slot: str
    c_slot: str
    w: int
    h: int
    r: int
    trans_a: bool
    trans_b: bool
    alpha: object
    beta: object
    row0: int
    rows: int


class Cublas:
    """cuBLAS's GEMM: nothing to compile, nothing beside the slots."""

    emulator = None
    """The run's :class:`oocgemm.cuda.ozaki.Emulator` (emulating launches only)."""
    #: Whether a GEMM waits for each operation it depends on on another stream itself (the
    #: emulator's conversions run on streams of their own and need those events).
    waits_across_streams = False

    def __init__(self, strategy: Native):
        self.strategy = strategy

    def compile(self, index: int, cache: dict, problem) -> None:
        """Compile what the run launches on GPU ``index`` (kept in ``cache``) before it is
        timed, so that a kernel that does not build fails before any byte is read."""

    def start(self, gpu, plan, timing: bool) -> None:
        """Set up what the run's GEMMs need beside the slots of ``gpu`` (a
        :class:`~oocgemm.cuda.context.GpuContext`), once they are allocated."""

    def gemm(self, gpu, block: Block, a_ptr: int, c_ptr: int, panels, waits
             ) -> tuple[bool, str | None]:
        """Launch ``block``'s GEMM on ``gpu``'s compute stream (``a_ptr``, ``c_ptr``: where
        its rows of op(A) and C start; ``panels``: the keys of the panels the slots hold;
        ``waits``: the events of what it waits for on other streams); returns whether it did
        (False: cuBLAS does) and the note for the run's log."""
        return False, None

    def close(self) -> None:
        """Let go of what :meth:`start` made, once nothing is in flight."""


class Kernel(Cublas):
    """A kernel of ``kernels/``, launched with the row-major operands as they are."""

    def compile(self, index: int, cache: dict, problem) -> None:
        from . import kernels

        for vec in (True, False):
            kernels.function(self.strategy.name, problem.dtype, problem.trans_a,
                             problem.trans_b, vec, device=index, cache=cache)

    def gemm(self, gpu, block, a_ptr, c_ptr, panels, waits):
        from . import kernels

        b = block
        kernels.gemm(self.strategy.name, b.rows, b.h, b.r, b.alpha, a_ptr,
                     b.w if b.trans_a else b.r, gpu.device_ptr(b.b_slot),
                     b.r if b.trans_b else b.h, b.beta,
                     c_ptr, b.h, dtype=gpu.dtype, trans_a=b.trans_a, trans_b=b.trans_b,
                     stream=gpu.streams["compute"], cache=gpu.resources.kernels)
        return True, None


class Emulated(Cublas):
    """float64 GEMMs emulated from exact int8 GEMMs (:class:`oocgemm.cuda.ozaki.Emulator`)."""

    waits_across_streams = True

    def compile(self, index: int, cache: dict, problem) -> None:
        from . import ozaki

        ozaki.module(index, cache)

    def start(self, gpu, plan, timing: bool) -> None:
        from .ozaki import Emulator

        slots = [name for name in plan.schedule.slots
                 if name[0] in "AB" and name[1:].isdigit()]
        self.emulator = Emulator(gpu, self.strategy.name, plan.problem.clipped(plan.tile),
                                 slots, timing=timing)

    def gemm(self, gpu, block, a_ptr, c_ptr, panels, waits):
        b = block  # the emulator finds the rows in the whole C block
        return self.emulator.gemm(panels, b.a_slot, b.b_slot, gpu.device_ptr(b.c_slot), b.w,
                                  b.h, b.r, b.trans_a, b.trans_b, b.alpha, b.beta, b.row0,
                                  b.rows, waits)

    def close(self) -> None:
        if self.emulator is not None:
            self.emulator.close()
        self.emulator = None


LAUNCHES: dict[type, type[Cublas]] = {Native: Cublas, CudaKernel: Kernel, Ozaki: Emulated}
"""Each strategy's launch, by the strategy's class."""


def launch_of(strategy: Native) -> Cublas:
    """A fresh launch of ``strategy`` for one run."""
    return LAUNCHES[type(strategy)](strategy)

"""The per-block GEMMs that ``kernel=`` names, as strategies: each says where it runs, which
shapes of plan it takes, the device memory it keeps beside the plan's slots, how its
executor stages it and what its blocks cost, so that the planner, the staging policies and
the executors ask it rather than branch on its name.

- :class:`Native`: the dtype's own GEMM: cuBLAS on a GPU, numpy's BLAS on the CPU
  (``'cublas'``, the default);
- :class:`CudaKernel`: a kernel of ``kernels/`` (``'naive'``, ``'tiled'``, ``'opt'``,
  ``'regblock'``, ``'dmma'``; :data:`oocgemm.kernel_catalog.KERNELS` holds their sources and
  launch shapes), on a GPU only;
- :class:`Ozaki`: float64 products emulated by Ozaki scheme II from exact int8 GEMMs
  (``'ozaki'``, ``'ozaki:N'``; :mod:`oocgemm.ozaki`), on a GPU or the CPU, the same bits.

:func:`strategy_of` finds a name's strategy (names checked by
:func:`oocgemm.kernel_catalog.check_kernel`). Pure Python, no CuPy; how a GPU launches each
is :mod:`oocgemm.cuda`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .kernel_catalog import DEFAULT, OZAKI, ozaki_moduli

if TYPE_CHECKING:
    from .ozaki import Footprint
    from .planning.model import DeviceModel
    from .planning.problem import Problem
    from .planning.staging import StagingSettings


@dataclass(frozen=True)
class Native:
    """The dtype's own GEMM: cuBLAS on a GPU, numpy's BLAS on the CPU."""

    name: str = DEFAULT
    """The name ``kernel=`` gives it."""

    #: Device kinds it runs on.
    devices = ("cpu", "cuda")
    #: Whether its products are emulated (not the dtype's GEMM, nor a kernel of it).
    emulated = False
    #: Whether a Gram product may compute only its blocks on and above the diagonal (the
    #: executors mirror those of cuBLAS and numpy).
    halves_gram = True
    #: Whether a product small enough may run in core (one upload, one GEMM, one download).
    in_core = True
    #: The moduli an emulation asks for (None: none asked).
    moduli: int | None = None

    def max_depth(self, staged: bool) -> int | None:
        """The deepest K panel it takes (None: any), in a staged plan or not."""
        return None

    def converted(self, w: int, h: int, r: int) -> Footprint | None:
        """The device memory it keeps beside the slots of a plan with tile (w, h, r) (clipped
        to the product), or None for none."""
        return None

    def seconds(self, prob: Problem, tile: tuple[int, int, int], model: DeviceModel,
                loaded: float) -> float | None:
        """Its compute time in a staged plan where it differs from the dtype's GEMM (whose
        time the cost model gives), with ``loaded`` bytes of A and B panels loaded; None for
        the same. No longer for a deeper K panel (a larger r, fewer bytes loaded) of the
        same block: the planner's search counts on it
        (:func:`oocgemm.planning.tiling._resource_floor`)."""
        return None

    def cpu_staging(self, settings: StagingSettings, prob: Problem) -> StagingSettings:
        """The CPU executor's staging ``settings`` for it."""
        return settings

    def cuda_staging(self, settings: StagingSettings, prob: Problem) -> StagingSettings:
        """The CUDA executor's staging ``settings`` for it."""
        if prob.gram:
            # A symmetric product writes two blocks of C for each it computes, in half the
            # time: 16 output stripes (and writers) rather than 8 made X^T X quicker, since
            # writing fresh host pages goes faster from more threads (docs/performance.md,
            # "Gram products").
            return replace(settings, n_out=16)
        return settings


@dataclass(frozen=True)
class CudaKernel(Native):
    """A kernel of ``kernels/`` in place of cuBLAS: the same plan, on a GPU only."""

    devices = ("cuda",)
    halves_gram = False


@dataclass(frozen=True)
class Ozaki(Native):
    """float64 products emulated by Ozaki scheme II: with ``moduli`` moduli ('ozaki:N'), or
    as many as keep every element within DGEMM's error bound (None: 'ozaki')."""

    name: str = OZAKI
    moduli: int | None = None

    emulated = True
    halves_gram = False
    in_core = False  # it converts whole panels

    def max_depth(self, staged: bool) -> int | None:
        """On a GPU, K panels no deeper than its int32 products stay exact for."""
        from .ozaki import MAX_DEPTH

        return MAX_DEPTH if staged else None

    def converted(self, w: int, h: int, r: int) -> Footprint | None:
        """The converted panels and the products' scratch (the emulator sizes its buffers for
        the tile clipped to the product, as here)."""
        from .ozaki import footprint

        return footprint(w, h, r, self.moduli)

    def seconds(self, prob: Problem, tile: tuple[int, int, int], model: DeviceModel,
                loaded: float) -> float | None:
        """The GPU's time: one int8 GEMM per modulus (:func:`oocgemm.ozaki.reserved_moduli`:
        for the rule, the most it may take); per C block and K panel, the finish of every
        element of C; per panel loaded, its conversion. The finish, once per K panel, is what
        favours deep K panels. None where the model has no int8 rate (the CPU)."""
        from .ozaki import reserved_moduli

        if not model.int8_ops:
            return None
        w, h, r = tile
        n = reserved_moduli(self.moduli)
        gemms = n * prob.flops / model.int8_ops * (
            1 + model.half_size / w + model.half_size / h + model.half_size / r)
        finish = prob.m * prob.n * math.ceil(prob.k / r) * n * model.finish_digit
        convert = loaded / prob.itemsize * (n * model.convert_digit + model.convert_element)
        return gemms + finish + convert

    def cpu_staging(self, settings: StagingSettings, prob: Problem) -> StagingSettings:
        """On the CPU each panel runs whole (a stripe would be an emulated product of its
        own)."""
        return replace(settings, split_last=1)

    def cuda_staging(self, settings: StagingSettings, prob: Problem) -> StagingSettings:
        """On a GPU each slot keeps its converted panel beside it, and every K panel's
        product is finished in an elementwise pass over C: two slots each for A and B, no
        ramp (small first panels would each take that pass), one tail panel."""
        return replace(settings, ramp=0, tail_panels=1, n_a=2, n_b=2)



def strategy_of(kernel: str | None) -> Native:
    """The strategy of ``kernel`` (a name as :func:`~oocgemm.kernel_catalog.check_kernel`
    gives it; None: the default)."""
    if kernel is None or kernel == DEFAULT:
        return Native()
    if kernel.partition(":")[0] == OZAKI:
        return Ozaki(kernel, ozaki_moduli(kernel))
    return CudaKernel(kernel)

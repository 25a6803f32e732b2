"""The per-block GEMM kernels one can choose with ``kernel=``: names, sources and launch shapes.

Pure data (no CuPy), so that argument checks, the planner, the CLI and the compile tests read it
on machines without a GPU, and outside :mod:`oocgemm.cuda` (which compiles and launches them:
:mod:`oocgemm.cuda.kernels`), so that planning a product never imports the GPU's package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import OptionError
from .settings import get as setting

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: The default: cuBLAS (through CuPy), the fastest on every GPU measured so far.
DEFAULT = "cublas"


@dataclass(frozen=True)
class KernelSpec:
    """How to compile and launch one kernel of ``kernels/``."""

    name: str
    """What ``kernel=`` calls it."""
    source: str
    """File name under ``kernels/`` (``oocgemm/_kernels/`` in an installed wheel)."""
    function: str
    """The C++ template ``function<T, TA, TB, VEC>`` the file defines."""
    threads: tuple[int, int]
    """Block shape (x, y) in threads."""
    tile: tuple[int, int]
    """Rows x columns of C one block computes; the grid is ceil(N / cols) x ceil(M / rows)."""
    dtypes: tuple[str, ...] = ("float64", "float32")
    """Element types it multiplies."""
    dynamic_shared: int = 0
    """Bytes of dynamic shared memory a block needs."""
    min_capability: int = 70
    """Lowest compute capability (major * 10 + minor) it runs on."""
    about: str = ""
    """One line for the docs and ``python -m benchmarks kernels``."""

    def expression(self, dtype: str, trans_a: bool, trans_b: bool, vec: bool) -> str:
        """The template instance NVRTC compiles, e.g. ``dmma_gemm<double,false,true,true>``."""
        t = {"float64": "double", "float32": "float"}[dtype]
        flags = ",".join("true" if f else "false" for f in (trans_a, trans_b, vec))
        return f"{self.function}<{t},{flags}>"


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec for spec in (
        KernelSpec("naive", "naive.cu", "naive_gemm", (16, 16), (16, 16),
                   about="one thread per C element, operands from global memory"),
        KernelSpec("tiled", "tiled.cu", "tiled_gemm", (32, 32), (32, 32),
                   about="shared-memory tiles of A and B, one C element a thread"),
        KernelSpec("opt", "opt.cu", "opt_gemm", (128, 1), (32, 128),
                   about="the seed paper's 3.2 mapping: A in shared memory, B streamed into "
                         "registers, a thread computes a strip of 4 columns of C"),
        KernelSpec("regblock", "regblock.cu", "regblock_gemm", (128, 1), (64, 128),
                   about="2-D register blocking 8x8 a thread, double-buffered shared memory, "
                         "two blocks an SM"),
        KernelSpec("dmma", "dmma.cu", "dmma_gemm", (128, 1), (128, 64), dtypes=("float64",),
                   dynamic_shared=3 * (128 * 20 + 64 * 20) * 8, min_capability=80,
                   about="FP64 tensor cores (mma.sync), 3-stage cp.async pipeline, "
                         "fragments read a k slice ahead"),
    )
}

#: float64 products emulated by Ozaki scheme II (``oocgemm/ozaki.py``): correctly rounded
#: block products ('ozaki'), or with N moduli ('ozaki:N': operands rounded to the bits N
#: moduli hold); on a GPU by int8 tensor-core GEMMs (``oocgemm/cuda/ozaki.py``), on the CPU
#: by numpy, with the same bits.
OZAKI = "ozaki"


def is_ozaki(kernel: str | None) -> bool:
    return kernel is not None and kernel.partition(":")[0] == OZAKI


def ozaki_moduli(kernel: str) -> int | None:
    """The moduli 'ozaki:N' asks for (None for 'ozaki': the rule's, per block)."""
    count = kernel.partition(":")[2]
    return int(count) if count else None

#: Every name ``kernel=`` accepts.
CHOICES = (DEFAULT, *KERNELS, OZAKI)

#: Sources of ``kernels/`` that are steps of a run rather than GEMM kernels of
#: :data:`KERNELS`: the elementwise kernels of Ozaki scheme II (``oocgemm/ozaki.py``), the
#: mirror of a symmetric product's diagonal blocks, and the packing of C's frames compressed
#: on the GPU (``oocgemm/cuda/nvcomp.py``).
STEPS = ("ozaki.cu", "symmetric.cu", "frames.cu")


def kernels_dir() -> Traversable:
    """Where the .cu sources are, first found of:

    - the ``kernels`` setting (:mod:`oocgemm.settings`: ``$OOCGEMM_KERNELS``), a folder;
    - ``oocgemm/_kernels`` inside the installed package (a wheel carries them there: the build
      copies ``kernels/``), read through ``importlib.resources``;
    - the ``kernels/`` folder of the checkout this package runs from (a source tree, or an
      editable install, which reads them in place).
    """
    override = setting("kernels")
    if override:
        return Path(override)
    packaged = resources.files("oocgemm").joinpath("_kernels")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[1] / "kernels"


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def source_text(spec: KernelSpec) -> str:
    """The kernel's source with its local ``#include "x.cuh"`` files spliced in, so that
    NVRTC needs no include path and CuPy's kernel cache keys on every line compiled."""
    folder = kernels_dir()

    def read(name: str) -> str:
        path = folder / name
        try:
            return path.read_text()
        except OSError as exc:
            raise OptionError(f"kernel {spec.name!r}: cannot read {path} ({exc}); set "
                              "OOCGEMM_KERNELS to the folder holding the .cu files") from exc

    def splice(match: re.Match) -> str:
        return f"// ---- {match.group(1)} ----\n" + read(match.group(1)).replace("#pragma once", "")

    return _INCLUDE.sub(splice, read(spec.source))


def check_kernel(kernel, dtype) -> str:
    """Normalise ``kernel=`` (None means the default) and check that it multiplies ``dtype``.
    'ozaki' emulates float64 products; other dtypes stay on cuBLAS (numpy's BLAS on the CPU).

    Raises
    ------
    OptionError
        An unknown name, or a kernel that does not handle ``dtype``.
    """
    name = check_kernel_name(DEFAULT if kernel is None else kernel)
    if is_ozaki(name):
        return name if str(dtype) == "float64" else DEFAULT
    if name != DEFAULT:
        spec = KERNELS[name]
        if str(dtype) not in spec.dtypes:
            raise OptionError(f"kernel {name!r} multiplies {' and '.join(spec.dtypes)}, not "
                              f"{dtype}; use kernel='cublas' for {dtype}")
    return name


def check_kernel_name(kernel) -> str:
    """``kernel=`` normalised, a name this catalogue knows (ozaki:N with a count of moduli
    it takes), before the dtype it multiplies is known (:func:`check_kernel` checks that);
    OptionError otherwise."""
    name = kernel.strip().lower() if isinstance(kernel, str) else None
    if name is not None and is_ozaki(name):
        count = name.partition(":")[2]
        if count:
            from .ozaki import MAX_MODULI

            if not count.isdigit() or not 1 <= int(count) <= MAX_MODULI:
                raise OptionError(f"kernel {name!r}: ozaki:N takes N from 1 to {MAX_MODULI} "
                                  f"moduli")
        return name
    if name not in CHOICES:
        raise OptionError(f"unknown kernel {kernel!r}; expected one of {', '.join(CHOICES)} "
                          f"(or ozaki:N, N moduli)")
    return name

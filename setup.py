"""The one build step that pyproject.toml cannot state: the CUDA sources of ``kernels/`` (their
source of truth, beside the package) are copied into the wheel as ``oocgemm/_kernels/``, where
:func:`oocgemm.kernel_catalog.kernels_dir` finds them through ``importlib.resources``. An editable
install copies nothing: the package then reads ``kernels/`` of its checkout in place.
Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNELS = Path(__file__).resolve().parent / "kernels"
PATTERNS = ("*.cu", "*.cuh")


class BuildWithKernels(build_py):
    """``build_py`` that also puts the kernel sources into ``oocgemm/_kernels``."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib, "oocgemm", "_kernels")
        self.mkpath(str(target))
        for pattern in PATTERNS:
            for source in sorted(KERNELS.glob(pattern)):
                self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildWithKernels})

"""Deprecated name of :mod:`oocgemm.info` (the facts ``oocgemm info`` reports), kept for code
that imports it; it warns once, on import."""

from __future__ import annotations

from .info import (  # noqa: F401 - re-exported
    blas_info,
    describe_startup,
    gpu_info,
    startup_info,
    system_info,
)
from .version import renamed

renamed("oocgemm.sysinfo", "oocgemm.info")

"""Deprecated name of :mod:`oocgemm.cuda.context` (the GPU's context, pools and resources),
kept for code that imports it; it warns once, on import."""

from __future__ import annotations

from ..version import renamed
from .context import (  # noqa: F401 - re-exported
    PROCESS,
    SYRK_ROWS,
    Crew,
    CrewPool,
    GpuContext,
    HandlePool,
    PinnedPool,
    Resources,
    memory_in_use,
    mirror_kernel,
)

renamed("oocgemm.cuda.engine", "oocgemm.cuda.context")

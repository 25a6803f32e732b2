"""Deprecated name of :mod:`oocgemm.cuda.context` (the GPU's context, pools and resources),
kept for code that imports it; it warns once, on import."""

from __future__ import annotations

import warnings

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

warnings.warn("oocgemm.cuda.engine is oocgemm.cuda.context now; import it from there",
              DeprecationWarning, stacklevel=2)

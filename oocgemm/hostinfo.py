"""Deprecated name of :mod:`oocgemm.machine` (the host's memory and cores), kept for code
that imports it; it warns once, on import."""

from __future__ import annotations

from .machine import available_memory, cores, total_memory  # noqa: F401 - re-exported
from .version import renamed

renamed("oocgemm.hostinfo", "oocgemm.machine")

"""Deprecated name of :mod:`oocgemm.random_matrices` (random matrices in memory or written to
storage, and the tolerance of their products), kept for code that imports it; it warns once,
on import."""

from __future__ import annotations

from .random_matrices import (  # noqa: F401 - re-exported
    DEFAULT_CHUNK,
    RANDOM_BLOCK_BYTES,
    NormalStream,
    check_dtype,
    random_kind,
    random_matrix,
    tolerance,
    write_random,
)
from .version import renamed

renamed("oocgemm.testing", "oocgemm.random_matrices")

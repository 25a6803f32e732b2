"""Deprecated name of :mod:`oocgemm.random_matrices` (random matrices in memory or written to
storage, and the tolerance of their products), kept for code that imports it; it warns once,
on import."""

from __future__ import annotations

import warnings

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

warnings.warn("oocgemm.testing is oocgemm.random_matrices now; import it from there",
              DeprecationWarning, stacklevel=2)

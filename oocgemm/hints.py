"""Deprecated name of :mod:`oocgemm.typing` (the public API's type aliases), kept for code
that imports it; it warns once, on import."""

from __future__ import annotations

import warnings

from .typing import DeviceLike, MatrixLike, Scalar, Size

__all__ = ["DeviceLike", "MatrixLike", "Scalar", "Size"]

warnings.warn("oocgemm.hints is oocgemm.typing now; import it from there",
              DeprecationWarning, stacklevel=2)

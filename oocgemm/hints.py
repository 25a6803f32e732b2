"""Deprecated name of :mod:`oocgemm.typing` (the public API's type aliases), kept for code
that imports it; it warns once, on import."""

from __future__ import annotations

from .typing import DeviceLike, MatrixLike, Scalar, Size
from .version import renamed

__all__ = ["DeviceLike", "MatrixLike", "Scalar", "Size"]

renamed("oocgemm.hints", "oocgemm.typing")

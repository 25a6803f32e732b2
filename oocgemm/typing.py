"""The type aliases of the public API (a leaf: every module may import it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

#: A matrix that :func:`oocgemm.multiply` reads or writes: a path or URL (``str``,
#: ``os.PathLike``), or an array (numpy array or memmap, CuPy, ``zarr.Array``, dask, xarray
#: ``DataArray``; their types are not imported here, hence ``Any``).
MatrixLike: TypeAlias = "str | os.PathLike[str] | np.ndarray | Any"
#: alpha and beta: real or complex.
Scalar: TypeAlias = "float | complex"
#: A memory limit: bytes, or a string like ``'8GB'`` or ``'80%'``; None for the default.
Size: TypeAlias = "int | str | None"
#: A device (``'auto'``, ``'cpu'``, ``'cuda'``, ``'cuda:N'``, ``'cuda:all'``), or several.
DeviceLike: TypeAlias = "str | Sequence[str]"

__all__ = ["DeviceLike", "MatrixLike", "Scalar", "Size"]

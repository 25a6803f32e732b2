"""The checks of a product's arguments that every entry point makes (multiply, plan, verify,
oocgemm.dask): scalars, dtypes, matrices, an output's compressor spelled NAME[:LEVEL]."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .errors import DTypeError, InputError, OptionError, operand_name
from .storage.base import MatrixSource

#: The dtypes oocgemm multiplies (the one list: operands, options and ``oocgemm random``).
DTYPES = ("float32", "float64", "complex64", "complex128")
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in DTYPES)


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool; OptionError unless it is True or False (numpy's too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise OptionError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def scalar(name: str, value: Any) -> float | complex:
    """``value`` as a float or complex; OptionError for booleans, non-numbers, NaN, and what a
    float64 cannot hold."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        raise OptionError(f"{name} must be a number, got {value!r}")
    number: Any = value  # a Number: int, float, complex, a numpy scalar, a Fraction, ...
    try:
        if isinstance(number, complex) or np.iscomplexobj(number):
            return complex(number)
        real = float(number)
    except OverflowError:
        raise OptionError(f"{name}={value!r} is beyond the range of a float64") from None
    if real != real:
        raise OptionError(f"{name} must not be NaN")
    return real


def check_dtype(role: str | None, dtype) -> np.dtype:
    """``dtype`` as a numpy dtype; DTypeError unless oocgemm multiplies it (either byte order).

    The one check of a dtype: operands and outputs (``role`` is the operand, 'a', 'c', 'out',
    named in the message), and dtypes asked for by name (``role`` None: ``oocgemm random
    --dtype``, :func:`oocgemm.random_matrices.write_random`, the benchmarks' ``--dtype``)."""
    dt: np.dtype | None = None
    try:
        dt = np.dtype(dtype)
        supported = dt.kind in "fc" and dt.newbyteorder("=") in SUPPORTED_DTYPES
    except TypeError:  # not a numpy dtype, or one without a byte order (strings)
        supported = False
    if not supported or dt is None:  # '>f8' is float64 too
        if role is None:
            raise DTypeError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        raise DTypeError(f"{role} has dtype {dtype if dt is None else dt}; supported: "
                         f"{', '.join(DTYPES)}")
    return dt


def check_matrix(role: str, src: MatrixSource) -> None:
    """InputError unless the source of operand ``role`` is 2-d."""
    if len(src.shape) != 2:
        raise InputError(f"{operand_name(role, src.name)} is not a matrix: shape "
                         f"{tuple(src.shape)} has {len(src.shape)} dimension(s), expected 2")


#: The compressors a new Zarr output may name (``NAME[:LEVEL]``), beside none.
COMPRESSORS = ("zstd", "gzip", "blosc", "lz4")


def parse_compressor(spec: str) -> tuple[str, int | None]:
    """``NAME[:LEVEL]`` as (name, level or None), the name one of :data:`COMPRESSORS` or
    none (which takes no level); OptionError otherwise. The level's range is the codec's,
    which the output's Zarr format picks (:func:`oocgemm.storage.zarr_store.compressor`)."""
    name, colon, level_text = spec.strip().lower().partition(":")
    try:
        level = int(level_text) if level_text or colon else None
    except ValueError:
        raise OptionError(f"compressor {spec!r}: the level must be an integer") from None
    if name == "none" and level is not None:
        raise OptionError(f"compressor {spec!r}: none takes no level")
    if name != "none" and name not in COMPRESSORS:
        raise OptionError(f"unknown compressor {spec!r}; known: none, {', '.join(COMPRESSORS)}")
    return name, level

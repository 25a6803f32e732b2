"""Byte sizes: parse "8GB" / "512MiB" / "80%" / 123 and print them back."""

from __future__ import annotations

import re

from .errors import OptionError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


def parse_size(value: int | float | str | None, total: int | None = None, *, name: str = "size"
               ) -> int | None:
    """Parse a byte count.

    Parameters
    ----------
    value
        An int (bytes), a string with a unit ("8GB", "512 MiB", "1.5e9"), or a percentage
        ("80%") of ``total``. None passes through.
    total
        What a percentage is taken of, in bytes.
    name
        The option's name, for the error message.

    Raises
    ------
    OptionError
        For a negative, unparsable or unit-less-percentage value.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"{name} must be a byte count or a string like '8GB' or '80%', got "
                          f"{value!r}")
    if isinstance(value, (int, float)):
        if not 1 <= value < float("inf"):  # NaN, inf, 0 and fractions of a byte too
            raise OptionError(f"{name} must be a positive, finite byte count, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise OptionError(f"{name} must be a byte count or a string like '8GB' or '80%', got "
                          f"{value!r}")
    match = _SIZE.match(value)
    if not match:
        raise OptionError(f"{name} must look like '8GB', '512MiB', '80%' or a byte count, got "
                          f"{value!r}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        if total is None:
            raise OptionError(f"{name}={value!r}: a percentage needs a known total memory")
        if not 0 < number <= 100:
            raise OptionError(f"{name}={value!r}: a percentage must be in (0, 100]")
        return int(total * number / 100)
    if unit not in _UNITS:
        raise OptionError(f"{name}={value!r}: unknown unit {match.group(2)!r}; "
                          f"use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB or %")
    if number * _UNITS[unit] == float("inf"):
        raise OptionError(f"{name}={value!r} is not a finite size")
    result = int(number * _UNITS[unit])
    if result <= 0:
        raise OptionError(f"{name} must be positive, got {value!r}")
    return result


def format_size(nbytes: float) -> str:
    """``1536 -> '1.5 KiB'``: binary units, three significant digits."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1000 or unit == "TiB":  # 1000..1023 reads better as 0.98 of the next
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def echo_size(given, nbytes: int) -> str:
    """A size the user gave, said back in their own spelling with what it came to beside it
    (``"'30MB' (28.6 MiB)"``, ``"'80%' (12.5 GiB)"``), so that a message does not answer
    '30MB' with a number that looks like another; :func:`format_size` alone where they gave
    none (a default)."""
    if given is None or isinstance(given, bool):
        return format_size(nbytes)
    return f"{given!r} ({format_size(nbytes)})"


def format_seconds(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"

"""What the benchmarks share: option checks, error measures, sizes in words."""

from __future__ import annotations

import json

import numpy as np

from oocgemm import cuda
from oocgemm.errors import OptionError
from oocgemm.testing import check_dtype, tolerance

__all__ = ["check_dtype", "check_room", "gib", "max_relative_error", "tolerance", "write_json"]


def max_relative_error(result, reference) -> float:
    """``max|result - reference| / max|reference|`` (0 when the reference is all zeros)."""
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    diff = float(np.max(np.abs(np.asarray(result) - reference))) if reference.size else 0.0
    return diff / scale if scale else diff


def check_room(nbytes: int, what: str) -> None:
    """OptionError unless the current GPU has ``nbytes`` free for ``what``."""
    import cupy

    free, _ = cuda.memory_info(cupy.cuda.Device().id)
    if nbytes > free:
        raise OptionError(f"{what} needs {gib(nbytes)} of GPU memory; "
                          f"{gib(free)} is free (choose a smaller --size)")


def gib(nbytes: float) -> str:
    """``nbytes`` in binary units, e.g. ``1.5 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{int(nbytes)} B"


def write_json(path: str | None, doc: dict) -> None:
    """``doc`` as JSON at ``path`` (nothing when None); values JSON lacks as their ``str``."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str)

"""The options of a product beside its operands and scalars: where it runs, its budgets, its
tile and kernel, its output layout and its file systems. ``multiply``, ``plan`` and
``oocgemm.dask.matmul`` take them as keywords and check them here, in one place, before any
work (what needs the operands, such as a kernel's dtypes, is checked where the operands are
opened)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import OptionError
from .units import parse_size


@dataclass(frozen=True)
class Options:
    """A product's options, normalised: ``tile`` a (w, h, r) of positive integers, the
    mappings copied into dicts; sizes and devices as given (their totals are the device's)."""

    device: Any = "auto"
    """'auto', 'cpu', 'cuda', 'cuda:N', 'cuda:all', or a list of device names."""
    memory_limit: Any = None
    """Bytes, a string like '16GB' or '80%' (of the device's memory), or None."""
    host_memory_limit: Any = None
    """As ``memory_limit``, of host memory."""
    tile: tuple[int, int, int] | None = None
    """The C block and K panel (w, h, r), or None for the planner's choice."""
    kernel: str | None = None
    """The per-block GEMM on a GPU ('cublas', 'dmma', ...), or None for the default."""
    out_options: dict | None = None
    """The layout of a new ``.zarr`` output (``zarr.create_array`` keywords)."""
    storage_options: dict | None = None
    """Options of the fsspec file system of URL inputs and outputs."""

    @classmethod
    def of(cls, where: str, **given: Any) -> Options:
        """The options ``given`` (by name), checked; OptionError for an unknown name or a
        value that cannot be one, naming ``where`` they were given."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise OptionError(f"{where}: unknown options {unknown}; it takes "
                              f"{', '.join(names)}")
        for name in ("memory_limit", "host_memory_limit"):
            parse_size(given.get(name), 1 << 40, name=name)  # its spelling; the total later
        for name in ("out_options", "storage_options"):
            value = given.get(name)
            if value is not None and not isinstance(value, Mapping):
                raise OptionError(f"{name} must be a dict, got {type(value).__name__}")
            if value is not None:
                given[name] = dict(value)
        if given.get("tile") is not None:
            given["tile"] = parse_tile(given["tile"])
        kernel = given.get("kernel")
        if kernel is not None and not isinstance(kernel, str):
            raise OptionError(f"kernel must be a name, got {kernel!r}")
        return cls(**given)

    def keywords(self) -> dict[str, Any]:
        """The options that differ from the defaults, by name (to hand on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}


def parse_tile(tile) -> tuple[int, int, int]:
    """(w, h, r) from '8192,8192,4096', '8192x8192x4096' or a sequence of three."""
    if isinstance(tile, str):
        parts: list = tile.replace("x", ",").split(",")
    else:
        parts = list(tile) if isinstance(tile, (tuple, list)) else [tile]
    try:
        values = tuple(int(p) for p in parts)
        ok = len(values) == 3 and all(float(p) == int(p) for p in parts)
    except (TypeError, ValueError):
        ok = False
    if not ok or min(values) < 1:
        raise OptionError(f"tile must be three positive integers (w, h, r), got {tile!r}")
    w, h, r = values
    return w, h, r

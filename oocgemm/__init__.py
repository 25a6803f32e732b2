"""oocgemm: out-of-core dense matrix multiplication (Zarr, .npy, arrays; GPU or CPU).

    >>> import oocgemm
    >>> oocgemm.multiply("a.zarr", "b.zarr", out="c.zarr")   # doctest: +SKIP

The errors and the version are here at once; the rest (numpy and the planner with it) is
imported when first used, so that a process that only asks ``oocgemm --help`` or catches an
``OOCGemmError`` does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .errors import (
    BudgetError,
    DependencyError,
    DeviceError,
    DTypeError,
    ExecutionError,
    InputError,
    KernelError,
    MemoryPressureError,
    OOCGemmError,
    OptionError,
    OutputError,
    ShapeError,
)
from .version import __version__

if TYPE_CHECKING:
    from .api import gram, multiply, plan
    from .engine import Engine
    from .freivalds import VerifyReport, verify
    from .planning import Plan
    from .product import Product
    from .result import Result

#: Where each name imported on first use lives.
_LAZY = {"gram": "api", "multiply": "api", "plan": "api", "Engine": "engine",
         "VerifyReport": "freivalds", "verify": "freivalds", "Plan": "planning",
         "Product": "product", "Result": "result"}

__all__ = ["BudgetError", "DTypeError", "DependencyError", "DeviceError", "Engine",
           "ExecutionError", "InputError", "KernelError", "MemoryPressureError", "OOCGemmError",
           "OptionError", "OutputError", "Plan", "Product", "Result", "ShapeError",
           "VerifyReport", "gram", "multiply", "plan", "verify", "__version__"]


def __getattr__(name: str):
    if name == "settings":  # the module (oocgemm.settings.get, .set), as zarr.config
        return importlib.import_module(".settings", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # found here from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "settings"})

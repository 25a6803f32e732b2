"""oocgemm: out-of-core dense matrix multiplication (Zarr, .npy, arrays; GPU or CPU).

    >>> import oocgemm
    >>> oocgemm.multiply("a.zarr", "b.zarr", out="c.zarr")   # doctest: +SKIP
"""

from .api import gram, multiply, plan
from .engine import Engine
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
from .freivalds import VerifyReport, verify
from .planning import Plan
from .product import Product
from .result import Result
from .version import __version__

__all__ = ["BudgetError", "DTypeError", "DependencyError", "DeviceError", "Engine",
           "ExecutionError", "InputError", "KernelError", "MemoryPressureError", "OOCGemmError",
           "OptionError", "OutputError", "Plan", "Product", "Result", "ShapeError",
           "VerifyReport", "gram", "multiply", "plan", "verify", "__version__"]

"""One error hierarchy: every message names the bad value and what was expected."""

from __future__ import annotations


def operand_name(role: str, name: str) -> str:
    """How a message names the operand ``role`` ('a', 'out') read or written as ``name`` (a
    source's or sink's name): ``"b ('b.npy')"``-like for a path, and the name alone where it
    names the role already (``'b (numpy array)'``), so that no message says ``b (b (numpy
    array))``."""
    if not name or name == role:
        return role
    if name.startswith(role + " ("):
        return name
    return f"{role} ({name})"


class OOCGemmError(ValueError):
    """Base class of every error that oocgemm raises on purpose."""


class InputError(OOCGemmError):
    """An input (a, b or c) is missing, unreadable, corrupt, or not a matrix."""


class ShapeError(OOCGemmError):
    """Shapes do not agree (inner dimensions, c or out of the wrong shape)."""


class DTypeError(OOCGemmError):
    """A dtype that the executors do not support (int, bool, object, float16...)."""


class OutputError(OOCGemmError):
    """The output cannot be written as asked (exists, aliases an input, not writable)."""


class BudgetError(OOCGemmError):
    """A memory limit is too small for any tile, or a requested tile does not fit."""


class OptionError(OOCGemmError):
    """An option has a bad value (tile, memory size string, alpha/beta...)."""


class DeviceError(OOCGemmError):
    """An unknown device, or a device that is not available here."""


class ExecutionError(OOCGemmError):
    """The run failed midway (an I/O error, a corrupt chunk); no output was committed."""


class MemoryPressureError(ExecutionError):
    """An allocation failed during the run: ``where`` is 'device' (GPU memory), 'host' or
    'pinned' (page-locked host memory, or a CUDA allocation of unknown kind). ``multiply``
    catches it, plans again with smaller blocks and goes on."""

    def __init__(self, message: str, where: str):
        super().__init__(message)
        self.where = where


class KernelError(OOCGemmError):
    """A CUDA kernel failed to compile or to load; the compiler log is in the message."""


class DependencyError(OOCGemmError):
    """An optional dependency is not installed (matplotlib for plots); the message says
    what to install."""

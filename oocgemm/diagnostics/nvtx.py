"""NVTX ranges for Nsight Systems: one per block operation, in the ``oocgemm`` domain.

``nsys profile -t cuda,nvtx oocgemm multiply ...`` then shows, beside the CUDA rows, what each
thread did for which block: the dispatcher threads' ranges wrap the enqueue of each device
operation (so nsys projects them onto the GPU rows of the kernels and copies they launched),
the reader and writer threads' ranges wrap their host copies. A range is named by
:func:`~oocgemm.diagnostics.events.op_label` ('gemm C(1,2) q=3', 'H2D A(1,0)', 'read B(0,1)')
and coloured by kind (``KIND_COLORS``).

A profiler reaches NVTX through an injection library: Nsight Systems, and CUPTI for any
CUPTI-based collector, are loaded from ``NVTX_INJECTION64_PATH`` by each NVTX instance of the
process on its first call. Backends, the first that works:

- ``nvtx``: the ``nvtx`` package (``pip install nvtx``, in the ``cuda12``/``cuda13`` extras).
  It hands out a dummy domain (every call a no-op) unless ``nvtxDomainIsEnabled`` says yes,
  and NVTX answers that through its extension mechanism: yes where the tool handles no
  extension, no where the tool's extension initialisation fails. CUPTI 13.0, for one, fails it
  for a payload extension newer than it knows (it takes compatibility ids 0x0103 and 0x0104
  only), though its handling of the ranges themselves (the core NVTX calls) does not hang on it;
- ``lib``: the NVTX C API of ``libnvtx3interop.so`` (CUDA 13 toolkit, ``nvidia-nvtx`` wheel)
  or ``libnvToolsExt.so`` (``nvidia-nvtx-cu12``) through ctypes, in the ``oocgemm`` domain as
  well: where the ``nvtx`` package is missing, or gave a dummy domain while a tool is attached;
- ``cupy``: CuPy's ``cupy.cuda.nvtx``, which has no domains (the ranges land in the default
  one): the last resort.

Without a tool attached (``NVTX_INJECTION64_PATH`` unset: on Linux the only way a tool attaches
to NVTX at run time) no backend is even imported: every call is a no-op function. Setting up
never raises: a backend that fails is skipped (:attr:`Ranges.reason` says why).
``NVTX_DISABLE`` (the ``nvtx`` package's switch) or ``OOCGEMM_NVTX=off`` turns the ranges
off; ``OOCGEMM_NVTX=nvtx|lib|cupy`` asks for that backend alone.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from collections.abc import Callable
from typing import Any

from .events import KIND_COLORS, op_label

DOMAIN = "oocgemm"
BACKENDS = ("nvtx", "lib", "cupy")
ENV = "OOCGEMM_NVTX"
"""Environment variable: 'off' (no ranges), or one backend of :data:`BACKENDS` to use alone."""

# The NVTX C API's libraries, each of which has the domain calls (nvtxDomainCreateA, ...).
_LIBRARIES = ("libnvtx3interop.so.1", "libnvtx3interop.so", "libnvToolsExt.so.1",
              "libnvToolsExt.so")


def _noop(*_args) -> None:
    return None


def _argb(color: str) -> int:
    return 0xFF000000 | int(color.lstrip("#"), 16)


COLORS = {kind: _argb(c) for kind, c in KIND_COLORS.items()}
"""ARGB colour of the ranges of each kind of operation."""


def range_name(op) -> str:
    """The NVTX message of ``op``'s range: its label on the timeline."""
    return op_label(op.kind.value, op.operand, op.key, op.q)


def tool_attached() -> bool:
    """Whether an NVTX tool (Nsight Systems, CUPTI) is named for injection."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH"))


class _Attributes(ctypes.Structure):
    """``nvtxEventAttributes_t`` (version 3, 48 bytes on 64-bit platforms)."""

    _fields_ = [("version", ctypes.c_uint16), ("size", ctypes.c_uint16),
                ("category", ctypes.c_uint32), ("colorType", ctypes.c_int32),
                ("color", ctypes.c_uint32), ("payloadType", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("payload", ctypes.c_uint64),
                ("messageType", ctypes.c_int32), ("message", ctypes.c_char_p)]


_NVTX_VERSION, _NVTX_COLOR_ARGB, _NVTX_MESSAGE_TYPE_ASCII = 3, 1, 1


def _library_candidates() -> list[str]:
    """Where an NVTX C library may be: CUDA_PATH/CUDA_HOME, the ``nvidia-*`` wheels on
    ``sys.path``, /usr/local/cuda; then the bare names (the loader's search path)."""
    dirs = []
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            root = os.environ[var]
            dirs += [os.path.join(root, "lib64"), os.path.join(root, "lib"),
                     os.path.join(root, "targets", "x86_64-linux", "lib")]
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            dirs += sorted(glob.glob(os.path.join(entry, "nvidia", "cu1*", "lib")), reverse=True)
            dirs.append(os.path.join(entry, "nvidia", "nvtx", "lib"))
    dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib",
             "/usr/local/cuda/targets/x86_64-linux/lib"]
    found = [os.path.join(d, name) for d in dirs for name in _LIBRARIES
             if os.path.isfile(os.path.join(d, name))]
    return found + list(_LIBRARIES)


@functools.lru_cache(maxsize=1)
def _nvtx_library() -> tuple[Any, str]:
    """The first NVTX C library that loads and has the domain calls, and its path."""
    errors = []
    for path in _library_candidates():
        try:
            lib = ctypes.CDLL(path)
            create, push, pop = (lib.nvtxDomainCreateA, lib.nvtxDomainRangePushEx,
                                 lib.nvtxDomainRangePop)
        except (OSError, AttributeError) as exc:
            errors.append(f"{path}: {exc}")
            continue
        create.argtypes, create.restype = [ctypes.c_char_p], ctypes.c_void_p
        push.argtypes, push.restype = [ctypes.c_void_p, ctypes.POINTER(_Attributes)], ctypes.c_int
        pop.argtypes, pop.restype = [ctypes.c_void_p], ctypes.c_int
        return lib, path
    raise OSError("no NVTX library (" + "; ".join(errors[-len(_LIBRARIES):]) + ")")


@functools.lru_cache(maxsize=1)
def _library_domain() -> tuple[Any, int, str]:
    """(library, handle of the ``oocgemm`` domain, library path): one domain per process."""
    lib, path = _nvtx_library()
    return lib, lib.nvtxDomainCreateA(DOMAIN.encode()), path


class Ranges:
    """``push(op)`` / ``pop()`` an NVTX range around one block operation, on the calling
    thread (ranges nest per thread). ``backend`` is 'nvtx', 'lib', 'cupy' or None (no-ops);
    ``reason`` says why that one (and what was tried before it)."""

    def __init__(self):
        self.backend: str | None = None
        self.reason = ""
        self.push: Callable[[Any], None] = _noop
        self.pop: Callable[[], Any] = _noop
        try:
            self.reason = self._choose()
        except Exception as exc:  # never let a profiler's helper fail a product
            self.backend, self.push, self.pop = None, _noop, _noop
            self.reason = f"no NVTX ranges: {type(exc).__name__}: {exc}"

    def _choose(self) -> str:
        if os.environ.get("NVTX_DISABLE"):
            return "no NVTX ranges: NVTX_DISABLE is set"
        want = os.environ.get(ENV, "").strip().lower()
        if want in ("off", "0", "no", "none", "false"):
            return f"no NVTX ranges: {ENV}={want}"
        notes = []
        if want and want not in BACKENDS:
            notes.append(f"{ENV}={want!r} is not one of {', '.join(BACKENDS)}: ignored")
        if want not in BACKENDS and not tool_attached():
            # Nothing would take the ranges: leave every call a no-op, import nothing.
            return "; ".join(notes + ["no NVTX ranges: no NVTX tool attached "
                                      "(NVTX_INJECTION64_PATH is unset)"])
        for name in (want,) if want in BACKENDS else BACKENDS:
            try:
                note = getattr(self, f"_use_{name}")()
            except Exception as exc:  # this backend cannot be had: try the next one
                notes.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            notes.append(note)
            if self.backend is not None:
                break
        return "; ".join(notes)

    # -- backends: each sets backend/push/pop and returns a note, or returns a note alone ------
    def _use_nvtx(self) -> str:
        import nvtx

        domain = nvtx.get_domain(DOMAIN)
        if type(domain).__name__ == "DummyDomain":
            return ("nvtx: the package gave a dummy domain (no tool attached, or the tool's "
                    "nvtxDomainIsEnabled said no)")
        attributes: dict[str, Any] = {}
        push_range = domain.push_range

        def push(op) -> None:
            name = range_name(op)
            a = attributes.get(name)
            if a is None:
                a = attributes[name] = domain.get_event_attributes(
                    message=name, color=COLORS.get(op.kind.value))
            push_range(a)

        self.backend, self.push, self.pop = "nvtx", push, domain.pop_range
        try:
            from importlib.metadata import version

            return f"nvtx: the nvtx package {version('nvtx')}"
        except Exception:  # not installed as a distribution (a source tree on sys.path)
            return "nvtx: the nvtx package"

    def _use_lib(self) -> str:
        lib, handle, path = _library_domain()
        domain = ctypes.c_void_p(handle)
        push_ex, pop_ex = lib.nvtxDomainRangePushEx, lib.nvtxDomainRangePop
        attributes: dict[str, _Attributes] = {}

        def push(op) -> None:
            name = range_name(op)
            a = attributes.get(name)
            if a is None:
                a = attributes[name] = _Attributes(
                    version=_NVTX_VERSION, size=ctypes.sizeof(_Attributes),
                    colorType=_NVTX_COLOR_ARGB, color=COLORS.get(op.kind.value, 0xFFFFFFFF),
                    messageType=_NVTX_MESSAGE_TYPE_ASCII, message=name.encode())
            push_ex(domain, ctypes.byref(a))

        def pop() -> None:
            pop_ex(domain)

        self.backend, self.push, self.pop = "lib", push, pop
        return f"lib: {path}"

    def _use_cupy(self) -> str:
        from cupy.cuda import nvtx as cupy_nvtx

        if not getattr(cupy_nvtx, "available", True):
            return "cupy: CuPy was built without NVTX"

        def push(op) -> None:
            cupy_nvtx.RangePushC(range_name(op), COLORS.get(op.kind.value, 0xFFFFFFFF))

        self.backend, self.push, self.pop = "cupy", push, cupy_nvtx.RangePop
        return "cupy: CuPy's NVTX, in the default domain (it has no domains)"

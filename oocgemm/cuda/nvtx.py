"""NVTX ranges for Nsight Systems: one per block operation, in the ``oocgemm`` domain.

``nsys profile -t cuda,nvtx oocgemm multiply ...`` then shows, beside the CUDA rows, what each
thread did for which block: the dispatcher threads' ranges wrap the enqueue of each device
operation (so nsys projects them onto the GPU rows of the kernels and copies they launched),
the reader and writer threads' ranges wrap their host copies.

Backends, the first that is available: the ``nvtx`` package (``pip install nvtx``, in the
``cuda12``/``cuda13`` extras), which has domains; CuPy's ``cupy.cuda.nvtx`` (no domain: the
ranges land in the default one); else nothing. Without a profiler attached every call is a
no-op function: the ``nvtx`` package hands out a dummy domain then, and CuPy's backend is used
only when a tool set ``NVTX_INJECTION64_PATH`` (as nsys does).
"""

from __future__ import annotations

import os

from ..diagnostics.events import KIND_COLORS, op_label

DOMAIN = "oocgemm"


def _noop(*_args) -> None:
    return None


def _argb(color: str) -> int:
    return 0xFF000000 | int(color.lstrip("#"), 16)


class Ranges:
    """``push(op)`` / ``pop()`` an NVTX range around one block operation, on the calling
    thread (ranges nest per thread). ``backend`` is 'nvtx', 'cupy' or None (no-ops)."""

    def __init__(self):
        self.backend: str | None = None
        self.push = _noop
        self.pop = _noop
        try:
            import nvtx
        except ImportError:
            nvtx = None
        if nvtx is not None:
            domain = nvtx.get_domain(DOMAIN)
            if type(domain).__name__ != "DummyDomain":  # a tool is attached
                self._use_nvtx(domain)
            return
        if os.environ.get("NVTX_INJECTION64_PATH"):
            try:
                from cupy.cuda import nvtx as cupy_nvtx
            except ImportError:
                return
            if getattr(cupy_nvtx, "available", True):
                self._use_cupy(cupy_nvtx)

    def _use_nvtx(self, domain) -> None:
        colors = {kind: _argb(c) for kind, c in KIND_COLORS.items()}

        def push(op) -> None:
            kind = op.kind.value
            domain.push_range(domain.get_event_attributes(
                message=op_label(kind, op.operand, op.key, op.q), color=colors.get(kind)))

        self.backend, self.push, self.pop = "nvtx", push, domain.pop_range

    def _use_cupy(self, cupy_nvtx) -> None:
        colors = {kind: _argb(c) for kind, c in KIND_COLORS.items()}

        def push(op) -> None:
            kind = op.kind.value
            cupy_nvtx.RangePushC(op_label(kind, op.operand, op.key, op.q),
                                 colors.get(kind, 0xFFFFFFFF))

        self.backend, self.push, self.pop = "cupy", push, cupy_nvtx.RangePop

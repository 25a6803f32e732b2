"""What the executors share: slot views, the per-op arithmetic contract, the executor registry."""

from __future__ import annotations

import importlib

from ..errors import DeviceError

#: Executor modules by device kind, imported lazily (the CUDA one imports cupy).
_EXECUTORS = {"cpu": "oocgemm.runtime.cpu:CpuExecutor", "cuda": "oocgemm.runtime.cuda:CudaExecutor"}


def executor_class(kind: str):
    """The executor class for 'cpu' or 'cuda'."""
    try:
        target = _EXECUTORS[kind]
    except KeyError:
        raise DeviceError(f"unknown executor {kind!r}; known: {', '.join(sorted(_EXECUTORS))}") from None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def panel_shapes(plan, op):
    """Stored shapes of the A panel, B panel and C block that a GEMM op combines."""
    i, j = op.key
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    w, h = rows[i + 1] - rows[i], cols[j + 1] - cols[j]
    r = ks[op.q + 1] - ks[op.q]
    a = (r, w) if plan.problem.trans_a else (w, r)
    b = (h, r) if plan.problem.trans_b else (r, h)
    return a, b, (w, h)


class Cancelled(Exception):
    """Raised inside lanes when the run is being torn down."""

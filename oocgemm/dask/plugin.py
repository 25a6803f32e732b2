"""Workers made ready for their first group when they start: a ``dask.distributed`` worker
plugin that runs :func:`oocgemm.warmup.warm` on each worker (those there when it is
registered, and each that joins or is restarted later), so that the CUDA context, cuBLAS,
the pinned ring, nvCOMP and the kernels are there before the first group task::

    client.register_plugin(oocgemm.dask.WarmUp(device="cuda", memory_limit="16GB"))

This module imports ``distributed``; :mod:`oocgemm.dask` gives :class:`WarmUp` lazily.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


class WarmUp(WorkerPlugin):
    """Runs :func:`oocgemm.warmup.warm` with ``options`` on each worker as it starts; what
    each step took is kept on the worker (``worker.data`` is not touched) as
    ``worker.oocgemm_warm`` and returned by :func:`warm_times` through ``client.run``."""

    name = "oocgemm-warm-up"
    idempotent = True

    def __init__(self, **options: Any):
        from ..options import PLANS, Options

        options.setdefault("device", "auto")
        Options.of("oocgemm.dask.WarmUp", PLANS, **options)  # bad options said here, once
        self.options = options

    async def setup(self, worker) -> None:
        from ..warmup import warm

        loop = asyncio.get_running_loop()  # off the worker's event loop: it takes seconds
        worker.oocgemm_warm = await loop.run_in_executor(None, lambda: warm(**self.options))


def warm_times(dask_worker=None) -> dict[str, float]:
    """This worker's warm-up steps (seconds), for ``client.run(warm_times)``; empty where
    :class:`WarmUp` did not run."""
    return dict(getattr(dask_worker, "oocgemm_warm", {}))

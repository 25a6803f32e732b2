"""A process made ready for its first product: what the first run on a device pays once (CuPy
and the driver, each GPU's context, cuBLAS and a handle, the pinned staging ring, nvCOMP and
the kernels a run compiles, numpy's BLAS threads, zarr's codecs) paid ahead, by a small
product of each kind run through the whole path: Zarr in and out (zstd, decoded and encoded
where a run would), a Gram product (its mirror and transpose kernels). A dask worker calls it
when it starts (:class:`oocgemm.dask.plugin.WarmUp`), so that its first group does not pay.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

#: The side of the small products that warm a device: large enough for several blocks, K
#: panels and chunks (so that every kind of operation runs), small enough to take
#: milliseconds once what they start is there.
SIDE = 1024


def warm(device: Any = "auto", **options: Any) -> dict[str, float]:
    """Start everything a first product on ``device`` would start, by running small ones.

    Parameters
    ----------
    device
        As for :func:`oocgemm.multiply`: 'auto', 'cpu', 'cuda', 'cuda:N', 'cuda:all' or a list.
    options
        Options of :func:`oocgemm.multiply` the later runs use (``memory_limit``,
        ``host_memory_limit``, ``kernel``): the small products run with them.

    Returns
    -------
    dict
        Seconds per step: ``start`` (on a GPU: the driver, its context, cuBLAS and a first
        pinned buffer), ``zarr`` (a Zarr -> Zarr product with zstd chunks), ``gram`` (X^T X),
        and ``total``.

    Raises
    ------
    OOCGemmError
        As :func:`oocgemm.multiply` (a device that is not there, a bad option).
    """
    import zarr

    from .api import multiply
    from .devices import Device, device_names, resolve_device

    names = list(dict.fromkeys(  # several CPU executors ('cpu#1') are one CPU
        name.partition("#")[0] for name in device_names(device) or [str(resolve_device(device))]))
    steps: dict[str, float] = {}
    begin = time.perf_counter()
    from .backends import backend_of

    for name in names:
        backend_of(name).start_now(Device.named(name).index)
    steps["start"] = time.perf_counter() - begin
    rng = np.random.default_rng()
    x = rng.standard_normal((SIDE, SIDE))
    folder = tempfile.mkdtemp(prefix="oocgemm-warm-")
    try:
        for name in ("a", "b"):
            zarr.create_array(os.path.join(folder, f"{name}.zarr"), shape=x.shape,
                              dtype=x.dtype, chunks=(SIDE // 4, SIDE // 4))[...] = x
        tile = (SIDE // 2, SIDE // 2, SIDE // 2)
        for step, args, kw in (
                ("zarr", ("a.zarr", "b.zarr"), {"out": "c.zarr",
                                                "out_options": {"chunks": tile[:2]}}),
                ("gram", ("a.zarr", "a.zarr"), {"trans_a": True})):
            start = time.perf_counter()
            for name in names:
                multiply(*(os.path.join(folder, a) for a in args), device=name, tile=tile,
                         progress=False, **{k: os.path.join(folder, v) if k == "out" else v
                                            for k, v in kw.items()}, **options)
                if "out" in kw:
                    shutil.rmtree(os.path.join(folder, kw["out"]))
            steps[step] = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    steps["total"] = time.perf_counter() - begin
    return steps

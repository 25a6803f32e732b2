""":func:`~oocgemm.dask.matmul`'s result stored (``to_zarr``, ``store``): each group's run
writes its part of C straight into the Zarr array, as ``multiply`` writes a Zarr output of its
own, rather than handing its chunks to tasks that encode them on the host.

``to_zarr`` creates the array as dask does (its ``mode``, its keyword arguments) and then
calls the result's :meth:`Product.store`; there the group tasks write the regions of C they
compute (:class:`~oocgemm.storage.regions.ZarrRegion`): chunks encoded once, by the GPU where
the run has one, and nothing of C held in memory for a chunk task. In one process without a
Client the whole product is one run (``multiply``'s); under a Client, the groups laid out for
its workers. The array is marked incomplete in its attributes (``oocgemm: complete``) until
the last group has written its part.

Where the groups cannot write alone (a target that is not a Zarr array of the result's shape
and dtype, a region of it, ``return_stored``, the half of ``X^T X`` whose other half are
transposed chunks, groups that would share a chunk of the target), the result is stored as
any dask array is, chunk by chunk."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np

from ..storage.base import library_of
from ..storage.identity import check_output
from ..storage.regions import on_edges, write_unit
from .operands import Operand
from .runner import mark_complete, store_group


@dataclass(frozen=True)
class Build:
    """What a :func:`~oocgemm.dask.matmul` graph was built from, for its store."""

    name: str
    ops: dict[str, Operand]
    alpha: Any
    beta: Any
    options: dict[str, Any]
    groups: list[list[int]]
    """The graph's group bounds (rows, cols)."""
    laid_out: bool
    """The groups are the user's, or laid out for a Client's workers: kept."""
    annotations: dict[str, Any]
    symmetric: bool


class Product(da.Array):
    """The dask array :func:`~oocgemm.dask.matmul` returns: any dask array, but stored (by
    ``to_zarr``, or :meth:`store` into a ``zarr.Array``) by its groups' runs (see the
    module). Operations on it give plain dask arrays."""

    build: Build | None = None

    def store(self, target, **kwargs):
        """As ``dask.array.Array.store``; into a ``zarr.Array`` the result's groups write
        their parts of it themselves (see the module)."""
        graph = stored_graph(self, target, kwargs)
        if graph is None:
            return super().store(target, **kwargs)
        if kwargs.get("compute", True):
            extra = {k: v for k, v in kwargs.items()
                     if k not in ("lock", "regions", "compute", "return_stored", "load_stored")}
            dask.compute(graph, **extra)
            return None
        return graph


def stored_graph(product: Product, target, kwargs: dict):
    """A ``Delayed`` that stores ``product`` in ``target`` by its groups' runs, the target
    marked incomplete until it has run; None where the groups cannot write alone (the
    module says when)."""
    from dask.base import tokenize
    from dask.delayed import Delayed
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    build = product.build
    if build is None or not _storable(product, build, target, kwargs):
        return None
    ops = build.ops
    m, n = product.shape
    # one run of the whole product (multiply's), but where the groups are the user's, laid
    # out for workers, or hold a dask array's chunks in memory
    kept = build.laid_out or any(op.array is not None for op in ops.values())
    rows, cols = build.groups if kept else ([0, m], [0, n])
    boxes = {(i, j): ((rows[i], rows[i + 1]), (cols[j], cols[j + 1]))
             for i in range(len(rows) - 1) for j in range(len(cols) - 1)}
    unit = write_unit(target)
    if not all(on_edges(r, q, unit, (m, n)) for r, q in boxes.values()):
        return None
    # by what is behind them: a target that is an input would be overwritten while read
    check_output(target, [(role, ops[op].for_plan(), None)
                          for role, op in (("x", "A"), ("y", "B"), ("c, read", "C"))
                          if op in ops])
    name = "oocgemm-store-" + tokenize(product.name, _token(target), rows, cols)
    group_name = name + "-groups"
    layer = {(group_name, i, j): (
        store_group, ops["A"].part(r, None), ops["B"].part(None, q),
        ops["C"].part(r, q) if "C" in ops else None, build.alpha, build.beta,
        str(product.dtype), dict(build.options), name, len(boxes) == 1, f"{i},{j}", target,
        (r, q)) for (i, j), (r, q) in boxes.items()}
    annotations = build.annotations  # a worker each where the groups are laid out for them
    deps = [op.array for op in ops.values() if op.array is not None]
    graph = HighLevelGraph.from_collections(
        group_name, MaterializedLayer(layer, annotations=annotations or None),
        dependencies=deps)
    done = name + "-complete"  # (the groups' runs are named by ``name``: not a key)
    graph = HighLevelGraph(
        {**graph.layers, done: MaterializedLayer({done: (mark_complete, target, list(layer))})},
        {**graph.dependencies, done: {group_name}})
    target.attrs["oocgemm"] = {"complete": False}  # until the last group has written
    return Delayed(done, graph)


def _storable(product: Product, build: Build, target, kwargs: dict) -> bool:
    """Whether the groups of ``build`` may store ``product`` into ``target`` themselves, by
    what ``store`` is asked (``kwargs``) and what the target is (the groups' edges aside)."""
    return (build.name == product.name and not build.symmetric
            and library_of(target) == "zarr" and hasattr(target, "attrs")
            and tuple(getattr(target, "shape", ())) == tuple(product.shape)
            and np.dtype(target.dtype) == np.dtype(product.dtype)
            and not kwargs.get("return_stored") and not kwargs.get("load_stored")
            and _whole(kwargs.get("regions"), product.shape))


def _whole(regions, shape) -> bool:
    """Whether ``store``'s ``regions`` are none, or the whole array."""
    if regions is None:
        return True
    region = regions[0] if isinstance(regions, list) and len(regions) == 1 else regions
    if not isinstance(region, tuple) or len(region) != len(shape):
        return False
    return all(isinstance(s, slice) and s.step in (None, 1) and s.indices(n)[:2] == (0, n)
               for s, n in zip(region, shape, strict=True))


def _token(target) -> tuple:
    """What names a Zarr array in the store's task names."""
    return str(getattr(target, "store_path", id(target))), tuple(target.shape)

"""The graph of :func:`oocgemm.dask.matmul`: its arguments checked, C cut into groups (one run
of oocgemm each) and chunks, and three layers: a group task per group, per group a chain of links
each done when a block is written, and a task per chunk of the result behind the link of its
last block. It only lays the tasks out: what they do in a worker is :mod:`.runner`'s, where C
is cut :mod:`.partition`'s, and which half of a Gram product is computed :mod:`.gram`'s."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError, ShapeError
from ..planning.schedule import serpentine
from ..storage.identity import seen_through
from .gram import band_boxes, held_by, is_gram, transposed
from .operands import Operand
from .partition import (
    bounds_of_sizes,
    bounds_within,
    cut_chunks,
    owners,
    plan_blocks,
    row_band,
    spanned,
    whole_chunks,
    worker_layout,
    workers_of,
)
from .runner import run_group, written

if TYPE_CHECKING:
    import dask.array

    from ..api import MatrixLike, Scalar

    #: Sizes along (rows, cols): each a size, or a list of sizes; or one size for both.
    Bounds = int | tuple[int | Sequence[int], int | Sequence[int]]


def matmul(x: MatrixLike, y: MatrixLike, *, c: MatrixLike | None = None, alpha: Scalar = 1.0,
           beta: Scalar = 0.0, trans_a: bool = False, trans_b: bool = False,
           groups: Bounds | None = None, chunks: Bounds | None = None,
           resources: Mapping[str, float] | None = None, **options: Any) -> dask.array.Array:
    """``alpha * op(x) @ op(y) + beta * c`` as a lazy dask array, one group task per group
    of C blocks (each runs oocgemm's product of its group).

    Parameters
    ----------
    x, y, c
        Dask arrays, numpy arrays, ``zarr.Array`` objects, or ``.zarr`` / ``.npy`` paths
        or Zarr URLs (``c`` with ``beta != 0`` only). Every worker opens a path or URL
        itself: a URL's store (endpoint, credentials) comes from the workers' environment,
        or pass ``zarr.open_array(url, storage_options=...)``, which carries its options.
    groups
        The parts of C, one run (one task) each, as ``(rows, cols)`` (each a size, or a
        list of sizes) or one size for both. Default: bands of whole rows of the plan's C
        blocks (they share their A panels), as few as host memory allows (a band is held in
        memory until its chunks are used); under a ``dask.distributed`` Client of several
        workers (those with ``resources``), one contiguous region of C per worker, in the
        grid of regions that reads least, each cut into at least two groups annotated with
        their worker (another takes one when it is idle, or when its worker is lost); with
        ``chunks`` given, whole chunks.
        For ``X^T X`` or ``X X^T`` of one matrix (beta == 0, neither ``groups`` nor
        ``chunks`` given) a band computes only its part on and right of the diagonal (about
        half the flops); the chunks below the diagonal are the transposes of those above
        it, and the result's chunks are square on it (C == C.T bit for bit).
    chunks
        The result's chunks, each within one group; a light task hands out each as soon as the
        group's run has written the blocks under it. Default: the groups cut at the inputs' chunk
        grid (A's row chunks, B's column chunks) where that grid divides them, so that
        ``to_zarr`` writes chunks like the inputs', while the run goes on.
    resources
        dask resource annotations of the group tasks, e.g. ``{"GPU": 1}`` for workers started
        with ``--resources GPU=1``. A group task holds them until its run has the device
        (then the run goes on in the worker while the next task waits for the device).
    options
        Keywords of :func:`oocgemm.multiply` for each task's run: ``device``,
        ``memory_limit``, ``host_memory_limit``, ``tile``, ``kernel``; and ``trace_dir``, a
        folder every worker can write, where each run leaves its events for
        :func:`timeline` to merge.
    """
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from ..api import plan as plan_product
    from ..arguments import scalar

    options = _task_options(options)
    alpha, beta = scalar("alpha", alpha), scalar("beta", beta)
    ops, dtype = _operands(x, y, c, alpha, beta, trans_a, trans_b)
    groups, chunks = (((v, v) if isinstance(v, (int, np.integer)) else v)
                      for v in (groups, chunks))
    workers = workers_of(resources) if groups is None and chunks is None else []
    group_bounds, chunk_bounds, planned, symmetric, owner = _bounds(
        ops, groups, chunks, dtype, options,
        functools.partial(plan_blocks, plan_product, ops, alpha, beta, options), len(workers))
    rows, cols = group_bounds
    name = "oocgemm-matmul-" + tokenize(*(op.token for op in ops.values()), alpha, beta, rows,
                                        cols, chunk_bounds, symmetric, sorted(options.items()))
    group_name = name + "-groups"
    row_of, col_of = (owners(group_bounds[d], chunk_bounds[d]) for d in (0, 1))
    boxes = band_boxes(rows, cols, symmetric)
    # Each result chunk: the chunk of a group's product that holds it, and how it is taken
    held = {(ci, cj): held_by(ci, cj, symmetric) for ci in range(len(chunk_bounds[0]) - 1)
            for cj in range(len(chunk_bounds[1]) - 1)}
    takes = collections.Counter((row_of[ti], col_of[tj]) for ti, tj, take in held.values()
                                if take is not None)
    layer = {}
    for (i, j), (r, q) in boxes.items():
        layer[(group_name, i, j)] = (
            run_group, ops["A"].part(r, None), ops["B"].part(None, q),
            ops["C"].part(r, q) if "C" in ops else None,
            alpha, beta, str(dtype), dict(options), name, takes[(i, j)],
            len(rows) == len(cols) == 2, f"{i},{j}")
    wait_name = name + "-written"
    waits, link, inner_of = _chains(boxes, planned or group_bounds, group_name, wait_name)
    pieces: dict[tuple, tuple] = {}
    for (ci, cj), (ti, tj, take) in held.items():
        if take is None:  # below a symmetric product's diagonal: the chunk across it
            pieces[(name, ci, cj)] = (transposed, (name, cj, ci))
            continue
        i, j = row_of[ti], col_of[tj]
        (top, _), (left, _) = boxes[(i, j)]
        r0, r1 = chunk_bounds[0][ti] - top, chunk_bounds[0][ti + 1] - top
        c0, c1 = chunk_bounds[1][tj] - left, chunk_bounds[1][tj + 1] - left
        last = _last_link(inner_of[(i, j)], link[(i, j)], (r0, r1), (c0, c1))
        pieces[(name, ci, cj)] = (take, (wait_name, i, j, last), r0, r1, c0, c1)
    deps = [op.array for op in ops.values() if op.array is not None]
    annotations: dict[str, Any] = {"resources": dict(resources)} if resources else {}
    if owner:  # each group to its region's worker; another may take it once it is idle
        annotations |= {"workers": _Owner(owner, workers),
                        "allow_other_workers": True}
    graph = HighLevelGraph.from_collections(
        group_name, MaterializedLayer(layer, annotations=annotations or None),
        dependencies=deps)
    graph = HighLevelGraph(
        {**graph.layers, wait_name: MaterializedLayer(waits), name: MaterializedLayer(pieces)},
        {**graph.dependencies, wait_name: {group_name}, name: {wait_name}})
    from .stored import Build, Product

    product = Product(graph, name, tuple(tuple(np.diff(b)) for b in chunk_bounds), dtype=dtype)
    product.build = Build(name, ops, alpha, beta, dict(options), group_bounds,
                          groups is not None or bool(owner), annotations, symmetric)
    return product


def _task_options(options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of every task's run, checked here once rather than in every task."""
    from ..options import PLANS, Options

    trace_dir = options.pop("trace_dir", None)
    checked = Options.of("oocgemm.dask.matmul", PLANS, **options)
    if checked.out_options is not None or checked.storage_options is not None:
        raise OptionError("oocgemm.dask.matmul: out_options and storage_options do not apply "
                          "(the result is a dask array; inputs are read as given, in every "
                          "worker: give a URL's store as zarr.open_array(url, storage_options="
                          "...), or name it in the workers' environment, e.g. "
                          "AWS_ENDPOINT_URL and AWS_ACCESS_KEY_ID for s3://)")
    return checked.keywords() | ({"trace_dir": trace_dir} if trace_dir is not None else {})


def _operands(x, y, c, alpha, beta, trans_a: bool, trans_b: bool
              ) -> tuple[dict[str, Operand], np.dtype]:
    """A and B (and C where beta != 0) as operands, their shapes checked; the result's
    dtype."""
    x, trans_a, y, trans_b = seen_through(x, trans_a, y, trans_b)
    ops = {"A": Operand.of(x, "x", trans_a), "B": Operand.of(y, "y", trans_b)}
    (m, k), (k2, n) = ops["A"].shape, ops["B"].shape
    if k != k2:
        raise ShapeError(f"op(x) is {m}x{k} and op(y) is {k2}x{n}: inner dimensions differ")
    if beta != 0:
        if c is None:
            raise OptionError("beta != 0 needs c")
        ops["C"] = Operand.of(c, "c", False)
        if ops["C"].shape != (m, n):
            raise ShapeError(f"c has shape {ops['C'].shape}, expected {(m, n)}")
    dtype = np.dtype(np.result_type(*(op.dtype for op in ops.values()),
                                    *([np.complex64] if isinstance(alpha, complex) or
                                      isinstance(beta, complex) else [])))
    return ops, dtype


def _bounds(ops: dict[str, Operand], groups, chunks, dtype: np.dtype, options: dict[str, Any],
            plan: Callable[[], list[list[int]]], workers: int = 0
            ) -> tuple[list[list[int]], list[list[int]], list[list[int]] | None, bool,
                       dict[tuple[int, int], int]]:
    """Where C is cut, along rows and columns: into groups, and into the result's chunks (each
    within one group); the plan's block bounds where they were needed (``plan()``, else
    None); whether the groups compute a Gram product's half; and, laid out for ``workers``
    workers of a Client (:func:`~.partition.worker_layout`), the worker each group (i, j)
    belongs to (empty where the groups are not laid out for workers)."""
    extents = (ops["A"].shape[0], ops["B"].shape[1])
    m, n = extents
    chunk_bounds = None if chunks is None else [
        bounds_of_sizes(chunks[d], extents[d], "chunks", ("rows", "cols")[d]) for d in (0, 1)]
    # X^T X cut into bands: each band computes its part on and right of the diagonal only
    # (one group too: its run may see parts of a dask array as two matrices)
    symmetric = groups is None and chunk_bounds is None and is_gram(ops, options)
    planned = None
    owner: dict[tuple[int, int], int] = {}
    if groups is not None:
        group_bounds = [bounds_of_sizes(groups[d], extents[d], "groups", ("rows", "cols")[d])
                        for d in (0, 1)]
    elif chunk_bounds is not None:
        group_bounds = [whole_chunks(chunk_bounds[0], row_band(planned := plan(), n, dtype)),
                        [0, n]]
    elif workers > 1 and not symmetric:
        planned = plan()
        group_bounds, owner = worker_layout(planned, (m, n, ops["A"].shape[1]), dtype, workers,
                                            (ops["A"].grain[0], ops["B"].grain[1]))
    else:
        planned = plan()
        group_bounds = [row_band(planned, n, dtype), [0, n]]
    if chunk_bounds is None:
        grain = (ops["A"].grain[0], ops["B"].grain[1])
        sizes = planned or group_bounds
        chunk_bounds = [cut_chunks(group_bounds[d], grain[d], sizes[d]) for d in (0, 1)]
        if symmetric:  # a chunk below the diagonal is the transpose of one above it
            chunk_bounds[1] = chunk_bounds[0]
    for d, what in enumerate(("rows", "cols")):
        if not set(group_bounds[d]) <= set(chunk_bounds[d]):
            raise OptionError(f"chunks: the {what} of each chunk must lie within one group "
                              f"(group bounds {group_bounds[d]}, chunk bounds "
                              f"{chunk_bounds[d]})")
    return group_bounds, chunk_bounds, planned, symmetric, owner


class _Owner:
    """The ``workers`` annotation of the group tasks: each group's worker (by its layout's
    index, among ``workers``' addresses)."""

    def __init__(self, owner: dict[tuple[int, int], int], workers: list[str]):
        self.owner, self.workers = owner, workers

    def __call__(self, key) -> list[str]:
        return [self.workers[self.owner[(key[1], key[2])]]]


def _chains(boxes: dict, block_splits, group_name: str, wait_name: str
            ) -> tuple[dict, dict[tuple[int, int], dict[tuple[int, int], int]], dict]:
    """Each group's blocks, in the order its run writes them (the plan's blocks, in serpentine
    order), as a chain of tasks, each done when its block is written: a chunk's task waits
    for the chain's link of its last block, so it starts only once its data is there (at
    most one task a group waits for the group's run, whatever order the scheduler picks).

    Returns the chains' tasks, per group each block's link in its chain, and per group its
    block bounds (inside the group)."""
    waits: dict = {}
    link: dict[tuple[int, int], dict[tuple[int, int], int]] = {}
    inner_of: dict[tuple[int, int], list[list[int]]] = {}
    for (i, j), box in boxes.items():
        inner = inner_of[(i, j)] = [bounds_within(block_splits[d], *box[d]) for d in (0, 1)]
        links = link[(i, j)] = {}
        before: tuple = (group_name, i, j)
        for t, (bi, bj) in enumerate(serpentine(len(inner[0]) - 1, len(inner[1]) - 1)):
            links[(bi, bj)] = t
            waits[(wait_name, i, j, t)] = (
                written, before, inner[0][bi], inner[0][bi + 1], inner[1][bj],
                inner[1][bj + 1])
            before = (wait_name, i, j, t)
    return waits, link, inner_of


def _last_link(inner: list[list[int]], links: dict[tuple[int, int], int],
               rows: tuple[int, int], cols: tuple[int, int]) -> int:
    """The link of a group's chain after which ``rows`` x ``cols`` of its product are
    written: that of the last of the blocks (``inner``: their bounds) they span."""
    return max(links[(bi, bj)] for bi in spanned(inner[0], *rows)
               for bj in spanned(inner[1], *cols))

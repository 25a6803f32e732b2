"""oocgemm inside dask graphs: a lazy matmul with one engine task per group of C blocks.

    >>> import dask.array as da, oocgemm.dask
    >>> c = oocgemm.dask.matmul(da.from_zarr("a.zarr"), da.from_zarr("b.zarr"))  # doctest: +SKIP
    >>> c.to_zarr("c.zarr")                                                     # doctest: +SKIP

dask's own ``x @ y`` makes a partial product for every (i, k, j) triple of chunks and sums them
in a tree. :func:`matmul` makes one engine task per group of C blocks instead (by default a
band of whole block rows, as large as memory allows), and a light task per chunk of the result.
An engine task starts the engine's run of its group on the worker's device (a GPU where the
worker has one) and returns a handle once the run has the device; each chunk task takes its
chunk from the handle as soon as the engine has written the blocks under it, so that the rest
of the graph (``to_zarr``) works on the first chunks while the engine computes the next.

- Inputs that are stored (a ``.zarr`` or ``.npy`` path, a ``zarr.Array``, an untouched
  ``da.from_zarr``) are read by each run straight from storage, at its chunks, each chunk
  decoded once per process for all the runs of a graph there;
- any other dask array feeds its chunks to the engine tasks as graph dependencies, so each
  chunk is computed once per graph run.

Under a ``dask.distributed`` Client the engine tasks run on its workers (at least two groups
per worker by default, so that they balance). With one GPU per worker (dask-cuda's
``LocalCUDACluster``, or workers started with their own ``CUDA_VISIBLE_DEVICES`` and
``--resources GPU=1``), pass ``resources={"GPU": 1}``. Within one process the engine runs one
group at a time per device.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DeviceError, OptionError, ShapeError
from .planning.schedule import serpentine
from .storage.base import MatrixSource

if TYPE_CHECKING:
    import dask.array

    from .api import MatrixLike, Scalar

    #: Sizes along (rows, cols): each a size, or a list of sizes; or one size for both.
    Bounds = int | tuple[int | Sequence[int], int | Sequence[int]]
#: One engine run at a time per device in a process (a GPU's memory is planned for one run).
_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def matmul(x: MatrixLike, y: MatrixLike, *, c: MatrixLike | None = None, alpha: Scalar = 1.0,
           beta: Scalar = 0.0, trans_a: bool = False, trans_b: bool = False,
           groups: Bounds | None = None, chunks: Bounds | None = None,
           resources: Mapping[str, float] | None = None, **options: Any) -> dask.array.Array:
    """``alpha * op(x) @ op(y) + beta * c`` as a lazy dask array, one engine task per group
    of C blocks.

    Parameters
    ----------
    x, y, c
        Dask arrays, numpy arrays, ``zarr.Array`` objects, or ``.zarr`` / ``.npy`` paths
        (``c`` with ``beta != 0`` only).
    groups
        The parts of C, one engine run (one task) each, as ``(rows, cols)`` (each a size, or a
        list of sizes) or one size for both. Default: bands of whole rows of the plan's C
        blocks (they share their A panels), as few as host memory allows (a band is held in
        memory until its chunks are used), and under a ``dask.distributed`` Client at least
        two per worker, so that the workers balance; with ``chunks`` given, whole chunks.
        For ``X^T X`` or ``X X^T`` of one matrix (beta == 0, neither ``groups`` nor
        ``chunks`` given) a band computes only its part on and right of the diagonal (about
        half the flops); the chunks below the diagonal are the transposes of those above
        it, and the result's chunks are square on it (C == C.T bit for bit).
    chunks
        The result's chunks, each within one group; a light task hands out each as soon as the
        engine has written the blocks under it. Default: the groups cut at the inputs' chunk
        grid (A's row chunks, B's column chunks) where that grid divides them, so that
        ``to_zarr`` writes chunks like the inputs', while the engine goes on.
    resources
        dask resource annotations of the engine tasks, e.g. ``{"GPU": 1}`` for workers started
        with ``--resources GPU=1``. An engine task holds them until its run has the device
        (then the run goes on in the worker while the next task waits for the device).
    options
        Keywords of :func:`oocgemm.multiply` for each task's run: ``device``,
        ``memory_limit``, ``host_memory_limit``, ``tile``, ``kernel``; and ``trace_dir``, a
        folder every worker can write, where each run leaves its events for
        :func:`timeline` to merge.
    """
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from .api import plan as plan_product
    from .checks import scalar
    from .options import Options

    trace_dir = options.pop("trace_dir", None)
    checked = Options.of("oocgemm.dask.matmul", **options)  # here, not in every task
    if checked.out_options is not None or checked.storage_options is not None:
        raise OptionError("oocgemm.dask.matmul: out_options and storage_options do not apply "
                          "(the result is a dask array; inputs are read as given)")
    options = checked.keywords() | ({"trace_dir": trace_dir} if trace_dir is not None else {})
    alpha, beta = scalar("alpha", alpha), scalar("beta", beta)
    x, trans_a, y, trans_b = _seen_through(x, trans_a, y, trans_b)
    ops = {"A": _Operand.of(x, "x", trans_a), "B": _Operand.of(y, "y", trans_b)}
    (m, k), (k2, n) = ops["A"].shape, ops["B"].shape
    if k != k2:
        raise ShapeError(f"op(x) is {m}x{k} and op(y) is {k2}x{n}: inner dimensions differ")
    if beta != 0:
        if c is None:
            raise OptionError("beta != 0 needs c")
        ops["C"] = _Operand.of(c, "c", False)
        if ops["C"].shape != (m, n):
            raise ShapeError(f"c has shape {ops['C'].shape}, expected {(m, n)}")
    dtype = np.dtype(np.result_type(*(op.dtype for op in ops.values()),
                                    *([np.complex64] if isinstance(alpha, complex) or
                                      isinstance(beta, complex) else [])))
    extents = (m, n)
    groups, chunks = (((v, v) if isinstance(v, (int, np.integer)) else v)
                      for v in (groups, chunks))
    chunk_bounds = None if chunks is None else [
        _splits(chunks[d], extents[d], "chunks", ("rows", "cols")[d]) for d in (0, 1)]
    planned = None
    if groups is not None:
        group_bounds = [_splits(groups[d], extents[d], "groups", ("rows", "cols")[d])
                        for d in (0, 1)]
    elif chunk_bounds is not None:
        group_bounds = [_whole_chunks(chunk_bounds[0], _row_band(
            planned := _plan_blocks(plan_product, ops, alpha, beta, options), n, dtype)),
            [0, n]]
    else:
        planned = _plan_blocks(plan_product, ops, alpha, beta, options)
        group_bounds = [_row_band(planned, n, dtype), [0, n]]
    # X^T X cut into bands: each band computes its part on and right of the diagonal only
    # (one group too: its engine run may see parts of a dask array as two matrices)
    symmetric = groups is None and chunk_bounds is None and _gram(ops, options)
    if chunk_bounds is None:
        grain = (ops["A"].grain[0], ops["B"].grain[1])
        sizes = planned or group_bounds
        chunk_bounds = [_cut(group_bounds[d], grain[d], sizes[d]) for d in (0, 1)]
        if symmetric:  # a chunk below the diagonal is the transpose of one above it
            chunk_bounds[1] = chunk_bounds[0]
    for d, what in enumerate(("rows", "cols")):
        if not set(group_bounds[d]) <= set(chunk_bounds[d]):
            raise OptionError(f"chunks: the {what} of each chunk must lie within one group "
                              f"(group bounds {group_bounds[d]}, chunk bounds "
                              f"{chunk_bounds[d]})")
    rows, cols = group_bounds
    name = "oocgemm-matmul-" + tokenize(*(op.token for op in ops.values()), alpha, beta, rows,
                                        cols, chunk_bounds, symmetric, sorted(options.items()))
    group_name = name + "-groups"
    row_of, col_of = (_owners(group_bounds[d], chunk_bounds[d]) for d in (0, 1))
    boxes = _boxes(rows, cols, symmetric)
    # Each result chunk: the chunk of a group's product that holds it, and how it is taken
    held = {(ci, cj): _held(ci, cj, symmetric) for ci in range(len(chunk_bounds[0]) - 1)
            for cj in range(len(chunk_bounds[1]) - 1)}
    takes = collections.Counter((row_of[ti], col_of[tj]) for ti, tj, _ in held.values())
    layer = {}
    for (i, j), (r, q) in boxes.items():
        layer[(group_name, i, j)] = (
            _group, ops["A"].part(r, None), ops["B"].part(None, q),
            ops["C"].part(r, q) if "C" in ops else None,
            alpha, beta, str(dtype), dict(options), name, takes[(i, j)],
            len(rows) == len(cols) == 2)
    # Each group's blocks, in the order its run writes them (the plan's blocks, in serpentine
    # order), as a chain of tasks, each done when its block is written: a chunk's task waits
    # for the chain's link of its last block, so it starts only once its data is there (at
    # most one task a group waits for the engine, whatever order the scheduler picks).
    wait_name = name + "-written"
    waits: dict = {}
    link: dict[tuple[int, int, int, int], int] = {}  # (group, block) -> its link in the chain
    inner_of: dict[tuple[int, int], list[list[int]]] = {}  # group -> its block bounds, inside
    block_splits = planned or group_bounds
    for (i, j), box in boxes.items():
        inner = inner_of[(i, j)] = [_within(block_splits[d], *box[d]) for d in (0, 1)]
        before: tuple = (group_name, i, j)
        for t, (bi, bj) in enumerate(serpentine(len(inner[0]) - 1, len(inner[1]) - 1)):
            link[(i, j, bi, bj)] = t
            waits[(wait_name, i, j, t)] = (
                _written, before, inner[0][bi], inner[0][bi + 1], inner[1][bj],
                inner[1][bj + 1])
            before = (wait_name, i, j, t)
    pieces = {}
    for (ci, cj), (ti, tj, take) in held.items():
        i, j = row_of[ti], col_of[tj]
        (top, _), (left, _) = boxes[(i, j)]
        r0, r1 = chunk_bounds[0][ti] - top, chunk_bounds[0][ti + 1] - top
        c0, c1 = chunk_bounds[1][tj] - left, chunk_bounds[1][tj + 1] - left
        inner = inner_of[(i, j)]
        last = max(link[(i, j, bi, bj)] for bi in _spanned(inner[0], r0, r1)
                   for bj in _spanned(inner[1], c0, c1))
        pieces[(name, ci, cj)] = (take, (wait_name, i, j, last), r0, r1, c0, c1)
    deps = [op.array for op in ops.values() if op.array is not None]
    annotations = {"resources": dict(resources)} if resources else None
    graph = HighLevelGraph.from_collections(
        group_name, MaterializedLayer(layer, annotations=annotations), dependencies=deps)
    graph = HighLevelGraph(
        {**graph.layers, wait_name: MaterializedLayer(waits), name: MaterializedLayer(pieces)},
        {**graph.dependencies, wait_name: {group_name}, name: {wait_name}})
    return da.Array(graph, name, tuple(tuple(np.diff(b)) for b in chunk_bounds), dtype=dtype)


def _within(splits, lo: int, hi: int) -> list[int]:
    """The bounds of ``splits`` (sorted) inside ``lo:hi``, from ``lo`` (0) to ``hi``."""
    inner = splits[bisect.bisect_right(splits, lo):bisect.bisect_left(splits, hi)]
    return [0, *(int(v) - lo for v in inner), hi - lo]


def _spanned(bounds: Sequence[int], lo: int, hi: int) -> range:
    """The indices of the parts of ``bounds`` that ``lo:hi`` overlaps (the first for an empty
    span)."""
    return range(*_covering(bounds, (lo, hi)))


def _seen_through(x, trans_a: bool, y, trans_b: bool) -> tuple[Any, bool, Any, bool]:
    """``matmul(x.T, x)`` as ``matmul(x, x, trans_a=True)``: one side the other's dask
    transpose is that same matrix read transposed (so that a Gram product is found, and X is
    read once)."""
    from .storage import _module

    if _module(x) == "dask" and _module(y) == "dask" and x.ndim == y.ndim == 2:
        if x.name == y.T.name:
            return y, not trans_a, y, trans_b
        if y.name == x.T.name:
            return x, trans_a, x, not trans_b
    return x, trans_a, y, trans_b


def _gram(ops: dict[str, _Operand], options: Mapping[str, Any]) -> bool:
    """Whether the product is ``X^T X`` or ``X X^T`` of one matrix (the same stored array, by
    identity, or the same dask array), with beta == 0 and the default kernel: C is then
    symmetric, and bands of it need compute only their part on and right of the diagonal."""
    from .cuda.catalog import DEFAULT as DEFAULT_KERNEL
    from .storage.identity import identity, same_matrix

    a, b = ops["A"], ops["B"]
    if "C" in ops or a.transposed == b.transposed or \
            options.get("kernel", DEFAULT_KERNEL) != DEFAULT_KERNEL:
        return False
    if a.array is not None or b.array is not None:
        return a.array is not None and b.array is not None and a.array.name == b.array.name
    return same_matrix(identity(a.stored), identity(b.stored))


def _boxes(rows: list[int], cols: list[int], symmetric: bool
           ) -> dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]]:
    """Each group's part of C, ``(rows, cols)``: its rows and columns; of a symmetric product
    (bands of whole rows) the band's columns from its first row on, on and right of the
    diagonal (what lies left of it is the transpose of what bands above computed)."""
    return {(i, j): ((rows[i], rows[i + 1]),
                     (rows[i], cols[-1]) if symmetric else (cols[j], cols[j + 1]))
            for i in range(len(rows) - 1) for j in range(len(cols) - 1)}


def _held(ci: int, cj: int, symmetric: bool) -> tuple[int, int, Callable[..., np.ndarray]]:
    """Result chunk (ci, cj) as ``(ti, tj, take)``: the chunk of the groups' products that
    holds it, and the task that makes it of that one. A symmetric product's groups compute
    the chunks on and above the diagonal: one below it is the one across, transposed, and a
    diagonal chunk is its upper triangle, mirrored, so that C == C.T bit for bit."""
    if not symmetric or ci < cj:
        return ci, cj, _chunk
    if ci == cj:
        return ci, cj, _diagonal_chunk
    return cj, ci, _mirrored_chunk


def _splits(sizes, extent: int, what: str, dim: str) -> list[int]:
    if isinstance(sizes, (int, np.integer)):
        sizes = [int(sizes)] * max(1, math.ceil(extent / max(int(sizes), 1)))
        sizes[-1] = extent - sum(sizes[:-1])
    sizes = [int(s) for s in sizes]
    if sum(sizes) != extent or any(s < 0 for s in sizes):
        raise OptionError(f"{what}: {dim} {sizes} do not add up to {extent}")
    return [0, *np.cumsum(sizes).tolist()] if sizes else [0, 0]


def _owners(blocks: list[int], chunks: list[int]) -> list[int]:
    """For each chunk (bounds nested in ``blocks``): the block it lies in."""
    of = np.searchsorted(blocks, chunks[:-1], side="right") - 1
    return of.clip(0, len(blocks) - 2).tolist()


#: The smallest side of a result chunk cut at the inputs' grain, and the most chunks per side
#: of a C block of the plan: chunks large enough that a task per chunk costs nothing, small
#: enough that the chunks of a block are written by several threads at once.
MIN_CHUNK_SIDE = 1024
MAX_CHUNKS_PER_SIDE = 8


def _cut(groups: list[int], grain: int | None, blocks: list[int]) -> list[int]:
    """The result's chunk bounds along one dimension: ``groups`` cut every ``side`` elements,
    where ``side`` is the smallest multiple of ``grain`` (the inputs' chunk size) that
    divides every inner group bound and is at least ``MIN_CHUNK_SIDE`` and a block side (of
    ``blocks``) over ``MAX_CHUNKS_PER_SIDE``; so the chunks are regular, as ``to_zarr``
    needs. The groups themselves where no such side exists."""
    extent = groups[-1]
    largest = max(np.diff(groups).tolist() or [0])
    if not grain or largest <= grain:
        return groups
    inner = math.gcd(*groups[1:-1]) if len(groups) > 2 else 0
    if inner % grain:
        return groups
    least = max(MIN_CHUNK_SIDE, math.ceil(max(np.diff(blocks).tolist() or [0]) /
                                          MAX_CHUNKS_PER_SIDE))
    if inner:  # a multiple of the grain that divides every inner bound
        side = next((grain * f for f in sorted(_divisors(inner // grain))
                     if grain * f >= least), None)
    else:  # one group: any multiple of the grain
        side = grain * math.ceil(least / grain)
    if side is None or side >= largest:
        return groups
    return [*range(0, extent, side), extent]


def _divisors(x: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(x) + 1) if x % d == 0]
    return small + [x // d for d in small]


def _whole_chunks(chunks: list[int], planned: list[int]) -> list[int]:
    """Groups of whole chunks, each as large as the largest of ``planned`` or one chunk."""
    size = max(np.diff(planned).tolist() or [0])
    bounds = [0]
    for lo, hi in zip(chunks[:-1], chunks[1:]):
        if hi - bounds[-1] > size and lo > bounds[-1]:
            bounds.append(lo)
    return bounds + [chunks[-1]] if chunks[-1] > bounds[-1] else bounds


#: Bytes of C one group may hold (a group's product is held until its chunks are used);
#: None: a quarter of host memory.
GROUP_MEMORY: int | None = None


def _row_band(planned: list[list[int]], n: int, dtype: np.dtype) -> list[int]:
    """Row bounds of the default groups: bands of whole rows of the plan's C blocks, as few as
    ``GROUP_MEMORY`` holds, and at least two per worker of an active ``dask.distributed``
    Client."""
    from . import hostinfo

    rows = planned[0]
    blocks = len(rows) - 1
    if blocks < 1:  # no rows: one empty group
        return [0, 0]
    budget = GROUP_MEMORY if GROUP_MEMORY is not None else hostinfo.total_memory() // 4
    fits = budget // max(1, n * dtype.itemsize)
    per_band = max(1, fits // max(max(np.diff(rows).tolist()), 1))  # whole blocks that fit
    count = min(max(2 * _workers(), math.ceil(blocks / per_band), 1), blocks)
    per = math.ceil(blocks / count)  # as many bands, evened out
    return [*rows[:-1:per], rows[-1]]


def _workers() -> int:
    """The workers of the active ``dask.distributed`` Client; 0 without one."""
    import sys

    if "distributed" not in sys.modules:
        return 0
    from distributed import default_client

    try:
        return len(default_client().nthreads())
    except ValueError:  # no Client
        return 0


def _plan_blocks(plan_product, ops, alpha, beta, options) -> list[list[int]]:
    """The plan's C block bounds for these inputs (planned here, where the graph is built)."""
    args = {name: op.for_plan() for name, op in ops.items()}
    kw = dict(alpha=alpha, beta=beta, c=args.get("C"), trans_a=ops["A"].transposed,
              trans_b=ops["B"].transposed,
              **{k: v for k, v in options.items() if k != "trace_dir"})
    try:
        p = plan_product(args["A"], args["B"], **kw)
    except DeviceError:  # no GPU where the graph is built: the blocks of a CPU plan
        p = plan_product(args["A"], args["B"], **{**kw, "device": "cpu"})
    return [[int(v) for v in p.row_splits], [int(v) for v in p.col_splits]]


class _Operand:
    """One input of the graph: stored (each task reads its part from storage), or a dask
    array (each task gets its part's chunks as dependencies)."""

    def __init__(self, shape, dtype, transposed, *, stored=None, array=None, grain=None):
        self.shape, self.dtype, self.transposed = shape, np.dtype(dtype), transposed
        self.stored, self.array = stored, array
        #: The chunk sizes of op(operand) where it has a chunk grid, (rows, cols).
        self.grain = (grain[1], grain[0]) if transposed and grain else (grain or (None, None))

    @classmethod
    def of(cls, obj, role: str, transposed: bool) -> _Operand:
        import dask.array as da

        from .storage import _module, is_path, open_source, urls, zarr_behind

        stored = grain = None
        if is_path(obj):  # absolute: workers may run elsewhere (a shared file system)
            path = urls.local(os.fspath(obj))
            stored = path if urls.is_url(path) else os.path.abspath(path)
        elif _module(obj) == "zarr":
            stored = obj
        elif _module(obj) == "dask":
            stored = zarr_behind(obj)
        if stored is not None:
            src = open_source(stored, role)  # checked here: missing, corrupt, not a matrix
            shape, dtype, array = tuple(src.shape), src.dtype, None
            grain = getattr(src, "chunks", None)
            src.close()
        else:
            if _module(obj) == "xarray":
                obj = obj.data
            if _module(obj) == "dask":
                array = obj
                grain = tuple(sizes[0] if sizes else None for sizes in obj.chunks)
            else:
                array = da.from_array(np.asarray(obj))
            if array.ndim != 2:
                raise ShapeError(f"{role} must be 2-d, got shape {tuple(array.shape)}")
            src = open_source(array, role)  # unknown chunk sizes, dtypes: refused here
            shape, dtype = tuple(array.shape), src.dtype
        return cls((shape[1], shape[0]) if transposed else shape, dtype, transposed,
                   stored=stored, array=array, grain=grain)

    @property
    def token(self):
        if self.array is not None:
            return self.array.name
        return repr(self.stored) if not hasattr(self.stored, "store_path") else (
            str(self.stored.store_path), self.stored.shape)

    def for_plan(self):
        """What ``oocgemm.plan`` takes for this operand (it reads no data)."""
        return self.stored if self.stored is not None else self.array

    def part(self, rows, cols):
        """What a task needs of op(operand): rows ``rows`` (all columns) or columns ``cols``
        (all rows), or both; as a spec the task resolves."""
        m, n = self.shape
        r = rows or (0, m)
        q = cols or (0, n)
        stored_r, stored_q = (q, r) if self.transposed else (r, q)
        # Lists, not tuples: dask looks for the keys of dependencies inside lists.
        if self.stored is not None:
            return ["stored", self.stored, list(stored_r), list(stored_q), self.transposed]
        x = self.array
        row_bounds = np.cumsum((0,) + x.chunks[0])
        col_bounds = np.cumsum((0,) + x.chunks[1])
        i0, i1 = _covering(row_bounds, stored_r)
        j0, j1 = _covering(col_bounds, stored_q)
        keys = [[(x.name, i, j) for j in range(j0, j1)] for i in range(i0, i1)]
        offset = [int(row_bounds[i0]), int(col_bounds[j0])]
        return ["blocks", keys, offset, list(stored_r), list(stored_q), self.transposed]


def _covering(bounds, span) -> tuple[int, int]:
    """The chunk indices whose union covers ``span`` (a nonempty range of chunks for empty
    spans, so that a block of a 0-size dimension still has its shape)."""
    lo, hi = span
    i0 = max(0, int(np.searchsorted(bounds, lo, side="right")) - 1)
    i1 = max(i0 + 1, int(np.searchsorted(bounds, hi, side="left")))
    return min(i0, len(bounds) - 2), min(i1, len(bounds) - 1)


def _group(a, b, c, alpha, beta, dtype, options, graph: str = "", chunks: int = 1,
           alone: bool = False) -> _Handle:
    """One engine task: starts the run of its group on this worker's device and returns, once
    the run has the device, a handle from which :func:`_chunk` takes the group's ``chunks``
    chunks, each as soon as the blocks under it are written (the run goes on in a thread of
    this process; the last chunk taken waits for its end). ``alone``: the group is the whole
    product, and shares no decoded chunks with others."""
    trans_a, trans_b = a[-1], b[-1]  # each spec ends with its operand's transposition
    spec = (a, b, c, alpha, beta, dtype, options, graph)
    # the whole product in one run: the engine's own reads and cache, as multiply's
    shared_cm = contextlib.nullcontext() if alone else _shared_chunks(graph)
    shared = shared_cm.__enter__()  # left when the run ends
    try:
        a_src, b_src = _resolve(a, shared, "A"), _resolve(b, shared, "B")
        c_src = _resolve(c, shared, "C") if c is not None else None
    except BaseException:
        shared_cm.__exit__(None, None, None)
        raise
    shape = (a_src.shape[1] if trans_a else a_src.shape[0],
             b_src.shape[0] if trans_b else b_src.shape[1])
    run = _Run(np.empty(shape, dtype=dtype), chunks)
    thread = threading.Thread(target=run.run, name="oocgemm-group", daemon=True, args=(
        a_src, b_src, c_src, alpha, beta, trans_a, trans_b, dict(options), shared_cm))
    thread.start()
    run.wait_started()
    return _Handle(run, spec)


def _written(handle: _Handle, r0: int, r1: int, c0: int, c1: int) -> _Handle:
    """A link of a group's chain: done (handing on the handle) when the engine has written
    rows r0:r1, columns c0:c1 of the group."""
    handle.wait(r0, r1, c0, c1)
    return handle


def _chunk(handle: _Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """One chunk of the result, a view of its group's product, when the engine has written
    it."""
    return handle.chunk(r0, r1, c0, c1)


def _diagonal_chunk(handle: _Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """A chunk on the diagonal of a symmetric product: its upper triangle, and the same
    mirrored below (an exact copy, the plain transpose for complex dtypes, as the engine's)."""
    square = handle.chunk(r0, r1, c0, c1)
    return np.where(np.triu(np.ones(square.shape, dtype=bool)), square, square.T)


def _mirrored_chunk(handle: _Handle, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """A chunk below the diagonal of a symmetric product: the transpose of the chunk across
    it, rows r0:r1 and columns c0:c1 of its group (a contiguous copy)."""
    return np.ascontiguousarray(handle.chunk(r0, r1, c0, c1).T)


class _Cancelled(Exception):
    """The group's handle is gone (its graph was released): the run stops."""


class _Run:
    """A group's engine run in a thread: its product, and which of its blocks are written."""

    def __init__(self, out: np.ndarray, chunks: int):
        self.out = out
        self._left = chunks
        self._cond = threading.Condition()
        self._rows, self._cols = (0, out.shape[0]), (0, out.shape[1])
        self._written: dict = {}  # C block -> bytes of it written
        self._started = self._finished = self.cancelled = False
        self._error: BaseException | None = None

    def run(self, a, b, c, alpha, beta, trans_a, trans_b, options, shared_cm) -> None:
        from .api import multiply

        trace_dir = options.pop("trace_dir", None)
        try:
            if 0 in self.out.shape:
                result = None
            else:
                with _device_lock(str(options.get("device", "auto"))):
                    with self._cond:
                        self._started = True
                        self._cond.notify_all()
                    if self.cancelled:
                        raise _Cancelled()
                    result = multiply(a, b, self.out, c=c, alpha=alpha, beta=beta,
                                      trans_a=trans_a, trans_b=trans_b, progress=self,
                                      events=trace_dir is not None, **options)
            if trace_dir is not None and result is not None:
                _leave_events(trace_dir, result)
        except BaseException as exc:  # handed to every chunk of the group
            with self._cond:
                self._error = exc
        finally:
            shared_cm.__exit__(None, None, None)
            for src in (a, b, c):
                if src is not None:
                    src.close()
            with self._cond:
                self._started = self._finished = True
                self._cond.notify_all()

    # the engine's progress callable: planned(plan), then each finished event
    def planned(self, plan) -> None:
        """The plan the run's C blocks belong to (again after a replan: all blocks anew)."""
        with self._cond:
            self._rows, self._cols = plan.row_splits, plan.col_splits
            self._written = {}

    def __call__(self, event) -> None:
        with self._cond:
            if event.kind == "write" and event.operand == "C":
                # A staged run writes a block in row stripes, an event each; a block computed
                # in place is written by one event that moves nothing.
                key = tuple(event.key)
                self._written[key] = (self._bytes(*key) if event.nbytes == 0 else
                                      self._written.get(key, 0) + event.nbytes)
                self._cond.notify_all()
            elif self.cancelled and not self._covered(0, self.out.shape[0], 0,
                                                      self.out.shape[1]):
                raise _Cancelled()

    def wait_started(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._started)

    def wait(self, r0: int, r1: int, c0: int, c1: int) -> None:
        """Until rows r0:r1, columns c0:c1 of the product are written, or the run is over."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready(r0, r1, c0, c1))

    def chunk(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        """Rows r0:r1, columns c0:c1 of the product, when written; the last chunk, when the
        run is over (its events left, its sources closed), so that a graph is not done before
        its runs are."""
        with self._cond:
            self._cond.wait_for(lambda: self._ready(r0, r1, c0, c1))
            self._left -= 1
            if self._left <= 0:
                self._cond.wait_for(lambda: self._finished)
            if self._error is not None:
                raise self._error
        return self.out[r0:r1, c0:c1]

    def _ready(self, r0, r1, c0, c1) -> bool:
        """Rows r0:r1, columns c0:c1 written, or the run over (its error for every chunk)."""
        return self._finished or self._covered(r0, r1, c0, c1)

    def _covered(self, r0, r1, c0, c1) -> bool:
        """Whether every block of the plan under rows r0:r1, columns c0:c1 is written."""
        if r0 >= r1 or c0 >= c1:
            return True
        rows = _spanned(self._rows, r0, r1)
        cols = _spanned(self._cols, c0, c1)
        return all(self._written.get((i, j), 0) >= self._bytes(i, j) for i in rows for j in cols)

    def _bytes(self, i: int, j: int) -> int:
        """The bytes of C block (i, j)."""
        return ((self._rows[i + 1] - self._rows[i]) * (self._cols[j + 1] - self._cols[j]) *
                self.out.itemsize)


def _narrow(spec: list, rows, cols) -> list:
    """A part ``spec`` (of :meth:`_Operand.part`) narrowed to rows ``rows`` and columns
    ``cols`` of op(operand) within it (None: all)."""
    spec, transposed = list(spec), spec[-1]
    stored_r, stored_q = list(spec[-3]), list(spec[-2])
    r, q = (stored_q, stored_r) if transposed else (stored_r, stored_q)
    if rows is not None:
        r = [r[0] + rows[0], r[0] + rows[1]]
    if cols is not None:
        q = [q[0] + cols[0], q[0] + cols[1]]
    spec[-3], spec[-2] = (q, r) if transposed else (r, q)
    return spec


class _Handle:
    """What an engine task returns: its run going on in this process. Released (its graph
    is done or cancelled), the run stops if it is still going. Pickled (moved to another
    worker, or spilled), it carries its group's spec, and a chunk taken from it elsewhere is
    computed there by itself."""

    def __init__(self, run: _Run | None, spec):
        self.run, self.spec = run, spec
        if run is not None:
            weakref.finalize(self, setattr, run, "cancelled", True)

    def __reduce__(self):
        return (_Handle, (None, self.spec))

    def __sizeof__(self) -> int:
        return self.run.out.nbytes if self.run is not None else 0

    def wait(self, r0: int, r1: int, c0: int, c1: int) -> None:
        if self.run is not None:  # elsewhere, the chunk is computed when it is taken
            self.run.wait(r0, r1, c0, c1)

    def chunk(self, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
        if self.run is not None:
            return self.run.chunk(r0, r1, c0, c1)
        a, b, c, alpha, beta, dtype, options, graph = self.spec
        a, b = _narrow(a, (r0, r1), None), _narrow(b, None, (c0, c1))
        c = _narrow(c, (r0, r1), (c0, c1)) if c is not None else None
        return _group(a, b, c, alpha, beta, dtype, options, graph).chunk(
            0, r1 - r0, 0, c1 - c0)


def _leave_events(trace_dir: str, result) -> None:
    """The task's events, in a file of its own in ``trace_dir`` (for :func:`timeline`)."""
    import json
    import socket
    import uuid

    worker = f"{socket.gethostname()}:{os.getpid()}"
    doc = {"worker": worker, "device": result.plan.device, "started_at": result.started_at,
           "flops": result.flops, "seconds": result.seconds,
           "tile": list(result.plan.tile), "cache": list(result.plan.cache),
           "chunks": result.chunks,
           "events": [[e.index, e.kind, e.operand, list(e.key), e.q, e.lane, e.start, e.end,
                       e.nbytes, e.flops] for e in result.events]}
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, f"task-{uuid.uuid4().hex}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def timeline(trace_dir: str):
    """The tasks' events that :func:`matmul` left in ``trace_dir`` (``trace_dir=`` option),
    merged onto one clock: a :class:`~oocgemm.diagnostics.Timeline` with a lane group per
    worker and device ('host:pid/cuda:0/compute'), and its ``devices`` line for the share of
    each and the balance."""
    import glob
    import json

    from .diagnostics.events import Event
    from .diagnostics.timeline import Timeline
    from .errors import InputError

    docs = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "task-*.json"))):
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    if not docs:
        raise InputError(f"{trace_dir}: no task events (pass trace_dir= to matmul, and run it)")
    zero = min(d["started_at"] for d in docs)
    events = []
    for d in docs:
        shift = d["started_at"] - zero
        for index, kind, operand, key, q, lane, start, end, nbytes, flops in d["events"]:
            events.append(Event(index=index, kind=kind, operand=operand, key=tuple(key), q=q,
                                lane=f"{d['worker']}/{d['device']}/{lane}",
                                start=start + shift, end=end + shift, nbytes=nbytes,
                                flops=flops))
    return Timeline.from_events(events, meta={"tasks": len(docs)})


def _device_lock(device: str) -> threading.Lock:
    """This process's lock of ``device``."""
    with _LOCKS_LOCK:
        return _DEVICE_LOCKS.setdefault(device, threading.Lock())


class SharedChunks:
    """The decoded chunks of a graph's stored inputs, shared by its tasks in one process, so
    that each chunk is decoded once per process however many blocks need it. Held while
    some task of the graph runs (or waits for its device) here, and ``GRACE`` seconds after;
    at most ``budget`` bytes (chunks beyond it are decoded by each task for itself)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self.decodes = 0
        self._chunks: dict = {}
        self._lock = threading.Lock()
        self.active = 0
        self.timer: threading.Timer | None = None

    def get(self, key, decode) -> np.ndarray:
        """The chunk ``key``, decoded by ``decode()`` by the first task that asks."""
        with self._lock:
            found = self._chunks.get(key)
            mine = found is None
            entry = self._chunks[key] = _Pending() if found is None else found
        if not mine:
            return entry.wait()
        try:
            array = decode()
        except BaseException as exc:
            with self._lock:
                del self._chunks[key]
            entry.fail(exc)
            raise
        with self._lock:
            self.decodes += 1
            if self.bytes + array.nbytes > self.budget:
                del self._chunks[key]  # over budget: not kept, the next task decodes again
            else:
                self.bytes += array.nbytes
        entry.done(array)
        return array


class _Pending:
    def __init__(self):
        self._event = threading.Event()
        self._value = self._error = None

    def done(self, value):
        self._value = value
        self._event.set()

    def fail(self, error):
        self._error = error
        self._event.set()

    def wait(self):
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


#: Seconds a graph's shared chunks outlive its last task running in a process. 0: they go
#: as soon as no task of the graph runs here, so that a graph computed again after its stored
#: inputs changed never meets chunks decoded before.
GRACE = 0.0
_SHARED: dict[str, SharedChunks] = {}
_SHARED_LOCK = threading.Lock()  # of _SHARED, and of its entries' active counts and timers


@contextlib.contextmanager
def _shared_chunks(graph: str):
    """This process's shared chunks of ``graph``, held for the duration of one task."""
    from . import hostinfo

    with _SHARED_LOCK:
        shared = _SHARED.get(graph)
        if shared is None:
            shared = _SHARED[graph] = SharedChunks(hostinfo.total_memory() // 4)
        if shared.timer is not None:
            shared.timer.cancel()
            shared.timer = None
        shared.active += 1
    try:
        yield shared
    finally:
        with _SHARED_LOCK:
            shared.active -= 1
            if shared.active == 0 and GRACE <= 0:
                del _SHARED[graph]
            elif shared.active == 0:
                shared.timer = threading.Timer(GRACE, _drop, args=(graph, shared))
                shared.timer.daemon = True
                shared.timer.start()


def _drop(graph: str, shared: SharedChunks) -> None:
    with _SHARED_LOCK:
        if _SHARED.get(graph) is shared and shared.active == 0:
            del _SHARED[graph]


def _resolve(spec, shared: SharedChunks | None = None, role: str = "") -> MatrixSource:
    """A task's part of an operand, in its stored layout."""
    kind = spec[0]
    if kind == "blocks":
        _, blocks, (r0, c0), (lo_r, hi_r), (lo_c, hi_c), _ = spec
        from .storage.memory import NumpySource, host_array

        band = np.block([[np.asarray(host_array(b)) for b in row] for row in blocks])

        return NumpySource(band[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0], name="dask chunks")
    _, stored, rows, cols, _ = spec
    from .storage import open_source

    source = open_source(stored, "stored input")
    if shared is None and tuple(rows) == (0, source.shape[0]) and \
            tuple(cols) == (0, source.shape[1]):
        return source  # the whole operand, for a run of its own: read as multiply reads it
    return Region(source, rows, cols, shared=shared, role=role)


class Region(MatrixSource):
    """Rows ``rows`` and columns ``cols`` of a source, itself a source: chunked where the
    region starts on the source's chunk grid, so that reads stay at the storage's grain."""

    def __init__(self, inner: MatrixSource, rows, cols, *, shared: SharedChunks | None = None,
                 role: str = ""):
        self.inner = inner
        self._shared, self._role = shared, role
        self.rows, self.cols = tuple(rows), tuple(cols)
        self.region = (self.rows, self.cols)
        self.shape = (rows[1] - rows[0], cols[1] - cols[0])
        self.dtype = inner.dtype
        self.on_disk = inner.on_disk
        self.name = f"{inner.name}[{rows[0]}:{rows[1]}, {cols[0]}:{cols[1]}]"
        self.path = inner.path
        grid = getattr(inner, "chunks", None)
        aligned = grid is not None and rows[0] % grid[0] == 0 and cols[0] % grid[1] == 0
        self.chunks: tuple[int, int] | None = (
            (int(grid[0]), int(grid[1])) if grid is not None and aligned and
            hasattr(inner, "read_chunk") else None)

    def read(self, rows, cols, out):
        self.inner.read((self.rows[0] + rows[0], self.rows[0] + rows[1]),
                        (self.cols[0] + cols[0], self.cols[0] + cols[1]), out)

    def read_chunk(self, index, out):
        assert self.chunks is not None  # only regions on the chunk grid are read by chunks
        r0 = index[0] * self.chunks[0]
        c0 = index[1] * self.chunks[1]
        self.read((r0, r0 + out.shape[0]), (c0, c0 + out.shape[1]), out)

    @property
    def shared_chunk(self):
        """Chunks decoded once for every task of the graph in this process (None where the
        region is not on the chunk grid, or nothing is shared)."""
        if self._shared is None or self.chunks is None:
            return None
        return self._shared_chunk

    def _shared_chunk(self, index) -> np.ndarray:
        """Region chunk ``index``: its stored chunk, decoded once per process, clipped to the
        region."""
        assert self.chunks is not None and self._shared is not None  # see shared_chunk
        (ch, cw), (rows, cols) = self.chunks, self.inner.shape
        at = (self.rows[0] // ch + index[0], self.cols[0] // cw + index[1])
        r0, c0 = at[0] * ch, at[1] * cw
        r1, c1 = min(r0 + ch, rows), min(c0 + cw, cols)

        def decode():
            whole = np.empty((r1 - r0, c1 - c0), dtype=self.inner.dtype)
            self.inner.read((r0, r1), (c0, c1), whole)
            return whole

        whole = self._shared.get((self._role, at), decode)
        return whole[:min(r1, self.rows[1]) - r0, :min(c1, self.cols[1]) - c0]

    def array(self):
        return self.inner.array()

    def close(self):
        self.inner.close()

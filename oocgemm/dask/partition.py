"""Where C is cut: the groups, one run of oocgemm each (by default bands of whole rows of the
plan's C blocks, as few as ``GROUP_MEMORY`` holds; under a Client of several workers one
contiguous region of C per worker, cut into at least two groups), the result's chunks (the
groups cut at the inputs' grain), and which parts of a list of bounds a span covers.
Arithmetic on bounds, and the one plan made where the graph is built: it makes no tasks and
reads no data."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from ..errors import DeviceError, OptionError


def bounds_within(splits, lo: int, hi: int) -> list[int]:
    """The bounds of ``splits`` (sorted) inside ``lo:hi``, from ``lo`` (0) to ``hi``."""
    inner = splits[bisect.bisect_right(splits, lo):bisect.bisect_left(splits, hi)]
    return [0, *(int(v) - lo for v in inner), hi - lo]


def spanned(bounds: Sequence[int], lo: int, hi: int) -> range:
    """The indices of the parts of ``bounds`` that ``lo:hi`` overlaps (the first for an empty
    span)."""
    return range(*covering(bounds, (lo, hi)))


def bounds_of_sizes(sizes, extent: int, what: str, dim: str) -> list[int]:
    if isinstance(sizes, (int, np.integer)):
        if sizes < 1:  # parts of no rows would be tasks that do nothing
            raise OptionError(f"{what}: the {dim} of a part must be at least 1, got {sizes}")
        sizes = [int(sizes)] * max(1, math.ceil(extent / int(sizes)))
        sizes[-1] = extent - sum(sizes[:-1])
    sizes = [int(s) for s in sizes]
    if sum(sizes) != extent or any(s < 0 for s in sizes):
        raise OptionError(f"{what}: {dim} {sizes} do not add up to {extent}")
    if extent > 0 and 0 in sizes:
        raise OptionError(f"{what}: {dim} {sizes} has parts of no {dim}")
    return [0, *np.cumsum(sizes).tolist()] if sizes else [0, 0]


def owners(blocks: list[int], chunks: list[int]) -> list[int]:
    """For each chunk (bounds nested in ``blocks``): the block it lies in."""
    of = np.searchsorted(blocks, chunks[:-1], side="right") - 1
    return of.clip(0, len(blocks) - 2).tolist()


#: The smallest side of a result chunk cut at the inputs' grain, and the most chunks per side
#: of a C block of the plan: chunks large enough that a task per chunk costs nothing, small
#: enough that the chunks of a block are written by several threads at once.
MIN_CHUNK_SIDE = 1024
MAX_CHUNKS_PER_SIDE = 8


def cut_chunks(groups: list[int], grain: int | None, blocks: list[int]) -> list[int]:
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


def whole_chunks(chunks: list[int], planned: list[int]) -> list[int]:
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


def row_band(planned: list[list[int]], n: int, dtype: np.dtype) -> list[int]:
    """Row bounds of the default groups: bands of whole rows of the plan's C blocks, as few as
    ``GROUP_MEMORY`` holds, and at least two per worker of an active ``dask.distributed``
    Client of several workers (one worker runs the product as one group where memory
    allows: read as ``multiply`` reads it)."""
    from .. import machine

    rows = planned[0]
    blocks = len(rows) - 1
    if blocks < 1:  # no rows: one empty group
        return [0, 0]
    budget = GROUP_MEMORY if GROUP_MEMORY is not None else machine.total_memory() // 4
    fits = budget // max(1, n * dtype.itemsize)
    per_band = max(1, fits // max(max(np.diff(rows).tolist()), 1))  # whole blocks that fit
    workers = _workers()
    spread = 2 * workers if workers > 1 else 1  # two per worker, where there are several
    count = min(max(spread, math.ceil(blocks / per_band), 1), blocks)
    per = math.ceil(blocks / count)  # as many bands, evened out
    return [*rows[:-1:per], rows[-1]]


def _workers() -> int:
    """The workers of the active ``dask.distributed`` Client; 0 without one."""
    return len(workers_of(None))


def workers_of(resources) -> list[str]:
    """The addresses of the active ``dask.distributed`` Client's workers that offer
    ``resources`` (a mapping of resource to amount; None: every worker), sorted; empty
    without a Client."""
    import sys

    if "distributed" not in sys.modules:
        return []
    from distributed import default_client

    try:
        info = default_client().scheduler_info(n_workers=-1)["workers"]
    except ValueError:  # no Client
        return []
    return sorted(address for address, worker in info.items()
                  if all(worker.get("resources", {}).get(name, 0) >= amount
                         for name, amount in (resources or {}).items()))


def worker_grid(workers: int, shape: tuple[int, int, int], blocks: tuple[int, int]
                ) -> tuple[int, int]:
    """How C is shared among ``workers``: a grid of pr x pc contiguous regions, one per
    worker, that reads the least (each worker reads M K / pr of A and K N / pc of B, its row
    band of A and its column band of B once), with no more regions along a side than the
    plan has ``blocks`` there. Where no grid of exactly ``workers`` regions fits, the one of
    the most regions that does (some workers then start with none and take work from the
    others as they finish)."""
    m, n, k = shape
    best: tuple[tuple[int, float], tuple[int, int]] | None = None
    for pr in range(1, workers + 1):
        pc = workers // pr
        if pr > blocks[0] or pc > blocks[1] or pr * pc == 0:
            continue
        key = (-(pr * pc), m * k / pr + k * n / pc)  # the most regions, then the least read
        if best is None or key < best[0]:
            best = (key, (pr, pc))
    return best[1] if best is not None else (1, 1)


def worker_layout(planned: list[list[int]], shape: tuple[int, int, int], dtype: np.dtype,
                  workers: int, grain: tuple[int | None, int | None] = (None, None)
                  ) -> tuple[list[list[int]], dict[tuple[int, int], int]]:
    """Groups laid out for ``workers`` workers of a ``dask.distributed`` Client: C cut along
    the plan's block bounds (``planned``; where they are too few to go round, bounds on the
    inputs' ``grain``, :func:`refined`) into one contiguous region per worker
    (:func:`worker_grid`), each region into at least two groups where it has two block rows
    or columns (so that a worker that finishes first takes a group from another at the end)
    and as many more as ``GROUP_MEMORY`` asks; the group bounds (rows, cols), and the worker
    (its index) each group (i, j) belongs to. Each group's run plans its own blocks."""
    from .. import machine

    rows, cols = (refined(planned[d], 2 * workers, grain[d]) for d in (0, 1))
    pr, pc = worker_grid(workers, shape, (len(rows) - 1, len(cols) - 1))
    row_parts, col_parts = _even(rows, pr), _even(cols, pc)
    budget = GROUP_MEMORY if GROUP_MEMORY is not None else machine.total_memory() // 4
    region_bytes = (max(np.diff(row_parts).tolist()) * max(np.diff(col_parts).tolist())
                    * dtype.itemsize)
    wanted = max(2, math.ceil(region_bytes / max(budget, 1)))
    row_room = [len(bounds_within(rows, lo, hi)) - 1 for lo, hi in zip(row_parts, row_parts[1:])]
    col_room = [len(bounds_within(cols, lo, hi)) - 1 for lo, hi in zip(col_parts, col_parts[1:])]
    bands = min(wanted, max(row_room))  # (a region of fewer block rows has as many bands)
    # regions of one block row: two strips of columns instead, where each has two
    strips = 2 if min(row_room) < 2 <= min(wanted, min(col_room)) else 1
    row_bounds = _split_parts(rows, row_parts, bands)
    col_bounds = _split_parts(cols, col_parts, strips)
    region_row = [bisect.bisect_right(row_parts, lo) - 1 for lo in row_bounds[:-1]]
    region_col = [bisect.bisect_right(col_parts, lo) - 1 for lo in col_bounds[:-1]]
    owner = {(i, j): r * pc + c for i, r in enumerate(region_row)
             for j, c in enumerate(region_col)}
    return [row_bounds, col_bounds], owner


def refined(splits: list[int], parts: int, grain: int | None) -> list[int]:
    """``splits`` where they make ``parts`` parts at least; else as even a cut into ``parts``
    (fewer where the extent is short) on multiples of ``grain`` (the inputs' chunk side, so
    that groups read whole chunks)."""
    extent = splits[-1]
    if len(splits) - 1 >= parts or extent == 0:
        return splits
    unit = grain or 1
    units = -(-extent // unit)
    cuts = sorted({min(extent, round(units * d / parts) * unit) for d in range(parts + 1)})
    return cuts if len(cuts) > len(splits) else splits


def _even(splits: list[int], parts: int) -> list[int]:
    """``parts`` contiguous runs of the blocks between ``splits``, as even in blocks as can
    be: their bounds."""
    blocks = len(splits) - 1
    return [splits[round(blocks * d / parts)] for d in range(parts)] + [splits[-1]]


def _split_parts(splits: list[int], parts: list[int], each: int) -> list[int]:
    """Each of ``parts`` (bounds on ``splits``) cut into ``each`` runs of its blocks."""
    bounds = [parts[0]]
    for lo, hi in zip(parts, parts[1:]):
        inner = [lo + v for v in bounds_within(splits, lo, hi)]
        bounds += _even(inner, min(each, len(inner) - 1))[1:]
    return bounds


def plan_blocks(plan_product, ops, alpha, beta, options) -> list[list[int]]:
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


def covering(bounds, span) -> tuple[int, int]:
    """The chunk indices whose union covers ``span`` (a nonempty range of chunks for empty
    spans, so that a block of a 0-size dimension still has its shape)."""
    lo, hi = span
    i0 = max(0, int(np.searchsorted(bounds, lo, side="right")) - 1)
    i1 = max(i0 + 1, int(np.searchsorted(bounds, hi, side="left")))
    return min(i0, len(bounds) - 2), min(i1, len(bounds) - 1)

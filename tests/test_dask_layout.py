"""The groups of ``oocgemm.dask.matmul`` laid out for the workers of a dask.distributed Client:
one contiguous region of C per worker, the grid of regions that reads the least, each region
cut into groups of whole plan blocks (at least two where it can, so that a worker that finishes
first takes one from another at the end), each group annotated with its worker (a loose
restriction: another worker may take it, and does when its worker is lost)."""

from __future__ import annotations

import itertools
import os

import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand, zarr_stores

import oocgemm
import oocgemm.dask as odask
from oocgemm.dask.partition import refined, worker_grid, worker_layout


def _read_per_worker(shape, grid):
    m, n, k = shape
    pr, pc = grid
    return m * k / pr + k * n / pc


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 6, 8, 64])
@pytest.mark.parametrize("shape", [(32768, 32768, 32768), (1000, 100_000, 50_000),
                                   (100_000, 2000, 1_000_000)])
def test_the_grid_of_regions_reads_the_least(workers, shape):
    blocks = (16, 16)
    pr, pc = worker_grid(workers, shape, blocks)
    assert pr * pc == workers  # one region per worker: every grid here fits the blocks
    fits = [(r, workers // r) for r in range(1, workers + 1)
            if workers % r == 0 and r <= blocks[0] and workers // r <= blocks[1]]
    assert _read_per_worker(shape, (pr, pc)) == min(_read_per_worker(shape, g) for g in fits)


def test_too_few_blocks_are_refined_on_the_inputs_grain():
    """The plan of the whole product may be one block (a GPU holds it all): the workers'
    regions are then cut on the inputs' chunk grain, so that each has groups of its own."""
    assert refined([0, 32768], 4, 4096) == [0, 8192, 16384, 24576, 32768]
    assert refined([0, 10000], 4, 4096) == [0, 4096, 8192, 10000]
    assert refined([0, 100], 4, None) == [0, 25, 50, 75, 100]
    assert refined([0, 10, 20, 30, 40, 50], 4, 7) == [0, 10, 20, 30, 40, 50]
    assert refined([0, 3], 4, 5) == [0, 3]
    (rows, cols), owner = worker_layout([[0, 49152], [0, 49152]], (49152,) * 3,
                                        np.dtype("f8"), 2)
    assert len(rows) - 1 == 2 and len(cols) - 1 == 2  # two groups a worker
    assert sorted(owner.values()) == [0, 0, 1, 1]


def test_the_grid_keeps_to_the_plans_blocks():
    assert worker_grid(4, (100, 100, 100), (1, 8)) == (1, 4)
    assert worker_grid(4, (100, 100, 100), (3, 1)) == (3, 1)  # three regions: one worker idle
    assert worker_grid(2, (100, 100, 100), (1, 1)) == (1, 1)


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("blocks", [(8, 8), (2, 2), (5, 3), (1, 6)])
def test_each_worker_has_one_contiguous_region_of_whole_blocks(workers, blocks):
    rows = [0, *np.cumsum(np.full(blocks[0], 100)).tolist()]
    cols = [0, *np.cumsum(np.full(blocks[1], 70)).tolist()]
    rows[-1] -= 33  # a ragged last block
    (row_bounds, col_bounds), owner = worker_layout([rows, cols], (rows[-1], cols[-1], 500),
                                                    np.dtype("f8"), workers, (10, None))
    # on the plan's blocks, or where they are too few to go round on the inputs' grain
    rows, cols = refined(rows, 2 * workers, 10), refined(cols, 2 * workers, None)
    assert all(r % 10 == 0 or r == rows[-1] for r in rows)
    assert set(row_bounds) <= set(rows) and set(col_bounds) <= set(cols)
    assert row_bounds[0] == col_bounds[0] == 0
    assert (row_bounds[-1], col_bounds[-1]) == (rows[-1], cols[-1])
    groups = list(itertools.product(range(len(row_bounds) - 1), range(len(col_bounds) - 1)))
    assert sorted(owner) == groups
    pr, pc = worker_grid(workers, (rows[-1], cols[-1], 500), (len(rows) - 1, len(cols) - 1))
    assert set(owner.values()) == set(range(pr * pc))
    room = []
    for w in set(owner.values()):
        mine = [g for g in groups if owner[g] == w]
        i0, i1 = min(i for i, _ in mine), max(i for i, _ in mine)
        j0, j1 = min(j for _, j in mine), max(j for _, j in mine)
        assert len(mine) == (i1 - i0 + 1) * (j1 - j0 + 1)  # a rectangle of groups
        room.append((len([r for r in rows if row_bounds[i0] <= r <= row_bounds[i1 + 1]]) - 1,
                     len([c for c in cols if col_bounds[j0] <= c <= col_bounds[j1 + 1]]) - 1,
                     len(mine)))
    if min(r for r, _, _ in room) >= 2 or min(c for _, c, _ in room) >= 2:
        assert all(groups_ >= 2 for _, _, groups_ in room)  # two a worker, where they fit


def test_groups_go_to_their_workers_and_each_chunk_is_decoded_by_few(rng, workdir):
    """Two worker processes, Zarr inputs: each group task is annotated with its region's
    worker (loosely), the product is right, and each stored chunk is decoded at most once
    per worker that needs it (A's row band and B's column band of its region)."""
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (256, 96)), rand(rng, (96, 200))
    zarr_stores((32, 32), a=a, b=b)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        z = odask.matmul(da.from_zarr("a.zarr"), "b.zarr", device="cpu", tile=(64, 64, 96),
                         trace_dir="trace")
        layer = z.dask.layers[z.name + "-groups"]
        workers = sorted(client.scheduler_info()["workers"])
        where = {key: layer.annotations["workers"](key) for key in layer}
        assert layer.annotations["allow_other_workers"] is True
        assert {w for ws in where.values() for w in ws} == set(workers)
        assert len(layer) >= 4  # two a worker
        assert_gemm(z.compute(), a, b)
        pids = set(client.run(os.getpid).values())
    t = odask.timeline("trace")
    per_worker = t.meta["workers"]
    assert {int(name.rpartition(":")[2]) for name in per_worker} <= pids
    chunks_a, chunks_b = 8 * 3, 3 * 7
    decodes = sum(w["decodes"] for w in per_worker.values())
    # a 1 x 2 or 2 x 1 grid: one operand's chunks decoded by both workers, the other's once
    assert chunks_a + chunks_b <= decodes <= chunks_a + chunks_b + max(chunks_a, chunks_b)
    decoders = t.meta["decoders"]  # which worker decoded which stored chunk
    assert (decoders["A"]["chunks"], decoders["B"]["chunks"]) == (chunks_a, chunks_b)
    assert max(x["most_workers"] for x in decoders.values()) <= 2
    assert min(x["most_workers"] for x in decoders.values()) == 1
    assert "decoded by" in str(t)


def test_a_run_says_which_stored_chunks_it_decoded(rng, workdir):
    a, b = rand(rng, (100, 70)), rand(rng, (70, 50))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(32, 32))[...] = a
    r = oocgemm.multiply("a.zarr", b, device="cpu", tile=(64, 50, 70))
    at = r.chunks["A"]["decoded_at"]
    assert sorted(map(tuple, at)) == [(i, j) for i in range(4) for j in range(3)]
    assert len(at) == r.chunks["A"]["decodes"]


def test_a_workers_chunks_wait_for_its_next_group_of_the_graph(monkeypatch):
    """A graph's decoded chunks outlive its last active task in a process while the worker
    says it holds more groups of the graph (they read the same rows of A or columns of B),
    and go once it holds none; without a worker they go at once."""
    import threading
    import time

    from oocgemm.dask import sharing

    monkeypatch.setattr(sharing, "RECHECK", 0.01)
    more = threading.Event()
    more.set()
    with sharing.shared_chunks("g", more.is_set) as shared:
        shared.get(("B", (0, 0)), lambda: np.ones(3))
    time.sleep(0.05)
    assert sharing._SHARED.get("g") is shared  # kept: the next group of the graph is here
    with sharing.shared_chunks("g", more.is_set) as again:
        assert again is shared
        again.get(("B", (0, 0)), lambda: pytest.fail("decoded again"))
    more.clear()
    deadline = time.monotonic() + 5
    while "g" in sharing._SHARED:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with sharing.shared_chunks("h") as alone:
        alone.get(("A", (0, 0)), lambda: np.ones(3))
    assert "h" not in sharing._SHARED

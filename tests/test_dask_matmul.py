"""oocgemm.dask.matmul (issue 19): a lazy dask array with one engine task per group of C
blocks, whose chunks are handed out as the engine writes them; stored inputs read by the tasks,
dask inputs computed once per graph run."""

from __future__ import annotations

import collections
import json
import os
import pickle
import threading

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand, zarr_stores
from dask.callbacks import Callback
from test_dask_inputs import Counter, counted

import oocgemm
import oocgemm.dask as odask
from oocgemm import cuda
from oocgemm.dask import partition, sharing


def _groups(z):
    """The graph's engine tasks, one per group."""
    return z.dask.layers[z.name + "-groups"]


def test_one_engine_task_per_group_and_no_partial_products(rng):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    x, y = da.from_array(a, chunks=(64, 50)), da.from_array(b, chunks=(50, 64))
    z = odask.matmul(x, y, device="cpu", memory_limit="200KB")
    p = oocgemm.plan(x, y, device="cpu", memory_limit="200KB")
    assert p.grid[0] > 2 and p.grid[1] > 2  # many C blocks ...
    assert len(_groups(z)) == 1  # ... one engine run: one process, memory to spare
    chunks = len(z.chunks[0]) * len(z.chunks[1])  # the inputs' chunks are below 1024: uncut
    # the group, a link per block (done when the engine has written it), the chunks, and the
    # input chunks, nothing else
    assert len(z.dask) == 1 + p.grid[0] * p.grid[1] + chunks + 5 * 4 + 4 * 4
    assert len((x @ y).dask) > 2 * len(z.dask)  # dask's own: partial products and their sums
    assert_gemm(z.compute(), a, b)


def test_groups_are_bands_of_whole_block_rows_that_fit_in_memory(rng, monkeypatch):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    x, y = da.from_array(a, chunks=(64, 50)), da.from_array(b, chunks=(50, 64))
    p = oocgemm.plan(x, y, device="cpu", memory_limit="200KB")
    fits = 120  # rows of C that a group may hold
    monkeypatch.setattr(partition, "GROUP_MEMORY", fits * 250 * 8)
    z = odask.matmul(x, y, device="cpu", memory_limit="200KB")
    bounds = np.cumsum((0,) + z.chunks[0]).tolist()
    assert len(bounds) > 2 and set(bounds) <= set(p.row_splits)
    assert max(z.chunks[0]) <= fits and z.chunks[1] == (250,)
    assert len(_groups(z)) == len(z.chunks[0])
    assert_gemm(z.compute(), a, b)


def test_the_result_is_chunked_like_the_inputs_within_the_groups(rng, workdir, monkeypatch):
    monkeypatch.setattr(partition, "MIN_CHUNK_SIDE", 1)  # the grain of these small inputs
    a, b = rand(rng, (160, 100)), rand(rng, (100, 120))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(20, 50))[...] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype="f8", chunks=(50, 30))[...] = b
    z = odask.matmul(da.from_zarr("a.zarr"), "b.zarr", groups=(80, 60), device="cpu")
    assert z.chunks == ((20,) * 8, (30,) * 4)  # A's row chunks, B's column chunks
    assert len(_groups(z)) == 2 * 2  # and still one engine task per group
    z.to_zarr("c.zarr")
    c = zarr.open_array("c.zarr", mode="r")
    assert c.chunks == (20, 30)
    assert_gemm(c[...], a, b)

    # chunks given: groups of whole chunks, bands as large as memory allows
    z = odask.matmul("a.zarr", "b.zarr", chunks=(20, 30), device="cpu", memory_limit="200KB")
    assert z.chunks == ((20,) * 8, (30,) * 4)
    assert len(_groups(z)) == 1
    assert_gemm(z.compute(), a, b)
    monkeypatch.setattr(partition, "GROUP_MEMORY", 50 * 120 * 8)
    z = odask.matmul("a.zarr", "b.zarr", chunks=(20, 30), device="cpu", memory_limit="200KB")
    assert len(_groups(z)) == 4  # bands of 40 rows: two chunks each, under 50
    assert_gemm(z.compute(), a, b)


def _group_threads():
    return [t for t in threading.enumerate() if t.name == "oocgemm-group"]


def test_chunks_are_handed_out_while_the_engine_goes_on(rng):
    a, b = rand(rng, (400, 300)), rand(rng, (300, 400))
    p = oocgemm.plan(a, b, device="cpu", memory_limit="300KB")
    rows, cols = (int(max(np.diff(s))) for s in (p.row_splits, p.col_splits))
    z = odask.matmul(a, b, chunks=(rows, cols), device="cpu", memory_limit="300KB")
    assert len(_groups(z)) == 1 and p.grid[0] * p.grid[1] > 8
    running = []  # as each chunk is done: whether the engine still runs

    class Watch(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if key[0] == z.name:
                running.append(bool(_group_threads()))

    with Watch(), dask.config.set(scheduler="threads", num_workers=2):
        got = z.compute()
    assert_gemm(got, a, b)
    assert len(running) == len(z.chunks[0]) * len(z.chunks[1])
    assert not running[-1]  # the last chunk after the run's end, and most before it, in
    assert sum(running) > len(running) // 2  # whatever order the scheduler takes them


def test_a_run_whose_chunks_are_not_wanted_stops(rng, workdir):
    a, b = rand(rng, (1200, 400)), rand(rng, (400, 1200))
    z = odask.matmul(a, b, chunks=50, device="cpu", memory_limit="1MB",
                     trace_dir=str(workdir / "trace"))
    assert_gemm(z[:50, :50].compute(), a[:50], b[:, :50])  # one chunk of 576 taken
    for thread in _group_threads():
        thread.join(10)
    assert not _group_threads()
    assert not os.path.exists(workdir / "trace")  # stopped: a run that ends leaves its events


def test_the_rows_of_a_block_go_as_they_are_written(rng):
    """A run's last block (all of C, where it is one block) is written in row stripes: the
    chunks of its rows are handed out as soon as their stripes are written, not when the
    whole block is (a GPU's in-core plan writes all of C as one block)."""
    from oocgemm.dask.runner import _Run

    a, b = rand(rng, (400, 60)), rand(rng, (60, 300))
    seen = []

    class Watched(_Run):
        def __call__(self, event):
            super().__call__(event)
            if event.kind == "write":
                seen.append((self.ready(0, 100, 0, 300), self.ready(300, 400, 0, 300)))

    run = Watched(np.empty((400, 300)), chunks=4)
    result = oocgemm.multiply(a, b, run.out, device="cpu", tile=(400, 300, 30), progress=run)
    assert result.plan.grid[:2] == (1, 1)
    # (the writers finish the stripes in any order: one end of C is ready before the other)
    assert {(True, False), (False, True)} & set(seen) and seen[-1] == (True, True)
    assert_gemm(run.out, a, b)


def test_a_released_group_stops_with_the_executors_cancellation():
    """A run whose handle is gone stops at its next event with runtime.base.Cancelled, the one
    exception of a cancelled run (which runtime.base.failure passes over)."""
    from types import SimpleNamespace

    from oocgemm.dask.runner import _Run
    from oocgemm.runtime.base import Cancelled

    run = _Run(np.empty((4, 4)), chunks=1)
    run(SimpleNamespace(kind="gemm", operand=None))  # wanted: goes on
    run.cancelled = True
    with pytest.raises(Cancelled):
        run(SimpleNamespace(kind="gemm", operand=None))


def test_a_corrupt_chunk_fails_every_chunk_of_its_group(rng, workdir):
    a = rand(rng, (12, 10))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(4, 5))[...] = a
    chunk = os.path.join("a.zarr", "c", "1", "1")
    data = open(chunk, "rb").read()
    with open(chunk, "wb") as fh:
        fh.write(bytes(reversed(data)))
    z = odask.matmul("a.zarr", rand(rng, (10, 6)), chunks=(4, 3), device="cpu")
    with pytest.raises(oocgemm.OOCGemmError, match="corrupt or truncated chunk"):
        z.compute()
    for thread in _group_threads():
        thread.join(10)
    assert not _group_threads()


def test_a_handle_moved_to_another_process_computes_its_chunk_there(rng):
    a, b, c = rand(rng, (90, 60)), rand(rng, (60, 70)), rand(rng, (90, 70))
    z = odask.matmul(a, da.from_array(b.T.copy(), chunks=30), c=c, beta=2.0, trans_b=True,
                     chunks=(30, 35), device="cpu")
    graph = dict(z.__dask_graph__())
    group_key = next(iter(_groups(z)))
    spec = dask.get(graph, group_key)  # the group task's handle, as a worker holds it
    moved = pickle.loads(pickle.dumps(spec))  # as another worker gets it: no run with it
    assert moved.run is None
    assert_gemm(moved.chunk(30, 60, 35, 70), a[30:60], b[:, 35:70], c[30:60, 35:70], beta=2.0)


def test_each_dask_chunk_is_computed_once_per_graph_run(rng):
    a, b = rand(rng, (120, 90)), rand(rng, (90, 100))
    ca, cb = Counter(), Counter()
    z = odask.matmul(counted(a, (30, 30), ca), counted(b, (30, 25), cb), groups=(40, 50),
                     device="cpu")
    assert_gemm(z.compute(), a, b)
    assert set(ca.calls.values()) == {1} and len(ca.calls) == 4 * 3
    assert set(cb.calls.values()) == {1} and len(cb.calls) == 3 * 4


def test_stored_inputs_are_read_by_the_tasks(rng, workdir):
    a, b, c = rand(rng, (100, 80)), rand(rng, (80, 60)), rand(rng, (100, 60))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(32, 16))[...] = a
    np.save("b.npy", b)
    zc = zarr.create_array("c.zarr", shape=c.shape, dtype="f8", chunks=(25, 30))
    zc[...] = c
    z = odask.matmul(da.from_zarr("a.zarr"), "b.npy", c=zc, beta=0.5, groups=(32, 30),
                     device="cpu")
    # a group, its link and its chunk per block of 32 x 30: no input tasks at all
    assert len(z.dask) == 3 * len(_groups(z)) == 3 * 4 * 2
    assert_gemm(z.compute(), a, b, c, beta=0.5)


def test_tasks_of_a_process_share_their_decoded_chunks(rng, workdir, monkeypatch):
    a, b = rand(rng, (100, 80)), rand(rng, (80, 60))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(20, 16))[...] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype="f8", chunks=(16, 20))[...] = b
    z = odask.matmul("a.zarr", da.from_zarr("b.zarr"), groups=(40, 20), device="cpu")
    decodes = []  # of each graph's shared chunks, when its last task here is done
    monkeypatch.setattr(sharing, "_SHARED", _Watched(decodes))
    with dask.config.set(scheduler="threads", num_workers=9):  # all 9 tasks at once
        got = z.compute()
    assert_gemm(got, a, b)
    assert decodes == [5 * 5 + 5 * 3]  # each chunk decoded once, for 3 x 3 = 9 groups
    assert z.name not in sharing._SHARED


class _Watched(dict):
    """The registry of shared chunks, noting the decodes of each graph's as it goes."""

    def __init__(self, decodes: list):
        super().__init__()
        self.decodes = decodes

    def __delitem__(self, key):
        self.decodes.append(self[key].decodes)
        super().__delitem__(key)


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False)])
def test_transposes_scalars_and_mixed_inputs(rng, workdir, trans_a, trans_b):
    a, b = rand(rng, (70, 50), "complex128"), rand(rng, (50, 40), "complex64")
    c = rand(rng, (70, 40))
    x = da.from_array(a.T.copy() if trans_a else a, chunks=(16, 16))
    np.save("b.npy", b.T.copy() if trans_b else b)
    z = odask.matmul(x, "b.npy", c=da.from_array(c, chunks=20), alpha=1 - 2j, beta=-0.5,
                     trans_a=trans_a, trans_b=trans_b, groups=(30, 15), device="cpu")
    assert z.dtype == np.complex128
    assert_gemm(z.compute(), a, b, c, alpha=1 - 2j, beta=-0.5)


def test_the_plans_blocks_with_transposes_and_a_trace(rng, workdir):
    a, b = rand(rng, (90, 60)), rand(rng, (60, 70))  # stored transposed: no groups= given
    np.save("at.npy", a.T.copy())
    bt = da.from_array(b.T.copy(), chunks=20)
    z = odask.matmul("at.npy", bt, trans_a=True, trans_b=True, device="cpu",
                     memory_limit="60KB", trace_dir=str(workdir / "trace"))
    assert z.shape == (90, 70) and len(_groups(z)) == 1
    assert_gemm(z.compute(), a, b)
    t = odask.timeline(str(workdir / "trace"))  # the folder made by the task
    assert t.flops == 2 * 90 * 70 * 60
    assert len({e.key for e in t.events if e.kind == "write"}) > 1  # several blocks, one run


def test_composes_with_the_rest_of_a_graph(rng, workdir):
    a, b = rand(rng, (90, 60)), rand(rng, (60, 70))
    z = odask.matmul(da.from_array(a, chunks=30), da.from_array(b, chunks=30), groups=(30, 35),
                     device="cpu")
    z.to_zarr("c.zarr")
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)
    total = (z * 2).sum().compute()
    np.testing.assert_allclose(total, 2 * (a @ b).sum(), rtol=1e-10)
    kept = z.persist()
    assert_gemm(kept.compute(), a, b)
    assert_gemm(da.map_blocks(np.negative, z).compute(), a, b, alpha=-1.0)


def test_under_a_distributed_local_cluster(rng, workdir):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (120, 80)), rand(rng, (80, 90))
    zarr.create_array("b.zarr", shape=b.shape, dtype="f8", chunks=(40, 30))[...] = b
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        x = da.from_array(a, chunks=(40, 40))
        z = odask.matmul(x, "b.zarr", device="cpu", tile=(30, 30, 40))
        p = oocgemm.plan(x, "b.zarr", device="cpu", tile=(30, 30, 40))
        assert p.grid[0] >= 4 and len(_groups(z)) == 4  # two per worker: the workers balance
        got = z.compute()
        ran = client.run(lambda: True)
    assert len(ran) == 2
    assert_gemm(got, a, b)


def test_the_tasks_timelines_merge_into_one(rng, workdir):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (160, 60)), rand(rng, (60, 120))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  resources={"engine": 1}, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        z = odask.matmul(da.from_array(a, chunks=40), da.from_array(b, chunks=40),
                         groups=(40, 60), device="cpu", trace_dir=str(workdir),
                         resources={"engine": 1})
        assert_gemm(z.compute(), a, b)
    t = odask.timeline(str(workdir))
    assert t.flops == 2 * 160 * 120 * 60
    shares = t.device_shares()  # one lane group per worker process and device
    assert len(shares) == 2 and all(name.endswith("/cpu") for name in shares)
    assert sum(x["flops"] for x in shares.values()) == t.flops
    assert "balance" in str(t)
    t.save("merged.json")
    trace = json.load(open("merged.json"))
    groups = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert len(groups) == 2


def test_the_merged_timeline_says_what_each_worker_decoded(rng, workdir):
    """Zarr inputs read by two worker processes: the merged timeline (and its JSON) has each
    worker's runs, flops and the chunks it decoded, and the storage line sums them."""
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (160, 64)), rand(rng, (64, 120))
    zarr_stores((16, 16), a=a, b=b)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        z = odask.matmul("a.zarr", da.from_zarr("b.zarr"), groups=(40, 120), device="cpu",
                         trace_dir=str(workdir / "trace"))
        assert_gemm(z.compute(), a, b)
        pids = set(client.run(os.getpid).values())
    t = odask.timeline(str(workdir / "trace"))
    workers = t.meta["workers"]
    assert {int(name.rpartition(":")[2]) for name in workers} <= pids
    assert sum(w["tasks"] for w in workers.values()) == 4
    assert sum(w["flops"] for w in workers.values()) == t.flops == 2 * 160 * 120 * 64
    # every chunk of A (10 x 4) and B (4 x 8) decoded somewhere, A's at most twice (a band
    # of 40 rows meets three 16-row chunks), B's at most once per run
    decodes = sum(w["decodes"] for w in workers.values())
    assert 40 + 32 <= decodes <= 2 * 40 + 4 * 32
    assert all(w["decoded"] > 0 for w in workers.values())
    assert t.meta["storage"]["decoded"] == sum(w["decoded"] for w in workers.values())
    assert "workers   " in str(t) and "decoded" in str(t)
    assert t.to_dict()["meta"]["workers"] == workers


@pytest.mark.parametrize("m, k, n", [(0, 5, 4), (4, 0, 3), (4, 5, 0)])
def test_empty_dimensions(rng, m, k, n):
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    z = odask.matmul(da.from_array(a), b, device="cpu")
    assert_gemm(z.compute(), a, b)  # zeros where k = 0
    assert_gemm(oocgemm.multiply(da.from_array(a), b, device="cpu").out, a, b)


def test_bad_inputs_fail_when_the_graph_is_built(rng, workdir):
    a = da.from_array(rand(rng, (10, 8)), chunks=4)
    with pytest.raises(oocgemm.ShapeError, match="inner dimensions"):
        odask.matmul(a, a)
    with pytest.raises(oocgemm.OptionError, match="unknown options"):
        odask.matmul(a, a.T, overwrite=True)
    with pytest.raises(oocgemm.OptionError, match="do not add up"):
        odask.matmul(a, a.T, groups=((5, 4), (10,)))
    with pytest.raises(oocgemm.OptionError, match="within one group"):
        odask.matmul(a, a.T, groups=(5, 5), chunks=(4, 5))
    for empty in (dict(groups=0), dict(chunks=(0, 5)), dict(groups=((10, 0), (10,)))):
        with pytest.raises(oocgemm.OptionError, match="at least 1|parts of no"):
            odask.matmul(a, a.T, **empty)  # once: tasks of nothing, most of the graph
    with pytest.raises(oocgemm.InputError):
        odask.matmul("missing.zarr", a.T)
    with pytest.raises(oocgemm.OptionError, match="beta != 0 needs c"):
        odask.matmul(a, a.T, beta=1.0)
    with pytest.raises(oocgemm.ShapeError, match=r"c has shape \(10, 8\), expected \(10, 10\)"):
        odask.matmul(a, a.T, c=a, beta=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_on_the_gpu(rng, workdir):
    a, b = rand(rng, (600, 500)), rand(rng, (500, 450))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(128, 100))[...] = a
    z = odask.matmul(da.from_zarr("a.zarr"), da.from_array(b, chunks=100), device="cuda",
                     memory_limit="4MB", chunks=(128, 100))
    assert len(_groups(z)) == 1 and len(z.chunks[0]) * len(z.chunks[1]) > 1
    with dask.config.set(scheduler="threads", num_workers=4):
        assert_gemm(z.compute(), a, b)


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_on_the_gpu_chunks_wait_for_every_stripe_of_their_blocks(rng, workdir):
    a, b = rand(rng, (2048, 1024)), rand(rng, (1024, 1536))
    z = odask.matmul(a, b, chunks=256, device="cuda", memory_limit="48MB",
                     trace_dir=str(workdir / "trace"))
    with dask.config.set(scheduler="threads", num_workers=8):
        assert_gemm(z.compute(), a, b)
    writes = [e for e in odask.timeline(str(workdir / "trace")).events
              if e.kind == "write" and e.operand == "C"]
    assert len(writes) > len({e.key for e in writes}) > 1  # blocks written stripe by stripe


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_on_the_gpu_through_a_local_cluster(rng, workdir):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (600, 500)), rand(rng, (500, 450))
    zarr.create_array("b.zarr", shape=b.shape, dtype="f8", chunks=(100, 90))[...] = b
    with distributed.LocalCluster(n_workers=1, threads_per_worker=4, processes=True,
                                  resources={"GPU": 1}, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        z = odask.matmul(da.from_array(a, chunks=100), "b.zarr", device="cuda",
                         memory_limit="4MB", resources={"GPU": 1})
        p = oocgemm.plan(da.from_array(a, chunks=100), "b.zarr", device="cuda",
                         memory_limit="4MB")
        assert p.grid[0] >= 2 and len(_groups(z)) == 1  # one worker: the product one group
        z.to_zarr("c.zarr")
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)


@pytest.mark.parametrize("groups", [None, (16, 16), (16, 64), (48, 32)])
def test_gram_groups_are_parts_not_the_whole_matrix(rng, workdir, groups):
    """A Gram product of one stored matrix, cut into groups: each group's parts of X are
    other matrices than X itself (a group off the diagonal once computed its own part
    against itself: a silent wrong answer)."""
    x = rand(rng, (300, 64))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(100, 16))[:] = x
    z = odask.matmul("x.zarr", "x.zarr", trans_a=True, device="cpu", groups=groups,
                     tile=(16, 16, 100))
    np.testing.assert_allclose(z.compute(), x.T @ x, rtol=1e-12, atol=1e-10)


def _stored_gram_input(kind: str, x: np.ndarray, chunks):
    """X as ``kind``: a Zarr path, a ``zarr.Array``, an untouched ``da.from_zarr``, or a dask
    array of chunks in memory."""
    if kind == "dask":
        return da.from_array(x, chunks=chunks)
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=chunks)[...] = x
    return {"path": "x.zarr", "zarr": zarr.open_array("x.zarr", mode="r"),
            "from_zarr": da.from_zarr("x.zarr")}[kind]


def _gram_flops(x: np.ndarray, outer: bool) -> int:
    """Flops of the full product X^T X (X X^T with ``outer``), complex counting 4x."""
    n, k = (x.shape[0], x.shape[1]) if outer else (x.shape[1], x.shape[0])
    return (8 if np.iscomplexobj(x) else 2) * n * n * k


def _check_gram_graph(z) -> None:
    """Every group counts every take from its handle, so that its last take, and only it,
    waits for the run's end; a chunk below the diagonal takes nothing from a handle: it is
    the result chunk across it, transposed (the same bits wherever that was computed)."""
    from oocgemm.dask.gram import transposed

    groups = _groups(z)
    takes = {key[1:]: task[9] for key, task in groups.items()}
    pieces = z.dask.layers[z.name]
    below = {key: task for key, task in pieces.items() if task[0] is transposed}
    assert sorted(key[1:] for key in below) == sorted(
        (ci, cj) for ci in range(len(z.chunks[0])) for cj in range(len(z.chunks[1])) if ci > cj)
    assert all(task[1] == (z.name, key[2], key[1]) for key, task in below.items())
    chained = collections.Counter(task[1][1:3] for key, task in pieces.items()
                                  if key not in below)
    assert takes == dict(chained)
    n = len(z.chunks[0])
    assert sum(takes.values()) == n * (n + 1) // 2


@pytest.mark.parametrize("kind", ["path", "zarr", "from_zarr", "dask"])
@pytest.mark.parametrize("outer, dtype", [(False, "float32"), (True, "complex128"),
                                          (False, "complex128"), (True, "float32")])
def test_gram_bands_compute_half_and_give_an_exactly_symmetric_result(
        rng, workdir, monkeypatch, kind, outer, dtype):
    """X^T X (X X^T) cut into bands of rows: each band computes its part on and right of
    the diagonal, and the chunks below it are the transposes of those above it."""
    monkeypatch.setattr(partition, "MIN_CHUNK_SIDE", 1)  # chunks at the inputs' grain, in bands
    x = rand(rng, (301, 77), dtype)  # ragged: neither tile nor chunks divide it
    tile = 48 if outer else 16
    n = x.shape[0] if outer else x.shape[1]
    monkeypatch.setattr(partition, "GROUP_MEMORY", 2 * tile * n * x.itemsize)  # 2 block rows
    xs = _stored_gram_input(kind, x, (24, 8))
    z = odask.matmul(xs, xs, trans_a=not outer, trans_b=outer, device="cpu",
                     tile=(tile, tile, 64), trace_dir="trace")
    assert len(_groups(z)) >= 3
    assert z.chunks[0] == z.chunks[1] and len(z.chunks[0]) > len(_groups(z))  # chunks in bands
    _check_gram_graph(z)
    with dask.config.set(scheduler="threads", num_workers=4):
        got = z.compute()
    assert got.dtype == x.dtype
    assert_gemm(got, x, x, trans_a=not outer, trans_b=outer)
    assert np.array_equal(got, got.T)  # bit for bit; symmetric, not Hermitian
    assert len(os.listdir("trace")) == len(_groups(z))  # each run over before the graph
    assert odask.timeline("trace").flops < 0.75 * _gram_flops(x, outer)


def test_gram_bands_under_a_distributed_local_cluster(rng, workdir):
    distributed = pytest.importorskip("distributed")
    x = rand(rng, (301, 77))
    xs = _stored_gram_input("from_zarr", x, (50, 13))
    dx = da.from_array(x, chunks=(50, 13))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        for trace, (left, right, trans_a) in enumerate([(xs, "x.zarr", True),
                                                       (dx, dx, False)]):
            z = odask.matmul(left, right, trans_a=trans_a, trans_b=not trans_a, device="cpu",
                             tile=(16, 16, 64), trace_dir=f"trace{trace}")
            assert len(_groups(z)) >= 3  # about two per worker
            _check_gram_graph(z)
            got = z.compute()
            assert_gemm(got, x, x, trans_a=trans_a, trans_b=not trans_a)
            assert np.array_equal(got, got.T)
            assert odask.timeline(f"trace{trace}").flops < 0.75 * _gram_flops(x, not trans_a)


def test_gram_under_worker_processes_is_exactly_symmetric(rng, workdir):
    """Worker processes of two threads: a chunk task may run where its group's run is not,
    and computes its chunk there by itself (another order of sums). A chunk below the
    diagonal is the result chunk across it, transposed, wherever each ran: C == C.T bit for
    bit (it was not, on every compute, when it was taken from the group's moved handle)."""
    distributed = pytest.importorskip("distributed")
    x = rand(rng, (64, 2600))
    zarr.create_array("x.zarr", shape=x.shape, dtype="f8", chunks=(64, 1024))[...] = x
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        for _ in range(2):
            z = odask.matmul("x.zarr", "x.zarr", trans_a=True, device="cpu")
            _check_gram_graph(z)
            got = z.compute()
            assert_gemm(got, x, x, trans_a=True)
            assert np.array_equal(got, got.T)


def test_gram_with_beta_groups_or_chunks_computes_the_full_product(rng, workdir, monkeypatch):
    monkeypatch.setattr(partition, "GROUP_MEMORY", 10 * 40 * 8)  # bands of one block row
    x, c = rand(rng, (120, 40)), rand(rng, (40, 40))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(30, 10))[...] = x
    full = _gram_flops(x, False)
    cases = {"beta": dict(c=c, beta=0.5), "groups": dict(groups=(10, 40)),
             "chunks": dict(chunks=(10, 40))}
    for trace, (what, given) in enumerate(cases.items()):
        z = odask.matmul("x.zarr", "x.zarr", trans_a=True, device="cpu", tile=(10, 10, 30),
                         trace_dir=f"trace{trace}", **given)
        assert len(_groups(z)) > 1, what
        assert_gemm(z.compute(), x, x, given.get("c"), beta=given.get("beta", 0.0),
                    trans_a=True)
        assert odask.timeline(f"trace{trace}").flops == full, what


@pytest.mark.parametrize("spelling", ["x.T @ x", "x @ x.T", "trans_a", "trans_b"])
def test_gram_of_a_dask_array_and_its_transpose_is_exactly_symmetric(rng, spelling):
    """``matmul(x.T, x)``, dask's own spelling, is X^T X of one matrix (its transpose seen
    through), and so is one group of ``matmul(x, x, trans_a=True)``: C == C.T bit for bit."""
    xn = rand(rng, (300, 60))
    x = da.from_array(xn, chunks=(50, 20))
    args = {"x.T @ x": ((x.T, x), {}), "x @ x.T": ((x, x.T), {}),
            "trans_a": ((x, x), {"trans_a": True}),
            "trans_b": ((x, x), {"trans_b": True})}[spelling]
    c = odask.matmul(*args[0], device="cpu", **args[1]).compute()
    outer = spelling in ("x @ x.T", "trans_b")
    np.testing.assert_allclose(c, xn @ xn.T if outer else xn.T @ xn, rtol=1e-12, atol=1e-10)
    assert np.array_equal(c, c.T)

"""oocgemm.dask.matmul (issue 19): a lazy dask array with one task per C block, that runs the
engine in each task; stored inputs read by the tasks, dask inputs computed once per graph run."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import oocgemm
import oocgemm.dask as odask
from oocgemm import cuda
from test_dask_inputs import Counter, counted
from _helpers import assert_gemm, rand


def _layer(z):
    return z.dask.layers[z.name]


def test_one_task_per_c_block_and_no_partial_products(rng):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    x, y = da.from_array(a, chunks=(64, 50)), da.from_array(b, chunks=(50, 64))
    z = odask.matmul(x, y, device="cpu", memory_limit="200KB")
    blocks = len(z.chunks[0]) * len(z.chunks[1])
    assert len(_layer(z)) == blocks
    assert len(z.dask) == blocks + 5 * 4 + 4 * 4  # the blocks and the input chunks, nothing else
    assert len((x @ y).dask) > 2 * len(z.dask)  # dask's own: partial products and their sums
    p = oocgemm.plan(x, y, device="cpu", memory_limit="200KB")
    assert z.chunks == (tuple(np.diff(p.row_splits)), tuple(np.diff(p.col_splits)))
    assert_gemm(z.compute(), a, b)


def test_each_dask_chunk_is_computed_once_per_graph_run(rng):
    a, b = rand(rng, (120, 90)), rand(rng, (90, 100))
    ca, cb = Counter(), Counter()
    z = odask.matmul(counted(a, (30, 30), ca), counted(b, (30, 25), cb), chunks=(40, 50),
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
    z = odask.matmul(da.from_zarr("a.zarr"), "b.npy", c=zc, beta=0.5, chunks=(32, 30),
                     device="cpu")
    assert len(z.dask) == len(_layer(z)) == 4 * 2  # no input tasks at all
    assert_gemm(z.compute(), a, b, c, beta=0.5)


def test_tasks_of_a_process_share_their_decoded_chunks(rng, workdir, monkeypatch):
    a, b = rand(rng, (100, 80)), rand(rng, (80, 60))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(20, 16))[...] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype="f8", chunks=(16, 20))[...] = b
    z = odask.matmul("a.zarr", da.from_zarr("b.zarr"), chunks=(40, 20), device="cpu")
    decodes = []  # of each graph's shared chunks, when its last task here is done
    monkeypatch.setattr(odask, "_SHARED", _Watched(decodes))
    with dask.config.set(scheduler="threads", num_workers=9):  # all 9 tasks at once
        got = z.compute()
    assert_gemm(got, a, b)
    assert decodes == [5 * 5 + 5 * 3]  # each chunk decoded once, for 3 x 3 = 9 blocks
    assert z.name not in odask._SHARED


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
                     trans_a=trans_a, trans_b=trans_b, chunks=(30, 15), device="cpu")
    assert z.dtype == np.complex128
    assert_gemm(z.compute(), a, b, c, alpha=1 - 2j, beta=-0.5)


def test_the_plans_blocks_with_transposes_and_a_trace(rng, workdir):
    a, b = rand(rng, (90, 60)), rand(rng, (60, 70))  # stored transposed: no chunks= given
    np.save("at.npy", a.T.copy())
    bt = da.from_array(b.T.copy(), chunks=20)
    z = odask.matmul("at.npy", bt, trans_a=True, trans_b=True, device="cpu",
                     memory_limit="60KB", trace_dir=str(workdir))
    p = oocgemm.plan("at.npy", bt, trans_a=True, trans_b=True, device="cpu",
                     memory_limit="60KB")
    assert z.chunks == (tuple(np.diff(p.row_splits)), tuple(np.diff(p.col_splits)))
    assert_gemm(z.compute(), a, b)
    assert odask.timeline(str(workdir)).flops == 2 * 90 * 70 * 60


def test_composes_with_the_rest_of_a_graph(rng, workdir):
    a, b = rand(rng, (90, 60)), rand(rng, (60, 70))
    z = odask.matmul(da.from_array(a, chunks=30), da.from_array(b, chunks=30), chunks=(30, 35),
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
        z = odask.matmul(da.from_array(a, chunks=(40, 40)), "b.zarr", chunks=(40, 45),
                         device="cpu")
        got = z.compute()
        ran = client.run(lambda: True)
    assert len(ran) == 2
    assert_gemm(got, a, b)


def test_the_tasks_timelines_merge_into_one(rng, workdir):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (160, 60)), rand(rng, (60, 120))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        z = odask.matmul(da.from_array(a, chunks=40), da.from_array(b, chunks=40),
                         chunks=(40, 60), device="cpu", trace_dir=str(workdir))
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


def test_bad_inputs_fail_when_the_graph_is_built(rng, workdir):
    a = da.from_array(rand(rng, (10, 8)), chunks=4)
    with pytest.raises(oocgemm.ShapeError, match="inner dimensions"):
        odask.matmul(a, a)
    with pytest.raises(oocgemm.OptionError, match="unknown options"):
        odask.matmul(a, a.T, overwrite=True)
    with pytest.raises(oocgemm.OptionError, match="do not add up"):
        odask.matmul(a, a.T, chunks=((5, 4), (10,)))
    with pytest.raises(oocgemm.InputError):
        odask.matmul("missing.zarr", a.T)
    with pytest.raises(oocgemm.OptionError, match="beta != 0 needs c"):
        odask.matmul(a, a.T, beta=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_on_the_gpu(rng, workdir):
    a, b = rand(rng, (600, 500)), rand(rng, (500, 450))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(128, 100))[...] = a
    z = odask.matmul(da.from_zarr("a.zarr"), da.from_array(b, chunks=100), device="cuda",
                     memory_limit="4MB")
    with dask.config.set(scheduler="threads", num_workers=4):  # one run at a time on the GPU
        assert_gemm(z.compute(), a, b)
    assert len(_layer(z)) == len(z.chunks[0]) * len(z.chunks[1]) > 1

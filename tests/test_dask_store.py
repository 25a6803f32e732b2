"""oocgemm.dask.matmul's result stored by its groups' runs (issue 50): ``to_zarr`` and
``store`` into a Zarr array have each group write its region of C as ``multiply`` writes a
Zarr output (:mod:`oocgemm.dask.stored`), in one run where one process computes it all; the
target is marked complete only when every group has written; anything else is stored as
any dask array is."""

from __future__ import annotations

import os

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, poisoned, rand, zarr_stores
from dask.delayed import Delayed

import oocgemm
import oocgemm.dask as odask
from oocgemm import cuda
from oocgemm.dask import partition
from oocgemm.errors import OutputError
from oocgemm.storage.regions import ZarrRegion


def _complete(path_or_array):
    z = zarr.open_array(path_or_array) if isinstance(path_or_array, str) else path_or_array
    return dict(z.attrs).get("oocgemm", {}).get("complete")


def _group_runs(delayed: Delayed) -> int:
    return sum(1 for key in delayed.dask if isinstance(key, tuple)
               and key[0].startswith("oocgemm-store-") and key[0].endswith("-groups"))


def test_to_zarr_is_one_run_of_the_product_as_multiply_writes_it(rng, workdir, monkeypatch):
    a, b = rand(rng, (700, 530)), rand(rng, (530, 610))  # ragged against the chunks
    zarr_stores((128, 128), a=a, b=b)
    monkeypatch.setattr(partition, "GROUP_MEMORY", 1 << 20)  # bands of C held in memory
    c = odask.matmul("a.zarr", "b.zarr", device="cpu", memory_limit="4MB")
    assert len(c.dask.layers[c.name + "-groups"]) > 1  # computed: bands held in memory
    stored = c.to_zarr("c.zarr", compute=False)
    assert isinstance(stored, Delayed) and _group_runs(stored) == 1  # stored: one run
    assert _complete("c.zarr") is False  # created, not written yet
    stored.compute()
    got = zarr.open_array("c.zarr")
    assert _complete(got) is True and got.chunks == c.chunksize
    assert_gemm(got[...], a, b)
    # multiply writing the same layout: the same run, the same bits
    want = oocgemm.multiply("a.zarr", "b.zarr", out="m.zarr", device="cpu", memory_limit="4MB",
                            out_options={"chunks": got.chunks,
                                         "compressors": got.compressors}).out
    assert np.array_equal(got[...], want[...])
    assert want.compressors == got.compressors and got.compressors  # zarr's default: zstd


def test_store_into_an_existing_array_writes_every_cell(rng, workdir):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    zarr_stores((64, 64), a=a, b=b)
    c = odask.matmul("a.zarr", "b.zarr", device="cpu", groups=(128, 260))  # cut on chunks
    target = zarr.create_array("t.zarr", shape=c.shape, chunks=(64, 130), dtype="f8",
                               compressors=None, zarr_format=2)
    target[...] = poisoned(c.shape)
    stored = c.store(target, compute=False)
    assert isinstance(stored, Delayed) and _group_runs(stored) == 3  # the user's groups
    dask.compute(stored, scheduler="threads")
    assert _complete("t.zarr") is True
    assert_gemm(zarr.open_array("t.zarr")[...], a, b)


@pytest.mark.parametrize("case", ["groups cut the target's chunks", "a region of it",
                                  "return_stored", "X^T X (half computed)", "another dtype"])
def test_what_the_groups_cannot_write_alone_is_stored_chunk_by_chunk(rng, workdir, case):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    zarr_stores((64, 64), a=a, b=b)
    want = a @ b
    c = odask.matmul("a.zarr", "b.zarr", device="cpu", groups=(100, 260))
    dtype, kwargs = "f8", {}
    if case == "X^T X (half computed)":
        c, want = odask.matmul("a.zarr", "a.zarr", trans_a=True, device="cpu"), a.T @ a
    elif case == "another dtype":
        dtype = "f4"
    elif case == "a region of it":
        kwargs = {"regions": (slice(100, 400), slice(0, 260))}
    elif case == "return_stored":
        kwargs = {"return_stored": True}
    chunks = (64, 64) if case == "groups cut the target's chunks" else c.chunksize
    shape = (400, 260) if case == "a region of it" else c.shape
    target = zarr.create_array("t.zarr", shape=shape, chunks=chunks, dtype=dtype)
    target[...] = poisoned(shape, dtype)
    stored = c.store(target, compute=False, **kwargs)
    assert isinstance(stored, da.Array)  # dask's own store: a task per chunk
    stored.compute()
    got = zarr.open_array("t.zarr")[-c.shape[0]:]
    np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-5 if dtype == "f4" else 1e-12,
                               atol=1e-4 if dtype == "f4" else 1e-10)
    assert _complete("t.zarr") is None  # oocgemm marked nothing
    if case == "X^T X (half computed)":
        assert np.array_equal(got, got.T)


def test_an_input_as_the_target_is_refused_before_anything_is_written(rng, workdir):
    a, b = rand(rng, (256, 256)), rand(rng, (256, 256))
    zarr_stores((64, 64), a=a, b=b)
    c = odask.matmul("a.zarr", "b.zarr", device="cpu")
    target = zarr.open_array("a.zarr", mode="r+")
    before = dict(target.attrs)
    with pytest.raises(OutputError, match="same matrix as x"):
        c.store(target)
    assert dict(zarr.open_array("a.zarr").attrs) == before
    assert np.array_equal(zarr.open_array("a.zarr")[...], a)


def test_a_failed_group_leaves_the_target_incomplete(rng, workdir):
    a, b = rand(rng, (256, 192)), rand(rng, (192, 128))
    zarr_stores((64, 64), a=a, b=b)
    c = odask.matmul("a.zarr", "b.zarr", device="cpu", groups=(64, 128))
    stored = c.to_zarr("c.zarr", compute=False)
    os.rename("b.zarr", "gone.zarr")  # B gone once the graph is built
    with pytest.raises(oocgemm.OOCGemmError):
        stored.compute(scheduler="sync")
    assert _complete("c.zarr") is False


@pytest.mark.slow
def test_to_zarr_under_a_client_writes_each_workers_groups_there(rng, workdir):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (1024, 512)), rand(rng, (512, 1024))
    zarr_stores((128, 128), a=a, b=b)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        c = odask.matmul("a.zarr", "b.zarr", device="cpu", memory_limit="8MB")
        stored = c.to_zarr("c.zarr", compute=False)
        owners = c.dask.layers[c.name + "-groups"].annotations["workers"]
        assert _group_runs(stored) == len(c.dask.layers[c.name + "-groups"]) >= 4
        stored.compute()
    got = zarr.open_array("c.zarr")
    assert _complete(got) is True
    assert_gemm(got[...], a, b)
    assert len({owners(key)[0] for key in c.dask.layers[c.name + "-groups"]}) == 2


# --- the output behind it: a region of a Zarr array --------------------------------------
def test_runs_of_regions_make_the_whole_array(rng, workdir):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    z = zarr.create_array("c.zarr", shape=(300, 250), chunks=(64, 64), dtype="f8")
    z[...] = poisoned(z.shape)
    for r0, r1 in ((64, 300), (0, 64)):
        for c0, c1 in ((0, 128), (128, 250)):
            result = oocgemm.multiply(a[r0:r1], b[:, c0:c1], out=ZarrRegion(z, (r0, r1), (c0, c1)),
                                      device="cpu")
            assert result.out is None
    assert_gemm(zarr.open_array("c.zarr")[...], a, b)
    assert _complete(z) is None  # a region marks nothing: the whole is its writer's


@pytest.mark.parametrize("rows, cols, what", [
    ((10, 64), (0, 250), "cut the zarr array's chunks"),
    ((0, 320), (0, 250), "not inside"),
    ((0, 64), (0, 64), "cut the zarr array's chunks"),  # a sharded array: shards of 128
])
def test_a_region_that_other_runs_would_rewrite_is_refused(workdir, rows, cols, what):
    sharded = cols == (0, 64)
    z = zarr.create_array("c.zarr", shape=(300, 250), chunks=(64, 64), dtype="f8",
                          **({"shards": (128, 128)} if sharded else {}))
    with pytest.raises(OutputError, match=what):
        ZarrRegion(z, rows, cols)


def test_a_region_of_an_input_is_refused(rng, workdir):
    a = rand(rng, (128, 128))
    zarr_stores((64, 64), a=a)
    z = zarr.open_array("a.zarr", mode="r+")
    with pytest.raises(OutputError, match="shares storage with a|same matrix as a"):
        oocgemm.multiply(z, a, out=ZarrRegion(z, (0, 64), (0, 128)), device="cpu")
    assert np.array_equal(z[...], a)
    with pytest.raises(OutputError, match="read-only"):
        ZarrRegion(zarr.open_array("a.zarr", mode="r"), (0, 64), (0, 128))


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
@pytest.mark.parametrize("device", ["cuda", "cuda:all"])
def test_on_the_gpu_to_zarr_writes_the_files_multiply_writes(rng, workdir, device):
    a, b = rand(rng, (2048, 1536)), rand(rng, (1536, 1800))
    zarr_stores((512, 512), a=a, b=b)
    z = odask.matmul("a.zarr", "b.zarr", device=device, memory_limit="64MB")
    with dask.config.set(scheduler="threads"):
        z.to_zarr("c.zarr")
    got = zarr.open_array("c.zarr")
    assert _complete(got) is True
    assert_gemm(got[...], a, b)
    oocgemm.multiply("a.zarr", "b.zarr", out="m.zarr", device=device, memory_limit="64MB",
                     out_options={"chunks": got.chunks, "compressors": got.compressors})
    files = sorted(os.listdir(os.path.join("m.zarr", "c", "0")))
    assert files == sorted(os.listdir(os.path.join("c.zarr", "c", "0")))
    for i in range(-(-got.shape[0] // got.chunks[0])):
        for j in files:
            with open(os.path.join("c.zarr", "c", str(i), j), "rb") as mine, \
                    open(os.path.join("m.zarr", "c", str(i), j), "rb") as theirs:
                assert mine.read() == theirs.read(), (i, j)

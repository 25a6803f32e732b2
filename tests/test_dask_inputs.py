"""Dask (and xarray) inputs of ``oocgemm.multiply`` (issue 19): computed by the active scheduler
or Client, each chunk once per run; ``da.from_zarr`` arrays read from their store directly."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.storage import open_source
from oocgemm.storage.dask_arrays import DaskSource
from oocgemm.storage.zarr_store import ZarrSource


class Counter:
    """Counts the chunks a graph computes (per chunk position)."""

    def __init__(self):
        self.calls: dict[tuple, int] = {}
        self.lock = threading.Lock()

    def __call__(self, block, block_info=None):
        where = tuple(block_info[0]["chunk-location"])
        with self.lock:
            self.calls[where] = self.calls.get(where, 0) + 1
        return block * 1.0


def counted(x: np.ndarray, chunks, counter: Counter):
    return da.from_array(x, chunks=chunks).map_blocks(counter, dtype=x.dtype)


@pytest.mark.parametrize("tile", [(16, 12, 8), (13, 10, 7)])  # blocks along chunks, and across
def test_each_dask_chunk_is_computed_once_per_run(rng, tile):
    a, b = rand(rng, (60, 44)), rand(rng, (44, 50))
    ca, cb = Counter(), Counter()
    x, y = counted(a, (16, 11), ca), counted(b, (11, 25), cb)
    r = oocgemm.multiply(x, y, device="cpu", tile=tile)
    assert_gemm(r.out, a, b)
    assert set(r.plan.io.cache) == {"A", "B"}
    assert set(ca.calls.values()) == {1} and len(ca.calls) == 4 * 4
    assert set(cb.calls.values()) == {1} and len(cb.calls) == 4 * 2
    assert r.chunks["A"]["decodes"] == 16 and r.chunks["B"]["decodes"] == 8


def test_irregular_dask_chunks_are_read_on_a_regular_grid(rng):
    a, b = rand(rng, (30, 20)), rand(rng, (20, 25))
    x = da.from_array(a, chunks=((5, 15, 10), (7, 13)))
    source = open_source(x, "a")
    assert isinstance(source, DaskSource) and source.chunks == (15, 13)
    r = oocgemm.multiply(x, b, device="cpu", tile=(8, 8, 8))
    assert_gemm(r.out, a, b)


def test_from_zarr_is_read_from_its_store(rng, workdir):
    a, b = rand(rng, (50, 40)), rand(rng, (40, 30))
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(16, 8))[...] = a
    x = da.from_zarr("a.zarr")
    source = open_source(x, "a")
    assert isinstance(source, ZarrSource) and source.chunks == (16, 8)
    assert not isinstance(open_source(x[:, :20], "a"), ZarrSource)  # sliced: through dask
    r = oocgemm.multiply(x, b, "c.zarr", device="cpu", tile=(16, 16, 16))
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)
    assert r.chunks["A"]["decodes"] == 4 * 5


@pytest.mark.parametrize("compressor", ["zstd", None])
def test_from_zarr_of_a_local_folder_is_read_as_its_path_is(rng, workdir, compressor):
    """``da.from_zarr(path)`` opens the folder through fsspec: its source is the folder's, as
    ``multiply("a.zarr", ...)`` opens it (chunks decoded straight into the run's buffers, a
    compressed one's frames known for a GPU to decode, its page cache probed), not zarr's
    async file wrapper's (the dask path's groups read their inputs that way)."""
    a = rand(rng, (64, 48))
    kw = {} if compressor else {"compressors": None}
    zarr.create_array("a.zarr", shape=a.shape, dtype="f8", chunks=(16, 16), **kw)[...] = a
    by_path = open_source("a.zarr", "a")
    through_dask = open_source(da.from_zarr("a.zarr"), "a")
    assert through_dask.path == by_path.path == str(workdir / "a.zarr")
    for what in ("decodes_into", "sliced", "chunks"):
        assert getattr(through_dask, what) == getattr(by_path, what), what
    assert through_dask.zstd_frames == by_path.zstd_frames
    assert (through_dask.zstd_frames is not None) == (compressor == "zstd")
    out = np.empty((64, 48))
    through_dask.read((0, 64), (0, 48), out)
    assert np.array_equal(out, a)


def test_mixed_dask_path_and_numpy_inputs(rng, workdir):
    a, b, c = rand(rng, (40, 30)), rand(rng, (30, 20)), rand(rng, (40, 20))
    np.save("b.npy", b)
    r = oocgemm.multiply(da.from_array(a, chunks=(9, 7)), "b.npy", c=c, beta=-1.0,
                         device="cpu", tile=(10, 10, 10))
    assert_gemm(r.out, a, b, c, beta=-1.0)


def test_dask_inputs_run_on_the_active_scheduler(rng):
    a, b = rand(rng, (30, 20)), rand(rng, (20, 10))
    used = []

    def scheduler(dsk, keys, **kwargs):  # a scheduler of the user's, set as the default
        used.append(len(keys))
        return dask.get(dsk, keys, **kwargs)

    with dask.config.set(scheduler=scheduler):
        r = oocgemm.multiply(da.from_array(a, chunks=10), b, device="cpu", tile=(10, 10, 10))
    assert used, "the user's scheduler was not used"
    assert_gemm(r.out, a, b)


def test_dask_inputs_under_a_distributed_client(rng):
    distributed = pytest.importorskip("distributed")
    a, b = rand(rng, (40, 30)), rand(rng, (30, 20))

    def on_a_worker(block):
        distributed.get_worker()  # raises outside a worker: the chunk ran on the cluster
        return block

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        x = da.from_array(a, chunks=(10, 10)).map_blocks(on_a_worker, dtype=a.dtype)
        r = oocgemm.multiply(x, b, device="cpu", tile=(10, 10, 10))
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("backing", ["numpy", "dask"])
def test_xarray_dataarrays(rng, backing):
    xr = pytest.importorskip("xarray")
    a, b = rand(rng, (12, 9)), rand(rng, (9, 7))
    data = a if backing == "numpy" else da.from_array(a, chunks=4)
    x = xr.DataArray(data, dims=("sample", "feature"),
                     coords={"sample": np.arange(12) * 10, "site": ("sample", list("ab") * 6)})
    r = oocgemm.multiply(x, b, device="cpu")
    assert r.out.dims == ("sample", "dim_col")  # op(a)'s rows labelled; b has no labels
    assert list(r.out["sample"].values) == list(range(0, 120, 10))
    assert list(r.out["site"].values) == list("ab") * 6
    assert_gemm(np.asarray(r), a, b)
    with pytest.raises(oocgemm.InputError, match="not an array"):
        oocgemm.multiply(xr.Dataset({"x": x}), b, device="cpu")


def test_a_gram_product_of_a_dataarray_keeps_its_features(rng, workdir):
    """``X.T @ X`` of a (samples, features) DataArray: (features, features_2), each side
    with the features' coordinates, found to be a Gram product (exactly symmetric)."""
    xr = pytest.importorskip("xarray")
    a = rand(rng, (200, 5))
    x = xr.DataArray(a, dims=("samples", "features"),
                     coords={"features": list("abcde"), "unit": ("features", list("mmkkg"))})
    r = oocgemm.multiply(x.T, x, device="cpu", tile=(2, 2, 64))
    assert r.plan.symmetric
    assert r.out.dims == ("features", "features_2")
    assert list(r.out["features"].values) == list(r.out["features_2"].values) == list("abcde")
    assert list(r.out["unit_2"].values) == list("mmkkg")
    assert_gemm(np.asarray(r), a, a, trans_a=True)
    assert np.array_equal(np.asarray(r), np.asarray(r).T)
    stored = oocgemm.multiply(x.T, x, "c.zarr", device="cpu")  # an output of its own: as is
    assert not hasattr(stored.out, "dims")

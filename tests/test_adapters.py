"""What every storage adapter promises, as one suite of contracts subclassed per adapter (the
adapters are chosen by kind: ``oocgemm.storage.SOURCES`` and ``SINKS``). A new adapter gets
these tests by adding a class here."""

from __future__ import annotations

import os
import threading

import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import leftovers, rand

from oocgemm import storage
from oocgemm.errors import InputError, OutputError
from oocgemm.storage import SINKS, SOURCES, MatrixSink, MatrixSource, kind_of_path, open_source
from oocgemm.storage.base import ChunkedSource
from oocgemm.storage.regions import ZarrRegion

SHAPE = (37, 29)  # ragged against every chunking below


class SourceContract:
    """Subclasses say how their adapter is given a matrix ``x`` (``given``) and which kind
    they expect it to be read as."""

    kind: str
    dtypes = ("float64", "float32", "complex128")

    def given(self, x: np.ndarray):  # pragma: no cover - each adapter says
        raise NotImplementedError

    @pytest.fixture(params=dtypes)
    def x(self, request, rng, workdir):
        return rand(rng, SHAPE, request.param)

    def open(self, x) -> MatrixSource:
        return open_source(self.given(x), "a")

    def test_is_read_by_its_kind(self, x, monkeypatch):
        seen = []
        opener = storage._adapter(SOURCES, self.kind)

        def watched(*args):
            seen.append(self.kind)
            return opener(*args)

        monkeypatch.setitem(SOURCES, self.kind, watched)
        self.open(x).close()
        assert seen == [self.kind]

    def test_shape_dtype_and_name(self, x):
        src = self.open(x)
        assert tuple(src.shape) == x.shape and np.dtype(src.dtype) == x.dtype
        assert isinstance(src.name, str) and src.name
        assert src.path is None or os.path.exists(src.path) or "://" in src.path
        src.close()

    def test_reads_every_region_including_the_ragged_edges(self, x, rng):
        src = self.open(x)
        wide = np.complex128 if x.dtype.kind == "c" else np.float64
        regions = [((0, 37), (0, 29)), ((36, 37), (28, 29)), ((5, 5), (0, 29))]
        regions += [tuple(tuple(sorted(rng.integers(0, n + 1, 2))) for n in SHAPE)
                    for _ in range(20)]
        for rows, cols in regions:
            for dtype in (x.dtype, wide):  # the stored dtype, or a wider one
                out = np.full((rows[1] - rows[0], cols[1] - cols[0]), np.nan, dtype=dtype)
                src.read(rows, cols, out)
                np.testing.assert_array_equal(out, x[rows[0]:rows[1], cols[0]:cols[1]])
        src.close()

    def test_chunks_decode_whole_and_clipped_at_the_edges(self, x):
        src = self.open(x)
        if not (isinstance(src, ChunkedSource) and src.chunks):
            pytest.skip("no chunk grid")
        ch, cw = src.chunks
        for i in range(-(-SHAPE[0] // ch)):
            for j in range(-(-SHAPE[1] // cw)):
                want = x[i * ch:(i + 1) * ch, j * cw:(j + 1) * cw]
                out = np.empty(want.shape, dtype=src.dtype)
                src.read_chunk((i, j), out)
                np.testing.assert_array_equal(out, want)
        src.close()

    def test_a_view_is_none_or_the_data_itself(self, x):
        src = self.open(x)
        view = src.view((0, SHAPE[0]), (0, SHAPE[1]), x.dtype)
        assert view is None or np.array_equal(view, x)
        src.close()
        src.close()  # closing twice is harmless


class TestNumpyArray(SourceContract):
    kind = "numpy"

    def given(self, x):
        return x


class TestNumpyMemmap(SourceContract):
    kind = "numpy"

    def given(self, x):
        np.save("m.npy", x)
        return np.load("m.npy", mmap_mode="r")


class TestNpyPath(SourceContract):
    kind = "npy"

    def given(self, x):
        np.save("x.npy", x)
        return "x.npy"


class TestZarrV2Path(SourceContract):
    kind = "zarr"

    def given(self, x):
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(8, 7),
                          zarr_format=2)[...] = x
        return "x.zarr"


class TestZarrV3Path(SourceContract):
    kind = "zarr"

    def given(self, x):
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(10, 6))[...] = x
        return "x.zarr"


class TestShardedZarrPath(SourceContract):
    kind = "zarr"

    def given(self, x):
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(5, 4),
                          shards=(10, 8))[...] = x
        return "x.zarr"


class TestZipPath(SourceContract):
    kind = "zip"  # a Zarr array in a zip file, read through zarr's ZipStore

    def given(self, x):
        with zarr.storage.ZipStore("x.zip", mode="w") as store:
            zarr.create_array(store, shape=x.shape, dtype=x.dtype, chunks=(10, 6))[...] = x
        return "x.zip"


class TestFileUrl(SourceContract):
    kind = "zarr"  # a file:// URL is a local path

    def given(self, x):
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(9, 9))[...] = x
        return "file://" + os.path.abspath("x.zarr")


class TestZarrArray(SourceContract):
    kind = "zarr array"

    def given(self, x):
        z = zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(12, 10))
        z[...] = x
        return z


class TestDaskArray(SourceContract):
    kind = "dask array"

    def given(self, x):
        return da.from_array(x, chunks=(10, 8)) * 1  # computed by dask, not read from a store


class TestDaskFromZarr(SourceContract):
    kind = "dask array"  # read from its store, at the store's chunks

    def given(self, x):
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(10, 10))[...] = x
        return da.from_zarr("x.zarr")


class TestXarray(SourceContract):
    kind = "xarray array"

    def given(self, x):
        xr = pytest.importorskip("xarray")
        return xr.DataArray(da.from_array(x, chunks=(20, 20)), dims=("i", "j"))


class SinkContract:
    """Subclasses say what target their adapter writes (``target``), how to read back what it
    committed (``read_back``), and whether a target is a path (nothing there until commit)."""

    kind: str
    path: str | None = None

    def target(self):  # pragma: no cover - each adapter says
        raise NotImplementedError

    def read_back(self, committed) -> np.ndarray:
        return np.asarray(committed[...])

    def open(self, target, dtype="float64") -> MatrixSink:
        return storage.open_sink(target, shape=SHAPE, dtype=np.dtype(dtype))

    def test_blocks_written_from_threads_are_committed_whole(self, rng, workdir):
        x = rand(rng, SHAPE)
        sink = self.open(self.target())
        blocks = [((r, min(r + 10, 37)), (c, min(c + 8, 29)))
                  for r in range(0, 37, 10) for c in range(0, 29, 8)]
        rng.shuffle(blocks)
        threads = [threading.Thread(target=sink.write, args=(rows, cols, x[slice(*rows),
                                                                         slice(*cols)].copy()))
                   for rows, cols in blocks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.path is not None:
            assert not os.path.exists(self.path)  # nothing looks complete before the commit
        committed = sink.commit()
        np.testing.assert_array_equal(self.read_back(committed), x)
        if self.path is not None:
            np.testing.assert_array_equal(_read_path(self.path), x)
        assert leftovers(".") == []

    def test_an_aborted_output_leaves_nothing(self, rng, workdir):
        if self.path is None:
            pytest.skip("written in place: the array is the caller's")
        sink = self.open(self.target())
        sink.write((0, 10), (0, 8), rand(rng, (10, 8)))
        sink.abort()
        assert not os.path.exists(self.path) and leftovers(".") == []

    def test_an_existing_path_is_not_replaced_unasked(self, workdir):
        if self.path is None:
            pytest.skip("not a path")
        self.open(self.target()).commit()
        with pytest.raises(OutputError, match="exists"):
            self.open(self.target())


def _read_path(path: str) -> np.ndarray:
    src = open_source(path, "c")
    out = np.empty(src.shape, dtype=src.dtype)
    src.read((0, src.shape[0]), (0, src.shape[1]), out)
    src.close()
    return out


class TestNpySink(SinkContract):
    kind, path = "npy", "c.npy"

    def target(self):
        return self.path


class TestZarrSink(SinkContract):
    kind, path = "zarr", "c.zarr"

    def target(self):
        return self.path


class TestNumpySink(SinkContract):
    kind = "numpy"

    def target(self):
        return np.full(SHAPE, np.nan)


class TestZarrArraySink(SinkContract):
    kind = "zarr array"

    def target(self):
        return zarr.create_array("given.zarr", shape=SHAPE, dtype="f8", chunks=(10, 8))


class TestZarrRegionSink(SinkContract):
    """A region of a larger array, on its chunks' edges, reaching its last rows and columns:
    written whole, and nothing around it."""

    kind = "oocgemm array"
    top, left = 10, 8

    def target(self):
        whole = (self.top + SHAPE[0], self.left + SHAPE[1])
        z = zarr.create_array("given.zarr", shape=whole, dtype="f8", chunks=(10, 8))
        z[...] = np.nan
        return ZarrRegion(z, (self.top, whole[0]), (self.left, whole[1]))

    def read_back(self, committed) -> np.ndarray:
        assert committed is None  # the whole array is its writer's to publish
        z = zarr.open_array("given.zarr", mode="r")[...]
        assert np.isnan(z[:self.top]).all() and np.isnan(z[:, :self.left]).all()
        return z[self.top:, self.left:]


def test_every_adapter_has_its_contract_here():
    sources = {cls.kind for cls in SourceContract.__subclasses__()}
    sinks = {cls.kind for cls in SinkContract.__subclasses__()}
    assert sources >= set(SOURCES) - {"url", "cupy array"}  # URLs: test_urls; CuPy: the GPU
    assert sinks >= set(SINKS) - {"url", "cupy array"}


def test_adapters_registered_by_suffix_are_chosen_by_name(rng, workdir, monkeypatch):
    for table in ("SOURCES", "SINKS", "SUFFIXES"):  # registered for this test only
        monkeypatch.setattr(storage, table, dict(getattr(storage, table)))
    x = rand(rng, (6, 4))
    np.savetxt("x.csv", x, delimiter=",")

    def csv_source(path, role, storage_options, incomplete_ok):
        from oocgemm.storage.memory import NumpySource

        return NumpySource(np.loadtxt(path, delimiter=",", ndmin=2), name=f"{role} ({path})")

    storage.register_source("csv", csv_source, suffix=".csv")
    assert kind_of_path("x.csv") == "csv"
    np.testing.assert_allclose(_read_path("x.csv"), x)

    # by name: imported when first used; a round trip through a sink and a source
    storage.register_sink("raw", "oocgemm.storage:_npy_sink", suffix=".raw")
    storage.register_source("raw", "oocgemm.storage:_npy_source", suffix=".raw")
    sink = storage.open_sink("c.raw", shape=x.shape, dtype=x.dtype)
    sink.write((0, 6), (0, 4), x)
    sink.commit()
    np.testing.assert_array_equal(_read_path("c.raw"), x)
    assert callable(storage.SINKS["raw"]) and callable(storage.SOURCES["raw"])
    with pytest.raises(InputError, match="expected a path"):
        open_source(object(), "a")

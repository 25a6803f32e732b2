"""Input kinds, output kinds and dtypes."""

from __future__ import annotations

import pathlib

import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, poisoned, rand

import oocgemm

INPUT_KINDS = ["numpy", "transposed-view", "strided", "fortran", "memmap", "npy", "npy-pathlib",
               "zarr2", "zarr3", "zarr2-array", "zarr3-array", "zarr-zip", "dask"]


def as_kind(kind: str, x: np.ndarray, directory: pathlib.Path, name: str, rng):
    """``x`` stored or viewed as ``kind``; what is passed to multiply() has x's values."""
    if kind == "numpy":
        return x.copy()
    if kind == "transposed-view":
        view = np.ascontiguousarray(x.T).T
        assert not view.flags.c_contiguous or x.shape[0] <= 1
        return view
    if kind == "strided":
        big = rand(rng, (2 * x.shape[0] + 1, 3 * x.shape[1] + 2), x.dtype)
        view = big[1::2, 2::3][: x.shape[0], : x.shape[1]]
        view[...] = x
        return view
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "memmap":
        path = directory / f"{name}.raw"
        mm = np.memmap(path, dtype=x.dtype, mode="w+", shape=x.shape)
        mm[...] = x
        mm.flush()
        return np.memmap(path, dtype=x.dtype, mode="r", shape=x.shape)
    if kind in ("npy", "npy-pathlib"):
        path = directory / f"{name}.npy"
        np.save(path, x)
        return path if kind == "npy-pathlib" else str(path)
    if kind == "zarr-zip":  # a Zarr array in a zip file, named by its path
        path = str(directory / f"{name}.zip")
        with zarr.storage.ZipStore(path, mode="w") as store:
            zarr.create_array(store, shape=x.shape, dtype=x.dtype, chunks=(5, 4))[...] = x
        return path
    if kind.startswith("zarr"):
        fmt = 2 if kind.startswith("zarr2") else 3
        path = str(directory / f"{name}-v{fmt}.zarr")
        z = zarr.create_array(path, shape=x.shape, dtype=x.dtype, chunks=(5, 4), zarr_format=fmt)
        z[...] = x
        if kind.endswith("-array"):
            return zarr.open_array(path, mode="r")
        return path
    if kind == "dask":
        return da.from_array(x, chunks=(4, 6))
    raise AssertionError(kind)


@pytest.mark.parametrize("trans", [(False, False), (True, True)])
@pytest.mark.parametrize("kind", INPUT_KINDS)
def test_input_kinds(rng, tmp_path, kind, trans):
    trans_a, trans_b = trans
    m, n, k = 17, 13, 11
    a = rand(rng, (k, m) if trans_a else (m, k))
    b = rand(rng, (n, k) if trans_b else (k, n))
    c = rand(rng, (m, n))
    xa = as_kind(kind, a, tmp_path, "a", rng)
    xb = as_kind(kind, b, tmp_path, "b", rng)
    xc = as_kind(kind, c, tmp_path, "c", rng)
    r = oocgemm.multiply(xa, xb, c=xc, alpha=-1.25, beta=0.5, trans_a=trans_a,
                         trans_b=trans_b, tile=(4, 5, 3), device="cpu")
    assert_gemm(r.out, a, b, c, alpha=-1.25, beta=0.5, trans_a=trans_a, trans_b=trans_b)


@pytest.mark.parametrize("kind_b", ["zarr2", "dask", "memmap", "strided"])
@pytest.mark.parametrize("kind_a", ["npy", "zarr3-array", "fortran"])
def test_mixed_input_kinds(rng, tmp_path, kind_a, kind_b):
    a, b = rand(rng, (9, 12)), rand(rng, (12, 10))
    r = oocgemm.multiply(as_kind(kind_a, a, tmp_path, "a", rng),
                         as_kind(kind_b, b, tmp_path, "b", rng), tile=(4, 3, 5), device="cpu")
    assert_gemm(r.out, a, b)


def test_zarr_inputs_read_only_what_is_needed(rng, tmp_path):
    """Sanity of the traffic accounting: A is read once per block column here."""
    a, b = rand(rng, (12, 10)), rand(rng, (10, 9))
    r = oocgemm.multiply(as_kind("zarr3", a, tmp_path, "a", rng),
                         as_kind("zarr3", b, tmp_path, "b", rng), tile=(4, 3, 5), device="cpu")
    assert_gemm(r.out, a, b)
    assert r.bytes["storage_read"] >= (a.size + b.size) * 8


# -- outputs ---------------------------------------------------------------------------------
def test_out_none_gives_numpy(rng):
    a, b = rand(rng, (6, 5)), rand(rng, (5, 4))
    r = oocgemm.multiply(a, b, device="cpu")
    assert isinstance(r.out, np.ndarray) and not isinstance(r.out, np.memmap)
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("pathlike", [False, True])
def test_out_npy_path(rng, workdir, pathlike):
    a, b = rand(rng, (11, 7)), rand(rng, (7, 9))
    out = pathlib.Path("c.npy") if pathlike else "c.npy"
    r = oocgemm.multiply(a, b, out, tile=(4, 4, 3), device="cpu")
    assert isinstance(r.out, np.memmap)
    assert_gemm(np.load("c.npy"), a, b)
    assert_gemm(r.out, a, b)
    assert leftovers(workdir) == []


@pytest.mark.parametrize("tile", [(4, 6, 3), (5, 7, 2), (11, 13, 9), None])
def test_out_zarr_path_is_v3_chunk_aligned_and_complete(rng, workdir, tile):
    m, n, k = 11, 13, 9
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    r = oocgemm.multiply(a, b, "c.zarr", tile=tile, device="cpu")
    z = zarr.open_array("c.zarr", mode="r")
    assert z.metadata.zarr_format == 3
    assert z.shape == (m, n) and z.dtype == np.float64
    w, h, _ = r.plan.tile
    cr, cc = z.chunks
    assert w % cr == 0 and h % cc == 0, (r.plan.tile, z.chunks)  # every block write is whole chunks
    assert z.attrs["oocgemm"]["complete"] is True
    assert_gemm(z[:], a, b)
    assert isinstance(r.out, zarr.Array)
    assert_gemm(r.out[:], a, b)
    assert leftovers(workdir) == []


def test_out_given_numpy_array_written_in_place(rng):
    a, b = rand(rng, (10, 8)), rand(rng, (8, 12))
    out = poisoned((10, 12))
    r = oocgemm.multiply(a, b, out, tile=(3, 5, 3), device="cpu")
    assert r.out is out
    assert_gemm(out, a, b)


def test_out_given_non_contiguous_numpy_array(rng):
    a, b = rand(rng, (10, 8)), rand(rng, (8, 12))
    big = poisoned((12, 30))
    out = big[1:11, ::2][:, :12].T.T  # a strided view into a larger array
    before = big.copy()
    oocgemm.multiply(a, b, out, tile=(3, 5, 3), device="cpu")
    assert_gemm(out, a, b)
    mask = np.ones(big.shape, bool)
    mask[1:11, 0:24:2] = False
    np.testing.assert_array_equal(big[mask], before[mask])  # nothing outside the view


@pytest.mark.parametrize("chunks", [(3, 5), (4, 4), (10, 12)])
def test_out_given_zarr_array(rng, tmp_path, chunks):
    a, b = rand(rng, (10, 8)), rand(rng, (8, 12))
    z = zarr.create_array(str(tmp_path / "given.zarr"), shape=(10, 12), dtype="f8", chunks=chunks)
    z[:] = poisoned((10, 12))
    r = oocgemm.multiply(a, b, z, tile=(3, 5, 3), device="cpu")
    assert r.out is z
    assert_gemm(zarr.open_array(str(tmp_path / "given.zarr"), mode="r")[:], a, b)
    assert z.attrs["oocgemm"]["complete"] is True


@pytest.mark.parametrize("tile", [(4, 4, 40), (16, 8, 13), (5, 7, 3), None])
def test_out_given_sharded_zarr_array(rng, tmp_path, tile):
    """Blocks aligned to the inner chunks but not to the shards share a shard: concurrent
    writes of such blocks would lose each other's updates."""
    a, b = rand(rng, (32, 40)), rand(rng, (40, 48))
    path = str(tmp_path / "sharded.zarr")
    z = zarr.create_array(path, shape=(32, 48), dtype="f8", chunks=(4, 4), shards=(16, 16))
    z[:] = poisoned((32, 48))
    r = oocgemm.multiply(a, b, z, tile=tile, device="cpu")
    if tile is None:  # the planner aligns C blocks to the shards
        w, h, _ = r.plan.tile
        assert w % 16 == 0 and h % 16 == 0, r.plan.tile
    assert_gemm(zarr.open_array(path, mode="r")[:], a, b)


def test_sharded_zarr_input(rng, tmp_path):
    a, b = rand(rng, (19, 17)), rand(rng, (17, 11))
    path = str(tmp_path / "a.zarr")
    zarr.create_array(path, shape=a.shape, dtype="f8", chunks=(4, 4), shards=(8, 8))[:] = a
    for tile in [(5, 7, 6), None]:
        assert_gemm(oocgemm.multiply(path, b, tile=tile, device="cpu").out, a, b)


def test_zarr_v2_fortran_order_input(rng, tmp_path):
    a, b = rand(rng, (17, 12)), rand(rng, (12, 9))
    path = str(tmp_path / "f.zarr")
    zarr.create_array(path, shape=a.shape, dtype="f8", chunks=(5, 5), zarr_format=2,
                      order="F")[:] = a
    assert_gemm(oocgemm.multiply(path, b, tile=(4, 3, 5), device="cpu").out, a, b)


def test_out_given_in_memory_zarr_array(rng):
    a, b = rand(rng, (7, 8)), rand(rng, (8, 5))
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(7, 5), dtype="f4", chunks=(2, 2))
    r = oocgemm.multiply(a.astype("f4"), b.astype("f4"), z, tile=(3, 2, 3), device="cpu")
    assert_gemm(r.out[:], a.astype("f4"), b.astype("f4"))


def test_out_read_only_zarr_is_refused(rng, tmp_path):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 2))
    zarr.create_array(str(tmp_path / "ro.zarr"), shape=(4, 2), dtype="f8")
    ro = zarr.open_array(str(tmp_path / "ro.zarr"), mode="r")
    with pytest.raises(oocgemm.OutputError, match="read-only"):
        oocgemm.multiply(a, b, ro, device="cpu")


def test_out_read_only_numpy_is_refused(rng):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 2))
    out = np.zeros((4, 2))
    out.flags.writeable = False
    with pytest.raises(oocgemm.OutputError, match="read-only"):
        oocgemm.multiply(a, b, out, device="cpu")


# -- dtypes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("out_kind", [None, "npy", "zarr"])
def test_dtypes(rng, workdir, dtype, out_kind):
    m, n, k = 14, 9, 23
    a, b, c = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype)
    alpha = (0.5 - 1.5j) if dtype.startswith("complex") else -0.5
    out = None if out_kind is None else f"c.{out_kind}"
    r = oocgemm.multiply(a, b, out, c=c, alpha=alpha, beta=2.0, tile=(4, 4, 5), device="cpu")
    got = r.out[:]
    assert got.dtype == np.dtype(dtype)
    assert r.plan.problem.dtype == dtype
    assert_gemm(got, a, b, c, alpha=alpha, beta=2.0, dtype=dtype)


def test_float32_is_not_computed_in_float64_by_accident(rng):
    """float32 results are float32 (the tolerance above is float32's)."""
    a, b = rand(rng, (8, 300), "float32"), rand(rng, (300, 6), "float32")
    r = oocgemm.multiply(a, b, tile=(4, 3, 64), device="cpu")
    assert r.out.dtype == np.float32
    assert_gemm(r.out, a, b, dtype="float32")


@pytest.mark.parametrize("da_,db_,dc_,beta,want", [
    ("float32", "float64", None, 0.0, "float64"),
    ("float64", "float32", None, 0.0, "float64"),
    ("float32", "complex64", None, 0.0, "complex64"),
    ("float64", "complex64", None, 0.0, "complex128"),
    ("float32", "float32", "float64", 1.0, "float64"),   # c joins the promotion when read
    ("float32", "float32", "float64", 0.0, "float32"),   # ...and not when beta == 0
    ("float32", "float32", "complex64", -0.5, "complex64"),
])
def test_mixed_dtypes_follow_numpy_promotion(rng, da_, db_, dc_, beta, want):
    a, b = rand(rng, (7, 9), da_), rand(rng, (9, 5), db_)
    c = rand(rng, (7, 5), dc_) if dc_ else None
    assert np.result_type(*(x.dtype for x in (a, b, c) if x is not None and (x is not c or beta)))\
        == np.dtype(want)
    r = oocgemm.multiply(a, b, c=c, beta=beta, tile=(3, 2, 4), device="cpu")
    assert r.out.dtype == np.dtype(want)
    assert_gemm(r.out, a, b, c, beta=beta, dtype=want)


def test_big_endian_input(rng, workdir):
    a = rand(rng, (6, 5)).astype(">f8")
    b = rand(rng, (5, 4))
    np.save("a.npy", a)
    r = oocgemm.multiply("a.npy", b, device="cpu")
    assert r.out.dtype == np.float64
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("bad", ["int32", "int64", "bool", "float16", "object", "uint8"])
@pytest.mark.parametrize("role", ["a", "b", "c"])
def test_unsupported_dtypes(rng, bad, role):
    a, b, c = rand(rng, (4, 3)), rand(rng, (3, 5)), rand(rng, (4, 5))
    arrays = {"a": a, "b": b, "c": c}
    arrays[role] = (arrays[role] * 10).astype(bad)
    with pytest.raises(oocgemm.DTypeError, match=rf"{role}.*{np.dtype(bad)}"):
        oocgemm.multiply(arrays["a"], arrays["b"], c=arrays["c"], beta=1.0, device="cpu")


def test_unsupported_out_dtype(rng):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    with pytest.raises(oocgemm.DTypeError, match="int64"):
        oocgemm.multiply(a, b, np.zeros((4, 5), dtype=np.int64), device="cpu")
    with pytest.raises(oocgemm.DTypeError, match="complex"):
        oocgemm.multiply(a.astype(complex), b, np.zeros((4, 5)), device="cpu")


def test_unsupported_dtype_in_a_file(rng, workdir):
    np.save("a.npy", np.arange(12, dtype=np.int32).reshape(4, 3))
    with pytest.raises(oocgemm.DTypeError, match="int32"):
        oocgemm.multiply("a.npy", rand(rng, (3, 2)), device="cpu")


@pytest.mark.parametrize("bad", ["int8", "float16", "nonsense", object])
def test_unsupported_dtype_by_name(tmp_path, bad):
    """A dtype asked for by name (oocgemm random, the benchmarks) fails as an operand's does."""
    from oocgemm import random_matrices

    with pytest.raises(oocgemm.DTypeError, match="not supported; use one of float32"):
        random_matrices.check_dtype(bad)
    with pytest.raises(oocgemm.DTypeError):
        random_matrices.write_random(tmp_path / "x.npy", (2, 2), bad)
    assert random_matrices.check_dtype(">f8") == np.dtype(">f8")


def test_complex_scalars_need_complex_operands(rng):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    with pytest.raises(oocgemm.DTypeError, match="complex"):
        oocgemm.multiply(a, b, alpha=1j, device="cpu")


@pytest.mark.parametrize("out_dtype", ["float32", "complex64", "complex128"])
def test_out_array_of_another_supported_dtype(rng, out_dtype):
    """A given out of another (supported) dtype receives the float64 product, cast."""
    a, b, c = rand(rng, (9, 7)), rand(rng, (7, 8)), rand(rng, (9, 8))
    out = poisoned((9, 8), out_dtype)
    r = oocgemm.multiply(a, b, out, c=c, beta=0.5, tile=(4, 3, 2), device="cpu")
    assert r.out is out and r.plan.problem.dtype == "float64"
    assert_gemm(out, a, b, c, beta=0.5, dtype=np.finfo(out_dtype).dtype)


def test_out_given_memmap(rng, tmp_path):
    a, b = rand(rng, (9, 7)), rand(rng, (7, 8))
    path = tmp_path / "out.raw"
    mm = np.memmap(path, dtype="f8", mode="w+", shape=(9, 8))
    mm[:] = np.nan
    r = oocgemm.multiply(a, b, mm, tile=(4, 3, 2), device="cpu")
    assert r.out is mm
    assert_gemm(np.fromfile(path).reshape(9, 8), a, b)  # flushed to the file

"""In-place updates (beta != 0 reading the output) and what a failed run leaves behind."""

from __future__ import annotations

import os

import dask.array as da
import numcodecs
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, poisoned, rand

import oocgemm


def save(path: str, x: np.ndarray, chunks=(4, 4)):
    if path.endswith(".npy"):
        np.save(path, x)
    else:
        z = zarr.create_array(path, shape=x.shape, dtype=x.dtype, chunks=chunks)
        z[...] = x


def load(path: str) -> np.ndarray:
    return np.load(path) if path.endswith(".npy") else zarr.open_array(path, mode="r")[:]


def corrupt_zarr_chunks(path: str, how: str = "garble") -> None:
    """Garble (or truncate) every stored chunk of a Zarr v3 array."""
    chunks = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "c")) for f in fs]
    assert chunks
    for chunk in chunks:
        data = open(chunk, "rb").read()
        with open(chunk, "wb") as fh:
            fh.write(data[: len(data) // 2] if how == "truncate" else b"\x00garbage" * 3)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (-0.5, 2.0), (0.0, -1.0), (2.0, 0.5)])
@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_update_existing_out_path_in_place(rng, workdir, suffix, alpha, beta):
    m, n, k = 13, 10, 7
    a, b, old = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    path = "c" + suffix
    save(path, old)
    r = oocgemm.multiply(a, b, path, alpha=alpha, beta=beta, tile=(4, 3, 2), device="cpu")
    assert r.plan.problem.c is not None
    assert_gemm(load(path), a, b, old, alpha=alpha, beta=beta)
    assert_gemm(r.out[:], a, b, old, alpha=alpha, beta=beta)
    if suffix == ".zarr":
        assert zarr.open_array(path, mode="r").attrs["oocgemm"]["complete"] is True
    assert leftovers(workdir) == []


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_c_given_as_the_same_path_as_out(rng, workdir, suffix):
    m, n, k = 9, 11, 6
    a, b, old = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    path = "c" + suffix
    save(path, old)
    oocgemm.multiply(a, b, path, c=path, beta=-0.75, tile=(3, 4, 4), device="cpu")
    assert_gemm(load(path), a, b, old, beta=-0.75)
    # also through another spelling of the same path
    again = load(path)
    oocgemm.multiply(a, b, "./" + path, c=os.path.abspath(path), beta=2.0, tile=(3, 4, 4),
                     device="cpu")
    assert_gemm(load(path), a, b, again, beta=2.0)
    assert leftovers(workdir) == []


def test_update_given_numpy_array_in_place(rng):
    a, b, old = rand(rng, (8, 5)), rand(rng, (5, 9)), rand(rng, (8, 9))
    out = old.copy()
    r = oocgemm.multiply(a, b, out, alpha=3.0, beta=-1.0, tile=(3, 4, 2), device="cpu")
    assert r.out is out
    assert_gemm(out, a, b, old, alpha=3.0, beta=-1.0)


def test_c_is_out_same_numpy_array(rng):
    a, b, old = rand(rng, (8, 5)), rand(rng, (5, 9)), rand(rng, (8, 9))
    out = old.copy()
    oocgemm.multiply(a, b, out, c=out, beta=0.5, tile=(2, 2, 2), device="cpu")
    assert_gemm(out, a, b, old, beta=0.5)


def test_update_given_zarr_array_in_place(rng, tmp_path):
    a, b, old = rand(rng, (8, 5)), rand(rng, (5, 9)), rand(rng, (8, 9))
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=old.shape, dtype="f8", chunks=(3, 3))
    z[:] = old
    oocgemm.multiply(a, b, z, beta=1.0, tile=(4, 4, 2), device="cpu")
    assert_gemm(zarr.open_array(str(tmp_path / "z.zarr"), mode="r")[:], a, b, old, beta=1.0)


def test_in_place_needs_c_or_existing_out(rng, workdir):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    with pytest.raises(oocgemm.OptionError, match="beta != 0"):
        oocgemm.multiply(a, b, beta=1.0, device="cpu")
    with pytest.raises(oocgemm.OptionError, match="beta != 0"):
        oocgemm.multiply(a, b, "missing.zarr", beta=1.0, device="cpu")
    assert not os.path.exists("missing.zarr")


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_in_place_out_of_wrong_shape_is_refused_and_left_alone(rng, workdir, suffix):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    path = "c" + suffix
    old = rand(rng, (6, 5))
    save(path, old)
    with pytest.raises(oocgemm.ShapeError, match=r"\(6, 5\).*\(4, 5\)"):
        oocgemm.multiply(a, b, path, beta=1.0, device="cpu")
    np.testing.assert_array_equal(load(path), old)


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
@pytest.mark.parametrize("stored, inputs", [("float32", "float64"), ("float64", "complex128")])
def test_in_place_update_of_a_stored_out_keeps_its_dtype_or_is_refused(rng, workdir, suffix,
                                                                      stored, inputs):
    """A stored output updated in place is written anew: in the product's dtype it would
    have changed the user's array's type (float64 to complex128 silently). Refused before any
    work, the array left as it was; the same dtype updates it."""
    a, b = rand(rng, (4, 3)).astype(inputs), rand(rng, (3, 5)).astype(inputs)
    path = "c" + suffix
    old = rand(rng, (4, 5)).astype(stored)
    save(path, old)
    with pytest.raises(oocgemm.DTypeError, match=f"is {stored} and is updated in place"):
        oocgemm.multiply(a, b, path, beta=1.0, device="cpu")
    kept = load(path)
    assert kept.dtype == np.dtype(stored)
    np.testing.assert_array_equal(kept, old)
    assert leftovers(".") == []
    a, b = np.real(a).astype(stored), np.real(b).astype(stored)
    oocgemm.multiply(a, b, path, beta=1.0, device="cpu")
    assert load(path).dtype == np.dtype(stored)
    assert_gemm(load(path), a, b, old, beta=1.0, dtype=stored)


def test_in_place_out_that_is_not_a_matrix(rng, workdir):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    np.save("c.npy", rand(rng, (20,)))
    with pytest.raises(oocgemm.InputError, match="not a matrix"):
        oocgemm.multiply(a, b, "c.npy", beta=1.0, device="cpu")


def test_in_place_numpy_out_of_wrong_shape(rng):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    with pytest.raises(oocgemm.ShapeError, match="out has shape"):
        oocgemm.multiply(a, b, rand(rng, (5, 4)), beta=1.0, device="cpu")


def test_out_overlapping_c_is_refused(rng):
    a, b = rand(rng, (4, 3)), rand(rng, (3, 5))
    big = rand(rng, (5, 5))
    before = big.copy()
    with pytest.raises(oocgemm.OutputError, match="shares storage with c"):
        oocgemm.multiply(a, b, big[1:], c=big[:4], beta=1.0, device="cpu")
    np.testing.assert_array_equal(big, before)


# -- failures mid-run ------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["garble", "truncate"])
@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_failed_run_leaves_no_output(rng, workdir, suffix, how):
    m, n, k = 12, 10, 9
    a = rand(rng, (m, k))
    save("b.zarr", rand(rng, (k, n)))
    corrupt_zarr_chunks("b.zarr", how)
    out = "c" + suffix
    with pytest.raises(oocgemm.OOCGemmError, match="b.zarr.*corrupt or truncated chunk"):
        oocgemm.multiply(a, "b.zarr", out, tile=(4, 3, 3), device="cpu")
    assert not os.path.exists(out)
    assert leftovers(workdir) == []


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_failed_in_place_update_keeps_the_original(rng, workdir, suffix):
    m, n, k = 12, 10, 9
    a, old = rand(rng, (m, k)), rand(rng, (m, n))
    save("b.zarr", rand(rng, (k, n)))
    corrupt_zarr_chunks("b.zarr")
    path = "c" + suffix
    save(path, old)
    with pytest.raises(oocgemm.OOCGemmError, match="corrupt"):
        oocgemm.multiply(a, "b.zarr", path, beta=1.0, tile=(4, 3, 3), device="cpu")
    np.testing.assert_array_equal(load(path), old)
    assert leftovers(workdir) == []


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_failed_overwrite_keeps_the_original(rng, workdir, suffix):
    save("b.zarr", rand(rng, (9, 10)))
    corrupt_zarr_chunks("b.zarr")
    path, old = "c" + suffix, rand(rng, (12, 10))
    save(path, old)
    with pytest.raises(oocgemm.OOCGemmError):
        oocgemm.multiply(rand(rng, (12, 9)), "b.zarr", path, overwrite=True, tile=(4, 3, 3),
                         device="cpu")
    np.testing.assert_array_equal(load(path), old)
    assert leftovers(workdir) == []


def failing_dask(rng, shape, bad_block, chunks=(4, 4)):
    """A dask array whose block ``bad_block`` raises when computed (a failing source late in
    the run, after other blocks were written)."""
    x = rand(rng, shape)

    def block(blk, block_info=None):
        if tuple(block_info[0]["chunk-location"]) == bad_block:
            raise OSError("simulated read failure")
        return blk

    return da.from_array(x, chunks=chunks).map_blocks(block, dtype=x.dtype)


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
def test_failure_late_in_the_run(rng, workdir, suffix):
    """Blocks were already written when the failure comes: still nothing looks complete."""
    m, n, k = 16, 16, 8
    b = failing_dask(rng, (k, n), bad_block=(1, 3))
    out = "c" + suffix
    with pytest.raises(oocgemm.ExecutionError, match="simulated read failure"):
        oocgemm.multiply(rand(rng, (m, k)), b, out, tile=(4, 4, 4), device="cpu")
    assert not os.path.exists(out)
    assert leftovers(workdir) == []


def test_failure_from_a_progress_callback_aborts(rng, workdir):
    class Boom(Exception):
        pass

    seen = []

    def progress(event):
        seen.append(event)
        if event.kind == "gemm" and len([e for e in seen if e.kind == "gemm"]) == 5:
            raise Boom("stop here")

    with pytest.raises(oocgemm.ExecutionError, match="stop here"):
        oocgemm.multiply(rand(rng, (12, 8)), rand(rng, (8, 12)), "c.zarr", tile=(3, 3, 4),
                         device="cpu", progress=progress)
    assert not os.path.exists("c.zarr")
    assert leftovers(workdir) == []


def test_failure_before_the_run_starts_leaves_no_partial(rng, workdir, monkeypatch):
    """An executor that fails while being set up: the temporary output is removed too."""
    from oocgemm.runtime import cpu

    def broken(self, *args, **kwargs):
        raise MemoryError("cannot allocate the buffers")

    monkeypatch.setattr(cpu.CpuExecutor, "__init__", broken)
    for out in ("c.zarr", "c.npy"):
        with pytest.raises(MemoryError):
            oocgemm.multiply(rand(rng, (4, 3)), rand(rng, (3, 5)), out, device="cpu")
        assert not os.path.exists(out)
        assert leftovers(workdir) == []


def test_given_numpy_out_after_failure_has_no_nan_leak_claims(rng):
    """A given array is written in place: after a failure its content is unspecified, but a
    later successful run overwrites every element (poison does not survive)."""
    out = poisoned((16, 16))
    b = failing_dask(rng, (8, 16), bad_block=(1, 3))
    with pytest.raises(oocgemm.ExecutionError):
        oocgemm.multiply(rand(rng, (16, 8)), b, out, tile=(4, 4, 4), device="cpu")
    a2, b2 = rand(rng, (16, 8)), rand(rng, (8, 16))
    oocgemm.multiply(a2, b2, out, tile=(4, 4, 4), device="cpu")
    assert_gemm(out, a2, b2)


@pytest.mark.parametrize("layout", ["fortran", "transposed-view", "float32", "strided"])
def test_in_place_update_of_unusual_arrays(rng, layout):
    a, b, old = rand(rng, (9, 7)), rand(rng, (7, 8)), rand(rng, (9, 8))
    if layout == "fortran":
        out = np.asfortranarray(old)
    elif layout == "transposed-view":
        out = np.ascontiguousarray(old.T).T
    elif layout == "float32":
        out = old.astype(np.float32)
        old = out.astype(np.float64)  # what the update starts from
    else:
        big = rand(rng, (18, 24))
        out = big[::2, ::3]
        out[...] = old
    r = oocgemm.multiply(a, b, out, c=out, beta=-2.0, tile=(4, 3, 2), device="cpu")
    assert r.out is out
    assert_gemm(out, a, b, old, beta=-2.0, dtype=out.dtype)


IN_PLACE_LAYOUTS = {
    "v3 sharded zstd": dict(chunks=(16, 16), shards=(64, 64),
                            compressors=zarr.codecs.ZstdCodec(level=3),
                            dimension_names=["row", "col"]),
    "v3 big-endian, fill 3.5, v2 keys": dict(
        chunks=(24, 20), serializer=zarr.codecs.BytesCodec(endian="big"), fill_value=3.5,
        chunk_key_encoding={"name": "v2", "separator": "."}),
    "v2 blosc, delta filter, / keys": dict(
        chunks=(24, 20), zarr_format=2, compressors=numcodecs.Blosc(cname="lz4"),
        filters=[numcodecs.Delta("<f8")], chunk_key_encoding={"name": "v2", "separator": "/"}),
}


@pytest.mark.parametrize("layout", sorted(IN_PLACE_LAYOUTS))
@pytest.mark.parametrize("tile", [None, (24, 40, 30)])  # the planner's, and blocks cutting shards
def test_in_place_update_keeps_the_arrays_layout_and_attributes(rng, workdir, layout, tile):
    a, b, old = rand(rng, (100, 70)), rand(rng, (70, 90)), rand(rng, (100, 90))
    z = zarr.create_array("c.zarr", shape=old.shape, dtype="f8", **IN_PLACE_LAYOUTS[layout])
    z[...] = old
    z.attrs.update({"units": "kelvin", "history": ["made by hand"]})
    before = z.metadata.to_dict()
    oocgemm.multiply(a, b, "c.zarr", beta=0.5, tile=tile, device="cpu")
    new = zarr.open_array("c.zarr", mode="r")
    assert_gemm(new[...], a, b, old, beta=0.5)
    after = new.metadata.to_dict()
    attributes = after.pop("attributes")
    assert attributes.pop("oocgemm")["complete"] is True
    assert attributes == {"units": "kelvin", "history": ["made by hand"]}
    before.pop("attributes")
    assert after == before


def test_replacing_a_zarr_output_never_leaves_its_path_empty(rng, workdir, monkeypatch):
    """The new output takes the old one's place in one exchange: a crash right after it (here
    a removal of the old one, behind the call, that never happens) finds the new, whole
    output at the path."""
    from oocgemm.storage import files

    if files._renameat2() is None:
        pytest.skip("no renameat2 here")
    a, b, old = rand(rng, (30, 20)), rand(rng, (20, 25)), rand(rng, (30, 25))
    save("c.zarr", old)
    monkeypatch.setattr(files, "remove", lambda path: None)  # the process dies first
    oocgemm.multiply(a, b, "c.zarr", beta=1.0, tile=(8, 8, 8), device="cpu")
    assert_gemm(load("c.zarr"), a, b, old, beta=1.0)
    aside = leftovers(".")  # the old output, under a temporary name, for the next run to clear
    assert len(aside) == 1
    np.testing.assert_array_equal(zarr.open_array(aside[0], mode="r")[...], old)


@pytest.mark.parametrize("exchange", [True, False])
def test_in_place_update_with_and_without_the_exchange(rng, workdir, monkeypatch, exchange):
    from oocgemm.storage import files

    if not exchange:
        monkeypatch.setattr(files, "_exchange", lambda first, second: False)
    a, b, old = rand(rng, (30, 20)), rand(rng, (20, 25)), rand(rng, (30, 25))
    save("c.zarr", old)
    oocgemm.multiply(a, b, "c.zarr", beta=-1.0, tile=(8, 8, 8), device="cpu")
    assert_gemm(load("c.zarr"), a, b, old, beta=-1.0)
    assert leftovers(".") == []


def test_a_given_zarr_array_updated_in_place_is_read_and_rewritten_under_one_lock(
        rng, tmp_path, monkeypatch):
    """Blocks that cut chunks rewrite chunks that other blocks still read: those reads and
    writes are serialized (a read once met a chunk file being rewritten: 'the size of a
    decoded chunk is 0')."""
    from oocgemm.storage.zarr_store import ZarrSource

    a, b, old = rand(rng, (90, 40)), rand(rng, (40, 80)), rand(rng, (90, 80))
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=old.shape, dtype="f8", chunks=(7, 7))
    z[...] = old
    held = []
    read = ZarrSource._read

    def checked(self, rows, cols, out):
        held.append(self.lock is not None and self.lock.locked())
        return read(self, rows, cols, out)

    def checked_direct(self, index, out, rows, cols, files=None):
        held.append(self.lock is not None and self.lock.locked())
        return direct(self, index, out, rows, cols, files)

    direct = ZarrSource._read_direct
    monkeypatch.setattr(ZarrSource, "_read", checked)
    monkeypatch.setattr(ZarrSource, "_read_direct", checked_direct)
    oocgemm.multiply(a, b, z, beta=1.0, tile=(10, 9, 20), device="cpu")
    assert held and all(held)
    assert_gemm(zarr.open_array(str(tmp_path / "z.zarr"), mode="r")[...], a, b, old, beta=1.0)

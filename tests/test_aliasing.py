"""An output that shares storage with an input, under another handle than the input's (issue
32): refused before any work with an OutputError that names both, the input unchanged; or,
for C that is the output (beta != 0), the update in place it asks for. Every pair of handles
on one stored matrix: paths, ``file://`` URLs, symlinks, hard links, memmaps, zarr arrays
(v2, v3, sharded), dask arrays from zarr or from a memmap, numpy views."""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import fuzz_examples, rand
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oocgemm

N = 12  # every operand N x N, so that any of them could be the output
LAYOUTS = {"v2": dict(zarr_format=2), "v3": dict(zarr_format=3),
           "sharded": dict(zarr_format=3, shards=(8, 8))}


def _stored(kind: str, x: np.ndarray) -> str:
    if kind == "npy":
        np.save("x.npy", x)
        return "x.npy"
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(4, 4),
                      **LAYOUTS[kind])[...] = x
    return "x.zarr"


def _handle(how: str, path: str, writable: bool = False):
    """A handle of the matrix stored at ``path``, made as a user would make it."""
    if how == "path":
        return path
    if how == "abspath":
        return os.path.abspath(path)
    if how == "url":
        return "file://" + os.path.abspath(path)
    if how == "symlink":
        link = "link-" + path
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
        return link
    if how == "hardlink":
        link = "hard-" + path
        if not os.path.lexists(link):
            os.link(path, link)
        return link
    if how == "memmap":
        return np.load(path, mmap_mode="r+" if writable else "r")
    if how == "zarr":
        return zarr.open_array(path, mode="r+" if writable else "r")
    if how == "dask":
        if path.endswith(".zarr"):
            return da.from_zarr(path)
        return da.from_array(np.load(path, mmap_mode="r"), chunks=(5, 5))
    raise AssertionError(how)


def _content(path: str) -> np.ndarray:
    return np.load(path) if path.endswith(".npy") else zarr.open_array(path, mode="r")[...]


NPY_IN = ["path", "abspath", "url", "symlink", "hardlink", "memmap", "dask"]
NPY_OUT = ["path", "url", "symlink", "hardlink", "memmap"]
ZARR_IN = ["path", "url", "symlink", "zarr", "dask"]
ZARR_OUT = ["path", "url", "symlink", "zarr"]
PAIRS = ([("npy", i, o) for i in NPY_IN for o in NPY_OUT]
         + [(layout, i, o) for layout in LAYOUTS for i in ZARR_IN for o in ZARR_OUT])


def _run(role: str, handle, out, other: np.ndarray, x: np.ndarray):
    """multiply with the stored matrix as ``role`` and ``out`` as the output; what C must be
    when it runs."""
    a, b, c = (handle, other, None) if role == "a" else (other, handle, None)
    if role == "c":
        a, b, c = other, other.T.copy(), handle
    beta = 0.5 if role == "c" else 0.0
    result = oocgemm.multiply(a, b, out, c=c, alpha=2.0, beta=beta, device="cpu",
                              tile=(4, 4, 4), overwrite=True)
    xa, xb = (x, other) if role == "a" else (other, x) if role == "b" else (other, other.T)
    return result, 2.0 * xa @ xb + (0.5 * x if role == "c" else 0)


@pytest.mark.parametrize("role", ["a", "b", "c"])
@pytest.mark.parametrize("kind, given, written", PAIRS)
def test_an_output_on_an_input_is_refused_or_updated_in_place(rng, workdir, kind, given,
                                                              written, role):
    x, other = rand(rng, (N, N)), rand(rng, (N, N))
    path = _stored(kind, x)
    handle = _handle(given, path)
    out = _handle(written, path, writable=True)
    if kind == "npy" and given == "dask":  # dask copies the memmap it is made from (or not)
        try:
            result, want = _run(role, handle, out, other, x)
        except oocgemm.OutputError:
            np.testing.assert_array_equal(_content(path), x)
            return
        got = result.out[...] if not isinstance(result.out, str) else _content(result.out)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
        return
    if role != "c":
        with pytest.raises(oocgemm.OutputError, match=f"(same matrix as|shares storage "
                                                      f"with) {role} "):
            _run(role, handle, out, other, x)
        np.testing.assert_array_equal(_content(path), x)
        return
    # C is the output: an update in place, under whatever handles
    _, want = _run(role, handle, out, other, x)
    target = path if written != "hardlink" else "hard-" + path  # a path: swapped in anew
    got = np.asarray(out) if written in ("memmap", "zarr") else _content(target)
    if written == "zarr":
        got = out[...]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("role", ["a", "b"])
@pytest.mark.parametrize("view", ["same", "overlapping", "transposed-twice"])
def test_an_output_viewing_an_input_in_memory_is_refused(rng, role, view):
    big = rand(rng, (2 * N, N))
    x = big[:N]
    out = {"same": big[:N], "overlapping": big[N // 2: N // 2 + N],
           "transposed-twice": x.T.T}[view]
    before = big.copy()
    args = [rand(rng, (N, N)), rand(rng, (N, N))]
    args["ab".index(role)] = x
    with pytest.raises(oocgemm.OutputError, match=role):
        oocgemm.multiply(*args, out, device="cpu", tile=(4, 4, 4))
    np.testing.assert_array_equal(big, before)


def test_separate_arrays_of_one_folder_or_buffer_are_not_aliases(rng, workdir):
    """Arrays side by side in one Zarr group, and rows of one buffer that do not overlap, are
    different storage: the product runs."""
    x, y = rand(rng, (N, N)), rand(rng, (N, N))
    group = zarr.open_group("g.zarr", mode="w")
    group.create_array("x", shape=x.shape, dtype=x.dtype, chunks=(4, 4))[...] = x
    group.create_array("c", shape=x.shape, dtype=x.dtype, chunks=(4, 4))
    oocgemm.multiply("g.zarr/x", y, zarr.open_array("g.zarr/c", mode="r+"), device="cpu",
                     tile=(4, 4, 4))
    np.testing.assert_allclose(zarr.open_array("g.zarr/c")[...], x @ y, rtol=1e-12)
    big = rand(rng, (2 * N, N))
    oocgemm.multiply(big[:N], y, big[N:], device="cpu", tile=(4, 4, 4))
    np.testing.assert_allclose(big[N:], big[:N] @ y, rtol=1e-12)


@settings(max_examples=fuzz_examples(ci=40, thorough=200), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_two_handles_on_one_store_give_the_right_answer_or_an_output_error(data):
    """Two handles drawn on one stored matrix, one an input (a, b or c), one the output:
    either C is right or the call is an OutputError and the input is unchanged."""
    import tempfile

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kind = data.draw(st.sampled_from(["npy", *LAYOUTS]))
    ins, outs = (NPY_IN, NPY_OUT) if kind == "npy" else (ZARR_IN, ZARR_OUT)
    given_, written = data.draw(st.sampled_from(ins)), data.draw(st.sampled_from(outs))
    role = data.draw(st.sampled_from(["a", "b", "c"]))
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            x, other = rand(rng, (N, N)), rand(rng, (N, N))
            path = _stored(kind, x)
            out = _handle(written, path, writable=True)
            try:
                result, want = _run(role, _handle(given_, path), out, other, x)
            except oocgemm.OutputError:
                np.testing.assert_array_equal(_content(path), x)
                return
            got = result.out[...] if not isinstance(result.out, str) else _content(result.out)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
        finally:
            os.chdir(here)

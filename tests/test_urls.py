"""Inputs and outputs named by URL: file:// as local paths, memory:// (any fsspec file
system) read at the grain of its chunks and written under the same promises as paths."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, poisoned, rand
from click.testing import CliRunner

import oocgemm
from oocgemm.cli import main
from oocgemm.errors import InputError, OOCGemmError, OutputError


@pytest.fixture
def mem():
    """A fresh memory:// folder."""
    import fsspec

    root = f"memory://oocgemm-test-{uuid.uuid4().hex[:8]}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root.removeprefix("memory://")):
        fs.rm(root.removeprefix("memory://"), recursive=True)


def put(url, x, chunks=(16, 16), **kw):
    zarr.create_array(url, shape=x.shape, dtype=x.dtype, chunks=chunks, **kw)[:] = x


def test_memory_urls_in_and_out(rng, mem):
    a, b = rand(rng, (40, 35)), rand(rng, (35, 30))
    put(f"{mem}/a.zarr", a, compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{mem}/b.zarr", b)
    r = oocgemm.multiply(f"{mem}/a.zarr", f"{mem}/b.zarr", f"{mem}/c.zarr", device="cpu",
                         tile=(16, 16, 16))
    c = zarr.open_array(f"{mem}/c.zarr", mode="r")
    assert_gemm(c[:], a, b)
    assert c.attrs["oocgemm"]["complete"] is True
    assert r.chunks["A"]["decodes"] == 3 * 3 and r.chunks["B"]["decodes"] == 3 * 2


def test_file_urls_are_local_paths(rng, workdir):
    a, b = rand(rng, (20, 15)), rand(rng, (15, 10))
    put("a.zarr", a, chunks=(8, 8))
    np.save("b.npy", b)
    here = os.path.abspath(".")
    oocgemm.multiply(f"file://{here}/a.zarr", f"file://{here}/b.npy", f"file://{here}/c.zarr",
                     device="cpu")
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)
    result = CliRunner().invoke(main, ["multiply", f"file://{here}/a.zarr", "b.npy", "-o",
                                       f"file://{here}/d.npy", "-q", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert_gemm(np.load("d.npy"), a, b)


def test_an_existing_url_output_is_refused_then_replaced(rng, mem):
    a, b = rand(rng, (20, 15)), rand(rng, (15, 10))
    put(f"{mem}/a.zarr", a)
    put(f"{mem}/b.zarr", b)
    put(f"{mem}/c.zarr", np.ones((3, 3)))
    with pytest.raises(OutputError, match="exists"):
        oocgemm.multiply(f"{mem}/a.zarr", f"{mem}/b.zarr", f"{mem}/c.zarr", device="cpu")
    assert zarr.open_array(f"{mem}/c.zarr", mode="r").shape == (3, 3)  # untouched
    oocgemm.multiply(f"{mem}/a.zarr", f"{mem}/b.zarr", f"{mem}/c.zarr", device="cpu",
                     overwrite=True)
    assert_gemm(zarr.open_array(f"{mem}/c.zarr", mode="r")[:], a, b)
    import fsspec

    names = fsspec.filesystem("memory").ls(mem.removeprefix("memory://"), detail=False)
    assert sorted(os.path.basename(n) for n in names) == ["a.zarr", "b.zarr", "c.zarr"]


def test_url_update_in_place(rng, mem):
    a, b, c0 = rand(rng, (20, 15)), rand(rng, (15, 10)), rand(rng, (20, 10))
    for name, x in (("a", a), ("b", b), ("c", c0)):
        put(f"{mem}/{name}.zarr", x, chunks=(8, 8))
    oocgemm.multiply(f"{mem}/a.zarr", f"{mem}/b.zarr", f"{mem}/c.zarr", device="cpu",
                     beta=0.5, alpha=2.0)
    assert_gemm(zarr.open_array(f"{mem}/c.zarr", mode="r")[:], a, b, c0, alpha=2.0, beta=0.5)


def test_a_failed_run_leaves_no_url_output(rng, mem):
    a, b = rand(rng, (40, 15)), rand(rng, (15, 10))
    put(f"{mem}/a.zarr", a, chunks=(8, 8), compressors=zarr.codecs.ZstdCodec(level=1))
    put(f"{mem}/b.zarr", b, chunks=(8, 8))
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe(f"{mem.removeprefix('memory://')}/a.zarr/c/4/1", b"not zstd")
    with pytest.raises(OOCGemmError, match="corrupt"):
        oocgemm.multiply(f"{mem}/a.zarr", f"{mem}/b.zarr", f"{mem}/c.zarr", device="cpu",
                         tile=(8, 8, 8))
    assert not fs.exists(f"{mem.removeprefix('memory://')}/c.zarr")


def test_url_errors(rng, mem):
    b = rand(rng, (15, 10))
    put(f"{mem}/b.zarr", b)
    with pytest.raises(InputError, match="nothing at"):
        oocgemm.multiply(f"{mem}/missing.zarr", f"{mem}/b.zarr", device="cpu")
    with pytest.raises(InputError, match="must be local paths"):
        oocgemm.multiply(f"{mem}/a.npy", f"{mem}/b.zarr", device="cpu")
    with pytest.raises(OutputError, match="same matrix as a"):
        oocgemm.multiply(f"{mem}/b.zarr", f"{mem}/b.zarr/", f"{mem}/b.zarr/", device="cpu",
                         trans_a=True, overwrite=True)
    with pytest.raises(InputError, match="cannot open this URL"):
        oocgemm.multiply("nosuchscheme://x/a.zarr", f"{mem}/b.zarr", device="cpu")
    out = poisoned((15, 10))
    oocgemm.multiply(np.eye(15), f"{mem}/b.zarr", out, device="cpu")
    assert_gemm(out, np.eye(15), b)

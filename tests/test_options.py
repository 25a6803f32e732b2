"""A product's options are checked in one place (oocgemm.options.Options), the same way for
multiply, plan and oocgemm.dask.matmul, before any work."""

from __future__ import annotations

import os

import dask.array as da
import numpy as np
import pytest
from _helpers import rand

import oocgemm
import oocgemm.dask as odask
from oocgemm.options import Options


def test_options_are_normalised():
    o = Options.of("here", tile="8x6x4", memory_limit="2MB", storage_options={"anon": True})
    assert o.tile == (8, 6, 4) and o.memory_limit == "2MB"
    assert o.keywords() == {"tile": (8, 6, 4), "memory_limit": "2MB",
                            "storage_options": {"anon": True}}
    assert Options.of("here", tile=[3, 2, 1]).tile == (3, 2, 1)
    assert Options.of("here").keywords() == {}
    assert Options.of("here", progress=np.bool_(False)).progress is False
    assert Options.of("here", progress=print).progress is print
    assert Options.of("here", kernel="ozaki:14").kernel == "ozaki:14"


def test_a_compressors_level_is_left_to_the_outputs_format_where_none_is_given(workdir, rng):
    """zstd:30 is a level numcodecs takes (a v2 array) and zarr's v3 codec refuses: without a
    zarr_format, the output's group picks the format, so the level is not judged early."""
    import zarr

    zarr.open_group("g.zarr", mode="w", zarr_format=2)
    a, b = rand(rng, (20, 10)), rand(rng, (10, 15))
    oocgemm.multiply(a, b, "g.zarr/c", device="cpu", out_options={"compressors": "zstd:30"})
    np.testing.assert_allclose(zarr.open_array("g.zarr/c", mode="r")[:], a @ b, rtol=1e-12)
    with pytest.raises(oocgemm.OptionError, match="compressor 'zstd:30'"):
        oocgemm.multiply(a, b, "c3.zarr", device="cpu", out_options={"compressors": "zstd:30"})


def test_an_engine_refuses_bad_options_when_made():
    for bad in ({"kernel": "bogus"}, {"out_options": {"compressors": "foo"}}):
        with pytest.raises(oocgemm.OptionError):
            oocgemm.Engine(device="cpu", **bad)


@pytest.mark.parametrize("bad, match", [
    ({"memory_limt": "1GB"}, r"here: unknown options \['memory_limt'\]"),
    ({"tile": (8, 6)}, "tile must be three positive integers"),
    ({"tile": "8,6,0"}, "tile must be three positive integers"),
    ({"tile": (True, 5, 5)}, "tile must be three positive integers"),
    ({"memory_limit": "16 parsecs"}, "unknown unit"),
    ({"host_memory_limit": -1}, "host_memory_limit"),
    ({"storage_options": "anon"}, "storage_options must be a dict"),
    ({"out_options": ["chunks"]}, "out_options must be a dict"),
    ({"kernel": 3}, "kernel must be a name"),
    ({"kernel": "bogus"}, "unknown kernel 'bogus'"),
    ({"kernel": "ozaki:99"}, "ozaki:N takes N"),
    ({"out_options": {"compressors": "foo"}}, "unknown compressor 'foo'"),
    ({"out_options": {"compressors": "gzip:10", "zarr_format": 3}}, "compressor 'gzip:10'"),
    ({"out_options": {"compressors": "zstd:x"}}, "level must be an integer"),
    ({"progress": "yes"}, "progress must be None, True, False or a callable"),
    ({"progress": 1.5}, "progress must be None, True, False or a callable"),
    ({"progress": 0}, "progress must be None, True, False or a callable"),
])
def test_bad_options_are_refused_by_name(bad, match):
    with pytest.raises(oocgemm.OptionError, match=match):
        Options.of("here", **bad)


@pytest.mark.parametrize("name, key, flag", [
    ("chunks", "chunks", "--out-chunks"), ("shards", "shards", "--out-shards"),
    ("compressor", "compressors", "--out-compressor"),
    ("compressors", "compressors", "--out-compressor"),
])
def test_a_zarr_layout_keyword_given_to_multiply_points_to_out_options(rng, name, key, flag):
    a = rand(rng, (6, 4))
    with pytest.raises(oocgemm.OptionError) as caught:
        oocgemm.multiply(a, a.T, "c.zarr", device="cpu", **{name: "x"})
    message = str(caught.value)
    assert f"unknown options [{name!r}]" in message
    assert f"pass out_options={{{key!r}: ...}} ({flag} on the command line)" in message


def test_a_misspelled_option_is_answered_with_the_nearest_name():
    with pytest.raises(oocgemm.OptionError, match="did you mean memory_limit[?]"):
        Options.of("multiply()", memory_limt="1GB")


@pytest.mark.parametrize("bad", [{"tile": "8,6"}, {"memory_limit": "16 parsecs"}])
def test_every_entry_point_refuses_them_before_any_work(rng, workdir, bad):
    a = rand(rng, (20, 10))
    with pytest.raises(oocgemm.OptionError):
        oocgemm.plan(a, a.T, device="cpu", **bad)
    with pytest.raises(oocgemm.OptionError):
        oocgemm.multiply(a, a.T, "c.npy", device="cpu", **bad)
    with pytest.raises(oocgemm.OptionError):  # when the graph is built, not in a task
        odask.matmul(da.from_array(a, chunks=5), a.T, device="cpu", **bad)
    with pytest.raises(oocgemm.OptionError, match="do not apply"):
        odask.matmul(a, a.T, device="cpu", out_options={"chunks": (5, 5)})
    assert not any(name.startswith("c.") for name in os.listdir("."))


def test_the_dask_tasks_get_the_checked_options(rng):
    a, b = rand(rng, (40, 30)), rand(rng, (30, 20))
    z = odask.matmul(a, b, device="cpu", tile="10x10x10", groups=(20, 20))
    np.testing.assert_allclose(z.compute(), a @ b, rtol=1e-12)
    specs = [task for task in z.dask.layers[z.name + "-groups"].values()]
    assert all(spec[7] == {"device": "cpu", "tile": (10, 10, 10)} for spec in specs)

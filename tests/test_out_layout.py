"""The output's layout is the user's: out_options / --out-chunks, --out-shards,
--out-compressor, --zarr-format, checked before any work; default chunks of at most 64 MiB
that tile the C blocks and the stripes they are written in; an output inside a Zarr group is
an array that group sees."""

from __future__ import annotations

import dataclasses
import os

import numcodecs
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, rand
from click.testing import CliRunner

import oocgemm
from oocgemm.cli import main
from oocgemm.errors import OptionError
from oocgemm.storage.zarr_store import MAX_OUT_CHUNK, compressor, output_chunks


@pytest.fixture
def inputs(rng, workdir):
    a, b = rand(rng, (40, 30)), rand(rng, (30, 50))
    np.save("a.npy", a)
    np.save("b.npy", b)
    return a, b


@pytest.mark.parametrize("block, stripe", [((16384, 32768), 512), ((16384, 32768), None),
                                           ((10923, 7), None), ((4096, 4096), 256),
                                           ((1, 1), None)])
def test_default_chunks_tile_blocks_and_stripes_within_64_mib(block, stripe):
    rows, cols = output_chunks(block, 8, stripe)
    assert rows * cols * 8 <= MAX_OUT_CHUNK
    assert block[0] % rows == 0 and block[1] % cols == 0
    if stripe:
        assert stripe % rows == 0


@pytest.mark.parametrize("block, stripe", [((2048, 2048), 2047), ((2048, 2048), 1000),
                                           ((4096, 8192), 4095)])
def test_stripes_that_share_few_rows_with_the_blocks_do_not_make_tiny_chunks(block, stripe):
    """Stripes of 2047 rows in blocks of 2048 made chunks of one row (16 KiB): the store's
    cost per chunk was the run's bound. The chunks tile the blocks only then, the writer
    gathering the stripes that cut them."""
    rows, cols = output_chunks(block, 8, stripe)
    assert block[0] % rows == 0 and block[1] % cols == 0
    assert rows * cols * 8 >= min(4 << 20, block[0] * block[1] * 8 // 8)
    assert rows * cols * 8 <= MAX_OUT_CHUNK


def test_default_output_is_chunked_to_the_blocks(inputs):
    a, b = inputs
    r = oocgemm.multiply("a.npy", "b.npy", "c.zarr", device="cpu", tile=(16, 25, 30))
    out = zarr.open_array("c.zarr", mode="r")
    assert 16 % out.chunks[0] == 0 and 25 % out.chunks[1] == 0
    assert out.metadata.zarr_format == 3 and not out.compressors
    assert_gemm(out[:], a, b)
    assert r.plan.tile == (16, 25, 30)


def test_staged_writes_cover_whole_chunks(inputs):
    """Every WRITE of a staged plan (a row stripe of a C block) covers whole default chunks,
    so no chunk is rewritten by two writes."""
    plan = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(16, 25, 30))
    plan = dataclasses.replace(plan, staged=True, stripe=4 * 25, staging=dataclasses.replace(
        plan.staging, n_stage=3, n_out=2, min_stripes=2))
    from oocgemm.lifecycle.outputs import output_layout

    rows, cols = output_layout(plan, {})["chunks"]
    writes = [op for op in plan.schedule.ops if op.kind.value == "write"]
    assert len(writes) > plan.n_blocks  # C leaves in stripes
    for op in writes:
        (r0, r1), (c0, c1) = op.region
        if r1 - r0 == 4:  # interior stripes of the full-size blocks
            assert r0 % rows == 0 and r1 % rows == 0 and c0 % cols == 0


@pytest.mark.parametrize("options, check", [
    (dict(chunks=(8, 10)), lambda z: z.chunks == (8, 10)),
    (dict(chunks=(8, 10), shards=(16, 20)), lambda z: z.shards == (16, 20) and z.chunks == (8, 10)),
    (dict(compressors="zstd:3"), lambda z: type(z.compressors[0]).__name__ == "ZstdCodec"),
    (dict(zarr_format=2, compressors="zstd"), lambda z: z.metadata.zarr_format == 2
     and z.metadata.compressor == numcodecs.Zstd(level=1)),
    (dict(zarr_format=2, chunks=(7, 9)), lambda z: z.metadata.zarr_format == 2
     and z.chunks == (7, 9)),
    (dict(compressors=zarr.codecs.BloscCodec(cname="lz4")),
     lambda z: type(z.compressors[0]).__name__ == "BloscCodec"),
])
def test_out_options_shape_the_output(inputs, options, check):
    a, b = inputs
    r = oocgemm.multiply("a.npy", "b.npy", "c.zarr", device="cpu", out_options=options)
    z = zarr.open_array("c.zarr", mode="r")
    assert check(z), (z.metadata, options)
    assert_gemm(z[:], a, b)
    if "shards" in options:  # C blocks align to what one write rewrites: the shard
        assert r.plan.tile[0] % 16 == 0 or r.plan.tile[0] == 40


@pytest.mark.parametrize("options, message", [
    (dict(chunk=(8, 8)), "unknown keyword"),
    (dict(chunks=(0, 8)), "two positive integers"),
    (dict(chunks=(8,)), "two positive integers"),
    (dict(compressors="lzma9"), "unknown compressor"),
    (dict(compressors="zstd:x"), "level must be an integer"),
    (dict(compressors="zstd:"), "level must be an integer"),
    (dict(compressors="none:3"), "none takes no level"),
    (dict(compressors=""), "unknown compressor"),
    (dict(chunks=(True, 8)), "two positive integers"),
    (dict(zarr_format=4), "must be 2 or 3"),
    (dict(chunks=(8, 8), shards=(12, 12)), "not a valid Zarr array layout"),
    (dict(chunks=(16, 16), shards=(8, 8)), "not a valid Zarr array layout"),  # shard < chunk
    (dict(chunks=(16, 16), shards=(16, 8)), "not a valid Zarr array layout"),
    (dict(compressors="gzip:10"), "compressor 'gzip:10'"),  # refused by the codec itself
    (dict(compressors="zstd:1000"), "compressor 'zstd:1000'"),
    (dict(compressors="blosc:20"), "not a valid Zarr array layout"),  # only its encoder says
    (dict(compressors="lz4:-1"), "not a valid Zarr array layout"),
    (dict(compressors="blosc:20", zarr_format=2), "not a valid Zarr array layout"),
    (dict(compressors="gzip:10", zarr_format=2), "not a valid Zarr array layout"),
    ("zstd", "must be a dict"),
])
def test_bad_out_options_fail_before_any_work(inputs, options, message):
    with pytest.raises(OptionError, match=message):
        oocgemm.multiply("a.npy", "b.npy", "c.zarr", device="cpu", out_options=options)
    assert not os.path.exists("c.zarr") and leftovers(".") == []


def test_out_options_need_a_new_zarr_output(inputs):
    for out in ("c.npy", np.empty((40, 50))):
        with pytest.raises(OptionError, match="new Zarr output"):
            oocgemm.multiply("a.npy", "b.npy", out, device="cpu", out_options={"chunks": (8, 8)})


def test_compressor_names():
    assert compressor("none") is None
    assert compressor("zstd:5").level == 5
    assert compressor("gzip", zarr_format=2) == numcodecs.GZip(level=6)
    with pytest.raises(OptionError):
        compressor("snappy")


def test_cli_layout_flags(inputs):
    a, b = inputs
    result = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.zarr", "-q",
                                       "--device", "cpu", "--out-chunks", "10x25",
                                       "--out-compressor", "zstd:1", "--zarr-format", "2"])
    assert result.exit_code == 0, result.output
    z = zarr.open_array("c.zarr", mode="r")
    assert z.metadata.zarr_format == 2 and z.chunks == (10, 25)
    assert z.metadata.compressor == numcodecs.Zstd(level=1)
    assert_gemm(z[:], a, b)
    bad = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "d.zarr", "--device",
                                    "cpu", "--out-compressor", "nope"])
    assert bad.exit_code == 2 and "error: unknown compressor" in bad.output
    assert not os.path.exists("d.zarr")
    for flags in (["--out-compressor", "gzip:10"], ["--out-compressor", "blosc:20"],
                  ["--out-chunks", "16x16", "--out-shards", "8x8"]):
        bad = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "d.zarr",
                                        "--device", "cpu", *flags])
        assert bad.exit_code == 2 and bad.output.startswith("error: "), (flags, bad.output)
        assert "Traceback" not in bad.output and not os.path.exists("d.zarr")


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("consolidated", [False, True])
def test_output_inside_a_group_is_seen_by_it(inputs, zarr_format, consolidated):
    a, b = inputs
    group = zarr.open_group("g.zarr", mode="w", zarr_format=zarr_format)
    group.create_array("x", shape=(2, 2), dtype="f8")[:] = 1.0
    if consolidated:
        zarr.consolidate_metadata("g.zarr")
    oocgemm.multiply("a.npy", "b.npy", "g.zarr/C", device="cpu")
    seen = zarr.open_group("g.zarr", mode="r")
    assert sorted(seen.array_keys()) == ["C", "x"]
    c = seen["C"]
    assert c.metadata.zarr_format == zarr_format
    assert_gemm(c[:], a, b)
    assert seen["x"][0, 0] == 1.0  # the group's own data is untouched

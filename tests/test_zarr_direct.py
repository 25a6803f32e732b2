"""Chunks decoded straight from their files (``oocgemm.storage.zarr_store.direct_reader``:
chunk files, and shards whose inner chunks are plain) give what zarr gives, for every layout
that qualifies; every other layout goes through zarr; a corrupt or truncated chunk or shard
is an InputError naming it."""

from __future__ import annotations

import itertools

import numcodecs
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.errors import InputError
from oocgemm.planning.chunks import chunk_region
from oocgemm.storage.chunked import DiskQueue
from oocgemm.storage.zarr_store import ZarrSource

#: How a chunk's file is read: decoded from its pages (warm), or read whole in pieces first
#: (cold: the run's disk queue).
FILES = pytest.mark.parametrize("files", [None, DiskQueue.read], ids=["pages", "pieces"])

DIRECT = {
    "v3-zstd": dict(zarr_format=3),
    "v3-raw": dict(zarr_format=3, compressors=None),
    "v3-gzip": dict(zarr_format=3, compressors=zarr.codecs.GzipCodec()),
    "v3-blosc": dict(zarr_format=3, compressors=zarr.codecs.BloscCodec()),
    "v2-zstd": dict(zarr_format=2),
    "v2-raw": dict(zarr_format=2, compressors=None),
    "v2-blosc-lz4": dict(zarr_format=2, compressors=numcodecs.Blosc(cname="lz4")),
    "v3-sharded": dict(zarr_format=3, shards=(32, 32)),
    "v3-sharded-raw": dict(zarr_format=3, shards=(32, 32), compressors=None),
    "v3-sharded-gzip-index-first": dict(
        zarr_format=3, chunks=(32, 32), compressors=None, filters=None,
        serializer=zarr.codecs.ShardingCodec(
            chunk_shape=(16, 16), codecs=[zarr.codecs.BytesCodec(), zarr.codecs.GzipCodec()],
            index_codecs=[zarr.codecs.BytesCodec()], index_location="start")),
}
THROUGH_ZARR = {
    "v3-big-endian": dict(zarr_format=3, serializer=zarr.codecs.BytesCodec(endian="big")),
    "v3-sharded-big-endian": dict(
        zarr_format=3, chunks=(32, 32), compressors=None, filters=None,
        serializer=zarr.codecs.ShardingCodec(
            chunk_shape=(16, 16), codecs=[zarr.codecs.BytesCodec(endian="big")])),
    "v3-sharded-crc": dict(zarr_format=3, shards=(32, 32),
                           compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]),
    "v2-fortran": dict(zarr_format=2, order="F"),
    "v3-filtered": dict(zarr_format=3, filters=[zarr.codecs.TransposeCodec(order=(1, 0))]),
    "v3-crc": dict(zarr_format=3, compressors=[zarr.codecs.ZstdCodec(),
                                               zarr.codecs.Crc32cCodec()]),
}


def every_chunk(src: ZarrSource, files=None):
    grid = [-(-n // c) for n, c in zip(src.shape, src.chunks)]
    for index in itertools.product(*map(range, grid)):
        (r0, r1), (c0, c1) = chunk_region(index, src.chunks, src.shape)
        out = np.full((r1 - r0, c1 - c0), np.nan)
        src.read_chunk(index, out, files=files)
        yield (slice(r0, r1), slice(c0, c1)), out


@FILES
@pytest.mark.parametrize("layout", sorted(DIRECT) + sorted(THROUGH_ZARR))
def test_chunks_as_zarr_reads_them(rng, workdir, layout, files):
    """Ragged edges, and a band of chunks never written (read as the fill value, 7)."""
    x = rand(rng, (50, 37))
    options = DIRECT.get(layout) or THROUGH_ZARR[layout]
    array = zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype,
                              **{"chunks": (16, 16), **options}, fill_value=7.0)
    array[:40] = x[:40]
    want = zarr.open_array("x.zarr", mode="r")[:]
    assert np.array_equal(want[48:], np.full((2, 37), 7.0))  # chunks never written
    src = ZarrSource(zarr.open_array("x.zarr", mode="r"), "x")
    assert (src._direct is not None) == (layout in DIRECT)
    for where, got in every_chunk(src, files):
        assert np.array_equal(got, want[where]), where


@pytest.mark.parametrize("layout", ["v3-zstd", "v3-raw", "v2-zstd", "v3-sharded",
                                    "v3-sharded-raw"])
@FILES
@pytest.mark.parametrize("length", [100, 1 << 20], ids=["short", "long"])
def test_a_corrupt_or_truncated_chunk_is_named(rng, workdir, layout, files, length):
    x = rand(rng, (64, 64))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype,
                      **{"chunks": (16, 16), **DIRECT[layout]})[:] = x
    src = ZarrSource(zarr.open_array("x.zarr", mode="r"), "x")
    side = src.chunks[0]
    path = src._direct.path((1, 0))
    with open(path, "r+b") as f:
        f.truncate(length)  # cut short, or made longer than any chunk of it
    with pytest.raises(InputError, match=r"chunk \(1, 0\) \(corrupt or truncated chunk"):
        src.read_chunk((1, 0), np.empty((side, side)), files=files)


@FILES
@pytest.mark.parametrize("where", ["index", "inner chunk"])
def test_a_damaged_shard_is_named(rng, workdir, where, files):
    """A flipped byte in a shard's index fails its crc32c; one in the header of an inner
    chunk's zstd frame (its first, where the index is at the end) fails its decode: either
    is an InputError naming the shard, not wrong numbers."""
    x = rand(rng, (64, 64))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(16, 16),
                      shards=(32, 32))[:] = x
    src = ZarrSource(zarr.open_array("x.zarr", mode="r"), "x")
    path = src._direct.path((0, 1))
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        at = len(data) - 10 if where == "index" else 0
        data[at] ^= 0xFF
        f.seek(0)
        f.write(data)
    out = np.empty((32, 32))
    with pytest.raises(InputError, match=r"chunk \(0, 1\) \(corrupt or truncated chunk"):
        src.read_chunk((0, 1), out, files=files)
    src.read_chunk((1, 1), out, files=files)  # the shards around it read as before
    np.testing.assert_array_equal(out, x[32:, 32:])


def test_products_through_direct_chunks(rng, workdir):
    a, b = rand(rng, (70, 45)), rand(rng, (45, 33))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 16))[:] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype=b.dtype, chunks=(20, 11),
                      zarr_format=2)[:] = b
    result = oocgemm.multiply("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16))
    assert_gemm(result.out, a, b)
    # shards (of ragged edges) read straight from their files, either operand
    zarr.create_array("s.zarr", shape=b.shape, dtype=b.dtype, chunks=(10, 8),
                      shards=(20, 16))[:] = b
    zarr.create_array("t.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 8), shards=(32, 16),
                      compressors=None)[:] = a
    for tile in ((16, 16, 16), (70, 33, 45)):
        result = oocgemm.multiply("t.zarr", "s.zarr", device="cpu", tile=tile)
        assert_gemm(result.out, a, b)
        assert result.chunks["A"]["decodes"] == 3 * 3 and result.chunks["B"]["decodes"] == 9


def test_panels_that_are_whole_chunks_are_used_in_place(rng, workdir):
    """On the CPU a K panel that is exactly one decoded chunk is bound, not copied: its READs
    move no bytes; a panel that cuts chunks is copied."""
    x = rand(rng, (120, 30))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(40, 30))[:] = x
    whole = oocgemm.multiply("x.zarr", "x.zarr", device="cpu", trans_a=True, tile=(30, 30, 40))
    reads = [e for e in whole.events if e.kind == "read"]
    assert reads and all(e.nbytes == 0 for e in reads)
    assert whole.chunks["A"]["decodes"] == 3
    np.testing.assert_allclose(whole.out, x.T @ x, rtol=1e-12, atol=1e-11)
    cut = oocgemm.multiply("x.zarr", "x.zarr", device="cpu", trans_a=True, tile=(30, 30, 30))
    assert all(e.nbytes > 0 for e in cut.events if e.kind == "read")
    np.testing.assert_allclose(cut.out, x.T @ x, rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("layout", ["v3-raw", "v2-raw"])
def test_uncompressed_chunks_are_read_in_the_parts_panels_need(rng, workdir, layout):
    """Uncompressed chunk files are read in the parts a region needs, never decoded whole:
    regions across chunks and ragged edges give what zarr gives (a band never written reads
    as the fill value), and a Gram product runs under a host budget smaller than one chunk,
    holding no decoded chunk at all."""
    x = rand(rng, (300, 40))
    array = zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(128, 24),
                              fill_value=7.0, **DIRECT[layout])
    array[:256] = x[:256]
    want = zarr.open_array("x.zarr", mode="r")[:]
    src = ZarrSource(zarr.open_array("x.zarr", mode="r"), "x")
    assert src.sliced
    for rows, cols in (((0, 300), (0, 40)), ((5, 133), (3, 27)), ((250, 300), (30, 40)),
                       ((127, 129), (23, 25))):
        out = np.full((rows[1] - rows[0], cols[1] - cols[0]), np.nan)
        src.read(rows, cols, out)
        assert np.array_equal(out, want[slice(*rows), slice(*cols)]), (rows, cols)
    chunk = 128 * 24 * 8
    r = oocgemm.gram("x.zarr", device="cpu", host_memory_limit=chunk // 2)
    np.testing.assert_allclose(r.out, want.T @ want, rtol=1e-12, atol=1e-10)
    assert r.plan.decode_window == 0 and r.plan.chunk_reports() == [] and not r.chunks
    with open(src._direct.path((1, 1)), "r+b") as f:
        f.truncate(100)
    with pytest.raises(InputError, match=r"chunk \(1, 1\) \(corrupt or truncated chunk"):
        src.read((100, 200), (0, 40), np.empty((100, 40)))


def test_a_compressed_chunk_is_decoded_whole_once_for_its_panels(rng, workdir):
    """The same array compressed: panels far thinner than a chunk take their rows from one
    decode of it (each chunk decoded once), under a budget of about two chunks."""
    x = rand(rng, (600, 40))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(128, 40))[:] = x
    assert not ZarrSource(zarr.open_array("x.zarr", mode="r"), "x").sliced
    chunk = 128 * 40 * 8
    r = oocgemm.gram("x.zarr", device="cpu", host_memory_limit=int(2.5 * chunk),
                     tile=(40, 40, 16))
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-12, atol=1e-10)
    assert r.plan.io.cache == () and r.chunks["A"]["decodes"] == 5
    assert r.chunks["A"]["peak_bytes"] <= 2 * chunk


@pytest.mark.parametrize("codec", [None, numcodecs.Zstd(level=1)])
def test_chunks_written_from_the_rows_of_a_wider_block(rng, workdir, codec):
    """A whole chunk's rows inside a wider block (a column slice of it) are written as
    they lie, uncompressed; compressed, or at the array's edge (padded with the fill value),
    through a whole chunk. zarr reads back every value."""
    from oocgemm.storage.zarr_store import direct

    shape, chunks = (40, 50), (16, 16)
    out = zarr.create_array("c.zarr", shape=shape, chunks=chunks, dtype="f8", fill_value=0,
                            zarr_format=2, compressors=codec)
    x = rand(rng, shape)
    writer = direct(out)
    for index in itertools.product(range(3), range(4)):
        (r0, r1), (c0, c1) = chunk_region(index, chunks, shape)
        block = x[r0:r1]  # whole rows of x: a chunk is a column slice of them
        part = block[:, c0:c1]
        assert part.shape != chunks or not part.flags.c_contiguous
        writer.write(index, part)
    np.testing.assert_array_equal(zarr.open_array("c.zarr", mode="r")[...], x)


def test_buffers_written_back_to_back_through_short_writes(workdir, monkeypatch):
    """write_all: more buffers than one writev takes, and writes that stop short (at most
    1000 bytes a call here) go on where they stopped."""
    import os

    from oocgemm.storage import zarr_store

    rng = np.random.default_rng(5)
    buffers = [memoryview(rng.standard_normal(int(n))) for n in rng.integers(0, 40, 3000)]
    real, calls = os.writev, []

    def short(fd, views):
        calls.append(len(views))
        left, cut = 1000, []
        for view in views:
            cut.append(view[:left])
            left -= len(cut[-1])
            if not left:
                break
        return real(fd, cut)

    for writev in (real, short):
        monkeypatch.setattr(zarr_store.os, "writev", writev)
        with open("f.bin", "wb") as f:
            zarr_store.write_all(f.fileno(), buffers)
        with open("f.bin", "rb") as f:
            assert f.read() == b"".join(bytes(b) for b in buffers)
    assert max(calls) <= zarr_store.IOV_MAX and len(calls) > 3000 * 20 * 8 // 1000 // 2

"""The zstd frames of Zarr chunk files (what the GPU decoder reads): which arrays qualify, how
a stored object's bytes split into frames and how decoded frames assemble into its region,
checked here with numcodecs decoding the frames and numpy assembling them, against zarr's own
reads of real stores (v2, v3, sharded, ragged edges, chunks never written)."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zarr

import oocgemm
from oocgemm.errors import OptionError
from oocgemm.storage.frames import assemble, split_frames, zstd_layout
from oocgemm.storage.zarr_store import ZarrSource
from _helpers import rand


def _objects(layout):
    rows, cols = (-(-n // u) for n, u in zip(layout.shape, layout.unit))
    return [(i, j) for i in range(rows) for j in range(cols)]


def _decode_on_host(source, index):
    """Stored object ``index`` as the GPU decoder puts it together, with numcodecs for nvCOMP."""
    layout = source.zstd_layout
    try:
        with open(source.object_path(index), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = None
    zstd = numcodecs.Zstd()
    decoded = [None if frame is None else np.frombuffer(zstd.decode(bytes(frame)), np.uint8)
               for frame in split_frames(layout, index, data)]
    assert all(d is None or d.size == layout.frame_bytes for d in decoded)
    return assemble(np, layout, index, decoded)


LAYOUTS = {
    "v3": dict(chunks=(32, 24)),
    "v3-sharded": dict(chunks=(16, 12), shards=(32, 24)),
    "v3-sharded-index-first": dict(chunks=(32, 24), compressors=None, serializer=None),
    "v2": dict(chunks=(32, 24), zarr_format=2),
}


def _create(layout, x):
    options = dict(LAYOUTS[layout])
    if layout == "v3-sharded-index-first":
        options["serializer"] = zarr.codecs.ShardingCodec(
            chunk_shape=(16, 12), codecs=[zarr.codecs.BytesCodec(), zarr.codecs.ZstdCodec()],
            index_location="start")
    return zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, fill_value=-7, **options)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_frames_assemble_to_what_zarr_reads(rng, workdir, layout, dtype):
    x = rand(rng, (77, 53), dtype)  # ragged: neither side a multiple of a chunk or shard
    arr = _create(layout, x)
    arr[:40, :] = x[:40, :]  # the lower rows' chunks and shards are never written: fill
    if layout.startswith("v3-sharded"):
        arr[64:, :12] = x[64:, :12]  # an edge shard with most of its inner chunks missing
    source = ZarrSource(arr, "x")
    assert source.zstd_layout is not None
    want = arr[:]
    got = np.empty_like(want)
    for index in _objects(source.zstd_layout):
        (r0, r1), (c0, c1) = source.zstd_layout.region(index)
        got[r0:r1, c0:c1] = _decode_on_host(source, index)
    np.testing.assert_array_equal(got, want)
    assert (got[40:64] == -7).all()


@pytest.mark.parametrize("options", [
    dict(compressors=zarr.codecs.BloscCodec()),
    dict(compressors=zarr.codecs.GzipCodec()),
    dict(compressors=None),
    dict(compressors=zarr.codecs.ZstdCodec(), filters=None, serializer=zarr.codecs.BytesCodec(
        endian="big")),
    dict(compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()]),
    dict(zarr_format=2, compressors=numcodecs.Zstd(), filters=[numcodecs.Delta("<f8")]),
    dict(zarr_format=2, compressors=numcodecs.Blosc()),
], ids=["blosc", "gzip", "raw", "big-endian", "crc32c", "v2-filter", "v2-blosc"])
def test_other_codings_are_left_to_zarr(workdir, options):
    arr = zarr.create_array("x.zarr", shape=(40, 30), dtype="f8", chunks=(16, 16), **options)
    assert zstd_layout(arr) is None


def test_a_damaged_shard_index_is_refused(rng, workdir):
    arr = zarr.create_array("x.zarr", shape=(32, 24), dtype="f8", chunks=(16, 12),
                            shards=(32, 24))
    arr[:] = rand(rng, (32, 24))
    source = ZarrSource(arr, "x")
    path = source.object_path((0, 0))
    with open(path, "rb") as f:
        data = bytearray(f.read())
    with pytest.raises(ValueError, match="shorter than its index"):
        split_frames(source.zstd_layout, (0, 0), data[:10])
    at = len(data) - source.zstd_layout.index_size
    table = np.frombuffer(data, dtype="<u8", count=8, offset=at).copy()
    table[0] = len(data)  # the first inner chunk starts past the end
    data[at:at + 64] = table.tobytes()
    with pytest.raises(ValueError, match="runs past the shard's end"):
        split_frames(source.zstd_layout, (0, 0), bytes(data))


def test_decoder_option_is_checked(rng, workdir):
    x = rand(rng, (20, 20))
    zarr.create_array("a.zarr", shape=x.shape, dtype=x.dtype, chunks=(8, 8))[:] = x
    with pytest.raises(OptionError, match="decoder must be one of"):
        oocgemm.plan("a.zarr", "a.zarr", device="cpu", decoder="nvcomp")
    with pytest.raises(OptionError, match="decodes on a GPU, but the device is cpu"):
        oocgemm.plan("a.zarr", "a.zarr", device="cpu", decoder="gpu")
    r = oocgemm.multiply("a.zarr", "a.zarr", device="cpu", decoder="host")
    np.testing.assert_allclose(r.out, x @ x)
    assert r.plan.gpu_decode == ()

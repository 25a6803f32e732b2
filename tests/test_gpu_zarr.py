"""Zarr -> Zarr on the CUDA executor: the staged schedule reads every input chunk once (counted
at the store), writes the user's output layout, and reads URLs; skipped where no GPU is found."""

from __future__ import annotations

import pytest
import zarr
from _helpers import assert_gemm, rand
from test_chunks import counted, n_chunks, objects, unit, write

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


@pytest.mark.parametrize("layout", ["v3-zstd", "v3-sharded", "v2"])
def test_zarr_to_zarr_decodes_each_chunk_once(rng, workdir, layout):
    a, b = rand(rng, (600, 500)), rand(rng, (500, 450))
    write("a.zarr", a, (128, 96), layout)
    write("b.zarr", b, (96, 128), layout)
    (store_a, za), (store_b, zb) = counted("a.zarr"), counted("b.zarr")
    r = oocgemm.multiply(za, zb, "c.zarr", device="cuda", tile=(256, 192, 160),
                         out_options={"compressors": "zstd:1"})
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)
    assert r.plan.staged and set(r.plan.io.cache) == {"A", "B"}
    for name, store, x, chunks in (("A", store_a, a, (128, 96)), ("B", store_b, b, (96, 128))):
        chunks = unit(chunks, layout)
        assert objects(store) == n_chunks(x.shape, chunks)
        assert set(store.fetches.values()) == {1}
        assert r.chunks[name]["decodes"] == n_chunks(x.shape, chunks)
    out = zarr.open_array("c.zarr", mode="r")
    assert type(out.compressors[0]).__name__ == "ZstdCodec"


def test_streamed_operand_on_the_gpu(rng, workdir, monkeypatch):
    """One input kept decoded in host memory, the other streamed, on the host's decoders
    (OOCGEMM_GPU_DECODE=0: with the files in the page cache the GPU would decode both)."""
    monkeypatch.setenv("OOCGEMM_GPU_DECODE", "0")
    a, b = rand(rng, (512, 384)), rand(rng, (384, 512))
    write("a.zarr", a, (128, 128), "v3-zstd")
    write("b.zarr", b, (128, 128), "v3-zstd")
    kw = dict(device="cuda", tile=(128, 128, 128))
    roomy = oocgemm.plan("a.zarr", "b.zarr", **kw)
    budget = roomy.host_bytes - 1
    r = oocgemm.multiply("a.zarr", "b.zarr", host_memory_limit=budget, **kw)
    assert len(r.plan.io.cache) == 1
    assert_gemm(r.out, a, b)
    streamed = ({"A", "B"} - set(r.plan.io.cache)).pop()
    assert r.chunks[streamed]["decodes"] > n_chunks((384, 512), (128, 128))
    assert r.chunks[streamed]["peak_bytes"] <= r.plan.decode_window


def test_memory_urls_on_the_gpu(rng):
    import uuid

    root = f"memory://oocgemm-gpu-{uuid.uuid4().hex[:8]}"
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    for name, x in (("a", a), ("b", b)):
        zarr.create_array(f"{root}/{name}.zarr", shape=x.shape, dtype=x.dtype,
                          chunks=(64, 64))[:] = x
    oocgemm.multiply(f"{root}/a.zarr", f"{root}/b.zarr", f"{root}/c.zarr", device="cuda")
    assert_gemm(zarr.open_array(f"{root}/c.zarr", mode="r")[:], a, b)


def test_in_place_update_of_sharded_compressed_zarr_on_the_gpu(rng, workdir):
    # C blocks and write stripes smaller than the shards: writers share shards
    a, b, old = rand(rng, (300, 200)), rand(rng, (200, 260)), rand(rng, (300, 260))
    z = zarr.create_array("c.zarr", shape=old.shape, dtype="f8", chunks=(32, 32),
                          shards=(128, 128), compressors=zarr.codecs.ZstdCodec(level=3))
    z[...] = old
    z.attrs["units"] = "kelvin"
    oocgemm.multiply(a, b, "c.zarr", beta=-1.5, tile=(96, 64, 64), device="cuda")
    new = zarr.open_array("c.zarr", mode="r")
    assert_gemm(new[...], a, b, old, beta=-1.5)
    assert new.shards == (128, 128) and new.attrs["units"] == "kelvin"


@pytest.mark.parametrize("layout", ["v3-zstd", "v3-sharded"])
def test_stripes_store_each_output_chunk_once_on_the_gpu(rng, workdir, layout):
    """The CUDA executor writes C in row stripes thinner than the output's chunks: each
    chunk (shard) is still stored once, whole, at the end of its rows."""
    from test_chunk_writes import output

    a, b = rand(rng, (1024, 384)), rand(rng, (384, 768))
    store, array, _ = output("c.zarr", (1024, 768), (256, 192), layout)
    r = oocgemm.multiply(a, b, array, device="cuda", tile=(512, 384, 128))
    assert_gemm(array[:], a, b)
    writes = [op for op in r.plan.schedule.ops if op.kind.value == "write"]
    assert max(op.region[0][1] - op.region[0][0] for op in writes) < 256  # stripes cut chunks
    unit = (512, 384) if layout == "v3-sharded" else (256, 192)
    assert set(store.stores.values()) == {1}
    assert len(store.stores) == n_chunks((1024, 768), unit)


def test_small_blocks_run_the_planned_operations_and_store_each_chunk_once(rng, workdir):
    """The small-block cliff (issue 51): a small tile under a small budget into a default
    (uncompressed) Zarr C ran its planned operations, but its stripes cut C into chunks of a
    row or so, stored 16 KiB at a time. Every planned operation runs once, and C's chunks
    are stored once each, none under an eighth of a block."""
    import collections

    a, b = rand(rng, (2048, 2048)), rand(rng, (2048, 2048))
    for name, x in (("a", a), ("b", b)):
        zarr.create_array(f"{name}.zarr", shape=x.shape, chunks=(512, 512), dtype="f8",
                          compressors=None)[...] = x
    r = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cuda", tile=(512, 512, 512),
                         memory_limit="64MB", events=True)
    ran = collections.Counter(e.index for e in r.events if e.kind != "store")
    assert sorted(ran) == list(range(len(r.plan.schedule.ops))) and set(ran.values()) == {1}
    out = zarr.open_array("c.zarr", mode="r")
    assert out.chunks[0] * out.chunks[1] >= 512 * 512 // 8
    stores = [e for e in r.events if e.kind == "store"]
    assert len(stores) == n_chunks(out.shape, out.chunks)
    assert_gemm(out[:], a, b)

"""Reads at the grain of the storage: every chunk of a chunked input is fetched and decoded
whole, once per run when the host budget keeps it, once per load when it does not; counted
at the store, under the whole Zarr stack."""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
import time

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, evicted, leftovers, poisoned, rand
from zarr.storage import LocalStore, WrapperStore

import oocgemm
from oocgemm.devices import Device
from oocgemm.lifecycle.run import chunk_readers
from oocgemm.planning import IOChoices, Operand
from oocgemm.planning.chunks import (
    chunk_range,
    chunks_of,
    decode_counts,
    loads,
    most_touched,
    window_bytes,
)
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.memory import NumpySink, NumpySource
from oocgemm.storage.zarr_store import ZarrSource


class CountingStore(WrapperStore):
    """Counts the fetches of each chunk object (and, for shards, of each byte range other
    than the shard index, which zarr reads from the end), whichever way zarr asks: async,
    sync (zarr >= 3.4's fused pipeline) or by ranges."""

    def __init__(self, store):
        super().__init__(store)
        self.fetches: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, key, byte_range) -> None:
        name = key.rsplit("/", 1)[-1]
        metadata = name in ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")
        index = byte_range is not None and type(byte_range).__name__ == "SuffixByteRequest"
        if not metadata and not index:
            with self._lock:
                self.fetches[(key, repr(byte_range))] += 1

    async def get(self, key, prototype, byte_range=None):
        self._count(key, byte_range)
        return await super().get(key, prototype, byte_range)

    def get_sync(self, key, *, prototype=None, byte_range=None):
        self._count(key, byte_range)
        return super().get_sync(key, prototype=prototype, byte_range=byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        for key, byte_range in key_ranges:
            self._count(key, byte_range)
        return await super().get_partial_values(prototype, key_ranges)

    async def get_ranges(self, key, byte_ranges, **kwargs):
        for byte_range in byte_ranges:
            self._count(key, byte_range)
        async for group in super().get_ranges(key, byte_ranges, **kwargs):
            yield group


LAYOUTS = {
    "v3": dict(zarr_format=3),
    "v3-zstd": dict(zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=1)),
    "v2": dict(zarr_format=2),
    "v3-sharded": dict(zarr_format=3, shards="x2"),
}


def write(path, x, chunks, layout):
    options = dict(LAYOUTS[layout])
    if options.get("shards") == "x2":
        options["shards"] = (chunks[0] * 2, chunks[1] * 2)
    arr = zarr.create_array(path, shape=x.shape, dtype=x.dtype, chunks=chunks, **options)
    arr[:] = x


def unit(chunks, layout):
    """What a chunked source decodes at once: the chunk, or the shard of a sharded layout."""
    return (2 * chunks[0], 2 * chunks[1]) if layout == "v3-sharded" else chunks


def objects(store) -> int:
    """How many stored objects were fetched (a shard at the array's edge, which the array
    does not fill, is fetched inner chunk by inner chunk, each byte range once)."""
    return len({key for key, _ in store.fetches})


def counted(path):
    store = CountingStore(LocalStore(path, read_only=True))
    return store, zarr.open_array(store, mode="r")


def replayed(plan, sources: dict, shape) -> np.ndarray:
    """``plan`` replayed by the CPU executor from ``sources`` read at their grain
    (``chunk_readers``, as a run does) into a poisoned array of ``shape``, the readers
    closed after."""
    readers = chunk_readers(plan, sources)
    out = poisoned(shape)
    try:
        CpuExecutor(plan, readers, NumpySink(out)).run()
    finally:
        for src in readers.values():
            src.close()
    return out


def n_chunks(shape, chunks):
    return len(chunks_of(((0, shape[0]), (0, shape[1])), chunks))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("tile", [(16, 12, 8), (13, 10, 7)])  # aligned, and cutting chunks
def test_each_chunk_decoded_once_when_kept(rng, workdir, layout, tile):
    a, b = rand(rng, (50, 41)), rand(rng, (41, 37))
    write("a.zarr", a, (16, 8), layout)
    write("b.zarr", b, (8, 12), layout)
    (store_a, za), (store_b, zb) = counted("a.zarr"), counted("b.zarr")
    out = poisoned((50, 37))
    r = oocgemm.multiply(za, zb, out=out, device="cpu", tile=tile)
    assert_gemm(out, a, b)
    assert set(r.plan.io.cache) == {"A", "B"}  # the schedule reloads panels: keep them
    for name, store, x, chunks in (("A", store_a, a, (16, 8)), ("B", store_b, b, (8, 12))):
        chunks = unit(chunks, layout)
        assert objects(store) == n_chunks(x.shape, chunks)  # every chunk (shard)...
        assert set(store.fetches.values()) == {1}  # ...fetched once (each byte range)
        assert r.chunks[name]["decodes"] == n_chunks(x.shape, chunks)
        assert r.chunks[name]["kept"]
        # copies out of decoded chunks (none where a panel is one whole chunk, used in place)
        assert 0 <= r.chunks[name]["copy_seconds"] < r.seconds * 8  # 8 readers at most


@pytest.mark.parametrize("layout", ["v3-zstd", "v3-sharded"])
def test_staged_replay_decodes_each_chunk_once(rng, workdir, layout):
    """The CUDA executor's staged schedules read row stripes through the ring, many stripes
    to a chunk: replayed on the CPU, each chunk is still decoded once."""
    a, b = rand(rng, (48, 40)), rand(rng, (40, 36))
    write("a.zarr", a, (16, 8), layout)
    write("b.zarr", b, (8, 12), layout)
    (store_a, za), (store_b, zb) = counted("a.zarr"), counted("b.zarr")
    plan = oocgemm.plan(za, zb, device="cpu", tile=(16, 12, 8))
    plan = dataclasses.replace(plan, staged=True, stripe=24,
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))
    stripes = [op for op in plan.schedule.ops if op.kind.value == "read" and op.operand == "B"]
    assert len(stripes) > 2 * n_chunks(b.shape, (8, 12))  # stripes cut chunks, B is reloaded
    out = replayed(plan, {"A": ZarrSource(za, "a"), "B": ZarrSource(zb, "b")}, (48, 36))
    assert_gemm(out, a, b)
    for store, x, chunks in ((store_a, a, (16, 8)), (store_b, b, (8, 12))):
        assert set(store.fetches.values()) == {1}
        assert objects(store) == n_chunks(x.shape, unit(chunks, layout))


def test_streamed_operands_decode_once_per_load(rng, workdir):
    """Under a host budget too small to keep B, its chunks are decoded once per load that
    touches them (the plan says how many), and never more decoded bytes are held than the
    plan's window."""
    a, b = rand(rng, (64, 48)), rand(rng, (48, 64))
    write("a.zarr", a, (16, 16), "v3-zstd")
    write("b.zarr", b, (16, 16), "v3-zstd")
    # (a memory_limit that keeps no operand's panels all read, Plan.resident: each B panel is
    # loaded again for each block row)
    kw = dict(device="cpu", tile=(16, 16, 16), memory_limit="30KB")
    roomy = oocgemm.plan("a.zarr", "b.zarr", **kw)
    budget = roomy.host_bytes - 1  # one operand fewer fits
    plan = oocgemm.plan("a.zarr", "b.zarr", host_memory_limit=budget, **kw)
    assert len(plan.io.cache) == 1
    streamed = ({"A", "B"} - set(plan.io.cache)).pop()
    (store, zs) = counted(f"{streamed.lower()}.zarr")
    x = {"A": a, "B": b}[streamed]
    args = (zs, "b.zarr") if streamed == "A" else ("a.zarr", zs)
    r = oocgemm.multiply(*args, host_memory_limit=budget, **kw)
    assert_gemm(r.out, a, b)
    want = decode_counts(loads(r.plan.schedule.ops, streamed, (16, 16)), kept=False)
    assert sum(want.values()) > n_chunks(x.shape, (16, 16))  # reloaded: decoded again
    # each chunk is fetched once per load that needs it (a race between two readers of
    # neighbouring loads may add one decode, never lose one)
    fetches = {key: n for (key, _), n in store.fetches.items()}
    assert sum(fetches.values()) == r.chunks[streamed]["decodes"] >= sum(want.values())
    assert r.chunks[streamed]["decodes"] <= sum(want.values()) * 1.25
    report = {x.operand: x for x in r.plan.chunk_reports()}[streamed]
    assert sum(want.values()) <= report.decodes <= 1.5 * sum(want.values())  # an upper bound
    assert r.chunks[streamed]["peak_bytes"] <= r.plan.decode_window
    assert "decodes" in str(r.plan)


def test_staged_streamed_operand_stays_within_its_window(rng, workdir):
    """Stripes cut chunks (several stripes a chunk): a streamed operand's chunk is dropped
    after the last stripe of the load that needs it, so the decoded bytes held stay within
    the plan's window, while each chunk is still decoded once per load."""
    a, b = rand(rng, (64, 64)), rand(rng, (64, 96))
    write("a.zarr", a, (16, 16), "v3-zstd")
    write("b.zarr", b, (16, 16), "v3-zstd")
    (store_b, zb) = counted("b.zarr")
    plan = oocgemm.plan("a.zarr", zb, device="cpu", tile=(32, 32, 32))
    plan = dataclasses.replace(plan, staged=True, stripe=4 * 32, io=IOChoices(),
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2,
                                                           n_a=2, n_b=2))  # (reloaded)
    ops = plan.schedule.ops
    b_loads = loads(ops, "B", (16, 16))
    assert all(x.reads == 8 and set(x.uses) == {4} for x in b_loads)  # 4 stripes a chunk
    sources = chunk_readers(plan, {"A": ZarrSource(zarr.open_array("a.zarr"), "a"),
                                   "B": ZarrSource(zb, "b")})
    out = poisoned((64, 96))
    try:
        CpuExecutor(plan, sources, NumpySink(out)).run()
        peak, decodes = sources["B"].peak_bytes, sources["B"].decodes
    finally:
        for src in sources.values():
            src.close()
    assert_gemm(out, a, b)
    assert peak <= plan.decode_window
    assert decodes >= sum(decode_counts(b_loads, kept=False).values()) > n_chunks(b.shape,
                                                                                   (16, 16))


@pytest.mark.parametrize("layout", ["v3-zstd", "v2", "v3-sharded"])
@pytest.mark.parametrize("tile", [(40, 36, 8), (20, 18, 8), (20, 18, 7)])
def test_chunks_wider_than_panels_decode_once_per_stretch(rng, workdir, layout, tile):
    """Streamed operands whose chunks hold several K panels: a chunk stays decoded while
    consecutive loads need it, so each is decoded once per pass over K (not once per panel),
    and never more is held than the plan's window."""
    a, b = rand(rng, (40, 96)), rand(rng, (96, 36))
    write("a.zarr", a, (20, 32), layout)  # 4 or more K panels per chunk
    write("b.zarr", b, (32, 18), layout)
    (store_a, za), (store_b, zb) = counted("a.zarr"), counted("b.zarr")
    plan = oocgemm.plan(za, zb, device="cpu", tile=tile)
    plan = dataclasses.replace(plan, io=dataclasses.replace(plan.io, cache=()))
    sources = chunk_readers(plan, {"A": ZarrSource(za, "a"), "B": ZarrSource(zb, "b")})
    out = poisoned((40, 36))
    try:
        CpuExecutor(plan, sources, NumpySink(out)).run()
        got = {name: (sources[name].decodes, sources[name].peak_bytes) for name in "AB"}
    finally:
        for src in sources.values():
            src.close()
    assert_gemm(out, a, b)
    reports = {x.operand: x for x in plan.chunk_reports()}
    for name, x, store in (("A", a, store_a), ("B", b, store_b)):
        chunks = unit({"A": (20, 32), "B": (32, 18)}[name], layout)
        want = decode_counts(loads(plan.schedule.ops, name, chunks), kept=False)
        per_panel = decode_counts(loads(plan.schedule.ops, name, chunks), kept=False, gap=0)
        assert sum(want.values()) < sum(per_panel.values())  # panels share their chunks
        decodes, peak = got[name]
        assert sum(want.values()) <= decodes <= sum(want.values()) + 1
        assert decodes <= reports[name].decodes  # the plan's estimate is an upper bound
        assert peak <= plan.decode_window
        if tile[:2] == (40, 36):  # one C block: one pass over K, each chunk once
            assert decodes == n_chunks(x.shape, chunks) == objects(store)


@pytest.mark.parametrize("tile", [None, (16, 16, 300), (8, 8, 250)])
def test_gram_under_a_budget_of_a_few_chunks(rng, workdir, tile):
    """A Gram product of a matrix six chunks tall under a host budget of four: its chunks
    stream, each decoded once per C block for both roles (whatever the panels), and the
    decoded bytes held
    stay within the plan's window (the budget's four chunks, panels straddling chunks or
    not)."""
    x = rand(rng, (6000, 16))
    write("x.zarr", x, (1000, 16), "v3-zstd")
    chunk = 1000 * 16 * 8
    (store, zx) = counted("x.zarr")
    r = oocgemm.gram(zx, device="cpu", host_memory_limit=4 * chunk, tile=tile)
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-12, atol=1e-12)
    assert r.plan.io.cache == ()  # X does not fit: streamed
    report = r.plan.chunk_reports()[0]
    if r.plan.grid[0] == 1:  # one C block: one pass over K
        assert r.chunks["A"]["decodes"] == 6 == objects(store) == report.decodes
        assert set(store.fetches.values()) == {1}
    else:  # a pass per block (3), each decoding a chunk once for both roles
        assert r.plan.grid[0] == 2
        assert 2 * 6 < r.chunks["A"]["decodes"] == sum(store.fetches.values()) <= 3 * 6
        assert r.chunks["A"]["decodes"] <= report.decodes
    assert r.chunks["A"]["peak_bytes"] <= r.plan.decode_window <= 4 * chunk


def test_a_chunk_too_large_for_the_budget_is_named(rng, workdir):
    """A budget smaller than two of a chunk (one read, the next decoded) is refused before
    any work by a BudgetError naming the chunk, its size and a budget that works; that
    budget then runs."""
    x = rand(rng, (4000, 16))
    write("x.zarr", x, (2000, 16), "v3-zstd")
    with pytest.raises(oocgemm.BudgetError) as info:
        oocgemm.gram("x.zarr", device="cpu", host_memory_limit="300KB")
    message = str(info.value)
    assert "2000x16" in message and "250 KiB each" in message and "x.zarr" in message
    budget = message.split("host_memory_limit=")[-1].split(" would work")[0]
    assert oocgemm.units.parse_size(budget) <= 2.1 * 2000 * 16 * 8  # two chunks and a little
    r = oocgemm.gram("x.zarr", device="cpu", host_memory_limit=budget.replace(" ", ""))
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-12, atol=1e-12)


def test_window_bytes_rounds_to_whole_chunks():
    assert window_bytes((16, 16), (16, 16), 8) == 16 * 16 * 8
    assert window_bytes((17, 16), (16, 16), 8) == 2 * 16 * 16 * 8  # 17 rows span 2 chunks
    assert window_bytes((18, 16), (16, 16), 8) == 2 * 16 * 16 * 8  # starts even: 2
    assert window_bytes((19, 16), (16, 16), 8) == 3 * 16 * 16 * 8  # 19 from row 15: 3
    assert window_bytes((4, 16), (16, 16), 8) == 16 * 16 * 8  # panels inside one chunk
    assert window_bytes((19, 16), (16, 16), 8, shape=(20, 16)) == 2 * 16 * 16 * 8  # 2 exist
    assert window_bytes((10, 10), None, 8) == 0


def test_most_touched_is_the_most_any_panel_touches():
    """Panels of ``extent`` placed on multiples of it touch at most ``most_touched`` chunks,
    and some panel touches that many (checked against every panel of a long array)."""
    for extent in range(1, 41):
        for chunk in range(1, 25):
            total = 4 * extent * chunk
            most = max(len(chunk_range(i, min(i + extent, total), chunk))
                       for i in range(0, total, extent))
            assert most_touched(extent, chunk) == most, (extent, chunk)
            short = 2 * extent + 1
            within = max(len(chunk_range(i, min(i + extent, short), chunk))
                         for i in range(0, short, extent))
            assert within <= most_touched(extent, chunk, short) <= -(-short // chunk)


def test_loads_group_the_stripes_of_one_region(rng, workdir):
    a, b = rand(rng, (48, 40)), rand(rng, (40, 36))
    write("a.zarr", a, (16, 8), "v3")
    write("b.zarr", b, (8, 12), "v3")
    plan = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 12, 8))
    staged = dataclasses.replace(plan, staged=True, stripe=24,
                                 staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))
    flat, striped = (loads(p.schedule.ops, "B", (8, 12)) for p in (plan, staged))
    assert [x.region for x in flat] == [x.region for x in striped]
    assert all(x.reads == 1 for x in flat) and any(x.reads > 1 for x in striped)


def test_plan_keeps_within_host_memory_limit(rng, workdir):
    a, b = rand(rng, (64, 64)), rand(rng, (64, 64))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype=x.dtype, chunks=(16, 16))[:] = x
    roomy = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16))
    assert set(roomy.io.cache) == {"A", "B"}
    assert roomy.host_bytes >= 2 * a.nbytes and "kept in host memory" in str(roomy)
    none = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16),
                        host_memory_limit=roomy.decode_window + 4 * 16 * 16 * 8)
    assert none.io.cache == ()
    in_memory = oocgemm.plan(a, b, device="cpu", tile=(16, 16, 16))
    assert in_memory.io.cache == ()  # nothing to save: the data is in memory already
    np.save("a.npy", a)
    np.save("b.npy", b)
    memmaps = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(16, 16, 16))
    assert memmaps.io.cache == ()  # the OS page cache is already their cache
    for plan_ in (roomy, none):
        r = oocgemm.multiply("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16),
                             host_memory_limit=plan_.host_memory_limit)
        assert r.plan.io.cache == plan_.io.cache
        assert_gemm(r.out, a, b)


def test_keeping_cuts_predicted_decode_and_storage_time(workdir):
    zarr.create_array("a.zarr", shape=(4000, 3000), dtype="f8", chunks=(500, 500))
    zarr.create_array("b.zarr", shape=(3000, 5000), dtype="f8", chunks=(500, 500))
    # (a memory_limit that keeps no operand's panels all read, Plan.resident)
    kw = dict(device="cpu", tile=(1000, 1000, 1000), memory_limit="100MB")
    kept = oocgemm.plan("a.zarr", "b.zarr", **kw)
    streamed = oocgemm.plan("a.zarr", "b.zarr", host_memory_limit="64MB", **kw)
    assert kept.io.cache and not streamed.io.cache
    assert kept.prediction.storage_read < streamed.prediction.storage_read / 2
    assert kept.prediction.decode < streamed.prediction.decode / 2
    summary = streamed.summary()["chunks"]
    assert summary["A"]["grid"] == [8, 6] and summary["A"]["decodes"] > 8 * 6
    assert not summary["A"]["kept"] and kept.summary()["chunks"]["A"]["kept"]


@pytest.mark.parametrize("layout", ["v3-zstd", "v2", "v3-sharded"])
def test_storage_time_is_predicted_from_the_bytes_stored(rng, workdir, layout):
    """A compressed input's storage reads are predicted from its stored bytes (a sample of its
    objects' sizes, none read; chunks never written left out), not its decoded bytes: the
    same product from inputs that compress well and from ones that do not differs in its
    predicted storage time as their stored bytes do."""
    shape, chunks = (384, 320), (64, 64)
    noise = rand(rng, shape)
    smooth = np.round(noise, 1)  # a few distinct values: compresses well
    write("noise.zarr", noise, chunks, layout)
    write("smooth.zarr", smooth, chunks, layout)
    write("part.zarr", noise[:128], chunks, layout)
    part = zarr.open_array("part.zarr", mode="r+")
    part.resize(shape)  # (the rows added: chunks never written)
    fractions = {name: ZarrSource(zarr.open_array(name + ".zarr"), name).stored_fraction()
                 for name in ("noise", "smooth", "part")}
    assert 0.5 < fractions["noise"] <= 1.05 and fractions["smooth"] < 0.5 * fractions["noise"]
    # a third of its chunks written: the others cost no read
    assert fractions["part"] == pytest.approx(fractions["noise"] / 3, rel=0.1)
    assert NumpySource(noise).stored_fraction() == 1.0
    zarr.create_array("zeros.zarr", shape=shape, dtype="f8", chunks=chunks,
                      config={"write_empty_chunks": True})[:] = 0.0
    assert ZarrSource(zarr.open_array("zeros.zarr"), "z").stored_fraction() == 0.01  # least
    with pytest.raises(ValueError, match="stored=0"):
        Operand((2, 2), stored=0.0)
    ragged = rand(rng, (150, 130))  # uncompressed, edge chunks stored padded: read in parts
    zarr.create_array("raw.zarr", shape=ragged.shape, dtype="f8", chunks=(64, 64),
                      compressors=None)[:] = ragged
    whole = ZarrSource(zarr.open_array("raw.zarr"), "raw").stored_fraction()
    assert whole == pytest.approx(1.0, abs=0.01)
    assert oocgemm.plan("raw.zarr", ragged.T, device="cpu").problem.a.stored == 1.0
    kw = dict(device="cpu", tile=(128, 128, 64))
    plans = {name: oocgemm.plan(name + ".zarr", rand(rng, shape[::-1]), **kw)
             for name in ("noise", "smooth")}
    assert plans["smooth"].problem.a.stored == pytest.approx(fractions["smooth"])
    said = plans["smooth"].summary()["chunks"]["A"]["stored"]
    assert said == pytest.approx(fractions["smooth"], abs=1e-4)
    assert f"stored in {fractions['smooth']:.0%} of their decoded bytes" in str(plans["smooth"])
    ratio = plans["smooth"].prediction.storage_read / plans["noise"].prediction.storage_read
    assert ratio == pytest.approx(fractions["smooth"] / fractions["noise"], rel=1e-6)


@pytest.mark.parametrize("layout", ["v3", "v2", "v3-sharded"])
def test_chunk_objects_are_hinted_to_the_os_ahead_of_their_decodes(rng, workdir, layout):
    """A cold disk reads ahead of the decoders: each chunk's object (its shard when sharded)
    is a real file of the store, hinted before or when its decode starts."""
    a, b = rand(rng, (48, 40)), rand(rng, (40, 36))
    write("a.zarr", a, (8, 8), layout)
    calls = []

    class Watched(ZarrSource):
        def prefetch_chunk(self, index):
            calls.append(("hint", index, os.path.isfile(self.object_path(index))))
            super().prefetch_chunk(index)

        def read_chunk(self, index, out, *, files=None):
            calls.append(("decode", index, None))
            super().read_chunk(index, out, files=files)

    plan = oocgemm.plan("a.zarr", b, device="cpu", tile=(16, 12, 8))
    sources = chunk_readers(plan, {"A": Watched(zarr.open_array("a.zarr"), "a"),
                                   "B": NumpySource(b)})
    out = poisoned((48, 36))
    try:
        CpuExecutor(plan, sources, NumpySink(out)).run()
    finally:
        sources["A"].close()
    assert_gemm(out, a, b)
    hinted = [index for kind, index, _ in calls if kind == "hint"]
    decoded = [index for kind, index, _ in calls if kind == "decode"]
    assert sorted(decoded) == sorted(set(decoded)) == sorted(
        chunks_of(((0, 48), (0, 40)), unit((8, 8), layout)))
    assert sorted(hinted) == sorted(decoded)  # every chunk hinted once
    assert all(ok for kind, _, ok in calls if kind == "hint")  # a real object of the store
    for index in decoded:  # hinted no later than its decode
        assert calls.index(("decode", index, None)) > min(
            i for i, c in enumerate(calls) if c[0] == "hint" and c[1] == index)


@pytest.mark.parametrize("cold", [True, False])
def test_cold_sources_decode_in_the_order_the_schedule_needs_their_chunks(rng, workdir,
                                                                         monkeypatch, cold):
    """Chunks the page cache does not hold come from the disk itself: their decodes begin in
    the order the schedule first needs them, across the sources (A's later chunks do not
    share the disk with the B chunks the first block needs), a window of bytes at a time
    (here one chunk); a warm source decodes on every decoder at once."""
    from oocgemm.storage import chunked

    a, b = rand(rng, (96, 64)), rand(rng, (64, 48))
    write("a.zarr", a, (8, 8), "v3-zstd")
    write("b.zarr", b, (8, 8), "v3-zstd")
    monkeypatch.setattr(chunked, "COLD_WINDOW", 8 * 8 * 8)  # one chunk at a time
    lock, running, most, begun = threading.Lock(), [0], [0], []

    class Watched(ZarrSource):
        def read_chunk(self, index, out, *, files=None):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                begun.append((self.name, index))
            time.sleep(0.002)  # long enough for the decoders to overlap where they may
            super().read_chunk(index, out, files=files)
            with lock:
                running[0] -= 1

    plan = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(32, 48, 16))
    prob = plan.problem
    told = {name: dataclasses.replace(getattr(prob, name), cached=not cold) for name in "ab"}
    plan = dataclasses.replace(plan, problem=dataclasses.replace(prob, **told))
    out = replayed(plan, {"A": Watched(zarr.open_array("a.zarr"), "a"),
                          "B": Watched(zarr.open_array("b.zarr"), "b")}, (96, 48))
    assert_gemm(out, a, b)
    assert sorted(begun) == sorted(set(begun))  # each chunk once
    first = {}  # where the schedule first needs each chunk
    for name in "ab":
        for load in loads(plan.schedule.ops, name.upper(), (8, 8)):
            for index in load.chunks:
                first.setdefault((name, index), load.first)
    if cold:
        assert most[0] == 1
        assert [first[x] for x in begun] == sorted(first[x] for x in begun)
        names = [name for name, _ in begun]  # the sources interleaved, not one after the other
        assert names.index("b") < len(names) - 1 - names[::-1].index("a")
    else:
        assert most[0] > 1


def test_bytes_say_what_came_from_storage(rng, workdir):
    """``result.bytes`` keeps apart what came from storage (the compressed bytes of the
    chunks read, each chunk once here), what was decoded, and what the READs copied out of
    the decoded chunks into the slots (more: panels reloaded for every block); the plan, the
    JSON summary and the timeline say the same."""
    x = np.round(rand(rng, (4000, 48)), 2)  # compresses to well under its size
    write("x.zarr", x, (500, 48), "v3-zstd")
    stored = sum(f.stat().st_size for f in (workdir / "x.zarr" / "c").rglob("*") if f.is_file())
    r = oocgemm.gram("x.zarr", device="cpu", tile=(16, 16, 100))
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-12, atol=1e-9)
    assert r.chunks["A"]["decodes"] == 8  # kept: each chunk once
    assert r.bytes["storage_read"] == stored < x.nbytes / 2
    assert r.bytes["decoded"] == x.nbytes == r.chunks["A"]["decoded_bytes"]
    assert r.bytes["read"] > 2 * x.nbytes  # copied out of decoded chunks, panel by panel
    summary = r.summary()
    assert summary["bytes"]["storage_read"] == stored
    assert summary["planned_bytes"]["decoded"] >= x.nbytes
    assert "chunks decoded (at most)" in str(r.plan)
    assert "taken from storage" in str(r.timeline)
    assert r.timeline.to_dict()["meta"]["storage"]["storage_read"] == stored
    np.save("x.npy", x)  # a .npy's reads are its storage reads
    r = oocgemm.gram("x.npy", device="cpu", tile=(16, 16, 100))
    assert r.bytes["storage_read"] == r.bytes["read"] > 0 and r.bytes["decoded"] == 0


# -- chunks decoded straight into the pinned ring (Plan.io.into_ring) -----------------------------

def _gpu_like(plan):
    """``plan`` as the CUDA executor stages it (no GPU needed: the planner is pure), with its
    ring of whole chunks where that applies (``with_ring_decodes``)."""
    from oocgemm.planning import with_ring_decodes
    from oocgemm.runtime.cuda_executor import CudaExecutor

    staging = CudaExecutor.staging(plan.problem, plan.model)
    return with_ring_decodes(dataclasses.replace(
        plan, staged=True, io=dataclasses.replace(plan.io, cache=()), staging=staging))


@pytest.mark.parametrize("rows", [400, 377])  # whole chunks, and a ragged last one
@pytest.mark.parametrize("trans_a", [True, False])
def test_tall_skinny_gram_decodes_each_chunk_into_the_ring(rng, workdir, rows, trans_a):
    """A tall-skinny X^T X (or X X^T of a wide X, panels a chunk wide) of zstd chunks
    spanning X's short side:
    the staged plan's ring buffers are one chunk each, every read is one whole chunk read
    once, and the readers decode each chunk straight into the ring: no decoded chunk held,
    nothing copied out of one, each chunk decoded once; C right and bitwise symmetric."""
    x = rand(rng, (rows, 24)) if trans_a else rand(rng, (24, rows))
    chunks = (50, 24) if trans_a else (24, 50)
    write("x.zarr", x, chunks, "v3-zstd")
    zx = zarr.open_array("x.zarr", mode="r")
    # X X^T: a K panel of a wide X is whole chunks only where it is one chunk wide
    plan = _gpu_like(oocgemm.plan(zx, zx, trans_a=trans_a, trans_b=not trans_a, device="cpu",
                                  tile=(24, 24, 100 if trans_a else 50)))
    assert plan.io.into_ring == ("A", "B") and plan.symmetric
    assert plan.buffers.ring == 50 * 24 * 8
    assert "straight into the pinned ring" in str(plan)
    reads = [op.region for op in plan.schedule.ops if op.kind.value == "read"]
    assert len(reads) == len(set(reads)) == n_chunks(x.shape, chunks)
    source = ZarrSource(zx, "x")
    assert source.decodes_into
    sources = chunk_readers(plan, {"A": source, "B": source})
    out = poisoned((24, 24))
    try:
        CpuExecutor(plan, sources, NumpySink(out)).run()
        reader = sources["A"]
        assert reader is sources["B"] and reader.into
        assert reader.decodes == n_chunks(x.shape, chunks)
        assert reader.peak_bytes == 0 and reader.copy_seconds == 0
    finally:
        sources["A"].close()
    want = x.T @ x if trans_a else x @ x.T
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-10)
    assert np.array_equal(out, out.T)


def test_ring_of_chunks_only_where_every_read_is_a_whole_chunk(rng, workdir):
    """No ring of chunks where a read would cut a chunk (chunks narrower than X), where C
    has several blocks (panels reloaded), where the chunk is stored uncompressed (read in
    parts, no decode), or where the host budget has no room for it: the plan is unchanged."""
    x = rand(rng, (400, 24))
    write("narrow.zarr", x, (50, 8), "v3-zstd")
    write("x.zarr", x, (50, 24), "v3-zstd")
    zarr.create_array("raw.zarr", shape=x.shape, dtype=x.dtype, chunks=(50, 24),
                      compressors=None)[:] = x
    for path, tile in (("narrow.zarr", (24, 24, 100)), ("x.zarr", (8, 8, 100)),
                       ("raw.zarr", (24, 24, 100))):
        plan = _gpu_like(oocgemm.plan(path, path, trans_a=True, device="cpu", tile=tile))
        assert plan.io.into_ring == (), path
    roomy = _gpu_like(oocgemm.plan("x.zarr", "x.zarr", trans_a=True, device="cpu",
                                   tile=(24, 24, 100)))
    assert roomy.io.into_ring
    tight = dataclasses.replace(roomy, io=dataclasses.replace(roomy.io, into_ring=()),
                                stripe=50 * 8,
                                host_memory_limit=roomy.host_bytes - 1)
    assert _gpu_like(tight).io.into_ring == ()


def test_the_gpu_plan_of_a_tall_skinny_gram_rings_whole_chunks():
    """The H100 benchmark's X^T X (X 1,000,000 x 2048 in zstd chunks of 16384 rows), planned
    as on a 16-core host: 256 MiB ring buffers going up (a chunk each), 32 MiB ones coming
    down, no decoded chunk held in host memory, each chunk decoded once."""
    from unittest import mock

    from oocgemm import machine
    from oocgemm.planning import Plan, Problem, choose_tile, cuda_model, finished
    from oocgemm.runtime.cuda_executor import CudaExecutor

    x = Operand((1_000_000, 2048), (16384, 2048), True, "x.zarr", decodes_into=True)
    prob = Problem(m=2048, n=2048, k=1_000_000, itemsize=8, dtype="float64", a=x, b=x,
                   out=Operand((2048, 2048)), trans_a=True, shared=True)
    with mock.patch.object(machine, "cores", lambda: 16):
        staging = CudaExecutor.staging(prob, cuda_model())
    budget = dict(memory_limit=72 << 30, host_memory_limit=32 << 30)
    tile = choose_tile(prob, cuda_model(), *budget.values(), staged=True, symmetric=True,
                       **staging.tiling())
    plan = finished(Plan(problem=prob, device=Device("cuda", 0), model=cuda_model(), tile=tile,
                          staged=True, symmetric=True, **budget, staging=staging))
    assert plan.io.into_ring == ("A", "B") and plan.io.cache == ()
    assert (plan.buffers.ring, plan.buffers.out_ring) == (256 << 20, 32 << 20)
    assert plan.decode_window == 0
    assert plan.host_bytes == plan.staging.n_stage * (256 << 20) + plan.staging.n_out * (32 << 20)
    (report,) = plan.chunk_reports()
    assert report.into_ring and report.decodes == report.n_chunks == 62
    reads = [op for op in plan.schedule.ops if op.kind.value == "read"]
    assert len(reads) == 62
    # finished again for blocks that reload panels (a replan, a resume): decided anew, so
    # the chunks are kept or windowed again, never counted as decoded into a ring
    again = finished(dataclasses.replace(plan, tile=(1024, 1024, 98304)))
    assert again.io.into_ring == () and (again.io.cache or again.decode_window > 0)
    assert again.buffers.ring == 32 << 20


@pytest.mark.parametrize("window", [None, 1024], ids=["pieces", "pages"])
@pytest.mark.parametrize("layout", ["v3-zstd", "v3-sharded", "v3", "v2"])
def test_inputs_read_cold_from_the_disk_give_the_bits_of_a_warm_run(rng, workdir, layout,
                                                                   window, monkeypatch):
    """Inputs the page cache does not hold (dropped from it here) are planned as cold and
    read through the disk's queue, in the order needed, each chunk's file read whole in
    pieces (not decoded from its pages as they fault in), or, where an object is large
    beside the queue's window, decoded from its pages (no buffer of its size held): the
    same C, bit for bit, as from the page cache."""
    from oocgemm.storage import chunked
    from oocgemm.storage.chunked import DiskQueue

    if window is not None:
        monkeypatch.setattr(chunked, "COLD_WINDOW", window)

    files = []
    whole = DiskQueue.read
    monkeypatch.setattr(DiskQueue, "read", staticmethod(
        lambda path, into=None: files.append(path) or whole(path, into)))
    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    write("a.zarr", a, (64, 40), layout)
    write("b.zarr", b, (40, 64), layout)
    warm = oocgemm.multiply("a.zarr", "b.zarr", device="cpu", tile=(128, 130, 80))
    assert any("A and B held" in d for d in warm.plan.decisions)
    if not evicted("a.zarr", "b.zarr"):
        pytest.skip("this file system keeps the files in memory")
    assert files == []  # (warm: decoded from the page cache's pages)
    cold = oocgemm.multiply("a.zarr", "b.zarr", device="cpu", tile=(128, 130, 80))
    assert not any("held" in d for d in cold.plan.decisions)
    assert not cold.plan.problem.a.cached and not cold.plan.problem.b.cached
    read = {os.path.dirname(f).split(os.sep)[0] for f in files}
    assert read == ({"a.zarr", "b.zarr"} if window is None else set())
    assert np.array_equal(cold.out, warm.out)
    assert_gemm(cold.out, a, b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_reads_cold_files_with_pools_of_its_own(workdir, monkeypatch):
    """A child forked after the process's disk readers ran (a worker forked by a pool) reads
    a file in pieces too: the parent's threads are not its own, and a pool that counted
    them idle would hand the child's few pieces to threads that are not there."""
    import multiprocessing

    from oocgemm.storage import chunked

    monkeypatch.setattr(chunked, "DISK_PIECE", 1000)
    rng = np.random.default_rng(5)
    big, small = (rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (20_000, 1_500))
    for name, data in (("big.bin", big), ("small.bin", small)):
        with open(name, "wb") as fh:
            fh.write(data)
    assert bytes(chunked.DiskQueue.read("big.bin")) == big  # the parent's pool, at work
    time.sleep(0.2)  # its threads idle again (counted idle: what a child would find)

    def child():
        os._exit(0 if bytes(chunked.DiskQueue.read("small.bin")) == small else 1)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(30)
    if process.is_alive():
        process.kill()
        pytest.fail("the forked child's read never ended")
    assert process.exitcode == 0


def test_a_cold_file_is_read_whole_in_pieces_at_once(workdir, monkeypatch):
    """DiskQueue.read: a file's pieces read on several threads at once (a disk keeps its rate
    only with many requests under way), its bytes whole, into a new buffer or one given; a
    buffer too small for the file, or no file, is an error."""
    from oocgemm.storage import chunked

    data = np.random.default_rng(3).integers(0, 256, 10_500, dtype=np.uint8).tobytes()
    with open("f.bin", "wb") as fh:
        fh.write(data)
    monkeypatch.setattr(chunked, "DISK_PIECE", 1000)
    threads, preadv = set(), os.preadv

    def watched(fd, buffers, offset):
        threads.add(threading.current_thread().name)
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(chunked.os, "preadv", watched)
    got = chunked.DiskQueue.read("f.bin")
    assert bytes(got) == data and len(threads) > 1
    assert any(name.startswith("oocgemm-disk") for name in threads)
    into = bytearray(11_000)
    got = chunked.DiskQueue.read("f.bin", into)
    assert got.nbytes == len(data) and bytes(into[:len(data)]) == data
    with pytest.raises(ValueError, match="more than"):
        chunked.DiskQueue.read("f.bin", bytearray(10_000))
    with pytest.raises(FileNotFoundError):
        chunked.DiskQueue.read("missing.bin")


def test_a_corrupt_chunk_read_cold_fails_the_run_cleanly(rng, workdir):
    """A chunk that does not decode, read through the disk's queue: the run fails with the
    chunk named (no read left waiting), and no output is left."""
    x = rand(rng, (96, 80))
    write("a.zarr", x, (16, 16), "v3-zstd")
    chunk = os.path.join("a.zarr", "c", "2", "3")
    data = open(chunk, "rb").read()
    with open(chunk, "wb") as fh:
        fh.write(bytes(reversed(data)))
    if not evicted("a.zarr"):
        pytest.skip("this file system keeps the files in memory")
    with pytest.raises(oocgemm.OOCGemmError, match="corrupt or truncated chunk"):
        oocgemm.multiply("a.zarr", rand(rng, (80, 64)), "c.npy", device="cpu",
                         tile=(32, 32, 16))
    assert not os.path.exists("c.npy") and leftovers(workdir) == []


def test_a_disk_queue_begins_in_rank_order_within_its_window_without_recursion():
    """Decodes begin in the order of their ranks, no more bytes under way than the window
    (one at least); thousands that fail as they begin (a closed reader's) are passed over
    one after another, not by recursion."""
    from oocgemm.storage.chunked import DiskQueue

    queue, begun = DiskQueue(window=250), []

    def later(rank):
        def begin():
            begun.append(rank)
        return begin

    for rank in (5, 1, 4, 2, 3):
        queue.put(rank, 100, later(rank))
    assert begun == [5, 1]  # (5 came first, while the queue was empty) then the window is full
    for _ in range(5):  # each under way ends in turn
        queue.done(100)
    assert begun == [5, 1, 2, 3, 4] and not queue._pending and queue._running == 0
    failing = DiskQueue(window=100)
    failing.put(-1, 100, lambda: None)  # under way until its done below
    for rank in range(5000):
        failing.put(rank, 100, lambda: failing.done(100))  # fails at once: over at once
    assert len(failing._pending) == 5000
    failing.done(100)  # the first ends: the others begin, and fail, in turn
    assert failing._running == 0 and not failing._pending


def test_a_streamed_cold_source_queues_each_decode_where_its_load_needs_it(rng, workdir):
    """A streamed source read cold decodes a chunk again for each stretch of loads that needs
    it: each decode goes on the disk's queue at the first read of the load it is for, not at
    the chunk's first need in the run (which would put a late decode ahead of earlier ones)."""
    from oocgemm.storage.chunked import ChunkReader, DiskQueue

    b = rand(rng, (48, 64))
    write("b.zarr", b, (16, 16), "v3-zstd")
    kw = dict(device="cpu", tile=(16, 16, 16), memory_limit="30KB")
    roomy = oocgemm.plan(rand(rng, (64, 48)), "b.zarr", **kw)
    plan = oocgemm.plan(rand(rng, (64, 48)), "b.zarr", host_memory_limit=roomy.host_bytes - 1,
                        **kw)
    assert "B" not in plan.io.cache  # streamed: loaded again for each block row
    queued = []

    class Watched(DiskQueue):
        def put(self, rank, nbytes, begin):
            queued.append(rank)
            super().put(rank, nbytes, begin)

    load_list = loads(plan.schedule.ops, "B", (16, 16))
    reader = ChunkReader(ZarrSource(zarr.open_array("b.zarr"), "b"), load_list, kept=False,
                         disk=Watched())
    try:
        for load in load_list:  # read as the schedule does, load by load
            (r0, r1), (c0, c1) = load.region
            out = np.empty((r1 - r0, c1 - c0))
            reader.read((r0, r1), (c0, c1), out)
            np.testing.assert_array_equal(out, b[r0:r1, c0:c1])
    finally:
        reader.close()
    firsts = [load.first for load in load_list]
    assert len(queued) > len(set(load.chunks[0] for load in load_list))  # decoded again
    assert queued == sorted(queued) and set(queued) <= set(firsts)
    assert queued[-1] == firsts[-1]  # the last decodes at the last load's rank

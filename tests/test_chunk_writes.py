"""Writes at the grain of the storage: a staged schedule writes C blocks in row stripes, and
every chunk of a chunked output is still encoded and stored once, whole; counted at the
store, under the whole Zarr stack."""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand
from zarr.storage import LocalStore, WrapperStore

import oocgemm
from oocgemm.lifecycle.run import chunk_readers, chunk_writer
from oocgemm.planning.chunks import assembly_bytes, chunks_of
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.chunked import ChunkWriter
from oocgemm.storage.zarr_store import ZarrSink, ZarrSource


class StoringCounter(WrapperStore):
    """Counts the stores of each chunk object, whichever way zarr makes them."""

    def __init__(self, store):
        super().__init__(store)
        self.stores: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, key) -> None:
        if key.rsplit("/", 1)[-1] not in ("zarr.json", ".zarray", ".zattrs", ".zgroup"):
            with self._lock:
                self.stores[key] += 1

    async def set(self, key, value):
        self._count(key)
        return await super().set(key, value)

    def set_sync(self, key, value):
        self._count(key)
        return super().set_sync(key, value)


LAYOUTS = {
    "v3-zstd": dict(zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=1)),
    "v2": dict(zarr_format=2),
    "v3-sharded": dict(zarr_format=3, shards="x2"),
}


def output(path, shape, chunks, layout):
    """A new Zarr output of ``layout`` on a counting store, filled with a poison value, and
    the sink that writes it in place (as an update of a given array does)."""
    options = dict(LAYOUTS[layout])
    if options.get("shards") == "x2":
        options["shards"] = (chunks[0] * 2, chunks[1] * 2)
    store = StoringCounter(LocalStore(path))
    array = zarr.create_array(store, shape=shape, dtype="float64", chunks=chunks,
                              fill_value=np.nan, **options)
    store.stores.clear()
    return store, array, ZarrSink(shape=shape, dtype="float64", name="c", array=array)


def staged_plan(a, b, chunks, tile, stripe):
    """A CPU plan made to replay the CUDA executor's staged schedule: C blocks leave the
    ring in stripes of ``stripe`` elements, which cut the output's chunks."""
    plan = oocgemm.plan(a, b, device="cpu", tile=tile, out="c.zarr",
                        out_options={"chunks": chunks})
    return dataclasses.replace(plan, staged=True, stripe=stripe,
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))


def replay(plan, a, b, sink):
    sources = chunk_readers(plan, {"A": ZarrSource(zarr.open_array("a.zarr"), "a"),
                                   "B": ZarrSource(zarr.open_array("b.zarr"), "b")})
    try:
        CpuExecutor(plan, sources, sink).run()
        sink.flush()
    finally:
        for src in sources.values():
            src.close()


def inputs(rng, m, k, n):
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 16))[:] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype=b.dtype, chunks=(16, 16))[:] = b
    return a, b


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_staged_writes_store_each_chunk_once(rng, workdir, layout):
    """Four stripes to a chunk row band: through the writer every chunk (shard) is stored
    once; straight to the sink, each is stored again for every stripe that touches it."""
    a, b = inputs(rng, 64, 40, 72)
    chunks = (16, 12)
    plan = staged_plan(a, b, chunks, tile=(32, 24, 16), stripe=4 * 24)
    writes = [op for op in plan.schedule.ops if op.kind.value == "write"]
    assert {op.region[0][1] - op.region[0][0] for op in writes} == {4}  # 4-row stripes
    unit = (32, 24) if layout == "v3-sharded" else chunks
    n_units = len(chunks_of(((0, 64), (0, 72)), unit))

    store, array, sink = output("c.zarr", (64, 72), chunks, layout)
    writer = chunk_writer(plan, sink)
    assert isinstance(writer, ChunkWriter)
    replay(plan, a, b, writer)
    assert_gemm(array[:], a, b)
    assert len(store.stores) == n_units and set(store.stores.values()) == {1}
    # within the writer's budget: the plan's (planned with the chunks; a sharded sink
    # gathers whole shards, whose cells are larger than the plan was told)
    assert 0 < writer.peak_bytes <= writer.budget
    if layout != "v3-sharded":
        assert writer.budget == plan.assembly_window
    assert writer.held_bytes == 0  # flushed: nothing kept

    store, array, sink = output("d.zarr", (64, 72), chunks, layout)
    replay(plan, a, b, sink)  # the stripes as they come
    assert_gemm(array[:], a, b)
    assert sum(store.stores.values()) >= 4 * n_units // (2 if layout == "v3-sharded" else 1)


def test_blocks_that_cut_chunks(rng, workdir):
    """C blocks of 20 rows over 16-row chunks: a chunk row band shared by two blocks is
    gathered per block (the cell of each) and each cell is stored once, its chunks updated
    in place by the sink; the product is whole."""
    a, b = inputs(rng, 60, 32, 40)
    plan = staged_plan(a, b, (16, 40), tile=(20, 40, 16), stripe=3 * 40)
    assert plan.row_splits == (0, 20, 40, 60)
    store, array, sink = output("c.zarr", (60, 40), (16, 40), "v3-zstd")
    writer = chunk_writer(plan, sink)
    replay(plan, a, b, writer)
    assert_gemm(array[:], a, b)
    cells = sum(len(range(lo // 16, (hi - 1) // 16 + 1))
                for lo, hi in zip(plan.row_splits, plan.row_splits[1:]))
    assert writer.cells_written == cells  # no cell written stripe by stripe
    assert sum(store.stores.values()) == cells


def test_over_its_budget_a_cell_goes_out_stripe_by_stripe(rng, workdir):
    """With room for one cell only, the others are written as they come: slower, but the
    product is whole and the writer never holds more than its budget."""
    a, b = inputs(rng, 64, 32, 48)
    plan = staged_plan(a, b, (16, 48), tile=(32, 48, 16), stripe=4 * 48)
    store, array, sink = output("c.zarr", (64, 48), (16, 48), "v3-zstd")
    one_cell = 16 * 48 * 8
    writer = ChunkWriter(sink, plan.row_splits, plan.col_splits, budget=one_cell)
    replay(plan, a, b, writer)
    assert_gemm(array[:], a, b)
    assert writer.peak_bytes <= one_cell
    stores = sum(store.stores.values())
    assert 4 <= stores < 4 * 4  # some cells whole, none lost


def test_stripes_in_any_order_from_many_threads(rng, workdir):
    """The writers' threads finish stripes in any order: each cell is stored once, after its
    last stripe, whoever brings it."""
    shape, chunks = (96, 80), (32, 40)
    c = rng.standard_normal(shape)
    store, array, sink = output("c.zarr", shape, chunks, "v3-zstd")
    rows, cols = (0, 48, 96), (0, 40, 80)
    writer = ChunkWriter(sink, rows, cols, budget=10 * 32 * 40 * 8)
    stripes = [((lo, min(lo + 5, r1)), (c0, c1))
               for r0, r1 in zip(rows, rows[1:]) for c0, c1 in zip(cols, cols[1:])
               for lo in range(r0, r1, 5)]
    random.Random(7).shuffle(stripes)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: writer.write(*s, c[slice(*s[0]), slice(*s[1])].copy()),
                      stripes))
    writer.flush()
    np.testing.assert_array_equal(array[:], c)
    cells = 2 * 2 * 2  # blocks of 48 rows over 32-row bands: 2 cells each, 4 blocks
    assert writer.cells_written == cells


@pytest.mark.parametrize("layout", ["v2", "v3-zstd"])
def test_each_chunk_is_stored_from_one_piece_of_memory(rng, workdir, layout):
    """A cell's rows are gathered chunk by chunk, each chunk's part of the cell an array of
    its own: every chunk reaches the sink contiguous in memory, where blocks are several
    chunks wide and where their edges cut chunks (a row-major cell handed the sink column
    slices of itself: 2-3x slower to write), and its store holds the values."""
    shape, chunks = (64, 100), (16, 24)
    c = rng.standard_normal(shape)
    store, array, sink = output("c.zarr", shape, chunks, layout)
    seen, real = [], sink.write

    def write(rows, cols, data):
        seen.append(data.flags.c_contiguous)
        real(rows, cols, data)

    sink.write = write
    rows, cols = (0, 32, 64), (0, 60, 100)  # 60 cuts the third chunk column
    writer = ChunkWriter(sink, rows, cols, budget=1 << 20)
    for r0, r1 in zip(rows, rows[1:]):
        for c0, c1 in zip(cols, cols[1:]):
            for lo in range(r0, r1, 8):
                writer.write((lo, lo + 8), (c0, c1), c[lo:lo + 8, c0:c1].copy())
    writer.flush()
    np.testing.assert_array_equal(array[:], c)
    assert len(seen) == 4 * 5 + 4 and all(seen)  # two parts of each cut chunk


def test_flush_writes_what_incomplete_cells_hold(rng, workdir):
    """A run that stops inside a block (or writes part of one) leaves cells incomplete:
    flush stores the rows they hold, and only those."""
    shape = (32, 16)
    c = rng.standard_normal(shape)
    store, array, sink = output("c.zarr", shape, (16, 16), "v3-zstd")
    writer = ChunkWriter(sink, (0, 32), (0, 16), budget=1 << 20)
    writer.write((0, 4), (0, 16), c[0:4])
    writer.write((16, 20), (0, 16), c[16:20])
    assert sum(store.stores.values()) == 0  # held back
    writer.flush()
    got = array[:]
    np.testing.assert_array_equal(got[0:4], c[0:4])
    np.testing.assert_array_equal(got[16:20], c[16:20])
    assert np.isnan(got[4:16]).all() and np.isnan(got[20:]).all()  # never written


def test_assembly_window():
    assert assembly_bytes((64, 32), (16, 32), 4, 8) == 4 * 16 * 32 * 8
    # stripes of whole bands, or whole blocks: a cell copied while the one before is stored
    assert assembly_bytes((64, 32), (16, 32), 16, 8) == 2 * 16 * 32 * 8
    assert assembly_bytes((64, 32), (16, 32), 0, 8) == 2 * 16 * 32 * 8
    assert assembly_bytes((64, 32), None, 4, 8) == 0
    assert assembly_bytes((8, 32), (16, 32), 4, 8) == 4 * 8 * 32 * 8  # a band is the block


def test_plans_budget_the_assembly(rng, workdir):
    """A staged plan counts the cells it may hold in its host bytes."""
    a, b = inputs(rng, 64, 32, 48)
    plan = staged_plan(a, b, (16, 48), tile=(32, 48, 16), stripe=4 * 48)
    assert plan.assembly_window == 4 * 16 * 48 * 8
    flat = dataclasses.replace(plan, staged=False)  # whole blocks: two cells
    assert flat.assembly_window == 2 * 16 * 48 * 8
    assert plan.host_bytes - plan.assembly_window == (plan.staging.n_stage + plan.staging.n_out) \
        * plan.buffers.ring + plan.decode_window + plan.cache_bytes


def test_a_journal_records_a_block_only_when_its_chunks_are_stored(rng, workdir):
    """The writer's cells lie inside blocks: when a block's last stripe has passed, its
    chunks are stored and the journal over the sink records it, with checksums that the
    stored chunks match; a block cut short is neither recorded nor half stored."""
    from oocgemm.lifecycle.journal import Journal, JournaledSink, _verified

    shape, rows, cols = (64, 40), (0, 32, 64), (0, 40)
    c = rng.standard_normal(shape)
    sink = ZarrSink(shape=shape, dtype="float64", name="c", path="c.zarr",
                    options={"chunks": (16, 20), "compressors": None})
    journal = Journal(sink.temporary_path, {"fingerprint": "test"})
    writer = ChunkWriter(JournaledSink(sink, journal, rows, cols), rows, cols,
                         budget=1 << 20)
    for lo in range(0, 32, 6):  # block (0, 0) whole, in stripes of 6 rows
        writer.write((lo, min(lo + 6, 32)), (0, 40), c[lo:min(lo + 6, 32)])
    writer.write((32, 38), (0, 40), c[32:38])  # block (1, 0) cut short
    writer.wait()  # the cells handed to the encoders are stored
    assert set(journal.blocks) == {(0, 0)}
    stored = ZarrSource(zarr.open_array(sink.temporary_path, mode="r"), "c",
                        incomplete_ok=True)
    assert _verified(journal, stored) == {(0, 0)}
    np.testing.assert_array_equal(stored.array()[:32], c[:32])
    assert (stored.array()[32:] == 0).all()  # nothing of the cut block reached storage
    writer.abort()


def test_an_empty_product_assembles_nothing(rng, workdir):
    a, b = np.empty((0, 32)), rand(rng, (32, 48))
    plan = oocgemm.plan(a, b, device="cpu", out="c.zarr", out_options={"chunks": (16, 48)})
    staged = dataclasses.replace(plan, staged=True, stripe=4 * 48,
                                 staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))
    assert staged.assembly_window == 0 and staged.host_bytes >= 0

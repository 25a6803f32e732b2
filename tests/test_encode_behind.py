"""Compressed outputs behind compute: C's chunks are encoded and stored on the encoder
threads while the run goes on, written straight to their files for the outputs oocgemm
creates, and the run's last block leaves in the row stripes it becomes final in, so that the
run ends within about one chunk's encode of its last GEMM."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.errors import OOCGemmError
from oocgemm.planning.schedule import OpKind
from oocgemm.storage.chunked import ChunkWriter
from oocgemm.storage.zarr_store import ZarrSink, compressor, direct

CODECS = ["zstd", "zstd:5", "gzip", "blosc", "none"]


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("spec", CODECS)
def test_a_chunk_stored_straight_is_the_bytes_zarr_stores(rng, workdir, spec, zarr_format):
    """A whole chunk encoded by numcodecs and written as its file holds the very bytes that
    zarr stores for it (edge chunks padded with the fill value as zarr pads them)."""
    codec = compressor(spec, zarr_format)
    chunks, shape = (16, 24), (40, 50)
    data = rand(rng, shape)
    stored = {}
    for how in ("zarr", "straight"):
        path = f"{how}.zarr"
        z = zarr.create_array(path, shape=shape, chunks=chunks, dtype="float64",
                              zarr_format=zarr_format, fill_value=0,
                              compressors=None if codec is None else [codec])
        if how == "zarr":
            z[:] = data
        else:
            writer = direct(z)
            assert writer is not None
            for i in range(3):
                for j in range(3):
                    writer.write((i, j), data[i * 16:(i + 1) * 16, j * 24:(j + 1) * 24])
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data)
        stored[how] = {os.path.relpath(os.path.join(d, f), path): open(os.path.join(d, f),
                                                                        "rb").read()
                       for d, _, files in os.walk(path) for f in files
                       if not f.startswith((".z", "zarr.json"))}
    if spec == "gzip":  # a gzip member's header holds the second it was written
        for files in stored.values():
            for key, data in files.items():
                files[key] = data[:4] + b"...." + data[8:]
    assert stored["zarr"] == stored["straight"] and len(stored["zarr"]) == 9


def test_a_given_array_and_a_url_are_written_through_zarr(rng, workdir):
    """Only a new local output that oocgemm creates is written file by file; an array
    updated in place goes through zarr (its other readers, its store)."""
    z = zarr.create_array("given.zarr", shape=(8, 8), chunks=(4, 4), dtype="float64")
    assert ZarrSink(shape=(8, 8), dtype="float64", name="c", array=z)._writer is None
    made = ZarrSink(shape=(8, 8), dtype="float64", name="c", path="new.zarr",
                    options={"chunks": (4, 4)})
    assert made._writer is not None
    made.abort()
    sharded = ZarrSink(shape=(8, 8), dtype="float64", name="c", path="s.zarr",
                       options={"chunks": (2, 2), "shards": (4, 4)})
    assert sharded._writer is None  # one object holds several chunks: zarr writes it
    sharded.abort()


def timeline_run(rng, tile=(64, 256, 4096), k=20480):
    """A CPU product whose output is small and compute long: C 256 x 256 in zstd chunks of
    16 x 256 (a chunk row each), 4 blocks of 64 rows, 5 K panels."""
    a, b = rand(rng, (256, k)), rand(rng, (k, 256))
    r = oocgemm.multiply(a, b, "c.zarr", device="cpu", tile=tile,
                         out_options={"chunks": (16, 256), "compressors": "zstd"})
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)
    return r


def test_the_last_block_is_written_in_the_stripes_it_becomes_final_in(rng, workdir):
    """The schedule: the run's last block has one WRITE per row stripe of its last panel,
    each waiting for that stripe's GEMM only; the blocks before it are written whole."""
    r = timeline_run(rng)
    ops = r.plan.schedule.ops
    last = ops[-1].key
    writes = [op for op in ops if op.kind is OpKind.WRITE]
    final = [op for op in writes if op.key == last]
    assert len(writes) - len(final) == r.plan.n_blocks - 1 and len(final) > 2
    rows = [op.region[0] for op in final]
    assert rows[0][0] == 256 - 64 and rows[-1][1] == 256
    assert all(x[1] == y[0] for x, y in zip(rows, rows[1:]))
    assert rows[-1][1] - rows[-1][0] < 64 // 4  # tapered: few rows are left at the end
    for op in final:  # each waits for the GEMM of its own rows, none after it
        (gemm,) = [ops[d] for d in op.deps]
        assert gemm.kind is OpKind.GEMM and gemm.region[0] == op.region[0]


def test_chunks_are_stored_behind_compute_and_the_run_ends_at_its_last_gemm(rng, workdir):
    """The timeline: chunks are stored (events 'store') while GEMMs run, on the encoder
    threads; after the last GEMM only chunks of the last block are left to store, and the
    run's last event ends within a few chunks' store of it (two encoder threads here)."""
    r = timeline_run(rng)
    events = r.events
    gemms = [e for e in events if e.kind == "gemm"]
    stores = [e for e in events if e.kind == "store"]
    assert len(stores) == 16 and all(e.lane.startswith("encode-") for e in stores)
    assert sum(e.nbytes for e in stores) == 256 * 256 * 8
    last_gemm = max(e.end for e in gemms)
    # stores overlap compute: those of the first blocks end before the last block starts
    first_of_last = min(e.start for e in gemms if e.key == gemms[-1].key)
    assert sum(e.end <= first_of_last for e in stores) >= 4
    # what is left after the last GEMM is of the last block only (its last panel's stripes
    # finish a band each; the band of the last stripe is always left)
    after = [e for e in stores if e.end > last_gemm]
    assert 1 <= len(after) <= 4 and all(e.key == gemms[-1].key for e in after)
    longest = max(e.seconds for e in stores)
    assert r.timeline.drain <= 3 * longest + 0.05, (r.timeline.drain, longest)
    assert r.timeline.link("storage_write").bytes == 256 * 256 * 8  # not counted twice


class FailingSink(ZarrSink):
    """A sink whose store of one chunk fails, as a full disk does."""

    def __init__(self, *args, fail_at=(16, 32), **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at = fail_at
        self.after: list = []
        self.done = threading.Event()

    def write(self, rows, cols, block):
        if tuple(rows) == self.fail_at:
            raise OSError(28, "No space left on device")
        super().write(rows, cols, block)


def test_an_encoder_failure_fails_the_run_and_nothing_is_left(rng, workdir):
    """A store that fails on an encoder thread is raised in the run (the next write, or
    the flush), as an OOCGemmError of the run, and the output is not committed."""
    sink = FailingSink(shape=(64, 32), dtype="float64", name="c", path="c.zarr",
                       options={"chunks": (16, 32), "compressors": None})
    writer = ChunkWriter(sink, (0, 64), (0, 32), budget=4 * 16 * 32 * 8)
    c = rand(rng, (64, 32))
    with pytest.raises(OOCGemmError, match="No space"):
        for lo in range(0, 64, 8):
            writer.write((lo, lo + 8), (0, 32), c[lo:lo + 8])
        writer.flush()
    writer.abort()
    assert not os.path.exists("c.zarr") and not os.listdir(".")


def test_a_full_disk_while_storing_is_an_error_of_the_run(rng, workdir, monkeypatch):
    """Through multiply: the failure of an encoder is the run's error; no output appears."""
    from oocgemm.storage import zarr_store

    real = zarr_store._Direct.write

    def full(self, index, data):
        if index == (1, 0):
            raise OSError(28, "No space left on device")
        real(self, index, data)

    monkeypatch.setattr(zarr_store._Direct, "write", full)
    a, b = rand(rng, (64, 40)), rand(rng, (40, 48))
    with pytest.raises(OOCGemmError, match="No space left"):
        oocgemm.multiply(a, b, "c.zarr", device="cpu", tile=(32, 48, 40),
                         out_options={"chunks": (16, 48), "compressors": "zstd"})
    assert not os.path.exists("c.zarr")
    assert [f for f in os.listdir(".") if "c.zarr" in f] == []


def test_settle_drops_what_waits_and_waits_for_what_runs(rng, workdir):
    """After a failed run nothing stores behind it: settle() returns only once every store
    handed on has ended or was dropped."""
    from concurrent.futures import ThreadPoolExecutor

    gate = threading.Event()
    started = threading.Event()

    class Slow(ZarrSink):
        def write(self, rows, cols, block):
            started.set()
            gate.wait(5)
            super().write(rows, cols, block)

    sink = Slow(shape=(64, 32), dtype="float64", name="c", path="c.zarr",
                options={"chunks": (16, 32), "compressors": None})
    pool = ThreadPoolExecutor(1)
    writer = ChunkWriter(sink, (0, 64), (0, 32), budget=4 * 16 * 32 * 8, encoders=pool)
    c = rand(rng, (64, 32))
    writer.write((0, 32), (0, 32), c[:32])  # two cells: one runs, one waits
    assert started.wait(5)
    threading.Timer(0.2, gate.set).start()
    writer.settle()
    assert gate.is_set() and not writer._stores
    writer.abort()
    pool.shutdown()
    assert not os.path.exists("c.zarr")

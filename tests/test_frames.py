"""C's chunks stored from frames encoded elsewhere (oocgemm.storage.frames): the CPU executor
replays a framed run as the CUDA executor runs it with nvCOMP, each stripe's chunk pieces
compressed on their own and each chunk's file their frames in row order. The files are read
back by zarr (v2 and v3) and by numcodecs, on ragged shapes whose stripes cut chunks."""

from __future__ import annotations

import dataclasses
import os

import numcodecs
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.devices import Device
from oocgemm.lifecycle.journal import Journal, JournaledSink, verified
from oocgemm.lifecycle.run import chunk_readers, chunk_writer
from oocgemm.runtime.base import framed_writes
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.chunked import ChunkWriter
from oocgemm.storage.frames import Framing, encode_stripe
from oocgemm.storage.zarr_store import ZarrSink, ZarrSource

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

LAYOUTS = {
    "v3": dict(zarr_format=3, compressors=zarr.codecs.ZstdCodec(level=1)),
    "v2": dict(zarr_format=2, compressors=numcodecs.Zstd(level=1)),
}


def inputs(rng, m, k, n):
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 16))[:] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype=b.dtype, chunks=(16, 16))[:] = b
    return a, b


def staged_plan(a, b, chunks, tile, stripe):
    """A CPU plan that replays the CUDA executor's staged schedule: C leaves the output ring
    in stripes of ``stripe`` elements."""
    plan = oocgemm.plan(a, b, device="cpu", tile=tile, out="c.zarr",
                        out_options={"chunks": chunks})
    return dataclasses.replace(plan, staged=True, stripe=stripe,
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))


def new_output(path, shape, chunks, layout, **extra):
    """A new Zarr output written under a temporary name, as a run's output is."""
    options = dict(LAYOUTS[layout], chunks=chunks, **extra)
    return ZarrSink(shape=shape, dtype="float64", name=path, path=path, options=options)


def replay(plan, sink, frames=True):
    sources = chunk_readers(plan, {"A": ZarrSource(zarr.open_array("a.zarr"), "a"),
                                   "B": ZarrSource(zarr.open_array("b.zarr"), "b")})
    try:
        CpuExecutor(plan, sources, sink, frames=frames).run()
        sink.flush()
    finally:
        for src in sources.values():
            src.close()


def chunk_files(path):
    out = []
    for root, _, files in os.walk(path):
        out += [os.path.join(root, f) for f in files if f.replace(".", "").isdigit()]
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("encoder", ["replay", "writer"])
def test_a_framed_run_stores_chunks_that_zarr_reads(rng, workdir, layout, encoder):
    """Stripes of 6 rows over chunks of 16 rows (pieces cut at chunk rows), a ragged right
    and bottom edge: every chunk is stored once, from several frames, and zarr reads the
    product back; the frames encoded at the WRITE as a GPU would (replay), or by the
    writer's encoder threads, a piece each (writer)."""
    a, b = inputs(rng, 61, 40, 70)
    chunks = (16, 24)
    plan = staged_plan(a, b, chunks, tile=(32, 48, 16), stripe=6 * 48)
    sink = new_output("c.zarr", (61, 70), chunks, layout)
    writer = chunk_writer(plan, sink)
    assert isinstance(writer, ChunkWriter)
    assert framed_writes(plan, writer) is not None
    if encoder == "writer":
        assert writer.encode_frames() is not None
    replay(plan, writer, frames=encoder == "replay")
    n_chunks = -(-61 // 16) * -(-70 // 24)
    assert writer.chunks_framed == n_chunks and writer.cells_written == 0
    assert writer.held_bytes == 0 and 0 < writer.peak_bytes <= writer.budget
    sink.commit()
    got = zarr.open_array("c.zarr", mode="r")
    assert_gemm(got[:], a, b)
    files = chunk_files("c.zarr")
    assert len(files) == n_chunks
    for name in files:  # a chunk's rows come in several stripes: several frames
        with open(name, "rb") as f:
            assert f.read().count(ZSTD_MAGIC) >= 2


def test_framed_edges_hold_zeros(rng, workdir):
    """An edge chunk is stored whole: the columns and rows past the array are zeros, as
    zarr pads it (a larger array opened over the same chunk files sees them)."""
    a, b = inputs(rng, 20, 16, 30)
    plan = staged_plan(a, b, (16, 24), tile=(32, 48, 16), stripe=5 * 48)
    sink = new_output("c.zarr", (20, 30), (16, 24), "v2")
    writer = chunk_writer(plan, sink)
    replay(plan, writer)
    sink.commit()
    with open(os.path.join("c.zarr", "1.1"), "rb") as f:
        chunk = np.frombuffer(numcodecs.Zstd().decode(f.read()), "f8").reshape(16, 24)
    want = (a @ b)[16:20, 24:30]
    np.testing.assert_allclose(chunk[:4, :6], want, rtol=1e-12)
    assert not chunk[4:].any() and not chunk[:, 6:].any()


def test_frames_match_the_whole_chunk(rng):
    """A stripe's pieces decode to the stripe's rows of each chunk, padded."""
    data = rand(rng, (10, 50))
    framing = Framing((8, 16), (18, 50), 8, frame_bytes=256, codec=numcodecs.Zstd())
    pieces = encode_stripe(framing, data, (6, 16), (0, 50))
    assert [p.index for p, _ in pieces] == [(0, j) for j in range(4)] + [(1, j) for j in range(4)]
    for piece, frames in pieces:
        assert frames.count(ZSTD_MAGIC) == -(-framing.piece_bytes(piece) // 256)
        back = np.frombuffer(numcodecs.Zstd().decode(frames), "f8").reshape(-1, 16)
        (r0, r1), (c0, c1) = piece.rows, piece.cols
        np.testing.assert_array_equal(back[:, :c1 - c0], data[r0 - 6:r1 - 6, c0:c1])
        assert not back[:, c1 - c0:].any()


def test_a_gpu_stripes_packed_frames_read_back(rng, monkeypatch):
    """The ring buffer as the GPU's DOWNLOAD leaves it (nvcomp.StripeEncoder): the frames'
    sizes, their statuses, then the frames packed back to back (kernels/frames.cu); each
    piece comes back as its own frames joined, in order. A refused frame is named."""
    from oocgemm.cuda import nvcomp

    monkeypatch.setattr(nvcomp, "frame_capacity", lambda frame_bytes: frame_bytes + 64)
    framing = Framing((8, 16), (18, 50), 8, frame_bytes=256)
    rows, cols = (6, 16), (0, 50)
    pieces, layout, _ = nvcomp._frames_of(framing, rows, cols)
    frames = [[rng.bytes(int(rng.integers(1, 320))) for _ in piece] for piece in layout]
    flat = [f for piece in frames for f in piece]
    n = len(flat)
    head = nvcomp._up(12 * n)
    host = np.zeros(nvcomp.host_bytes(framing, rows, cols), dtype=np.uint8)
    host[:8 * n].view(np.uint64)[:] = [len(f) for f in flat]
    packed = b"".join(flat)
    host[head:head + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
    back = nvcomp.read_stripe(framing, host, rows, cols)
    assert [p for p, _ in back] == pieces and len(pieces) == 8
    for (_, data), want in zip(back, frames):
        assert bytes(data) == b"".join(want)
    host[8 * n + 4 * 5:8 * n + 4 * 6].view(np.int32)[0] = 7  # frame 5 refused
    with pytest.raises(RuntimeError, match="frame 5 of a stripe .status 7"):
        nvcomp.read_stripe(framing, host, rows, cols)


def test_what_frames_cannot_store(rng, workdir):
    """No frames where the chunks could not be stored from them: a checksum, another codec,
    shards, a fill value that is not zero, blocks that cut chunks; nor for an array given
    to update in place."""
    shape, chunks = (40, 40), (16, 16)

    def sink(**options):
        base = dict(zarr_format=3, chunks=chunks, compressors=zarr.codecs.ZstdCodec())
        return ZarrSink(shape=shape, dtype="float64", name="c", path=f"c{len(seen)}.zarr",
                        options={**base, **options})

    seen: list = []
    for options in (dict(compressors=zarr.codecs.ZstdCodec(checksum=True)),
                    dict(compressors=zarr.codecs.BloscCodec()),
                    dict(shards=(32, 32)), dict(fill_value=1.5)):
        s = sink(**options)
        seen.append(s)
        assert s.framing() is None, options
        s.abort()
    s = sink()
    assert s.framing() == Framing(chunks, shape, 8)
    cut = ChunkWriter(s, (0, 20, 40), (0, 40), budget=1 << 20)
    assert cut.framing() is None
    assert ChunkWriter(s, (0, 32, 40), (0, 40), budget=1 << 20).framing() is not None
    s.abort()
    given = zarr.create_array("given.zarr", shape=shape, chunks=chunks, dtype="f8")
    assert ZarrSink(shape=shape, dtype="float64", name="g", array=given).framing() is None


def test_a_framed_block_is_journaled(rng, workdir):
    """Chunks stored from frames are journaled without a checksum: a resume keeps the
    blocks whose chunks decode, and computes again a block whose chunk file was cut."""
    a, b = inputs(rng, 48, 32, 40)
    plan = staged_plan(a, b, (16, 40), tile=(32, 40, 16), stripe=8 * 40)
    sink = new_output("c.zarr", (48, 40), (16, 40), "v3")
    journal = Journal(sink.temporary_path, {"test": 1})
    writer = chunk_writer(plan, JournaledSink(sink, journal, plan.row_splits, plan.col_splits))
    replay(plan, writer)
    assert set(journal.blocks) == {(0, 0), (1, 0)}
    assert all(piece[-1] is None for pieces in journal.blocks.values() for piece in pieces)
    journal.close()
    reopened = Journal(sink.temporary_path)
    assert verified(reopened) == {(0, 0), (1, 0)}
    reopened.close()
    name = sorted(chunk_files(sink.temporary_path))[-1]  # the last chunk: block (1, 0)
    with open(name, "r+b") as f:
        f.truncate(os.path.getsize(name) // 2)
    reopened = Journal(sink.temporary_path)
    assert verified(reopened) == {(0, 0)}
    reopened.close()
    sink.abort()


def test_which_stripes_become_frames_without_nvcomp(rng, workdir, monkeypatch):
    """Without nvCOMP (as here) the GPU compresses nothing: the plan's gpu_encode=True (the
    default) leaves C to the host's whole-chunk encoders, as False does, 'last' and 'frames'
    to its encoders a stripe at a time. The planner's GPU encode pass decides it from the
    writer's facts, once the output is open; the CUDA executor reads the plan, not the
    environment."""
    from oocgemm.cuda import nvcomp
    from oocgemm.lifecycle.run import output_facts
    from oocgemm.planning.planner import gpu_encode_pass
    from oocgemm.runtime.cuda_executor import gpu_framing

    if nvcomp.library() is not None:
        pytest.skip("nvCOMP is installed here")
    a, b = inputs(rng, 64, 32, 48)
    plan = staged_plan(a, b, (16, 48), tile=(32, 48, 16), stripe=4 * 48)
    assert plan.io.gpu_encode is False  # a CPU plan's, here made to replay a CUDA run
    # its facts asked of the CUDA backend
    plan = dataclasses.replace(plan, device=Device("cuda", 0))
    sink = new_output("c.zarr", (64, 48), (16, 48), "v3")
    writer = chunk_writer(plan, sink)
    facts = output_facts(plan, writer)
    assert facts.frame_chunks == (16, 48) and facts.encoder is None
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "yes")  # not read here
    for mode, host in ((False, None), (True, None), ("last", True), ("frames", True)):
        got = gpu_encode_pass(dataclasses.replace(
            plan, io=dataclasses.replace(plan.io, gpu_encode=mode)), facts)
        assert (got.io.c_frames and got.io.c_frames.host) == host
        assert got.io.c_frames is None or not got.io.c_frames.downloads
        assert (gpu_framing(got, writer) is None) == (got.io.c_frames is None)
    assert output_facts(plan, sink).frame_chunks is None  # a sink that takes no frames
    with pytest.raises(ValueError, match="its sink takes none"):  # a plan for another writer
        gpu_framing(got, sink)
    sink.abort()

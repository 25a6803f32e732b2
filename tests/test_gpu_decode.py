"""Panels decoded on the device (``Plan.io.gpu_decode``), replayed by the CPU executor: each stored
object a load covers (a chunk file of one zstd frame, or a shard of many) is fetched as stored
into a ring buffer (FETCH), uploaded into its cell of a Z slot (UPLOAD_STORED), and one DECODE
per panel puts every frame in place (a K step's A and B DECODEs as one batch on the GPU). The
schedule passes its checker (which fails on a tampered one), the counts agree with the built
list, the product equals numpy's over ragged shapes, transposed operands, shards with their
index at either end and chunks never written; plans whose panels cut the objects, or operands
that are not zstd frames, are refused; a damaged object or one larger than its cell is an
InputError naming it."""

from __future__ import annotations

import dataclasses
import os

import numcodecs
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm.cuda.decode import panel_batch
from oocgemm.devices import Device
from oocgemm.diagnostics.timeline import Timeline
from oocgemm.errors import InputError, OptionError
from oocgemm.lifecycle.run import chunk_counts, chunk_readers
from oocgemm.planning import OpKind, ScheduleError, check_schedule, with_gpu_decode
from oocgemm.planning.grid import on_chunk_edges
from oocgemm.planning.schedule import Op, decode_batches
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.frames import zstd_pieces
from oocgemm.storage.memory import NumpySink
from oocgemm.storage.zarr_store import ZarrSource

LAYOUTS = {
    "v3": dict(chunks=(16, 12)),
    "v2": dict(chunks=(16, 12), zarr_format=2),
    "v3-sharded": dict(chunks=(8, 4), shards=(16, 12)),
    "v3-sharded-index-first": dict(
        chunks=(16, 12), compressors=None, filters=None,
        serializer=zarr.codecs.ShardingCodec(
            chunk_shape=(8, 6), codecs=[zarr.codecs.BytesCodec(), zarr.codecs.ZstdCodec()],
            index_codecs=[zarr.codecs.BytesCodec()], index_location="start")),
}


def store(path, x, layout, written=None):
    array = zarr.create_array(path, shape=x.shape, dtype=x.dtype, fill_value=7.0,
                              **LAYOUTS[layout])
    rows = x.shape[0] if written is None else written
    array[:rows] = x[:rows]
    return zarr.open_array(path, mode="r")


def run(plan, arrays, out, executor=CpuExecutor):
    """``plan`` run by ``executor`` on the Zarr ``arrays`` ('A', 'B') into ``out``: its log,
    and what its sources say they decoded (:func:`chunk_counts`)."""
    sources = chunk_readers(plan, {name: ZarrSource(z, name.lower())
                                   for name, z in arrays.items()})
    try:
        return executor(plan, sources, NumpySink(out)).run(), chunk_counts(sources)
    finally:
        for src in sources.values():
            src.close()


def gpu_plan(za, zb, tile, operands=("A", "B"), **keywords):
    plan = oocgemm.plan(za, zb, device="cpu", tile=tile, **keywords)
    plan = dataclasses.replace(plan, staged=True, stripe=64,
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))
    return with_gpu_decode(plan, operands)


def ragged(rng, layout, trans, device="cpu"):
    """(a, b, their stores, a plan decoding both on the device): 50 x 96 @ 96 x 37 on 16 x
    12 objects (K panels of 48 start on both operands' edges), rows of A never written (the
    fill value, 7), or both operands stored transposed."""
    a, b = rand(rng, (50, 96)), rand(rng, (96, 37))
    a[44:] = 7.0  # what A's stored array holds there: its fill value
    za = store("a.zarr", a.T.copy() if trans else a, layout, written=None if trans else 44)
    zb = store("b.zarr", b.T.copy() if trans else b, layout)
    plan = oocgemm.plan(za, zb, device=device, tile=(24, 16, 48) if trans else (32, 24, 48),
                        trans_a=trans, trans_b=trans)
    if device == "cpu":  # the CPU executor replays a staged plan too
        plan = dataclasses.replace(plan, staged=True, stripe=64, staging=dataclasses.replace(
            plan.staging, n_stage=3, n_out=2))
    return a, b, za, zb, with_gpu_decode(plan, ("A", "B"))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("trans", [False, True])
def test_products_of_panels_decoded_from_objects(rng, workdir, layout, trans):
    a, b, za, zb, plan = ragged(rng, layout, trans)
    check_schedule(plan.schedule, plan)
    assert plan.counts.ops == plan.schedule.counts().ops
    assert plan.decode_window == 0  # no decoded chunks held on the host
    ops = plan.schedule.ops
    decodes = [op for op in ops if op.kind is OpKind.DECODE]
    assert {op.operand for op in decodes} == {"A", "B"}
    assert all(op.lane == "decode" for op in decodes)
    out = poisoned((50, 37))
    log, counts = run(plan, {"A": za, "B": zb}, out)
    assert_gemm(out, a, b)
    # (an object never written is not read: its FETCH takes the fill value)
    assert counts["A"]["on_device"] and 0 < counts["A"]["decodes"] <= sum(
        op.kind is OpKind.FETCH and op.operand == "A" for op in ops)
    moved = sum(e.nbytes for e in log.events() if e.kind == "fetch")
    assert 0 < moved < sum(op.nbytes for op in ops if op.kind is OpKind.FETCH) * 1.1


def test_a_panel_decoded_on_the_device_is_fetched_and_uploaded_as_stored(rng, workdir):
    """Operations of their own: A's objects (A decoded on the device) are FETCHed on the
    readers and go up as UPLOAD_STOREDs on lane h2d, no READ or UPLOAD of A left, while B
    (decoded on the host) is READ and UPLOADed as ever. The CPU executor replays the plan into
    numpy's product, a FETCH's bytes counted as read and an UPLOAD_STORED's as h2d; the
    checker refuses a READ of A and a FETCH of B."""
    a, b = rand(rng, (32, 48)), rand(rng, (48, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    plan = gpu_plan(za, zb, (16, 24, 48), operands=("A",))
    check_schedule(plan.schedule, plan)
    ops = plan.schedule.ops
    kinds = {x: {op.kind for op in ops if op.operand == x} for x in "AB"}
    assert kinds["A"] == {OpKind.FETCH, OpKind.UPLOAD_STORED, OpKind.DECODE}
    assert {OpKind.READ, OpKind.UPLOAD} <= kinds["B"]
    assert not kinds["B"] & {OpKind.FETCH, OpKind.UPLOAD_STORED, OpKind.DECODE}
    assert {op.lane for op in ops if op.kind is OpKind.FETCH} == {"read"}
    assert {op.lane for op in ops if op.kind is OpKind.UPLOAD_STORED} == {"h2d"}
    assert plan.counts.ops == plan.schedule.counts().ops
    # two panels of A (16 rows, all 48 of K), each of four objects of 16 x 12
    assert plan.counts.ops[OpKind.FETCH] == plan.counts.ops[OpKind.UPLOAD_STORED] == 8
    assert plan.counts.traffic == plan.schedule.traffic()

    out = poisoned((32, 24))
    log, _ = run(plan, {"A": za, "B": zb}, out)
    assert_gemm(out, a, b)
    events = log.events()
    moved = {kind: sum(e.nbytes for e in events if e.kind == kind)
             for kind in ("read", "fetch", "upload", "upload_stored")}
    assert moved["fetch"] == moved["upload_stored"] > 0  # the objects' bytes as stored
    assert moved["read"] == moved["upload"] == b.nbytes  # B, stripe by stripe
    assert log.traffic()["read"] == moved["read"] + moved["fetch"]
    assert log.traffic()["h2d"] == moved["upload"] + moved["upload_stored"]
    timeline = Timeline.from_events(events)
    assert timeline.link("read").bytes == log.traffic()["read"]
    assert timeline.link("h2d").bytes == log.traffic()["h2d"]
    assert all(e.lane.startswith("read-") for e in events if e.kind == "fetch")

    fetch = next(op for op in ops if op.kind is OpKind.FETCH)
    read = next(op for op in ops if op.kind is OpKind.READ and op.operand == "B")
    for tampered, why in ((dataclasses.replace(fetch, kind=OpKind.READ), "which the plan decodes"),
                          (dataclasses.replace(read, kind=OpKind.FETCH), "does not decode")):
        bad = list(ops)
        bad[tampered.index] = tampered
        with pytest.raises(ScheduleError, match=why):
            check_schedule(dataclasses.replace(plan.schedule, ops=tuple(bad)), plan)


def test_the_checker_refuses_a_tampered_decode(rng, workdir):
    a, b = rand(rng, (32, 32)), rand(rng, (32, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    plan = gpu_plan(za, zb, (16, 24, 32))
    ops = list(plan.schedule.ops)
    decode = next(op for op in ops if op.kind is OpKind.DECODE)
    upload = ops[decode.index - 1]
    cases = [  # an upload not waited for; a cell out of place
        dataclasses.replace(decode, deps=tuple(d for d in decode.deps if d != upload.index)),
        dataclasses.replace(upload, offset=upload.offset + 1),
    ]
    for tampered in cases:
        bad = list(ops)
        bad[tampered.index] = tampered
        with pytest.raises(ScheduleError):
            check_schedule(dataclasses.replace(plan.schedule, ops=tuple(bad)), plan)


@pytest.mark.parametrize("tile, why", [
    ((16, 24, 8), "cut its stored objects"),     # K panels of 8 in chunks 12 wide
    ((20, 24, 12), "cut its stored objects"),    # blocks of 20 rows in chunks 16 high
])
def test_panels_that_cut_the_objects_are_refused(rng, workdir, tile, why):
    a, b = rand(rng, (32, 36)), rand(rng, (36, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    with pytest.raises(OptionError, match=why):
        gpu_plan(za, zb, tile, operands=("A",))


def test_only_zstd_frames_staged_out_of_core(rng, workdir):
    a, b = rand(rng, (32, 24)), rand(rng, (24, 24))
    zarr.create_array("raw.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 12),
                      compressors=None)[:] = a
    za, zb = zarr.open_array("raw.zarr", mode="r"), store("b.zarr", b, "v3")
    with pytest.raises(OptionError, match="not stored as zstd frames"):
        gpu_plan(za, zb, (16, 24, 12), operands=("A",))
    plan = oocgemm.plan(zb, zb, device="cpu", tile=(16, 24, 12))  # not staged
    with pytest.raises(OptionError, match="not staged"):
        with_gpu_decode(plan, ("B",))
    staged = gpu_plan(store("a.zarr", a, "v3"), zb, (16, 24, 12), operands=("A",))
    with pytest.raises(OptionError, match="ring buffers"):
        dataclasses.replace(staged, stripe=16).validate()


@pytest.mark.parametrize("damage", ["truncated", "grown"])
def test_a_damaged_object_is_named(rng, workdir, damage):
    a, b = rand(rng, (32, 24)), rand(rng, (24, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    plan = gpu_plan(za, zb, (16, 24, 32))
    path = ZarrSource(za, "a")._direct.path((1, 0))
    with open(path, "r+b") as f:
        if damage == "truncated":
            f.truncate(30)
        else:  # larger than zstd's bound allows a frame of its chunk
            f.seek(0, 2)
            f.write(b"\0" * plan.object_cell("A"))
    with pytest.raises(InputError, match=r"chunk \(1, 0\)") as info:
        run(plan, {"A": za, "B": zb}, poisoned((32, 24)))
    assert ("more than the" in str(info.value)) == (damage == "grown")


# -- which plans decode on the device (gpu_decode=True) ---------------------------------------
def cuda_plan(za, zb, tile, memory=1 << 30, trans_a=False, host=None, out=None,
              out_options=None):
    """A CUDA plan of ``za @ zb`` (the user's ``tile``, or the planner's for None) within
    ``memory`` of GPU and ``host`` (else ``memory``) of host memory, made without a GPU."""
    from oocgemm.backends import backend_of
    from oocgemm.lifecycle.run import open_run
    from oocgemm.planning import cuda_model
    from oocgemm.planning.planner import Facts, plan_product

    with open_run(za, zb, out, trans_a=trans_a, out_options=out_options) as io:
        m, n, k = io.shape
        a, b, c, out = io.operands()
        problem = oocgemm.planning.Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=a,
                                           b=b, c=c, out=out, alpha=1.0, beta=0.0,
                                           trans_a=trans_a)
    model = cuda_model()
    return plan_product(problem, Facts(
        device=Device("cuda", 0), kernel="cublas", model=model, memory_limit=memory,
        host_memory_limit=host or memory, tile=tile,
        staging=backend_of("cuda").staging(problem, model, "cublas")))


def test_decoded_on_device_where_the_tile_allows(rng, workdir, monkeypatch):
    from oocgemm import settings
    from oocgemm.planning.planner import decoded_on_device

    a, b = rand(rng, (64, 96)), rand(rng, (96, 48))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3-sharded")
    both = decoded_on_device(cuda_plan(za, zb, (32, 24, 48)))
    assert both.io.gpu_decode == ("A", "B") and both.buffers.ring >= both.object_cell("A")
    check_schedule(both.schedule, both)
    # K panels of 24 cut B's 16-row objects, not A's 12-wide ones: A alone
    assert decoded_on_device(cuda_plan(za, zb, (32, 24, 24))).io.gpu_decode == ("A",)
    assert decoded_on_device(cuda_plan(za, zb, (20, 20, 20))).io.gpu_decode == ()
    monkeypatch.setenv("OOCGEMM_GPU_DECODE", "yes")
    with pytest.raises(OptionError, match="OOCGEMM_GPU_DECODE='yes'"):
        settings.get("gpu_decode")
    for mode, value in (("0", False), ("1", True), ("auto", "auto")):
        monkeypatch.setenv("OOCGEMM_GPU_DECODE", mode)
        assert settings.get("gpu_decode") == value
    monkeypatch.delenv("OOCGEMM_GPU_DECODE")
    assert settings.get("gpu_decode") == "auto"


CHUNKS_4096 = dict(chunks=(4096, 4096))  # a 128 MiB frame each: batches of a dozen
SHARDS_512 = dict(chunks=(512, 512), shards=(4096, 4096))  # hundreds of 2 MiB frames
CHUNKS_1024 = dict(chunks=(1024, 1024))


@pytest.mark.parametrize("layout, n_k, memory, cached, chosen", [
    (CHUNKS_4096, 32768, 16, True, ()),
    (CHUNKS_4096, 32768, 16, False, ()),
    (SHARDS_512, 32768, 16, True, ("A", "B")),
    (SHARDS_512, 32768, 16, False, ()),
    (CHUNKS_1024, 65536, 32, True, ("A", "B")),
    (CHUNKS_1024, 65536, 32, False, ()),
])
def test_the_cost_model_chooses_who_decodes(workdir, layout, n_k, memory, cached, chosen):
    """32768 x n_k @ n_k x 32768 zstd inputs (metadata only), ``memory`` GiB of GPU memory,
    96 of host memory: the device decodes where the model predicts it faster - with the
    files in the page cache (``cached``: no storage reads), or from a cold disk, where the
    device's tile reloads an operand that the host keeps decoded, and reads it again. Not
    chunks of one large frame, whose K steps are batches of a dozen frames (the H200 decoded
    those 1.17-2x slower than the host, shards of 512² chunks in 0.43-0.49x its time). Both
    inputs or neither: A alone on the GPU was measured slower than both."""
    from oocgemm.planning.planner import decoded_on_device

    n = 32768
    a = zarr.create_array("a.zarr", shape=(n, n_k), dtype="f8", **layout)
    b = zarr.create_array("b.zarr", shape=(n_k, n), dtype="f8", **layout)
    planned = cuda_plan(a, b, None, memory=memory << 30, host=96 << 30)
    device = decoded_on_device(planned)
    assert device.io.gpu_decode == ("A", "B")
    pred, host = device.prediction, planned.prediction
    assert pred.device_decode > 0 and pred.decode == 0 and host.device_decode == 0
    auto = decoded_on_device(planned, choose=True, cached=cached)
    assert auto.io.gpu_decode == chosen

    def seconds(plan):
        p = plan.prediction
        return dataclasses.replace(p, storage_read=0.0).total if cached else p.total

    assert seconds(auto) == min(seconds(p) for p in (planned, device, auto))
    assert (auto is planned) == (not chosen)


@pytest.mark.parametrize("layout", [CHUNKS_4096, SHARDS_512])
def test_an_in_core_plan_is_weighed_against_decoding_on_the_device(workdir, layout):
    """n = 32768 zstd inputs (metadata only) within 64 GiB: the in-core plan (A, B and C on
    the GPU, decoded by the host) against the panelled plan with C whole whose inputs the
    GPU decodes, each once (H200: in core 3.2 s on 4096² chunks, 3.5-3.8 on shards). A
    product whose host decoding takes under IN_CORE_DECODE_FLOOR is not weighed."""
    from oocgemm.backends import backend_of
    from oocgemm.lifecycle.run import open_run
    from oocgemm.planning import cuda_model
    from oocgemm.planning.planner import (
        IN_CORE_DECODE_FLOOR,
        Facts,
        _in_core_decodable,
        decoded_on_device,
        plan_product,
    )

    def plans(n):
        arrays = [zarr.create_array(f"{x}{n}.zarr", shape=(n, n), dtype="f8", **layout)
                  for x in "ab"]
        with open_run(*arrays, None) as io:
            a, b, c, out = io.operands()
        problem = oocgemm.planning.Problem(m=n, n=n, k=n, itemsize=8, dtype="float64", a=a,
                                           b=b, c=c, out=out, alpha=1.0, beta=0.0)
        model = cuda_model()
        facts = Facts(device=Device("cuda", 0), kernel="cublas", model=model, memory_limit=64 << 30,
                      host_memory_limit=96 << 30,
                      staging=backend_of("cuda").staging(problem, model, "cublas"))
        return plan_product(problem, facts), plan_product(problem, facts, in_core=False)

    in_core, panelled = plans(32768)
    assert in_core.in_core and not panelled.in_core and _in_core_decodable(in_core)
    for cached in (True, False):
        chosen = decoded_on_device(panelled, choose=True, cached=cached, host=in_core)
        assert chosen.io.gpu_decode == ("A", "B") and chosen.tile[:2] == (32768, 32768)
    small, _ = plans(4096)
    assert small.in_core and small.prediction.decode < IN_CORE_DECODE_FLOOR
    assert not _in_core_decodable(small)


def test_whether_the_inputs_are_in_the_page_cache(rng, workdir):
    """What the model's choice is told: the share of the stored objects' bytes the page
    cache holds (mincore; nothing read), dropped from it and read back into it; a store
    that is not a local folder cannot tell."""
    from oocgemm.lifecycle.run import open_run
    from oocgemm.storage.files import cached_fraction

    a, b = rand(rng, (256, 192)), rand(rng, (192, 128))
    store("a.zarr", a, "v3-sharded")
    store("b.zarr", b, "v3")
    with open_run("a.zarr", "b.zarr", None) as io:
        paths = [os.path.join(root, f) for root, _, fs in os.walk(".") for f in fs
                 if "/c" in root]
        for path in paths:
            with open(path, "rb") as f:
                f.read()
        assert io.sources["A"].cached_fraction() == 1.0 and io.inputs_cached()
        os.sync()
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        if cached_fraction(paths) == 1.0:
            pytest.skip("this file system keeps its pages (tmpfs?)")
        assert io.sources["B"].cached_fraction() < 0.5 and not io.inputs_cached()
        assert not io.inputs_cached(("B",)) and cached_fraction(["missing"]) is None
    memory = zarr.create_array(zarr.storage.MemoryStore(), shape=(8, 8), dtype="f8")
    assert ZarrSource(memory, "m").cached_fraction() is None


def test_the_planners_tile_gives_way_to_one_on_the_objects_edges(workdir):
    """n = 32768 in 4096² zstd chunks (metadata only: planning reads nothing else), 16 GiB:
    the planner's K panels of 2048 cut the chunks; decoding on the device takes the nearest
    tile on their edges that fits, and a tile the user gave stays as it is."""
    from oocgemm.planning import on_object_edges
    from oocgemm.planning.planner import decoded_on_device

    n, side = 32768, 4096
    za = zarr.create_array("a.zarr", shape=(n, n), chunks=(side, side), dtype="f8")
    zb = zarr.create_array("b.zarr", shape=(n, n), chunks=(side, 2 * side), dtype="f8",
                           shards=(2 * side, 2 * side))
    planned = cuda_plan(za, zb, None, memory=16 << 30)
    assert planned.tile[2] % side and planned.io.gpu_decode == ()
    decoded = decoded_on_device(planned)
    assert "A and B go up as stored and are decoded on the device" in str(decoded)
    assert decoded.summary()["gpu_decode"] == ["A", "B"] and planned.summary()["gpu_decode"] == []
    w, h, r = decoded.tile
    assert decoded.io.gpu_decode == ("A", "B") and r == 2 * side
    assert w % side == 0 and h % (2 * side) == 0 and decoded.device_bytes <= 16 << 30
    check_schedule(decoded.schedule, decoded)
    tiles = on_object_edges(planned, ("A", "B"))
    assert [t[0] * t[1] for t in tiles] == sorted((t[0] * t[1] for t in tiles), reverse=True)
    assert all(t[0] % side == 0 and t[1] % (2 * side) == 0 and t[2] == 2 * side
               for t in tiles) and tiles[-1][:2] == (side, 2 * side)
    # K panels already on the edges of 1024² chunks, the first in ramp pieces (of a chunk
    # each, on their edges too): decoded on the device as planned
    small = {name: zarr.create_array(f"{name}1024.zarr", shape=(n, n), chunks=(1024, 1024),
                                     dtype="f8") for name in "ab"}
    ramped = cuda_plan(small["a"], small["b"], None, memory=16 << 30)
    assert ramped.ramp_pieces and not ramped.tile[2] % 1024
    on_device = decoded_on_device(ramped)
    assert on_device.io.gpu_decode == ("A", "B") and on_device.ramp_pieces
    check_schedule(on_device.schedule, on_device)
    # memory running short: the smaller plan decodes on the host (its tile may cut objects)
    from oocgemm.planning.planner import replan

    again = replan(decoded, memory_limit=8 << 30, host_memory_limit=16 << 30,
                   why="out of memory")
    assert again.io.gpu_decode == () and again.device_bytes <= 8 << 30
    given = cuda_plan(za, zb, planned.tile, memory=16 << 30)
    assert decoded_on_device(given).tile == planned.tile
    assert decoded_on_device(given).io.gpu_decode == ()
    # A stored transposed: its columns are op(A)'s rows
    zt = zarr.create_array("t.zarr", shape=(n, n), chunks=(2 * side, side), dtype="f8")
    transposed = cuda_plan(zt, zb, None, memory=16 << 30, trans_a=True)
    assert all(t[0] % side == 0 and t[2] % (2 * side) == 0
               for t in on_object_edges(transposed, ("A",)))


def test_blocks_decoded_on_the_device_start_on_the_outputs_chunks(workdir):
    """Zarr v2's 3000² input chunks and an output of 4096² chunks, n = 32768 (metadata
    only): no common multiple of the two fits, so a tile decoded on the device takes whole
    rows and columns of C (9000-row blocks, which cut the output's chunks, took the H200
    9.3-10.4 s against 4.3-4.8 s on the output's edges). 4096² objects and an output of
    8192² chunks: blocks on multiples of 8192."""
    from oocgemm.planning import on_object_edges
    from oocgemm.planning.planner import decoded_on_device

    n = 32768
    za, zb = (zarr.create_array(f"{x}.zarr", shape=(n, n), chunks=(3000, 3000), dtype="f8",
                                zarr_format=2) for x in "ab")
    planned = cuda_plan(za, zb, None, memory=16 << 30, out="c.zarr",
                        out_options={"chunks": (4096, 4096), "compressors": "zstd"})
    assert planned.problem.out.chunks == (4096, 4096)
    assert {t[:2] for t in on_object_edges(planned, ("A", "B"))} == {(n, n)}
    device = decoded_on_device(planned)  # both do not fit with C whole; A alone does
    assert device.io.gpu_decode == ("A",) and device.tile[0] == n
    for plan in (planned, device):
        assert on_chunk_edges((plan.row_splits, plan.col_splits), (4096, 4096), (n, n))
    za, zb = (zarr.create_array(f"{x}4.zarr", shape=(n, n), chunks=(4096, 4096), dtype="f8")
              for x in "ab")
    planned = cuda_plan(za, zb, None, memory=16 << 30, out="d.zarr",
                        out_options={"chunks": (8192, 8192)})
    tiles = on_object_edges(planned, ("A", "B"))
    assert tiles and all(t[0] % 8192 == 0 and t[1] % 8192 == 0 for t in tiles)
    assert decoded_on_device(planned).io.gpu_decode == ("A", "B")


# -- on a GPU ---------------------------------------------------------------------------------
def gpu_or_skip():
    from oocgemm import cuda

    if cuda.device_count() == 0:
        pytest.skip("no CUDA GPU (or no CuPy)")
    from oocgemm.cuda import nvcomp

    if nvcomp.library() is None:
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu12/13) is not installed")


def run_on_gpu(plan, arrays, out):
    from oocgemm.runtime.cuda_executor import CudaExecutor

    return run(plan, arrays, out, executor=CudaExecutor)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("trans", [False, True])
def test_products_decoded_on_the_gpu(rng, workdir, layout, trans):
    gpu_or_skip()
    a, b, za, zb, plan = ragged(rng, layout, trans, device="cuda")
    out = poisoned((50, 37))
    log, _ = run_on_gpu(plan, {"A": za, "B": zb}, out)
    assert_gemm(out, a, b)
    events = log.events()
    assert any(e.kind == "decode" and e.lane == "decode" for e in events)
    for kind in ("fetch", "upload_stored"):  # what moved: the compressed bytes, not the region's
        moved = sum(e.nbytes for e in events if e.kind == kind)
        planned = sum(op.nbytes for op in plan.schedule.ops if op.kind.value == kind)
        assert 0 < moved < planned * 1.1 and moved != planned


@pytest.mark.gpu
def test_a_frame_the_gpu_cannot_decode_is_named(rng, workdir):
    gpu_or_skip()
    a, b = rand(rng, (32, 24)), rand(rng, (24, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    plan = with_gpu_decode(oocgemm.plan(za, zb, device="cuda", tile=(16, 24, 32)), ("A", "B"))
    path = ZarrSource(za, "a")._direct.path((1, 0))
    with open(path, "r+b") as f:
        f.truncate(30)
    with pytest.raises(InputError, match=r"chunk \(1, 0\)"):
        run_on_gpu(plan, {"A": za, "B": zb}, poisoned((32, 24)))


@pytest.mark.gpu
def test_multiply_decodes_on_the_gpu_when_asked(rng, workdir, monkeypatch):
    gpu_or_skip()
    a, b = rand(rng, (64, 96)), rand(rng, (96, 48))
    store("a.zarr", a, "v3-sharded")
    store("b.zarr", b, "v3")
    monkeypatch.setenv("OOCGEMM_GPU_DECODE", "1")
    result = oocgemm.multiply("a.zarr", "b.zarr", device="cuda", tile=(32, 24, 48))
    assert result.plan.io.gpu_decode == ("A", "B")
    assert_gemm(result.out, a, b)
    assert result.chunks["A"]["on_device"] and result.chunks["A"]["decodes"] >= 4 * 2


# -- the GPU's batches and copies, replayed on the host ---------------------------------------
def replay_batch(plan, ops, cells, slots, fill, itemsize=8) -> dict:
    """DECODEs ``ops`` (a batch) as the GPU does them (:func:`oocgemm.cuda.decode.panel_batch`),
    with numcodecs for nvCOMP and numpy for the 2D copies, each checked as CUDA checks them
    (widths within both pitches, every byte inside its buffer): panel slot -> panel."""
    batch, copies, what = panel_batch(plan, ops, cells)
    assert len(what) == len(batch)
    scratch = np.zeros(plan.decode_scratch, dtype=np.uint8)
    for piece in batch:
        z = slots[piece.z]
        data = numcodecs.Zstd().decode(z[piece.at:piece.at + piece.nbytes].tobytes())
        assert len(data) == piece.content and piece.out + piece.content <= scratch.size
        scratch[piece.out:piece.out + piece.content] = np.frombuffer(data, np.uint8)
    panels, fills = {}, {}
    for op in ops:
        x = plan.problem_operand(op.operand)
        fills[op.dst] = np.full(x.chunks, fill).ravel()
        (r0, r1), (c0, c1) = op.region
        panels[op.dst] = np.full((r1 - r0) * (c1 - c0), np.nan)
    for c in copies:
        src = scratch.view(np.float64) if c.source == "scratch" else fills[c.slot]
        panel = panels[c.slot]
        assert c.width <= c.src_pitch and c.width <= c.dst_pitch
        assert c.src + (c.height - 1) * c.src_pitch + c.width <= src.size
        assert c.dst + (c.height - 1) * c.dst_pitch + c.width <= panel.size
        for row in range(c.height):
            panel[c.dst + row * c.dst_pitch:c.dst + row * c.dst_pitch + c.width] = \
                src[c.src + row * c.src_pitch:c.src + row * c.src_pitch + c.width]
    return panels


def replay_decodes(plan, arrays, fill=7.0) -> list[int]:
    """Every DECODE of ``arrays``' operands ('A', 'B': Zarr arrays) as the GPU runs it, in
    the schedule's batches (:func:`replay_batch`, at the batch's last DECODE), its objects
    fetched and uploaded as the schedule says, each panel checked against zarr's read of it;
    the size of each batch."""
    sources = {name: ZarrSource(z, name.lower()) for name, z in arrays.items()}
    ops = plan.schedule.ops
    last = {b[-1]: b for b in decode_batches(ops)}
    stages, cells, slots = {}, {}, {}
    sizes = []
    for op in ops:
        if op.kind is OpKind.DECODE and op.index in last:
            batch = [ops[i] for i in last[op.index] if ops[i].operand in arrays]
            panels = replay_batch(plan, batch, cells, slots, fill)
            for member in batch:
                (r0, r1), (c0, c1) = member.region
                np.testing.assert_array_equal(
                    panels[member.dst].reshape(r1 - r0, c1 - c0),
                    arrays[member.operand][r0:r1, c0:c1], err_msg=f"{member}")
            sizes.append(len(batch))
        if op.operand not in arrays:
            continue
        source = sources[op.operand]
        if op.kind is OpKind.FETCH:
            into = np.empty(plan.buffers.ring, dtype=np.uint8)
            index = (op.region[0][0] // source.chunks[0], op.region[1][0] // source.chunks[1])
            stages[op.dst] = (index, *source.read_object(index, into), into)
        elif op.kind is OpKind.UPLOAD_STORED:
            index, size, frames, into = stages[op.src[0]]
            z = slots.setdefault(op.dst, np.zeros(plan.schedule.slots[op.dst] * 8, np.uint8))
            z[op.offset * 8:op.offset * 8 + size] = into[:size]
            cells[(op.dst, op.offset)] = (index, size, frames)
    return sizes


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("trans", [False, True])
def test_the_gpus_batches_and_copies_replayed_on_the_host(rng, workdir, layout, trans):
    """Every panel's DECODE as the GPU runs it equals zarr's read of the panel: rows of A
    never written (whole objects, and inner chunks, of the fill value), ragged edges."""
    _, _, za, zb, plan = ragged(rng, layout, trans)
    sizes = replay_decodes(plan, {"A": za, "B": zb})
    assert sum(sizes) == plan.counts.ops[OpKind.DECODE] > 0
    assert max(sizes) == 2  # a K step's A and B panels decoded as one batch


def _op(index, kind, operand, deps=()):
    return Op(index, kind, operand, (0, 0), (), "x", tuple(deps), ((0, 1), (0, 1)))


def test_decode_batches_pair_panels_that_do_not_wait_for_each_other():
    D, U, G = OpKind.DECODE, OpKind.UPLOAD, OpKind.GEMM
    ops = [_op(0, D, "A"), _op(1, U, "B"), _op(2, D, "B", [1]),  # a K step: one batch
           _op(3, G, "C", [0, 2]), _op(4, D, "A", [3]),
           _op(5, G, "C", [4]), _op(6, U, "B", [5]), _op(7, D, "B", [6]),  # waits for 4
           _op(8, D, "A"),  # B then A: one batch
           _op(9, D, "A"),  # the same operand again: a batch of its own
           _op(10, D, "B", [9])]  # waits for 9 itself
    assert decode_batches(ops) == [(0, 2), (4,), (7, 8), (9,), (10,)]


def test_a_batchs_decodes_never_wait_for_each_other(rng, workdir):
    """In a real schedule (every op's ancestors worked out the long way), no DECODE of a
    batch waits for an earlier one of it, and the K steps' A and B panels pair up."""
    _, _, _, _, plan = ragged(rng, "v3-sharded", False)
    ops = plan.schedule.ops
    ancestors: list[set] = []
    for op in ops:
        ancestors.append(set(op.deps).union(*(ancestors[d] for d in op.deps)))
    batches = decode_batches(ops)
    assert sorted(i for b in batches for i in b) == [
        op.index for op in ops if op.kind is OpKind.DECODE]
    for batch in batches:
        assert len({ops[i].operand for i in batch}) == len(batch)
        assert not any(ancestors[i] & set(batch) for i in batch)
    assert sum(len(b) == 2 for b in batches) >= len(batches) // 2


def test_chunks_of_several_frames_go_as_several_pieces(rng, workdir):
    """A chunk stored as zstd frames back to back (as the GPU's encoder writes C's chunks)
    is read by zarr as one stream; on the device each frame is a piece of the batch, decoded
    into its place in the chunk's frame. A frame cut short is refused before it goes up."""
    a, b = rand(rng, (32, 48)), rand(rng, (48, 24))
    za, zb = store("a.zarr", a, "v3"), store("b.zarr", b, "v3")
    zstd = numcodecs.Zstd()
    for root, _, files in os.walk("a.zarr/c"):
        for name in files:
            path = os.path.join(root, name)
            raw = np.frombuffer(zstd.decode(open(path, "rb").read()), np.uint8)
            cut = raw.size // 3 // 8 * 8
            with open(path, "wb") as f:  # three frames: a third, the rest in two
                f.write(zstd.encode(raw[:cut]) + zstd.encode(raw[cut:2 * cut])
                        + zstd.encode(raw[2 * cut:]))
    np.testing.assert_array_equal(zarr.open_array("a.zarr")[:], a)  # zarr reads them
    plan = gpu_plan(za, zb, (16, 24, 48))
    sources = {"A": ZarrSource(za, "a"), "B": ZarrSource(zb, "b")}
    buffer = np.empty(plan.buffers.ring, dtype=np.uint8)
    size, frames = sources["A"].read_object((1, 0), buffer)
    assert [len(f.pieces) for f in frames] == [3]
    assert [p[2] for p in frames[0].pieces] == [0, cut, 2 * cut]
    with pytest.raises(ValueError, match="cut short"):
        zstd_pieces(buffer, 0, size - 1)
    # the whole product, and every DECODE as the GPU runs it
    out = poisoned((32, 24))
    run(plan, {"A": za, "B": zb}, out)
    assert_gemm(out, a, b)
    assert sum(replay_decodes(plan, {"A": za})) == 2

"""The CPU executor with small blocks (issue 51): cheap operations, the schedule taken as the
walk makes it, operands in memory used in place with a slot for each panel, and the advice
against a tile far slower than the planner's. No timed tests: speed is the benchmark's
(``python -m benchmarks small-blocks``)."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, fail_on_call, poisoned, rand, zarr_stores

import oocgemm
from oocgemm.planning import OpKind, Work
from oocgemm.planning.schedule import build_schedule, stream_schedule
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.memory import NumpySink, NumpySource

# Small tiles, ragged everywhere: blocks and panels that do not divide the shapes.
RAGGED = [((37, 29, 41), (8, 5, 7)), ((64, 50, 33), (16, 16, 16)), ((13, 70, 9), (4, 9, 32))]


def _quiet(call, *args, **kwargs):
    """``call`` with the advice against small tiles silenced (these tests ask for them)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "oocgemm: tile=", RuntimeWarning)
        return call(*args, **kwargs)


@pytest.mark.parametrize("shape, tile", RAGGED)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True)])
def test_small_ragged_blocks_from_numpy_into_a_poisoned_output(rng, shape, tile, trans_a,
                                                                trans_b):
    m, k, n = shape
    a = rand(rng, (k, m) if trans_a else (m, k))
    b = rand(rng, (n, k) if trans_b else (k, n))
    out = poisoned((m, n))
    r = _quiet(oocgemm.multiply, a, b, out, tile=tile, device="cpu", trans_a=trans_a,
               trans_b=trans_b, progress=False)
    assert r.out is out
    assert_gemm(out, a, b, trans_a=trans_a, trans_b=trans_b)


@pytest.mark.parametrize("shape, tile", RAGGED)
def test_small_ragged_blocks_with_alpha_and_beta(rng, shape, tile):
    m, k, n = shape
    a, b, c = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    r = _quiet(oocgemm.multiply, a, b, c=c, alpha=-1.5, beta=0.25, tile=tile, device="cpu",
               progress=False)
    assert_gemm(r.out, a, b, c, alpha=-1.5, beta=0.25)


@pytest.mark.parametrize("out", ["c.zarr", "c.npy", None])
@pytest.mark.parametrize("stored", ["zarr", "npy"])
def test_small_ragged_blocks_from_stored_inputs(rng, workdir, stored, out):
    (m, k, n), tile = (57, 45, 38), (8, 7, 6)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    if stored == "zarr":
        zarr_stores((20, 15), a=a, b=b)
    else:
        np.save("a.npy", a)
        np.save("b.npy", b)
    r = _quiet(oocgemm.multiply, f"a.{stored}", f"b.{stored}", out, tile=tile, device="cpu",
               progress=False)
    got = (r.out if out is None else np.load(out) if out.endswith(".npy")
           else zarr.open_array(out, mode="r")[...])
    assert_gemm(got, a, b)
    assert r.plan.in_place == (("C",) if out is None else ())
    # (a Zarr output's writer adds 'store' events, of no operation: index -1)
    assert len([e for e in r.events if e.index >= 0]) == len(r.plan.schedule.ops)


@pytest.mark.parametrize("stored", [False, True])
def test_the_operations_run_are_the_operations_planned(rng, workdir, stored):
    """Each operation of the schedule runs once: the run's events are the schedule's, index
    for index and kind for kind, the operations taken from the walk as it makes them."""
    (m, k, n), tile = (90, 70, 60), (16, 12, 10)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    if stored:
        zarr_stores((30, 30), a=a, b=b)
        a, b = "a.zarr", "b.zarr"
    r = _quiet(oocgemm.multiply, a, b, tile=tile, device="cpu", progress=False)
    ops = build_schedule(r.plan).ops
    assert sorted(e.index for e in r.events) == list(range(len(ops)))
    assert all(e.kind == ops[e.index].kind.value and e.key == ops[e.index].key
               for e in r.events)
    assert len(r.events) == r.plan.counts.total
    assert sum(e.kind == "read" for e in r.events) == r.plan.counts.ops[OpKind.READ]


def test_a_run_never_lists_the_whole_schedule(rng):
    """The executor takes the schedule from the walk as it makes it (Plan.replay): the
    plan's list of every operation is never built (on main it was, before the first GEMM)."""
    a, b = rand(rng, (80, 60)), rand(rng, (60, 70))
    r = _quiet(oocgemm.multiply, a, b, tile=(16, 16, 16), device="cpu", progress=False)
    assert "schedule" not in r.plan.__dict__  # functools.cached_property's, never made
    assert len(r.events) == len(r.plan.schedule.ops) == r.plan.counts.total


def test_the_stream_is_the_built_schedule(rng):
    a, b = rand(rng, (70, 50)), rand(rng, (50, 40))
    plan = _quiet(oocgemm.plan, a, b, tile=(9, 8, 7), device="cpu")
    built = build_schedule(plan)
    stream = stream_schedule(plan)
    batches = list(stream.batches)
    assert tuple(op for batch in batches for op in batch) == built.ops
    assert stream.slots == built.slots and stream.transposed == built.transposed
    assert len(batches) > 1  # handed out a few at a time


def test_inputs_in_place_keep_every_panel_with_the_same_bits(rng):
    """Operands in memory take a slot (a view, no memory) for each of their panels, so that
    each is read once: the same GEMMs in the same order, the same bits as two slots each."""
    (m, k, n), tile = (150, 140, 130), (32, 32, 32)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    plan = _quiet(oocgemm.plan, a, b, tile=tile, device="cpu")
    p, q, nk = plan.grid
    assert plan.in_place == ("A", "B", "C") and plan.resident == ("A", "B")
    assert (plan.staging.n_a, plan.staging.n_b) == (p * nk, q * nk)
    assert plan.notes and "A in place" in str(plan) and "B in place" in str(plan)
    assert plan.device_bytes < 3 * 32 * 32 * 8 + 1  # C's two slots and the accumulator
    reads = [op for op in plan.schedule.ops if op.kind is OpKind.READ]
    assert len(reads) == p * nk + q * nk
    # (the estimate leaves out the run's last block's tapering stripes: a few operations)
    assert plan.counts.total - 10 <= plan.prediction.operations <= plan.counts.total
    two = dataclasses.replace(plan, staging=dataclasses.replace(plan.staging, n_a=2, n_b=2),
                              notes=())
    assert len(two.schedule.ops) > len(plan.schedule.ops)
    outs = []
    for each in (plan, two):
        out = poisoned((m, n))
        CpuExecutor(each, {"A": NumpySource(a), "B": NumpySource(b)}, NumpySink(out)).run()
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])
    assert_gemm(outs[0], a, b)


def _stripes(plan) -> set:
    """The blocks of ``plan``'s schedule that run some GEMM on part of their rows."""
    rows = plan.row_splits
    return {op.key for op in plan.schedule.ops if op.kind is OpKind.GEMM
            and op.region[0] != (rows[op.key[0]], rows[op.key[0] + 1])}


def test_only_the_runs_last_block_runs_its_last_panel_in_row_stripes(rng):
    """The CPU splits the run's last block in the whole order (it leaves as its rows become
    final), whatever part of the run a plan computes (a device's group, a resume); every
    other block runs each panel in one GEMM."""
    a, b = rand(rng, (100, 60)), rand(rng, (60, 90))
    plan = _quiet(oocgemm.plan, a, b, tile=(16, 20, 25), device="cpu")
    p, q, nk = plan.grid
    assert plan.staging.split_blocks == "last" and plan.staging.split_last > 1
    last = (p - 1, 0 if p % 2 == 0 else q - 1)  # where the serpentine ends
    assert _stripes(plan) == {last}
    gemms = [op for op in plan.schedule.ops if op.kind is OpKind.GEMM]
    assert len(gemms) > p * q * nk  # its stripes
    assert len([op for op in gemms if op.key != last]) == (p * q - 1) * nk
    assert plan.counts == plan.schedule.counts()
    group = dataclasses.replace(plan, work=Work(blocks=((0, 0), (0, 1), (1, 1))))
    assert _stripes(group) == set()
    with_last = dataclasses.replace(plan, work=Work(blocks=((1, 1), last)))
    assert _stripes(with_last) == {last}
    every = dataclasses.replace(  # the CUDA executor's way
        plan, staging=dataclasses.replace(plan.staging, split_blocks="every"))
    assert len(_stripes(every)) == p * q


@pytest.mark.parametrize("gram", [False, True])
def test_a_blocks_bits_do_not_depend_on_where_c_goes(rng, workdir, gram):
    """C computed in place (memory, an array given, a .npy file) or written (Zarr) has the
    same bits, one-row stripes in the run's last block included (a ragged block of 3 rows,
    its last stripe tapered: the GEMMs of a row are numpy's GEMV)."""
    if gram:
        x = rand(rng, (70, 99))
        a, b, kw = x, x, {"trans_a": True}  # a symmetric plan: 99 x 99 in 24 x 24 blocks
        m = n = 99
    else:
        (m, k, n) = (99, 70, 83)
        a, b, kw = rand(rng, (m, k)), rand(rng, (k, n)), {}
    tile = (24, 24, 20)
    outs = {}
    for out in (None, "array", "c.npy", "c.zarr"):
        target = poisoned((m, n)) if out == "array" else out
        r = _quiet(oocgemm.multiply, a, b, target, device="cpu", tile=tile, **kw)
        got = {None: r.out, "array": target}.get(out)
        if got is None:
            got = np.load(out) if out.endswith(".npy") else zarr.open_array(out, mode="r")[...]
        outs[out] = np.asarray(got)
        assert r.plan.symmetric == gram and _stripes(r.plan)
    assert_gemm(outs[None], a, b, **kw)
    for out in ("array", "c.npy", "c.zarr"):
        np.testing.assert_array_equal(outs[out], outs[None], err_msg=out)


def test_a_failing_read_on_a_reader_lane_stops_the_run(rng, workdir, monkeypatch):
    a, b = rand(rng, (60, 50)), rand(rng, (50, 40))
    np.save("a.npy", a)
    np.save("b.npy", b)
    fail_on_call(monkeypatch, CpuExecutor, "_read", 4, OSError("disk on fire"))
    with pytest.raises(oocgemm.ExecutionError, match="disk on fire"):
        _quiet(oocgemm.multiply, "a.npy", "b.npy", tile=(10, 10, 10), device="cpu",
               progress=False)


# -- the advice against a tile far slower than the planner's ---------------------------------
def test_a_tile_far_slower_than_the_planners_is_warned_of_and_recorded(rng):
    a, b = np.empty((1000, 1000)), np.empty((1000, 1000))
    with pytest.warns(RuntimeWarning, match=r"tile=\(16, 16, 16\) is predicted to take .* "
                                            r"times the .* planner's own choice") as caught:
        plan = oocgemm.plan(a, b, tile=(16, 16, 16), device="cpu")
    assert caught[0].filename == __file__  # the caller's line
    assert len(plan.warnings) == 1 and "leave tile= out" in plan.warnings[0]
    assert "warning" in str(plan) and plan.summary()["warnings"] == list(plan.warnings)
    own = oocgemm.plan(a, b, device="cpu")
    assert plan.prediction.total > 3 * own.prediction.total
    text = plan.warnings[0]
    assert f"w={own.tile[0]} h={own.tile[1]} r={own.tile[2]}" in text


def test_the_planners_own_tile_is_not_warned_of(rng):
    a, b = np.empty((1000, 800)), np.empty((800, 600))
    own = oocgemm.plan(a, b, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = oocgemm.plan(a, b, tile=own.tile, device="cpu")
        near = oocgemm.plan(a, b, tile=(500, 300, 400), device="cpu")  # a few blocks
    assert again.warnings == () and near.warnings == ()
    assert own.warnings == () and "warning" not in str(own)


def test_a_small_product_is_not_warned_of(rng):
    """Milliseconds either way: a tile of a small product is left alone."""
    a, b = rand(rng, (40, 30)), rand(rng, (30, 20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = oocgemm.multiply(a, b, tile=(4, 4, 4), device="cpu", progress=False)
    assert r.plan.warnings == ()
    assert_gemm(r.out, a, b)

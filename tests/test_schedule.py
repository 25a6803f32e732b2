"""The schedule and its checker: random plans pass, mutated schedules fail, and the CPU
executor replays staged plans (the CUDA executor's schedule) correctly."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from _helpers import assert_gemm, examples, poisoned, rand
from hypothesis import given, settings
from hypothesis import strategies as st

from oocgemm.devices import Device
from oocgemm.planning import (
    Operand,
    OpKind,
    Plan,
    Problem,
    ScheduleError,
    Work,
    check_schedule,
    cpu_model,
    cuda_model,
)
from oocgemm.planning.schedule import op_span, stream_schedule
from oocgemm.planning.staging import StagingSettings
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage import open_sink, open_source

PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}
STAGING_FIELDS = {f.name for f in dataclasses.fields(StagingSettings)}
BIG = 1 << 50


def make_plan(m, n, k, tile, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
              staged=False, dtype="float64", model=None, **slots) -> Plan:
    """A Plan built directly (no API), with generous budgets: ``slots`` are its fields, or
    settings of its :attr:`~oocgemm.planning.Plan.staging` (the rest of which are the
    defaults)."""
    itemsize = np.dtype(dtype).itemsize
    prob = Problem(
        m=m, n=n, k=k, itemsize=itemsize, dtype=dtype,
        a=Operand((k, m) if trans_a else (m, k)), b=Operand((n, k) if trans_b else (k, n)),
        c=Operand((m, n)) if beta != 0 else None, out=Operand((m, n)),
        alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
    staging = StagingSettings(**{k: v for k, v in slots.items() if k in STAGING_FIELDS})
    slots = {key: value for key, value in slots.items() if key in PLAN_FIELDS}
    return Plan(problem=prob, device=Device("cpu"), model=model or cpu_model(), tile=tile,
                memory_limit=BIG, host_memory_limit=BIG, staged=staged, staging=staging,
                **slots).validate()


@st.composite
def plans(draw, max_extent=40):
    m, n, k = (draw(st.integers(0, max_extent)) for _ in range(3))
    tile = tuple(draw(st.integers(1, max(e, 1) + 2)) for e in (m, n, k))
    staged = draw(st.booleans())
    slots = {name: draw(st.integers(1, 3)) for name in ("n_a", "n_b", "n_c", "n_stage", "n_out")}
    slots["split_last"] = draw(st.integers(1, 4))  # the last panel's GEMM in row stripes
    slots["ramp"] = draw(st.integers(0, 3))  # the first panel in halving pieces
    slots["tail_panels"] = draw(st.integers(1, 4))  # the last panels stripe by stripe
    slots["min_stripes"] = draw(st.integers(1, 5))
    if staged:
        slots["stripe"] = draw(st.integers(1, 64))  # many stripes per panel
    return make_plan(m, n, k, tile, alpha=draw(st.sampled_from([0.0, 1.0, 2.5])),
                     beta=draw(st.sampled_from([0.0, 1.0, -0.5])), trans_a=draw(st.booleans()),
                     trans_b=draw(st.booleans()), staged=staged,
                     model=draw(st.sampled_from([cpu_model(), cuda_model()])), **slots)


@settings(max_examples=examples(ci=100, thorough=300))
@given(plans())
def test_random_plans_pass_the_checker(plan):
    schedule = plan.schedule
    check_schedule(schedule, plan)
    p, q, nk = plan.grid
    prob = plan.problem
    gemms = [op for op in schedule.ops if op.kind is OpKind.GEMM]
    assert len({(op.key, op.q) for op in gemms}) == (p * q * nk if prob.computes_product else 0)
    assert sum(op.flops for op in gemms) == prob.flops
    s = plan.staging
    tail = min(s.tail_panels, nk, s.n_a, s.n_b)
    assert len(gemms) <= p * q * (nk - tail + tail * (s.split_last + 3))  # +3: the taper
    assert schedule.count(OpKind.FILL) == (0 if prob.computes_product else p * q)
    written = sum(op.nbytes for op in schedule.ops if op.kind is OpKind.WRITE)
    assert written == prob.m * prob.n * prob.itemsize
    if not prob.reads_c:
        assert all(op.operand != "C" for op in schedule.ops if op.kind is OpKind.READ)
    if not prob.computes_product:
        assert all(op.operand == "C" for op in schedule.ops)
    kinds = {op.kind for op in schedule.ops}
    assert (OpKind.UPLOAD in kinds or OpKind.DOWNLOAD in kinds) == (plan.staged and p * q > 0)


@settings(max_examples=examples(ci=60, thorough=300))
@given(plans())
def test_the_stream_hands_out_the_built_schedule(plan):
    """What an executor takes from the walk as it makes it (Plan.replay, before the schedule
    is built) is the built schedule, operation for operation; once built, the same list."""
    stream = plan.replay()
    assert "schedule" not in plan.__dict__
    ops = tuple(op for batch in stream.batches for op in batch)
    assert ops == plan.schedule.ops
    assert (stream.slots, stream.transposed) == (plan.schedule.slots, plan.schedule.transposed)
    again = plan.replay()
    assert tuple(op for batch in again.batches for op in batch) == plan.schedule.ops
    fresh = stream_schedule(plan)
    assert all(len(batch) for batch in fresh.batches)


# -- mutations -------------------------------------------------------------------------------
def with_op(schedule, op):
    ops = list(schedule.ops)
    ops[op.index] = op
    return replace(schedule, ops=tuple(ops))


def without(schedule, index):
    """The schedule minus one op; later ops are renumbered, dependencies on it dropped."""
    kept = [op for op in schedule.ops if op.index != index]
    new = {op.index: i for i, op in enumerate(kept)}
    return replace(schedule, ops=tuple(
        replace(op, index=new[op.index], deps=tuple(new[d] for d in op.deps if d in new))
        for op in kept))


def duplicated(schedule, index):
    """The schedule with a copy of op ``index`` right after it (depending on it)."""
    def shift(i):
        return i if i <= index else i + 1
    ops = []
    for op in schedule.ops:
        moved = replace(op, index=shift(op.index), deps=tuple(shift(d) for d in op.deps))
        ops.append(moved)
        if op.index == index:
            ops.append(replace(moved, index=index + 1, deps=tuple(sorted({*moved.deps, index}))))
    return replace(schedule, ops=tuple(ops))


def lane_of(op) -> str | None:
    """The executors' in-order lanes, written out again: CUDA streams h2d (A/B uploads),
    compute (GEMM, FILL) and c (C uploads, downloads); READ and WRITE run on pools."""
    if op.kind in (OpKind.GEMM, OpKind.FILL):
        return "compute"
    if op.kind is OpKind.UPLOAD:
        return "c" if op.operand == "C" else "h2d"
    if op.kind is OpKind.DOWNLOAD:
        return "c"
    return None


def predecessors(schedule, upto=None) -> list[list[int]]:
    """For each op (the first ``upto``): its deps and the op before it on its in-order lane."""
    ops = schedule.ops[:upto]
    preds, last = [], {}
    for op in ops:
        lane = lane_of(op)
        preds.append(list(op.deps) + ([last[lane]] if lane in last else []))
        if lane is not None:
            last[lane] = op.index
    return preds


def ancestors(schedule, index) -> set[int]:
    """Everything that happens before op ``index``: an independent closure of the deps and of
    program order on each in-order lane."""
    preds = predecessors(schedule, index + 1)
    seen, todo = set(), list(preds[index])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(preds[d])
    return seen


def hazard_free(schedule) -> bool:
    """The checker's hazard rules, element by element with whole ancestor sets: slow, and
    independent of its bookkeeping. Reads and writes touch ``op_span`` clipped to the slot.
    Sets of ops are bit masks (bit ``i``: op ``i``)."""
    ops = schedule.ops
    before: list[int] = []  # the ops that happen before each op
    last: dict[str, int] = {}
    for op in ops:
        seen = 0
        lane = lane_of(op)
        for d in list(op.deps) + ([last[lane]] if lane in last else []):
            seen |= before[d] | (1 << d)
        before.append(seen)
        if lane is not None:
            last[lane] = op.index
    writer = {slot: [None] * size for slot, size in schedule.slots.items()}
    readers = {slot: [0] * size for slot, size in schedule.slots.items()}

    def span(op, slot, writing):
        lo, hi = op_span(op, slot, writing)
        return range(lo, min(hi, schedule.slots[slot]))

    for op in ops:
        me, seen = 1 << op.index, before[op.index]
        for slot in op.src:
            wrote = {writer[slot][e] for e in span(op, slot, False)} - {None}
            if not wrote or not all(seen >> w & 1 for w in wrote):
                return False
            for e in span(op, slot, False):
                readers[slot][e] |= me
        if op.dst is not None:
            for e in span(op, op.dst, True):
                if readers[op.dst][e] & ~me & ~seen:  # a reader, not itself, not before it
                    return False
                if writer[op.dst][e] is not None and not seen >> writer[op.dst][e] & 1:
                    return False
                writer[op.dst][e], readers[op.dst][e] = op.index, 0
    return True


def content_writers(schedule, index, slot) -> set[int]:
    """The ops that wrote what ``slot`` holds when op ``index`` runs (its current content)."""
    found, key = set(), None
    for op in reversed(schedule.ops[:index]):
        if op.dst != slot:
            continue
        if key is not None and (op.operand, op.key) != key:
            break
        key = (op.operand, op.key)
        found.add(op.index)
    return found


MUTATION_PLANS = {
    "unstaged beta=0": dict(beta=0.0),
    "unstaged beta=-0.5": dict(beta=-0.5, alpha=2.5),
    "unstaged beta=1 trans": dict(beta=1.0, trans_a=True, trans_b=True),
    "staged beta=0": dict(beta=0.0, staged=True, stripe=5, n_stage=3, n_out=2),
    "staged beta=-0.5": dict(beta=-0.5, staged=True, stripe=7, n_stage=2, n_out=2),
    "staged split last GEMM": dict(beta=0.5, staged=True, stripe=6, n_stage=2, n_out=2,
                                   split_last=3),
    "staged tail of 2 panels": dict(beta=0.0, staged=True, stripe=6, n_stage=2, n_out=2,
                                    split_last=3, tail_panels=2, n_a=3, n_b=3),
    "staged one slot each": dict(beta=1.0, staged=True, stripe=9, n_stage=1, n_out=1, n_a=1,
                                 n_b=1, n_c=1),
}


@pytest.fixture(params=sorted(MUTATION_PLANS))
def mplan(request):
    plan = make_plan(10, 9, 12, (4, 4, 3), **MUTATION_PLANS[request.param])
    check_schedule(plan.schedule, plan)  # the unmutated schedule is fine
    return plan


def gemms(schedule):
    return [op for op in schedule.ops if op.kind is OpKind.GEMM]


def test_dropping_a_gemm_dependency_is_caught_unless_implied(mplan):
    """RAW: drop the GEMM's dependencies through which it waits for the op(s) that filled its
    A (or B) slot. The checker must object exactly when nothing else (its own lane's earlier
    GEMMs included) still orders them."""
    sched = mplan.schedule
    caught = 0
    for op in gemms(sched):
        for which in (0, 1):
            writers = content_writers(sched, op.index, op.src[which])
            assert writers and writers <= ancestors(sched, op.index), (
                f"{op} does not wait for the writers of {op.src[which]}")
            through = {d for d in op.deps if writers & (ancestors(sched, d) | {d})}
            mutated = with_op(sched, replace(op, deps=tuple(d for d in op.deps if d not in
            through)))
            # The dropped deps may also have ordered the GEMM's other operands: the slow
            # element-wise replay says whether the mutated schedule is still correct.
            if hazard_free(mutated):
                assert writers <= ancestors(mutated, op.index)
                check_schedule(mutated, mplan)  # still ordered through other ops: correct
                continue
            with pytest.raises(ScheduleError, match="RAW|WAR|WAW"):
                check_schedule(mutated, mplan)
            if not writers <= ancestors(mutated, op.index):
                with pytest.raises(ScheduleError, match="RAW"):
                    check_schedule(mutated, mplan)
                caught += 1
    assert caught >= len(gemms(sched)) // 2


def touched(op, slot, writing: bool) -> tuple[int, int]:
    """Elements of ``slot`` that ``op`` touches, as the CPU executor's copies do: a staged
    UPLOAD writes (and a DOWNLOAD reads) a stripe at its offset; GEMMs use whole slots."""
    if op.kind is OpKind.GEMM or op.kind is OpKind.FILL:
        return (0, BIG)
    rows, cols = op.shape
    offset = getattr(op, "offset", 0)
    if (op.kind is OpKind.UPLOAD and writing) or (op.kind is OpKind.DOWNLOAD and not writing):
        return (offset, offset + rows * cols)
    return (0, rows * cols)


def test_dropping_a_war_dependency_is_caught_unless_implied(mplan):
    """WAR: a READ/UPLOAD that overwrites a slot stops waiting for the slot's readers. The
    checker must object exactly when a reader of overlapping elements is left unordered."""
    sched = mplan.schedule
    caught = 0
    for op in sched.ops:
        if op.kind not in (OpKind.READ, OpKind.UPLOAD):
            continue
        war = {d for d in op.deps if op.dst in sched.ops[d].src}
        if not war:
            continue
        mutated = with_op(sched, replace(op, deps=tuple(d for d in op.deps if d not in war)))
        lo, hi = touched(op, op.dst, writing=True)
        needed = {d for d in war
                  if (lambda r: r[0] < hi and lo < r[1])(touched(sched.ops[d], op.dst, False))}
        if needed <= ancestors(mutated, op.index):
            check_schedule(mutated, mplan)
            continue
        with pytest.raises(ScheduleError, match="WAR"):
            check_schedule(mutated, mplan)
        caught += 1
    assert caught >= 5


def test_swapping_a_gemm_slot_is_caught(mplan):
    sched = mplan.schedule
    names = sorted(s for s in sched.slots if s[0] in "AB")
    for op in gemms(sched):
        for which in (0, 1):
            for other in names:
                if other[0] != op.src[which][0] or other == op.src[which]:
                    continue
                src = list(op.src)
                src[which] = other
                with pytest.raises(ScheduleError):
                    check_schedule(with_op(sched, replace(op, src=tuple(src))), mplan)
        # the A and B slots exchanged
        src = (op.src[1], op.src[0]) + op.src[2:]
        with pytest.raises(ScheduleError):
            check_schedule(with_op(sched, replace(op, src=src)), mplan)


def test_duplicating_a_gemm_is_caught(mplan):
    sched = mplan.schedule
    for op in gemms(sched):
        with pytest.raises(ScheduleError):
            check_schedule(duplicated(sched, op.index), mplan)


def test_removing_an_op_is_caught(mplan):
    """Every WRITE, GEMM and READ is needed."""
    sched = mplan.schedule
    for op in sched.ops:
        if op.kind in (OpKind.WRITE, OpKind.GEMM, OpKind.READ):
            with pytest.raises(ScheduleError):
                check_schedule(without(sched, op.index), mplan)


def test_wrong_regions_and_scalars_are_caught(mplan):
    sched = mplan.schedule
    prob = mplan.problem
    for op in sched.ops:
        (r0, r1), (c0, c1) = op.region
        if op.kind in (OpKind.READ, OpKind.WRITE) and r1 - r0 > 0:
            shifted = ((r0 + 1, r1 + 1), (c0, c1))
            with pytest.raises(ScheduleError):
                check_schedule(with_op(sched, replace(op, region=shifted)), mplan)
        if op.kind is OpKind.GEMM:
            with pytest.raises(ScheduleError):
                check_schedule(with_op(sched, replace(op, alpha=op.alpha + 1)), mplan)
            with pytest.raises(ScheduleError):
                check_schedule(with_op(sched, replace(op, q=(op.q + 1) % mplan.grid[2])), mplan)
    # the first GEMM of a block that reads C must scale it by beta, not drop it
    first = gemms(sched)[0]
    bad_beta = 0.0 if prob.reads_c else 1.0
    src = first.src[:2] + ((first.dst,) if bad_beta else ())
    with pytest.raises(ScheduleError):
        check_schedule(with_op(sched, replace(first, beta=bad_beta, src=src)), mplan)


def test_reading_c_when_beta_is_zero_is_caught():
    plan = make_plan(6, 5, 4, (3, 5, 4), beta=-0.5)
    c_plan = make_plan(6, 5, 4, (3, 5, 4), beta=0.0)
    with pytest.raises(ScheduleError, match="beta == 0"):
        check_schedule(plan.schedule, c_plan)


def test_reading_a_when_alpha_is_zero_is_caught():
    plan = make_plan(6, 5, 4, (3, 5, 4), alpha=1.0)
    zero = make_plan(6, 5, 4, (3, 5, 4), alpha=0.0)
    with pytest.raises(ScheduleError):
        check_schedule(plan.schedule, zero)


def test_out_of_order_dependency_is_caught():
    plan = make_plan(6, 5, 4, (3, 5, 2))
    sched = plan.schedule
    op = sched.ops[3]
    with pytest.raises(ScheduleError, match="not an earlier operation"):
        check_schedule(with_op(sched, replace(op, deps=op.deps + (5,))), plan)


# -- the CPU executor on staged (CUDA-shaped) plans -----------------------------------------
def run_plan(plan, a, b, c):
    """Replay ``plan`` with the CPU executor on numpy sources; return the output array."""
    prob = plan.problem
    sources = {"A": open_source(a, "a"), "B": open_source(b, "b")}
    if prob.reads_c:
        sources["C"] = open_source(c, "c")
    out = poisoned((prob.m, prob.n), prob.dtype)
    sink = open_sink(out, shape=(prob.m, prob.n), dtype=prob.dtype)
    log = CpuExecutor(plan, sources, sink).run()
    assert sink.commit() is out
    assert len(log.events()) == len(plan.schedule.ops)
    return out


@st.composite
def executed_plans(draw):
    m, n, k = (draw(st.integers(0, 24)) for _ in range(3))
    tile = tuple(draw(st.integers(1, max(e, 1) + 1)) for e in (m, n, k))
    slots = {name: draw(st.integers(1, 3)) for name in ("n_a", "n_b", "n_c", "n_stage", "n_out")}
    slots["stripe"] = draw(st.integers(1, 40))
    slots["split_last"] = draw(st.integers(1, 4))
    slots["ramp"] = draw(st.integers(0, 3))
    slots["tail_panels"] = draw(st.integers(1, 4))
    slots["min_stripes"] = draw(st.integers(1, 5))
    return dict(m=m, n=n, k=k, tile=tile, alpha=draw(st.sampled_from([0.0, 1.0, -2.5])),
                beta=draw(st.sampled_from([0.0, 1.0, -0.5])), trans_a=draw(st.booleans()),
                trans_b=draw(st.booleans()), staged=draw(st.booleans()),
                dtype=draw(st.sampled_from(["float64", "float32", "complex128"])), **slots)


@settings(max_examples=examples(ci=30, thorough=200))
@given(executed_plans(), st.integers(0, 2**32 - 1))
def test_cpu_executor_replays_random_plans(spec, seed):
    rng = np.random.default_rng(seed)
    m, n, k, dtype = spec["m"], spec["n"], spec["k"], spec["dtype"]
    plan = make_plan(**spec)
    check_schedule(plan.schedule, plan)
    a = rand(rng, (k, m) if spec["trans_a"] else (m, k), dtype)
    b = rand(rng, (n, k) if spec["trans_b"] else (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    if spec["alpha"] == 0:
        a, b = poisoned(a.shape, dtype), poisoned(b.shape, dtype)
    if spec["beta"] == 0:
        c = poisoned(c.shape, dtype)
    out = run_plan(plan, a, b, c)
    assert_gemm(out, a, b, c, alpha=spec["alpha"], beta=spec["beta"], trans_a=spec["trans_a"],
                trans_b=spec["trans_b"], dtype=dtype)


@pytest.mark.parametrize("stripe", [1, 6, 1000])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_cpu_executor_on_staged_plans(rng, stripe, trans_a, trans_b, beta):
    m, n, k = 17, 13, 11
    plan = make_plan(m, n, k, (5, 4, 3), alpha=1.5, beta=beta, trans_a=trans_a,
                     trans_b=trans_b, staged=True, stripe=stripe, n_stage=3, n_out=2)
    assert plan.schedule.count(OpKind.UPLOAD) > 0
    check_schedule(plan.schedule, plan)
    a = rand(rng, (k, m) if trans_a else (m, k))
    b = rand(rng, (n, k) if trans_b else (k, n))
    c = rand(rng, (m, n)) if beta != 0 else poisoned((m, n))
    out = run_plan(plan, a, b, c)
    assert_gemm(out, a, b, c, alpha=1.5, beta=beta, trans_a=trans_a, trans_b=trans_b)


def test_cpu_executor_with_one_slot_of_each_kind(rng):
    m, n, k = 14, 9, 10
    plan = make_plan(m, n, k, (3, 4, 2), beta=-1.0, staged=True, stripe=5, n_a=1, n_b=1, n_c=1,
                     n_stage=1, n_out=1)
    a, b, c = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    assert_gemm(run_plan(plan, a, b, c), a, b, c, beta=-1.0)


def test_cpu_executor_on_a_staged_plan_from_the_api(rng):
    """The API's CPU plans are unstaged; restage one as the CUDA path would and replay it."""
    import oocgemm

    a, b, c = rand(rng, (20, 15)), rand(rng, (15, 18)), rand(rng, (20, 18))
    plan = oocgemm.plan(a, b, c=c, beta=0.5, tile=(6, 7, 4), device="cpu")
    staged = replace(plan, staged=True, **({"stripe": 10} if "stripe" in PLAN_FIELDS else {}))
    check_schedule(staged.schedule, staged)
    assert staged.schedule.count(OpKind.UPLOAD) > 0
    assert_gemm(run_plan(staged, a, b, c), a, b, c, beta=0.5)



# -- lane order ------------------------------------------------------------------------------
@settings(max_examples=examples(ci=100, thorough=400))
@given(plans(max_extent=16), st.data())
def test_checker_agrees_with_an_element_wise_replay(plan, data):
    """Drop a dependency, move one to another earlier op, or drop them all: the checker says
    the schedule is wrong exactly when the slow element-wise replay (whole ancestor sets,
    program order on the in-order lanes) finds a hazard."""
    sched = plan.schedule
    assert hazard_free(sched)
    if len(sched.ops) < 2:
        return
    op = sched.ops[data.draw(st.integers(1, len(sched.ops) - 1))]
    how = data.draw(st.sampled_from(["drop", "move", "none"]))
    deps = list(op.deps)
    if how == "drop" and deps:
        deps.pop(data.draw(st.integers(0, len(deps) - 1)))
    elif how == "move" and deps:
        deps[data.draw(st.integers(0, len(deps) - 1))] = data.draw(st.integers(0, op.index - 1))
    elif how == "none":
        deps = []
    mutated = with_op(sched, replace(op, deps=tuple(sorted(set(deps)))))
    if hazard_free(mutated):
        check_schedule(mutated, plan)
    else:
        with pytest.raises(ScheduleError, match="RAW|WAR|WAW"):
            check_schedule(mutated, plan)


def lane_mutations(sched):
    """(op, dep, other): op waits for ``dep``; ``other`` is a later op than ``dep``, still
    before ``op``, on another in-order lane or none (pools)."""
    for op in sched.ops:
        for d in op.deps:
            for other in sched.ops[d + 1:op.index]:
                yield op, d, other


def test_a_later_op_of_the_same_lane_stands_for_an_earlier_one():
    """Waiting for a later op of an in-order lane is waiting for all its earlier ones."""
    moved = 0
    for spec in MUTATION_PLANS.values():
        plan = make_plan(10, 9, 12, (4, 4, 3), **spec)
        sched = plan.schedule
        for op, d, other in lane_mutations(sched):
            lane = lane_of(sched.ops[d])
            if lane is None or lane_of(other) != lane or lane == lane_of(op):
                continue
            mutated = with_op(sched, replace(op, deps=tuple(sorted({*op.deps, other.index} - {d}))))
            assert hazard_free(mutated)
            check_schedule(mutated, plan)
            moved += 1
    assert moved > 20


def test_no_lane_order_is_assumed_where_executors_have_none():
    """Move a dependency to a later op of its kind that only a wrong lane model would let
    stand for it: one on another stream (h2d, c and compute are three on the GPU, although
    the CPU copies on one thread), or a later READ or WRITE (pools run them in any order).
    Wherever nothing else orders the ops, the checker must object."""
    caught = set()
    for spec in MUTATION_PLANS.values():
        plan = make_plan(10, 9, 12, (4, 4, 3), **spec)
        sched = plan.schedule
        for op, d, other in lane_mutations(sched):
            lane = lane_of(sched.ops[d])
            if lane is not None and lane_of(other) == lane:
                continue  # the same in-order lane: implied (the test above)
            if sched.ops[d].kind is not other.kind:
                continue
            mutated = with_op(sched, replace(op, deps=tuple(sorted({*op.deps, other.index} - {d}))))
            if d in ancestors(mutated, op.index) or hazard_free(mutated):
                check_schedule(mutated, plan)  # still ordered, or d was not needed
                continue
            with pytest.raises(ScheduleError, match="RAW|WAR|WAW"):
                check_schedule(mutated, plan)
            caught.add((sched.ops[d].kind, lane, lane_of(other)))
    # a C upload (stream c) replaced by a later A/B upload (stream h2d)
    assert (OpKind.UPLOAD, "c", "h2d") in caught
    # a READ, or a WRITE, replaced by a later one
    assert (OpKind.READ, None, None) in caught and (OpKind.WRITE, None, None) in caught


@settings(max_examples=examples(ci=100, thorough=300))
@given(plans())
def test_dependencies_are_few_and_one_per_lane(plan):
    """No dependency on the op's own in-order lane, at most one on each other one, and few on
    pool ops: a constant, whatever the size of the product."""
    sched = plan.schedule
    for op in sched.ops:
        lanes = [lane_of(sched.ops[d]) for d in op.deps]
        ordered = [lane for lane in lanes if lane is not None]
        assert lane_of(op) not in ordered, op
        assert len(ordered) == len(set(ordered)), op
        assert lanes.count(None) <= 3, op
        assert len(op.deps) <= 3, op


@settings(max_examples=examples(ci=100, thorough=300))
@given(plans())
def test_counts_without_building_equal_the_schedule(plan):
    assert plan.counts == plan.schedule.counts()
    assert plan.counts.total == len(plan.schedule.ops)
    assert plan.counts.traffic == plan.schedule.traffic()


@pytest.mark.parametrize("kw", [
    dict(),
    dict(beta=0.5, trans_a=True),
    dict(alpha=0.0, beta=2.0),
    dict(staged=True, beta=-1.0, trans_b=True, model=cuda_model(), stripe=37, min_stripes=3,
         n_stage=6, n_out=3, ramp=2, ramp_granule=2, split_last=4, tail_panels=3, n_a=4, n_b=4),
    dict(staged=True, alpha=0.0, beta=0.5, stripe=20, n_stage=2, n_out=2),
])
def test_counts_on_larger_ragged_plans(kw):
    plan = make_plan(203, 171, 389, (24, 20, 16), **kw)  # every edge ragged
    assert "schedule" not in vars(plan)
    text, summary = str(plan), plan.summary()
    assert "schedule" not in vars(plan)  # neither printing nor the summary builds it
    assert f"{len(plan.schedule.ops)} operations" in text
    assert summary["operations"] == len(plan.schedule.ops)
    assert summary["bytes"] == {**plan.schedule.traffic(), "decoded": plan.decoded_bytes}


def _growth(staged: bool, scale: int, grow: str) -> tuple[int, int, int]:
    """Operations, dependencies and the most dependencies of one op, for a product grown
    ``scale`` times along M (more blocks) or along K (more panels)."""
    m, k = (32 * scale, 64) if grow == "blocks" else (32, 64 * scale)
    kw = dict(staged=True, stripe=16, n_stage=4, n_out=2, split_last=2, tail_panels=2,
              ramp=1, n_a=3, n_b=3, min_stripes=2) if staged else {}
    plan = make_plan(m, 32, k, (8, 8, 4), beta=0.5, **kw)
    ops = plan.schedule.ops
    return len(ops), sum(len(op.deps) for op in ops), max(len(op.deps) for op in ops)


@pytest.mark.parametrize("grow", ["blocks", "panels"])
@pytest.mark.parametrize("staged", [False, True])
def test_operations_and_dependencies_grow_linearly(staged, grow):
    (o1, d1, x1), (o2, d2, x2), (o4, d4, x4) = (_growth(staged, s, grow) for s in (1, 2, 4))
    for small, large in ((o1, o2), (o2, o4), (d1, d2), (d2, d4)):
        assert 1.8 <= large / small <= 2.2, (small, large)
    assert x1 == x2 == x4 <= 3


@pytest.mark.parametrize("staged", [False, True])
def test_the_checker_needs_a_fixed_number_of_chains(staged):
    """The checker's vector clocks have one entry per chain: a few per lane and slot, not
    more as the schedule grows."""
    from oocgemm.planning.check import _Chains

    sizes = []
    for scale in (1, 4):
        kw = dict(staged=True, stripe=16, n_stage=4, n_out=2, split_last=2, tail_panels=2,
                  n_a=3, n_b=3) if staged else {}
        plan = make_plan(32 * scale, 32, 64 * scale, (8, 8, 4), beta=0.5, **kw)
        chains = _Chains()
        for op in plan.schedule.ops:
            chains.add(op)
        sizes.append(len(chains.last))
    slots = len(plan.schedule.slots)
    assert sizes[0] == sizes[1] <= 3 + 2 * slots


@pytest.mark.parametrize("staged", [False, True])
def test_a_plan_of_picked_blocks_computes_each_as_the_whole_plan_does(staged):
    """One device's group (Plan.work.blocks): only those blocks, built without walking the others,
    each with the K order and row parts it has in the whole schedule."""
    from oocgemm.planning.schedule import serpentine, serpentine_index

    whole = make_plan(50, 60, 45, (10, 12, 9), staged=staged, ramp=2, split_last=3,
                      tail_panels=2, n_a=3, n_b=3, stripe=40, n_stage=3, n_out=2)
    p, q, _ = whole.grid
    assert [serpentine_index(i, j, q) for i, j in serpentine(p, q)] == list(range(p * q))

    def gemms(plan, block):
        """Each row stripe's panels in the order they add to it: what sets its bits."""
        stripes: dict = {}
        for op in plan.schedule.ops:
            if op.kind is OpKind.GEMM and op.key == block:
                stripes.setdefault(op.region, []).append(op.q)
        return stripes

    for picked in (((3, 1), (0, 4), (4, 4)),  # the last block of the order among them
                   ((3, 1), (1, 2), (0, 4))):  # the group ends before the whole does
        group = replace(whole, work=Work(blocks=picked))
        assert {op.key for op in group.schedule.ops if op.kind is OpKind.GEMM} == set(picked)
        for block in picked:
            assert gemms(group, block) == gemms(whole, block)
        check_schedule(group.schedule, group)


def test_one_matrix_in_both_roles_keeps_each_roles_tail_in_its_own_slots(rng):
    """X X^T with a tile that is not square (computed in full) and a ragged edge where A's
    last row panel is B's last column panel: a device's group of blocks that starts on
    that panel found A's tail panels in B's slots, pinned them there and left B's own tail
    no slot ("every B slot is pinned"). Each role's tail now stays in its own slots; a
    diagonal block's one panel for both roles still takes one."""
    from oocgemm.runtime.multi_device import groups

    x = rand(rng, (281, 123))
    prob = Problem(m=281, n=281, k=123, itemsize=8, dtype="float64", a=Operand(x.shape),
                   b=Operand(x.shape), c=None, out=Operand((281, 281)), alpha=1.0, beta=0.0,
                   trans_a=False, trans_b=True, shared=True)
    whole = Plan(problem=prob, device=Device("cpu"), model=cpu_model(), tile=(256, 64, 32),
                 memory_limit=BIG, host_memory_limit=BIG, staged=True, stripe=4096,
                 staging=StagingSettings(n_a=5, n_b=5, tail_panels=4, split_last=8, n_stage=4,
                                         n_out=2)).validate()
    assert whole.grid == (2, 5, 4)
    out = poisoned((281, 281))
    for group in groups(whole, 3):
        plan = replace(whole, work=Work(blocks=tuple(group)))
        check_schedule(plan.schedule, plan)
        part = run_plan(plan, x, x, None)
        for i, j in group:
            rows = slice(plan.row_splits[i], plan.row_splits[i + 1])
            cols = slice(plan.col_splits[j], plan.col_splits[j + 1])
            out[rows, cols] = part[rows, cols]
    assert_gemm(out, x, x, trans_b=True)


@pytest.mark.parametrize("n_c", [1, 2])
def test_only_a_runs_last_block_takes_its_tail_stripe_by_stripe(n_c):
    """In the last block of a run (or of every block with one C slot) each row stripe goes
    through all the tail panels before the next stripe starts, so that C leaves a stripe at a
    time; elsewhere the stripes go panel by panel, each GEMM waiting for one panel only."""
    plan = make_plan(40, 36, 60, (10, 12, 6), staged=True, split_last=4, tail_panels=3,
                     n_a=4, n_b=4, stripe=40, n_stage=3, n_out=2, n_c=n_c)
    p, q, nk = plan.grid
    for run in (plan, replace(plan, work=Work(blocks=((1, 1), (2, 2))))):
        gemms = [op for op in run.schedule.ops if op.kind is OpKind.GEMM]
        last = gemms[-1].key
        for block in dict.fromkeys(op.key for op in gemms):
            full = max(op.region[0][1] - op.region[0][0] for op in gemms if op.key == block)
            tail = [(op.region[0], op.q) for op in gemms
                    if op.key == block and op.region[0][1] - op.region[0][0] < full]
            assert len({q for _, q in tail}) == 3 and len({rows for rows, _ in tail}) >= 4

            def runs(xs):
                return 1 + sum(x != y for x, y in zip(xs, xs[1:]))

            stripe_major = runs([rows for rows, _ in tail]) == len({rows for rows, _ in tail})
            panel_major = runs([q for _, q in tail]) == 3
            if block == last or n_c == 1:
                assert stripe_major and not panel_major, block
            else:
                assert panel_major and not stripe_major, block
        check_schedule(run.schedule, run)


def test_a_resumed_plan_checks_out():
    plan = make_plan(50, 60, 45, (10, 12, 9))
    resumed = replace(plan, work=Work(done=((0, 0), (2, 3))))
    check_schedule(resumed.schedule, resumed)
    with pytest.raises(ScheduleError, match="leaves out"):
        check_schedule(plan.schedule, resumed)  # blocks computed again that were done

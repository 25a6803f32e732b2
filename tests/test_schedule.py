"""The schedule and its checker: random plans pass, mutated schedules fail, and the CPU
executor replays staged plans (the CUDA executor's schedule) correctly."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oocgemm.plan import (OpKind, Operand, Plan, Problem, ScheduleError, check_schedule,
                          cpu_model, cuda_model)
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage import open_sink, open_source
from _helpers import assert_gemm, poisoned, rand

PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)}
BIG = 1 << 50


def make_plan(m, n, k, tile, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
              staged=False, dtype="float64", model=None, **slots) -> Plan:
    """A Plan built directly (no API), with generous budgets."""
    itemsize = np.dtype(dtype).itemsize
    prob = Problem(
        m=m, n=n, k=k, itemsize=itemsize, dtype=dtype,
        a=Operand((k, m) if trans_a else (m, k)), b=Operand((n, k) if trans_b else (k, n)),
        c=Operand((m, n)) if beta != 0 else None, out=Operand((m, n)),
        alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
    slots = {key: value for key, value in slots.items() if key in PLAN_FIELDS}
    return Plan(problem=prob, device="cpu", model=model or cpu_model(), tile=tile,
                memory_limit=BIG, host_memory_limit=BIG, staged=staged, **slots).validate()


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


@settings(max_examples=300)
@given(plans())
def test_random_plans_pass_the_checker(plan):
    schedule = plan.schedule
    check_schedule(schedule, plan)
    p, q, nk = plan.grid
    prob = plan.problem
    gemms = [op for op in schedule.ops if op.kind is OpKind.GEMM]
    assert len({(op.key, op.q) for op in gemms}) == (p * q * nk if prob.computes_product else 0)
    assert sum(op.flops for op in gemms) == prob.flops
    tail = min(plan.tail_panels, nk, plan.n_a, plan.n_b)
    assert len(gemms) <= p * q * (nk - tail + tail * (plan.split_last + 3))  # +3: the taper
    assert schedule.count(OpKind.FILL) == (0 if prob.computes_product else p * q)
    written = sum(op.nbytes for op in schedule.ops if op.kind is OpKind.WRITE)
    assert written == prob.m * prob.n * prob.itemsize
    if not prob.reads_c:
        assert all(op.operand != "C" for op in schedule.ops if op.kind is OpKind.READ)
    if not prob.computes_product:
        assert all(op.operand == "C" for op in schedule.ops)
    kinds = {op.kind for op in schedule.ops}
    assert (OpKind.UPLOAD in kinds or OpKind.DOWNLOAD in kinds) == (plan.staged and p * q > 0)


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


def ancestors(schedule, index) -> set[int]:
    """Everything that happens before op ``index`` (an independent closure of the deps)."""
    seen, todo = set(), list(schedule.ops[index].deps)
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(schedule.ops[d].deps)
    return seen


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
    """RAW: drop a GEMM's wait for the op(s) that filled its A (or B) slot. The checker must
    object exactly when nothing else still orders them."""
    sched = mplan.schedule
    caught = 0
    for op in gemms(sched):
        for which in (0, 1):
            writers = {d for d in op.deps if sched.ops[d].dst == op.src[which]}
            assert writers, f"{op} does not wait for the writer of {op.src[which]}"
            mutated = with_op(sched, replace(op, deps=tuple(d for d in op.deps if d not in writers)))
            if writers <= ancestors(mutated, op.index):
                check_schedule(mutated, mplan)  # still ordered through other ops: correct
                continue
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


@settings(max_examples=60)
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


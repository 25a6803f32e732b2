"""The in-core shape (products whose A, B and C fit on the device at once): chosen by the
planner exactly when it applies, its schedule's order and dependencies (B up first, A in row
stripes, a GEMM per C stripe waiting for its own rows of A, each C stripe down as its GEMM
ends), proved by the checker, and replayed by the CPU executor into the right product.

The plans are the CUDA executor's (its staging, the CUDA model) made without a GPU: the
device is faked for the planner, which reads no more than its free memory; the replays run
on the CPU executor, which runs staged schedules with one copy thread for both in-order copy
lanes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda
from oocgemm.devices import Device
from oocgemm.planning import (
    ORDERED_LANES,
    OpKind,
    Problem,
    check_schedule,
    cpu_model,
    cuda_model,
    in_core_shape,
    ordered_lane,
    tiling,
)
from oocgemm.planning.problem import Operand
from oocgemm.planning.staging import StagingSettings
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage import open_sink, open_source

GPU_MEMORY = 80 << 30


@pytest.fixture
def fake_gpu(monkeypatch):
    """One GPU as the planner sees it (a count and free memory), without CuPy."""
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "memory_info", lambda index: (GPU_MEMORY - (1 << 30), GPU_MEMORY))


@pytest.fixture
def small_stripes(monkeypatch):
    """Stripes of 64 KiB at the least, so that the small products here still go in several
    stripes (the planner's floor, 8 MiB, would move them whole)."""
    monkeypatch.setattr(tiling, "IN_CORE_STRIPE_BYTES", 1 << 16)


def _shapes(m, n, k, trans_a=False, trans_b=False):
    return (k, m) if trans_a else (m, k), (n, k) if trans_b else (k, n)


def cuda_plan(m, n, k, *, trans_a=False, trans_b=False, beta=0.0, **kw):
    """The planner's plan for a GPU, of numpy operands (never read)."""
    sa, sb = _shapes(m, n, k, trans_a, trans_b)
    c = np.empty((m, n)) if beta != 0 else None
    return oocgemm.plan(np.empty(sa), np.empty(sb), c=c, beta=beta, trans_a=trans_a,
                        trans_b=trans_b, device="cuda", **kw)


def replay(plan, a, b, c=None):
    """The plan replayed by the CPU executor into a NaN-poisoned output: (out, events)."""
    plan = dataclasses.replace(plan, device=Device("cpu"), model=cpu_model())  # the CPU's buffers
    check_schedule(plan.schedule, plan)
    sources = {"A": open_source(a, "a"), "B": open_source(b, "b")}
    if plan.problem.reads_c:
        sources["C"] = open_source(c, "c")
    prob = plan.problem
    out = poisoned((prob.m, prob.n), prob.dtype)
    sink = open_sink(out, shape=(prob.m, prob.n), dtype=prob.dtype)
    log = CpuExecutor(plan, sources, sink).run()
    assert sink.commit() is out
    return out, log.events()


# -- the planner's choice ------------------------------------------------------------------
@pytest.mark.parametrize("n", [1024, 2048, 4096])
def test_chosen_when_a_b_and_c_fit(fake_gpu, n):
    plan = cuda_plan(n, n, n)
    assert plan.in_core and plan.tile == (n, n, n) and plan.grid == (1, 1, 1)
    assert (plan.staging.n_a, plan.staging.n_b, plan.n_c) == (1, 1, 1)
    assert plan.device_bytes == 3 * n * n * 8
    assert "in core" in str(plan) and plan.summary()["in_core"] is True
    # C's stripes (a GEMM each) and A's and B's: 8 and the readers' count at most, none
    # under 8 MiB (n = 1024: one of each)
    assert plan.staging.split_last == {1024: 1, 2048: 4, 4096: 8}[n]
    assert plan.staging.min_stripes == min(plan.staging.readers, n * n * 8 >> 23)
    assert plan.stripe & (plan.stripe - 1) == 0  # a power of two: pinned buffers reused
    # the pinned ring is sized to the stripes (not 28 x 32 MiB whatever the product)
    assert plan.host_bytes <= 2 * plan.device_bytes + (64 << 20)


def test_not_chosen_when_they_do_not_fit(fake_gpu):
    n = 2048
    tight = cuda_plan(n, n, n, memory_limit=3 * n * n * 8 - 1)
    assert not tight.in_core and tight.device_bytes <= 3 * n * n * 8 - 1
    assert cuda_plan(n, n, n, memory_limit=3 * n * n * 8).in_core


def test_not_chosen_for_a_tile_of_the_users_or_on_the_cpu(fake_gpu):
    n = 512
    assert not cuda_plan(n, n, n, tile=(n, n, n)).in_core
    assert not oocgemm.plan(np.empty((n, n)), np.empty((n, n)), device="cpu").in_core
    assert not cuda_plan(n, n, n, kernel="ozaki").in_core  # converts whole panels
    x = np.empty((n, n))
    assert not oocgemm.plan(x, x, trans_a=True, device="cuda").in_core  # X^T X: half


def test_not_chosen_where_compute_outweighs_the_upload_of_a():
    """At n = 32768 from host memory the GEMMs take longer than moving A up: loading all of B
    before the first GEMM would add its upload to the run (the panelled shape hides it)."""
    def problem(n):
        return Problem(m=n, n=n, k=n, itemsize=8, dtype="float64", a=Operand((n, n)),
                       b=Operand((n, n)), c=None, out=Operand((n, n)))

    model, room = cuda_model(), 79 << 30
    staging = dict(staged=True, settings=StagingSettings(split_last=8, min_stripes=10))
    assert in_core_shape(problem(4096), model, room, **staging) is not None
    assert in_core_shape(problem(32768), model, room, **staging) is None
    assert in_core_shape(problem(4096), model, room, **{**staging, "staged": False}) is None


def test_smaller_plan_after_memory_ran_short_is_panelled(fake_gpu):
    from oocgemm.errors import MemoryPressureError
    from oocgemm.runtime.replan import smaller

    plan = cuda_plan(2048, 2048, 2048)
    again = smaller(plan, MemoryPressureError("out of memory", where="device"))
    assert not again.in_core and again.staging.n_a == 5
    assert again.device_bytes <= plan.memory_limit // 2


# -- the schedule --------------------------------------------------------------------------
def _happens_before(ops):
    """For each op, the set of ops that happen before it: its dependencies and program order
    on its in-order lane, closed transitively (small schedules only)."""
    before: list[set[int]] = []
    last: dict[str, int] = {}
    for op in ops:
        direct = set(op.deps)
        lane = ordered_lane(op)
        if lane in ORDERED_LANES and lane in last:
            direct.add(last[lane])
        closure = set(direct)
        for d in direct:
            closure |= before[d]
        before.append(closure)
        if lane is not None:
            last[lane] = op.index
    return before


@pytest.mark.parametrize("trans_a", [False, True])
def test_schedule_order_and_dependencies(fake_gpu, small_stripes, trans_a):
    plan = cuda_plan(1000, 1313, 777, trans_a=trans_a)
    assert plan.in_core
    ops = plan.schedule.ops
    check_schedule(plan.schedule, plan)
    assert plan.counts.ops == plan.schedule.counts().ops
    assert plan.counts.traffic == plan.schedule.counts().traffic
    uploads = {name: [op for op in ops if op.kind is OpKind.UPLOAD and op.operand == name]
               for name in "AB"}
    gemms = [op for op in ops if op.kind is OpKind.GEMM]
    downloads = [op for op in ops if op.kind is OpKind.DOWNLOAD]
    assert len(gemms) == len(downloads) == plan.staging.split_last == 3  # 3 of >= 256 rows
    assert max(op.index for op in uploads["B"]) < min(op.index for op in uploads["A"])
    before = _happens_before(ops)
    h = 1313
    for s, (gemm, down) in enumerate(zip(gemms, downloads)):
        rows = (gemm.offset // h, gemm.offset // h + gemm.shape[0])
        assert all(b.index in before[gemm.index] for b in uploads["B"])
        a_rows = [(up, up.offset // 777, up.offset // 777 + up.shape[0])
                  for up in uploads["A"]]
        for up, _lo, hi in ([] if trans_a else a_rows):
            if hi <= rows[1]:  # its rows: waited for
                assert up.index in before[gemm.index]
            else:  # later rows: not waited for
                assert up.index not in before[gemm.index]
        if trans_a:  # A's rows are not contiguous: the whole of A
            assert all(up.index in before[gemm.index] for up in uploads["A"])
            assert gemm.a_span is None
        else:
            assert gemm.a_span == (rows[0] * 777, rows[1] * 777)
        assert down.region == gemm.region and gemm.index in before[down.index]
        for later in gemms[s + 1:]:  # C's stripes go down while the next ones compute
            assert down.index not in before[later.index]
            assert later.index not in before[down.index]


def test_event_sequence_of_a_cpu_replay(fake_gpu, small_stripes, rng):
    """The CPU executor's events of the in-core schedule: B up before the first GEMM, each
    GEMM after the uploads of its rows of A, each download after its GEMM, each write after
    its download."""
    m, n, k = 1000, 1313, 777
    plan = cuda_plan(m, n, k)
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    out, events = replay(plan, a, b)
    assert_gemm(out, a, b)
    ops = plan.schedule.ops
    by_index = {e.index: e for e in events}
    assert sorted(by_index) == list(range(len(ops)))
    first_gemm = min(e.start for e in events if e.kind == "gemm")
    assert all(e.end <= first_gemm for e in events if e.kind == "upload" and e.operand == "B")
    gemms = sorted((e for e in events if e.kind == "gemm"), key=lambda e: e.start)
    for gemm in gemms:
        op = ops[gemm.index]
        lo, hi = op.a_span
        for up in (o for o in ops if o.kind is OpKind.UPLOAD and o.operand == "A"):
            if up.offset + up.elements <= hi:
                assert by_index[up.index].end <= gemm.start
    for op in ops:
        if op.kind in (OpKind.DOWNLOAD, OpKind.WRITE):
            assert all(by_index[d].end <= by_index[op.index].start for d in op.deps)
    downloads = sorted((e for e in events if e.kind == "download"), key=lambda e: e.start)
    assert [ops[e.index].region for e in downloads] == [ops[e.index].region for e in gemms]


def test_a_small_product_moves_in_few_stripes(fake_gpu):
    """Under 8 MiB a stripe costs more host work than its overlap wins: n = 1024 is one
    upload of each operand, one GEMM and one download."""
    plan = cuda_plan(1024, 1024, 1024)
    kinds = [op.kind for op in plan.schedule.ops]
    assert [kinds.count(k) for k in (OpKind.UPLOAD, OpKind.GEMM, OpKind.DOWNLOAD)] == [2, 1, 1]
    tall = cuda_plan(8192, 1024, 1024)  # A and C 64 MiB, B 8 MiB
    assert tall.in_core and tall.staging.split_last == 8 and tall.staging.min_stripes == 1
    ups = {name: [op for op in tall.schedule.ops
                  if op.kind is OpKind.UPLOAD and op.operand == name] for name in "AB"}
    assert len(ups["B"]) == 1 and len(ups["A"]) == 8  # A's stripes end where C's do
    assert all(op.elements * 8 >= 8 << 20 for op in ups["A"] + ups["B"])


def test_copies_in_bands_only_where_one_read_of_each_operand_leaves_threads_idle(fake_gpu):
    """The CUDA executor's rule (runtime.cuda_executor.few_copies), on the planner's plans: n =
    1024 is one read of A and of B (and of C with beta) and one write; n = 2048 moves each in
    four stripes, which keep the readers busy; a panelled plan never."""
    from oocgemm.runtime.cuda_executor import few_copies

    assert few_copies(cuda_plan(1024, 1024, 1024))
    assert few_copies(cuda_plan(1000, 1313, 777, beta=0.5))
    assert not few_copies(cuda_plan(2048, 2048, 2048))
    assert not few_copies(cuda_plan(8192, 1024, 1024))  # A and C in eight stripes
    panelled = cuda_plan(1024, 1024, 1024, tile=(512, 512, 512))
    assert not panelled.in_core and not few_copies(panelled)


# -- products --------------------------------------------------------------------------------
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-1.5, 0.0), (2.0, 0.5), (1.0, 1.0)])
def test_products_of_ragged_shapes(fake_gpu, rng, trans_a, trans_b, alpha, beta):
    m, n, k = 1000, 1313, 777
    sa, sb = _shapes(m, n, k, trans_a, trans_b)
    a, b = rand(rng, sa), rand(rng, sb)
    c = rand(rng, (m, n)) if beta != 0 else None
    plan = cuda_plan(m, n, k, trans_a=trans_a, trans_b=trans_b, beta=beta, alpha=alpha)
    assert plan.in_core
    out, _ = replay(plan, a, b, c)  # beta == 0: the poisoned out is never read
    assert_gemm(out, a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (255, 3, 2), (300, 7, 513), (2048, 64, 96)])
def test_products_of_other_dtypes_and_thin_shapes(fake_gpu, rng, dtype, shape):
    m, n, k = shape
    a, b, c = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype), rand(rng, (m, n), dtype)
    plan = oocgemm.plan(a, b, c=c, beta=-0.5, device="cuda")
    assert plan.in_core
    out, _ = replay(plan, a, b, c)
    assert_gemm(out, a, b, c, beta=-0.5, dtype=dtype)


# -- start-up, without a GPU -----------------------------------------------------------------
def test_start_up_steps_are_kept_once_and_summed():
    from oocgemm.cuda import startup

    index = 97  # no such GPU: the bookkeeping alone
    startup.record(index, "context", 0.25)
    startup.record(index, "context", 9.0)  # the first measurement stays
    startup.pinned(index, 0.125, 64 << 20)
    steps = startup.times(index)
    assert steps["context"] == 0.25 and steps["pinned"] == 0.125
    assert steps["total"] == pytest.approx(0.375 + steps.get("driver", 0.0))
    assert steps["pinned_bytes"] == 64 << 20


def test_info_without_a_gpu_says_so():
    import json

    from click.testing import CliRunner

    from oocgemm.cli import main

    if cuda.device_count():
        pytest.skip("a GPU is present")
    out = CliRunner().invoke(main, ["info"])
    assert out.exit_code == 0 and "CUDA start-up: none (no GPU)" in out.output
    data = json.loads(CliRunner().invoke(main, ["info", "--json"]).output)
    assert data["gpus"]["startup"] is None

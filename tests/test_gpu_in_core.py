"""The in-core shape on a GPU (skipped where none is found): the products the planner runs in
core against numpy (ragged shapes, alpha and beta, transposes, an output poisoned with NaN
that beta == 0 never reads), the process's start-up measured once, and the run's kept
threads and buffers back in their pools after each run."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-1.5, 0.0), (2.0, 0.5), (1.0, 1.0)])
def test_in_core_products(rng, trans_a, trans_b, alpha, beta):
    m, n, k = 1000, 1313, 777
    a = rand(rng, (k, m) if trans_a else (m, k))
    b = rand(rng, (n, k) if trans_b else (k, n))
    c = rand(rng, (m, n)) if beta != 0 else None
    out = poisoned((m, n))
    result = oocgemm.multiply(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                              trans_b=trans_b, device="cuda", progress=False)
    assert result.plan.in_core
    assert_gemm(out, a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_in_core_other_dtypes(rng, dtype):
    a, b = rand(rng, (300, 513), dtype), rand(rng, (513, 7), dtype)
    result = oocgemm.multiply(a, b, device="cuda", progress=False)
    assert result.plan.in_core
    assert_gemm(result.out, a, b, dtype=dtype)


def test_in_core_matches_the_cpu_executor_replaying_its_plan(rng):
    """The numpy executor as the oracle: the same staged schedule, replayed on the CPU."""
    import dataclasses

    from oocgemm.devices import Device
    from oocgemm.planning import cpu_model
    from oocgemm.runtime.cpu import CpuExecutor
    from oocgemm.storage import open_sink, open_source

    a, b = rand(rng, (1024, 640)), rand(rng, (640, 900))
    gpu = oocgemm.multiply(a, b, device="cuda", progress=False)
    plan = dataclasses.replace(gpu.plan, device=Device("cpu"), model=cpu_model())
    out = poisoned((1024, 900))
    CpuExecutor(plan, {"A": open_source(a, "a"), "B": open_source(b, "b")},
                open_sink(out, shape=out.shape, dtype="float64")).run()
    np.testing.assert_allclose(gpu.out, out, rtol=1e-12, atol=1e-12 * 640)


def test_start_up_is_measured_once_and_shown(rng):
    from oocgemm.cuda import startup
    from oocgemm.info import describe_startup, gpu_info

    a, b = rand(rng, (256, 256)), rand(rng, (256, 256))
    oocgemm.multiply(a, b, device="cuda", progress=False)
    first = startup.times(0)
    assert {"context", "cublas", "pinned", "total"} <= set(first)
    assert first["total"] > 0 and first["pinned_bytes"] > 0
    oocgemm.multiply(a, b, device="cuda", progress=False)
    assert startup.times(0) == first  # paid once
    info = gpu_info()
    assert info["startup"]["device"] == "cuda:0"
    assert describe_startup(info).startswith("cuda:0 ")


def test_buffers_pinned_behind_the_caller_in_the_order_asked():
    """A run's ring is handed out at once and pinned behind it, first used first: each use
    waits for its buffer; one given back before it was pinned is never pinned nor kept."""
    import cupy

    from oocgemm.cuda.context import PinnedPool

    pool, pinned = PinnedPool(), []
    sizes = [(24 << 20) + 4096 * i for i in range(4)]  # sizes no other test asks for
    held = [pool.acquire(n, later=True, then=lambda n=n: pinned.append(n)) for n in sizes]
    pool.ready(held[-1][0])
    assert pinned == sizes  # one after another, in the order asked
    for ptr, raw in held:
        pool.ready(ptr)
        attributes = cupy.cuda.runtime.pointerGetAttributes(ptr)
        assert attributes.type == cupy.cuda.runtime.memoryTypeHost
        raw[:: 1 << 20] = 7  # the host writes into it, the device copies from it
        copied = cupy.empty(raw.nbytes, dtype=cupy.uint8)
        cupy.cuda.runtime.memcpy(copied.data.ptr, ptr, raw.nbytes, 1)  # host to device
        assert int(copied[1 << 20]) == 7
    for ptr, _ in held:
        pool.give_back(ptr)
    assert pool.cached() == sum(sizes) and pool.in_use() == 0
    first = pool.acquire(sizes[0])  # an idle one: pinned already, no wait
    assert first[0] == held[0][0]
    pool.give_back(first[0])
    pool.release()


def test_threads_and_buffers_are_kept_and_given_back(rng):
    from oocgemm.cuda.context import PROCESS, memory_in_use

    a, b = rand(rng, (512, 512)), rand(rng, (512, 512))
    oocgemm.multiply(a, b, device="cuda", progress=False)  # warm the pools
    before = memory_in_use(0)
    idle = sum(len(v) for v in PROCESS.crews._idle.values())
    for _ in range(3):
        assert_gemm(oocgemm.multiply(a, b, device="cuda", progress=False).out, a, b)
    assert memory_in_use(0) == before
    assert sum(len(v) for v in PROCESS.crews._idle.values()) == idle  # reused, not more


def test_engine_close_stops_its_threads(rng):
    a, b = rand(rng, (256, 256)), rand(rng, (256, 256))
    with oocgemm.Engine(device="cuda") as engine:
        engine.multiply(a, b, progress=False)
        resources = engine.resources("cuda")
        assert resources.crews._idle and resources.handles._idle
    assert not resources.crews._idle and not resources.handles._idle


def test_runs_keep_their_handle_and_streams_and_concurrent_runs_have_their_own(rng):
    """A run's cuBLAS handle comes with its streams (cuda.context.Lanes): the next run takes
    the same; runs at once each take their own, and every product is right."""
    import threading

    a, b = rand(rng, (1024, 1024)), rand(rng, (1024, 1024))
    with oocgemm.Engine(device="cuda") as engine:
        engine.multiply(a, b, progress=False)
        pool = engine.resources("cuda").handles
        (kept,) = pool._idle[0]
        for _ in range(3):
            assert_gemm(engine.multiply(a, b, progress=False).out, a, b)
            assert pool._idle[0] == [kept]
        results, errors = {}, []

        def run(i):
            try:
                x, y = rand(np.random.default_rng(i), (1024, 1024)), b
                results[i] = (x, engine.multiply(x, y, progress=False).out)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        for x, out in results.values():
            assert_gemm(out, x, b)
        lanes = pool._idle[0]
        assert kept in lanes and len({id(x.streams["compute"]) for x in lanes}) == len(lanes)


def test_runs_record_the_events_their_lanes_kept(rng):
    """The CUDA events a run records go back to its lanes once its streams are done, at most
    KEEP_EVENTS of them: the next run records those again, and its timeline is right."""
    from oocgemm.cuda.context import KEEP_EVENTS

    a, b = rand(rng, (1024, 1024)), rand(rng, (1024, 1024))
    with oocgemm.Engine(device="cuda") as engine:
        engine.multiply(a, b, progress=False)
        (kept,) = engine.resources("cuda").handles._idle[0]
        first = {id(ev) for ev in kept.events}
        assert 0 < len(first) <= KEEP_EVENTS
        result = engine.multiply(a, b, progress=False)
        assert {id(ev) for ev in kept.events} == first  # the same ones, no more
        assert_gemm(result.out, a, b)
        events = {e.kind: e for e in result.timeline.events}
        assert events["upload"].end <= events["gemm"].start + 1e-4
        assert events["gemm"].end <= events["download"].start + 1e-4
        assert 0 < events["gemm"].seconds < result.seconds
        big = rand(rng, (4096, 4096))  # a run of many events keeps no more than its bound
        assert_gemm(engine.multiply(big, big, progress=False).out, big, big)
        assert len(kept.events) <= KEEP_EVENTS


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_a_product_of_few_operations_runs_in_the_calling_thread(rng, monkeypatch, beta):
    """One read of each operand and one write of C (n = 1024): the run replays its schedule
    in the calling thread (no feeder, dispatchers or clock), with the same result and the
    same events; a product of more stripes (n = 2048) keeps its threads."""
    from oocgemm.runtime.cuda_executor import CudaExecutor

    inline = []
    real = CudaExecutor._run_inline
    monkeypatch.setattr(CudaExecutor, "_run_inline",
                        lambda self: inline.append(self.plan.problem.m) or real(self))
    for n in (1024, 2048):
        a, b = rand(rng, (n, n - 3)), rand(rng, (n - 3, n + 5))
        c = rand(rng, (n, n + 5)) if beta else None
        out = poisoned((n, n + 5))
        r = oocgemm.multiply(a, b, out, c=c, beta=beta, device="cuda", progress=False)
        assert r.plan.in_core
        assert_gemm(out, a, b, c, beta=beta)
        kinds = sorted(e.kind for e in r.timeline.events)
        assert kinds.count("gemm") >= 1 and kinds.count("write") >= 1
        assert len(r.timeline.events) == len(r.plan.schedule.ops)
        if n == 1024:  # A's copy started while B's ran: on a lane of its own
            lanes = {e.operand: e.lane for e in r.timeline.events if e.kind == "read"}
            assert lanes["B"] == "read-0" and lanes["A"] == "read-1"
    assert inline == [1024]


def test_a_failed_read_started_ahead_is_an_error_and_the_next_product_is_right(
        rng, monkeypatch):
    """A's copy, started while B's runs, fails: the run raises, none of its bands outlives
    it (the next product, which takes the same pinned buffers, is right)."""
    from oocgemm.errors import OOCGemmError
    from oocgemm.storage.memory import NumpySource

    a, b = rand(rng, (1024, 1024)), rand(rng, (1024, 1024))
    real = NumpySource.read

    def failing(self, rows, cols, out):
        if self._array is a and rows[0] >= 512:
            raise OSError(5, "Input/output error")
        return real(self, rows, cols, out)

    monkeypatch.setattr(NumpySource, "read", failing)
    with pytest.raises(OOCGemmError, match="Input/output error"):
        oocgemm.multiply(a, b, poisoned((1024, 1024)), device="cuda", progress=False)
    monkeypatch.setattr(NumpySource, "read", real)
    for _ in range(3):
        a, b = rand(rng, (1024, 1024)), rand(rng, (1024, 1024))
        out = poisoned((1024, 1024))
        oocgemm.multiply(a, b, out, device="cuda", progress=False)
        assert_gemm(out, a, b)


def test_a_failed_write_of_a_product_run_inline_is_an_error_and_leaves_nothing(
        rng, tmp_path, monkeypatch):
    """A product run in the calling thread fails as a threaded one does."""
    from oocgemm.errors import OOCGemmError
    from oocgemm.storage import npy

    def full(self, rows, cols, block):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(npy.NpySink, "write", full)
    a, b = rand(rng, (1024, 1024)), rand(rng, (1024, 1024))
    with pytest.raises(OOCGemmError, match="No space left"):
        oocgemm.multiply(a, b, str(tmp_path / "c.npy"), device="cuda", progress=False)
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary

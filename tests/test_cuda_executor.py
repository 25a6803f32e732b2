"""The CUDA executor's own promises: the staged schedule on real streams and pinned memory.

Skipped where no GPU is found. Correctness against numpy and the CPU executor, with the ring
and the ping-pong slots forced to be reused many times; determinism (a race shows up as a
moving result); device and pinned memory back at their starting level after a run and after a
run that fails midway.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda
from oocgemm.planning import check_schedule
from oocgemm.storage import open_sink, open_source
from oocgemm.storage.memory import NumpySink, NumpySource

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


def _tight_plan(a, b, *, tile, stripe, ring, **kw):
    """A CUDA plan with a tiny ring, so that every ring buffer is reused many times."""
    plan = oocgemm.plan(a, b, device="cuda", tile=tile, **kw)
    plan = dataclasses.replace(plan, stripe=stripe,
                               staging=dataclasses.replace(plan.staging, n_stage=ring, n_out=ring))
    check_schedule(plan.schedule, plan)
    return plan


def _run(plan, sources, sink):
    from oocgemm.runtime.cuda_executor import CudaExecutor

    return CudaExecutor(plan, sources, sink).run()


def _levels():
    from oocgemm.cuda.context import memory_in_use

    return memory_in_use(0)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tiny_ring_many_blocks(rng, trans_a, trans_b, dtype):
    m, n, k = 61, 47, 53  # primes: every block and panel edge is ragged
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c = rand(rng, (m, n), dtype)
    plan = _tight_plan(a, b, c=c, alpha=1.5, beta=-0.5, trans_a=trans_a, trans_b=trans_b,
                       tile=(16, 12, 7), stripe=40, ring=2)
    assert plan.grid == (4, 4, 8)
    out = poisoned((m, n), dtype)
    _run(plan, {"A": NumpySource(a), "B": NumpySource(b), "C": NumpySource(c)}, NumpySink(out))
    assert_gemm(out, a, b, c, alpha=1.5, beta=-0.5, trans_a=trans_a, trans_b=trans_b,
                dtype=dtype)
    cpu = oocgemm.multiply(a, b, c=c, alpha=1.5, beta=-0.5, trans_a=trans_a, trans_b=trans_b,
                           device="cpu", tile=(16, 12, 7))
    rtol = 1e-4 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(out, cpu.out, rtol=rtol, atol=rtol * k)


def test_three_runs_bitwise_identical(rng):
    a, b, c = rand(rng, (300, 257)), rand(rng, (257, 211)), rand(rng, (300, 211))
    results = []
    for _ in range(3):
        r = oocgemm.multiply(a, b, c=c, beta=0.25, device="cuda", tile=(64, 64, 32),
                             memory_limit="4MB")
        results.append(r.out.copy())
    assert_gemm(results[0], a, b, c, beta=0.25)
    assert all(np.array_equal(results[0], x) for x in results[1:])


def test_memory_back_to_start_after_a_run(rng):
    a, b = rand(rng, (200, 150)), rand(rng, (150, 120))
    oocgemm.multiply(a, b, device="cuda", tile=(64, 64, 64))  # warm the pools
    before = _levels()
    oocgemm.multiply(a, b, device="cuda", tile=(64, 64, 64))
    assert _levels() == before


class _Failing(NumpySource):
    """Reads fine a few times, then the storage breaks."""

    def __init__(self, array, after):
        super().__init__(array)
        self.left = after

    def read(self, rows, cols, out):
        self.left -= 1
        if self.left < 0:
            raise OSError("disk on fire")
        super().read(rows, cols, out)


def test_memory_back_to_start_after_a_failure(rng, tmp_path):
    a, b = rand(rng, (200, 150)), rand(rng, (150, 120))
    plan = _tight_plan(a, b, tile=(32, 32, 16), stripe=64, ring=2)
    before = _levels()
    sink = open_sink(str(tmp_path / "c.zarr"), shape=(200, 120), dtype="float64",
                     options={"chunks": (32, 32)})
    with pytest.raises(oocgemm.ExecutionError, match="disk on fire"):
        _run(plan, {"A": _Failing(a, after=20), "B": NumpySource(b)}, sink)
    sink.abort()
    assert _levels() == before
    assert not list(tmp_path.iterdir())


def test_device_resident_c_and_in_place_update(rng, workdir):
    a, b, c = rand(rng, (90, 70)), rand(rng, (70, 80)), rand(rng, (90, 80))
    np.save("c.npy", c)
    oocgemm.multiply(a, b, "c.npy", alpha=2.0, beta=1.0, device="cuda", tile=(32, 32, 16))
    assert_gemm(np.load("c.npy"), a, b, c, alpha=2.0, beta=1.0)


def test_zarr_sources_read_in_stored_layout(rng, workdir):
    import zarr

    a, b = rand(rng, (70, 90)), rand(rng, (60, 70))  # op(a) = a.T, op(b) = b.T
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(32, 32))[:] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype=b.dtype, chunks=(32, 32),
                      zarr_format=2)[:] = b
    src = open_source("a.zarr", "a")
    assert src.shape == (70, 90)
    r = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", trans_a=True, trans_b=True,
                         device="cuda", tile=(32, 32, 32))
    assert r.plan.grid == (3, 2, 3)
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b, trans_a=True, trans_b=True)


def test_auto_picks_the_gpu(rng):
    a, b = rand(rng, (10, 10)), rand(rng, (10, 10))
    r = oocgemm.multiply(a, b)
    assert str(r.plan.device) == "cuda:0"
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("events", [True, False])
def test_progress_hears_each_gemm_once(rng, events):
    """The clock thread reports every GEMM to the progress callback once, events on or off."""
    a, b = rand(rng, (300, 200)), rand(rng, (200, 170))
    seen = []
    r = oocgemm.multiply(a, b, device="cuda", tile=(128, 64, 48), events=events,
                         progress=seen.append)
    assert_gemm(r.out, a, b)
    gemms = [e for e in seen if e.kind == "gemm"]
    wanted = [op.index for op in r.plan.schedule.ops if op.kind.value == "gemm"]
    assert sorted(e.index for e in gemms) == wanted
    assert sum(e.flops for e in gemms) == r.flops
    assert all(e.lane == "compute" and e.end >= e.start for e in gemms)
    assert (len(r.events) > 0) == events


class _Slow(NumpySource):
    """A slow disk: every read takes a few milliseconds; counts the reads."""

    def __init__(self, array):
        super().__init__(array)
        self.reads = 0

    def read(self, rows, cols, out):
        import time

        time.sleep(0.005)
        self.reads += 1
        super().read(rows, cols, out)


def test_ctrl_c_stops_the_run_and_frees_memory(rng, tmp_path):
    """A real SIGINT while the calling thread waits: the run stops (most reads never happen),
    memory returns to its starting level, and the caller can remove the output."""
    import os
    import signal
    import threading

    a, b = rand(rng, (768, 768)), rand(rng, (768, 768))
    plan = _tight_plan(a, b, tile=(64, 64, 64), stripe=4096, ring=4)
    total = sum(1 for op in plan.schedule.ops if op.kind.value == "read")
    assert total > 2000  # 5 ms each over at most 12 readers: over a second, signal at 0.3 s
    source_a, source_b = _Slow(a), _Slow(b)
    before = _levels()
    sink = open_sink(str(tmp_path / "c.npy"), shape=(768, 768), dtype="float64")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run(plan, {"A": source_a, "B": source_b}, sink)
    finally:
        timer.cancel()
    sink.abort()
    assert source_a.reads + source_b.reads < total // 2
    assert _levels() == before
    assert not list(tmp_path.iterdir())

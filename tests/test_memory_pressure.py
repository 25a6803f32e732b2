"""Memory pressure (issue 18, item 4): an allocation that fails during a run makes the engine
plan again with smaller blocks and go on, and say so; memory returns to where it was."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, poisoned, rand

import oocgemm
from oocgemm import cuda
from oocgemm.runtime.cpu import CpuExecutor


def _failing(monkeypatch, cls, name, error, after: int, times: int = 1):
    """Make ``cls.name`` raise ``error`` on its call number ``after`` (and the ``times - 1``
    calls after it)."""
    real, calls = getattr(cls, name), {"n": 0}

    def method(self, *args, **kwargs):
        calls["n"] += 1
        if after <= calls["n"] < after + times:
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, method)
    return calls


@pytest.mark.parametrize("out", [None, "c.zarr", "c.npy"])
def test_out_of_memory_midway_plans_again_and_finishes(rng, workdir, monkeypatch, out):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=7)
    with pytest.warns(RuntimeWarning, match="host memory ran out"):
        r = oocgemm.multiply(a, b, out, device="cpu", memory_limit="400KB")
    assert len(r.replanned) == 1 and "planned again with tile" in r.replanned[0]
    assert r.plan.memory_limit <= 400_000 // 2  # half the budget that ran out
    first = oocgemm.plan(a, b, out, device="cpu", memory_limit="400KB")
    assert r.plan.device_bytes < first.device_bytes
    got = r.out if out is None else (np.load(out) if out.endswith(".npy")
                                     else zarr.open_array(out, mode="r")[...])
    assert_gemm(got, a, b)
    assert leftovers(".") == []


@pytest.mark.parametrize("out", [None, "c.zarr", "c.npy"])
def test_out_of_memory_on_one_of_several_devices_plans_that_group_again(rng, workdir,
                                                                         monkeypatch, out):
    """README: memory pressure plans again with smaller blocks, with several devices too.
    Only the group that ran out is planned again (half the budget, blocks inside its own)
    and run again; the other groups keep what they computed with the product's plan.

    The MemoryError is injected at the CPU executor's GEMM (the narrowest seam: a real
    allocation failure cannot be provoked on one group only); the executor turns it into
    the MemoryPressureError as it does a real one."""
    from oocgemm.runtime.multi_device import groups

    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=5)
    with pytest.warns(RuntimeWarning, match="host memory ran out.*the group of"):
        r = oocgemm.multiply(a, b, out, device=["cpu", "cpu"], memory_limit="400KB")
    assert len(r.replanned) == 1 and "planned the group of" in r.replanned[0]
    first = oocgemm.plan(a, b, device="cpu", memory_limit="400KB")
    assert r.plan.tile == first.tile  # the product's plan: the other groups kept it
    assert set(r.devices) == {"cpu#0", "cpu#1"}
    p, q, _ = r.plan.grid
    assert sum(d["blocks"] for d in r.devices.values()) == p * q
    assert sum(d["groups"] for d in r.devices.values()) == len(groups(r.plan, 2))
    assert sum(d["flops"] for d in r.devices.values()) == r.flops  # each block once
    got = r.out if out is None else (np.load(out) if out.endswith(".npy")
                                     else zarr.open_array(out, mode="r")[...])
    assert_gemm(got, a, b)
    assert leftovers(".") == []


def test_a_group_planned_again_keeps_its_region_of_c(rng):
    """A group's smaller plan has a tile whose w and h divide the group's, and blocks that
    cover exactly the group's region (a symmetric plan: square, on and above the
    diagonal)."""
    from oocgemm.errors import MemoryPressureError
    from oocgemm.planning.planner import replan
    from oocgemm.runtime.multi_device import Share, again, groups

    x, y = rand(rng, (200, 300)), rand(rng, (300, 250))
    for gram in (False, True):
        plan = oocgemm.plan(x, x if gram else y, trans_a=gram, device="cpu",
                            memory_limit="600KB")
        assert plan.symmetric == gram and plan.grid[0] >= 2
        group = tuple(groups(plan, 2)[-1])
        work = Share(replan(plan, blocks=group, why="a group"), len(group))
        small, note = again(work, "cpu#1", MemoryPressureError("host memory ran out", "host"))
        w, h, _ = plan.tile
        w2, h2, _ = small.plan.tile
        assert w % w2 == 0 and h % h2 == 0 and (w2, h2) != (w, h)
        assert small.plan.memory_limit == plan.memory_limit // 2 and small.replans == 1
        assert "on cpu#1" in note

        def cells(p, blocks):
            rows, cols = p.row_splits, p.col_splits
            out = set()
            for i, j in blocks:
                for r0, c0 in ((i, j), (j, i)) if p.symmetric else ((i, j),):
                    out |= {(x, y) for x in range(rows[r0], rows[r0 + 1])
                            for y in range(cols[c0], cols[c0 + 1])}
            return out
        assert cells(small.plan, small.plan.work.blocks) == cells(plan, group)


def test_a_part_of_k_that_runs_out_is_planned_again(rng, monkeypatch):
    """A tall-skinny product's K split among the devices: the part that ran out is planned
    again whole (it writes its own partial C); the result is still bitwise symmetric.
    MemoryError injected at the CPU executor's GEMM, as above."""
    x = rand(rng, (5000, 24))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=3)
    with pytest.warns(RuntimeWarning, match="planned part"):
        r = oocgemm.multiply(x, x, trans_a=True, device=["cpu", "cpu"], tile=(24, 24, 500))
    assert len(r.replanned) == 1
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-12, atol=1e-10)
    assert np.array_equal(r.out, r.out.T)


def test_several_devices_give_up_after_max_replans(rng, workdir, monkeypatch):
    from oocgemm.runtime.replan import MAX_REPLANS

    a, b = rand(rng, (200, 150)), rand(rng, (150, 120))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=1, times=10**6)
    with pytest.warns(RuntimeWarning), \
            pytest.raises(oocgemm.MemoryPressureError, match="host memory ran out"):
        oocgemm.multiply(a, b, "c.zarr", device=["cpu", "cpu"], memory_limit="2MB")
    assert MAX_REPLANS == 3
    assert leftovers(".") == []


def test_memory_that_keeps_running_out_is_an_error_in_the_end(rng, workdir, monkeypatch):
    a, b = rand(rng, (200, 150)), rand(rng, (150, 120))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=1, times=100)
    with pytest.warns(RuntimeWarning), \
            pytest.raises(oocgemm.MemoryPressureError, match="host memory ran out"):
        oocgemm.multiply(a, b, "c.npy", device="cpu", memory_limit="2MB")
    assert leftovers(".") == []


def test_given_out_array_is_written_whole_after_a_replan(rng, monkeypatch):
    a, b = rand(rng, (120, 90)), rand(rng, (90, 100))
    out = poisoned((120, 100))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=3)
    with pytest.warns(RuntimeWarning):
        r = oocgemm.multiply(a, b, out, device="cpu", memory_limit="100KB")
    assert r.out is out and r.replanned
    assert_gemm(out, a, b)


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
@pytest.mark.parametrize("error", ["device", "pinned"])
@pytest.mark.parametrize("where", ["start", "midway"])
def test_gpu_allocation_failure_is_survived(rng, workdir, monkeypatch, error, where):
    import cupy

    from oocgemm.cuda.context import GpuContext

    if error == "device":
        exc = cupy.cuda.memory.OutOfMemoryError(1 << 30, 0, 0)
    else:
        exc = cupy.cuda.runtime.CUDARuntimeError(2)  # cudaErrorMemoryAllocation
    a, b = rand(rng, (700, 600)), rand(rng, (600, 650))
    pool = cupy.get_default_memory_pool()
    used = pool.used_bytes()
    if where == "start":
        _failing(monkeypatch, GpuContext, "device_buffer", exc, after=2)
    else:
        _failing(monkeypatch, GpuContext, "gemm", exc, after=5)
    with pytest.warns(RuntimeWarning, match="memory ran out"):
        r = oocgemm.multiply(a, b, "c.zarr", device="cuda", memory_limit="8MB")
    assert r.replanned and r.plan.memory_limit <= 4 << 20
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)
    assert pool.used_bytes() == used  # device memory back where it was
    assert leftovers(".") == []

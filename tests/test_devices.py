"""One product on several devices (issue 19): C block groups handed out to one executor per
device as each is free, one merged timeline; tested with several CPU executors."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, poisoned, rand

import oocgemm
from oocgemm.runtime.cpu import CpuExecutor

THREE = ["cpu", "cpu", "cpu"]


def _blocks_by_device(r):
    blocks: dict[str, set] = {}
    for e in r.events:
        if e.kind == "gemm":
            blocks.setdefault(e.lane.rpartition("/")[0], set()).add(e.key)
    return blocks


@pytest.mark.parametrize("out", [None, "c.zarr", "c.npy", "array"])
def test_three_cpu_executors_share_the_blocks(rng, workdir, out):
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    target = poisoned((300, 250)) if out == "array" else out
    r = oocgemm.multiply(a, b, target, device=THREE, tile=(32, 40, 50))
    got = {None: r.out, "array": target}.get(out)
    if got is None:
        got = np.load(out) if out.endswith(".npy") else zarr.open_array(out, mode="r")[...]
    assert_gemm(got, a, b)
    p, q, _ = r.plan.grid
    assert set(r.devices) == {"cpu#0", "cpu#1", "cpu#2"}
    assert sum(d["blocks"] for d in r.devices.values()) == p * q
    assert sum(d["flops"] for d in r.devices.values()) == r.flops
    owned = _blocks_by_device(r)  # each block computed once, by one device
    assert sum(len(x) for x in owned.values()) == p * q
    assert set().union(*owned.values()) == {(i, j) for i in range(p) for j in range(q)}
    # bitwise what one device computes with the same plan
    one = oocgemm.multiply(a, b, device="cpu", tile=(32, 40, 50))
    np.testing.assert_array_equal(np.asarray(got), one.out)
    assert leftovers(".") == []


def test_in_place_update_on_several_devices(rng, workdir):
    a, b, old = rand(rng, (120, 90)), rand(rng, (90, 100)), rand(rng, (120, 100))
    np.save("c.npy", old)
    oocgemm.multiply(a, b, "c.npy", beta=-0.5, device=["cpu", "cpu"], tile=(30, 25, 45))
    assert_gemm(np.load("c.npy"), a, b, old, beta=-0.5)


def test_a_slow_device_takes_fewer_blocks(rng, monkeypatch):
    a, b = rand(rng, (320, 100)), rand(rng, (100, 160))
    run = CpuExecutor.run

    def slow_on_device_0(self):
        if threading.current_thread().name.endswith("_0"):
            time.sleep(0.2)
        return run(self)

    monkeypatch.setattr(CpuExecutor, "run", slow_on_device_0)
    r = oocgemm.multiply(a, b, device=["cpu", "cpu"], tile=(20, 160, 100))  # 16 rows of blocks
    assert_gemm(r.out, a, b)
    assert r.devices["cpu#0"]["blocks"] < r.devices["cpu#1"]["blocks"]


def test_the_merged_timeline_shows_every_device(rng, workdir):
    a, b = rand(rng, (200, 150)), rand(rng, (150, 180))
    r = oocgemm.multiply(a, b, device=THREE, tile=(25, 60, 50))
    text = str(r.timeline)
    assert "cpu#0/compute" in text and "cpu#2/compute" in text
    assert "devices" in text and "balance" in text
    shares = r.timeline.device_shares()
    assert set(shares) == {"cpu#0", "cpu#1", "cpu#2"}
    assert sum(x["flops"] for x in shares.values()) == r.flops
    r.timeline.save("run.json")
    trace = json.load(open("run.json"))
    groups = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert len(groups) == 3 and all("cpu#" in g for g in groups)


def test_device_lists_are_checked(rng):
    a = rand(rng, (4, 4))
    with pytest.raises(oocgemm.DeviceError, match="one kind"):
        oocgemm.multiply(a, a, device=["cpu", "cuda:0"])
    with pytest.raises(oocgemm.DeviceError):
        oocgemm.multiply(a, a, device=[])
    if not oocgemm.cuda.device_count():
        with pytest.raises(oocgemm.DeviceError, match="no CUDA GPU|CuPy is not installed"):
            oocgemm.multiply(a, a, device="cuda:all")


def test_a_failure_on_one_device_stops_them_all(rng, workdir, monkeypatch):
    a, b = rand(rng, (200, 100)), rand(rng, (100, 120))
    gemm, calls = CpuExecutor._gemm, {"n": 0}

    def failing(self, op):
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("device on fire")
        return gemm(self, op)

    monkeypatch.setattr(CpuExecutor, "_gemm", failing)
    with pytest.raises(oocgemm.ExecutionError, match="device on fire"):
        oocgemm.multiply(a, b, "c.zarr", device=THREE, tile=(20, 30, 25))
    assert leftovers(".") == [] and not __import__("os").path.exists("c.zarr")


@pytest.mark.parametrize("grid,devices,shape", [
    ((8, 3), 2, "rows"), ((3, 8), 2, "columns"), ((2, 2), 2, "runs"), ((3, 3), 2, "runs"),
    ((1, 1), 4, "runs"), ((5, 1), 2, "rows")])
def test_groups_share_panels(grid, devices, shape):
    """Rows of blocks (sharing A panels) where there are two rows per device, else columns
    (sharing B), else one run of neighbouring blocks per device; every block once, in the
    plan's order, the blocks already done left out."""
    import types

    from oocgemm.planning.schedule import serpentine
    from oocgemm.runtime.split import groups

    p, q = grid
    done = ((0, 0),) if p * q > 1 else ()
    plan = types.SimpleNamespace(grid=(p, q, 4), done=done, symmetric=False)
    got = groups(plan, devices)
    order = [x for x in serpentine(p, q) if x not in done]
    assert sorted(x for g in got for x in g) == sorted(order)
    for g in got:  # each group in the plan's order
        assert g == sorted(g, key=order.index)
    if shape == "rows":
        assert all(len({i for i, _ in g}) == 1 for g in got)
        assert len(got) == len({i for i, _ in order})
    elif shape == "columns":
        assert all(len({j for _, j in g}) == 1 for g in got)
        assert len(got) == len({j for _, j in order})
    else:
        assert len(got) == min(devices, len(order))
        assert all(order.index(g[-1]) - order.index(g[0]) == len(g) - 1 for g in got)

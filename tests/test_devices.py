"""One product on several devices (issue 19): C block groups handed out to one executor per
device as each is free, one merged timeline; tested with several CPU executors."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, fail_on_call, leftovers, poisoned, rand

import oocgemm
from oocgemm.devices import Device
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
    """Each device that ran blocks has its lanes, its share and its track group in the merged
    timeline. (Which devices get blocks is the run's own balance: a device that starts late
    on a loaded machine may find every group taken.)"""
    a, b = rand(rng, (200, 150)), rand(rng, (150, 180))
    r = oocgemm.multiply(a, b, device=THREE, tile=(25, 60, 50))
    ran = {name for name, share in r.devices.items() if share["blocks"]}
    assert ran and ran <= {"cpu#0", "cpu#1", "cpu#2"}
    text = str(r.timeline)
    assert all(f"{name}/compute" in text for name in ran)
    assert ("devices" in text and "balance" in text) == (len(ran) > 1)
    shares = r.timeline.device_shares()
    assert set(shares) == ran
    assert sum(x["flops"] for x in shares.values()) == r.flops
    r.timeline.save("run.json")
    trace = json.load(open("run.json"))
    groups = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert len(groups) == len(ran) and all("cpu#" in g for g in groups)


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
    fail_on_call(monkeypatch, CpuExecutor, "_gemm", 5, OSError("device on fire"))
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

    from oocgemm.planning import Work
    from oocgemm.planning.schedule import serpentine
    from oocgemm.runtime.multi_device import groups

    p, q = grid
    done = ((0, 0),) if p * q > 1 else ()
    plan = types.SimpleNamespace(grid=(p, q, 4), work=Work(done=done), symmetric=False)
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


# -- one C block: K split among the executors ------------------------------------------------
@pytest.mark.parametrize("k,r,chunk,devices,want", [
    (5000, 500, 500, 2, [(0, 2500), (2500, 5000)]),
    (5000, 250, 1000, 3, [(0, 2000), (2000, 3000), (3000, 5000)]),  # chunk edges only
    (5100, 500, 500, 2, [(0, 2500), (2500, 5100)]),  # the ragged end goes with the last
    (900, 500, 500, 2, []),  # one whole panel and a bit: nothing to split
    (5000, 500, 500, 1, []),
])
def test_k_parts_start_on_panel_and_chunk_edges(k, r, chunk, devices, want):
    from oocgemm.planning import Operand, Plan, Problem, cpu_model
    from oocgemm.runtime.multi_device import k_parts

    x = Operand((k, 24), (chunk, 24), on_disk=True)
    prob = Problem(m=24, n=24, k=k, itemsize=8, dtype="float64", a=x, b=x, trans_a=True,
                   shared=True)
    plan = Plan(problem=prob, tile=(24, 24, r), device=Device("cpu"), model=cpu_model(),
                memory_limit=1 << 30, host_memory_limit=1 << 30, symmetric=True)
    assert k_parts(plan, devices) == want
    several = dataclasses.replace(plan, tile=(8, 8, r))  # 6 blocks: they split instead
    assert k_parts(several, devices) == []


@pytest.mark.parametrize("how", ["zarr", "npy", "memory", "general"])
def test_a_tall_skinny_product_splits_k_among_executors(rng, workdir, how):
    """One C block, K long: every executor computes a partial C over its part of K (each
    chunk decoded once in all), the partials are summed once, beta * C added once; a Gram
    product stays bitwise symmetric."""
    x, y = rand(rng, (5100, 24)), rand(rng, (5100, 16))
    c = rand(rng, (24, 24 if how != "general" else 16))
    if how != "general":
        c = c + c.T  # symmetric, as a Gram product's C
    if how == "zarr":
        zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(500, 24))[:] = x
        a = b = "x.zarr"
    elif how == "npy":
        np.save("x.npy", x)
        a = b = "x.npy"
    elif how == "memory":
        a = b = x
    else:
        np.save("y.npy", y)
        a, b = x, "y.npy"
    want = 2.0 * x.T @ (y if how == "general" else x) + 0.5 * c
    out = poisoned(want.shape)
    r = oocgemm.multiply(a, b, out, c=c, alpha=2.0, beta=0.5, trans_a=True, device=THREE,
                         tile=(24, 24, 500))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-10)
    if how != "general":
        assert r.plan.symmetric and np.array_equal(out, out.T)  # bitwise
    assert sorted(r.devices) == ["cpu#0", "cpu#1", "cpu#2"]
    assert sum(d["flops"] for d in r.devices.values()) == r.flops
    assert all(d["flops"] > r.flops / 5 for d in r.devices.values())  # each took a share
    if how == "zarr":
        assert r.bytes["decoded"] == x.nbytes  # each chunk once, over all the parts
    writes = [e for e in r.events if e.kind == "write" and e.lane == "write-0"]
    assert len(writes) == 1 and writes[0].nbytes == want.nbytes  # C written once


def test_a_k_split_run_leaves_a_committed_zarr_output(rng, workdir):
    x = rand(rng, (4000, 12))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(1000, 12),
                      compressors=None)[:] = x  # uncompressed: read in parts
    r = oocgemm.gram("x.zarr", "g.zarr", device=["cpu", "cpu"], tile=(12, 12, 1000))
    assert len(r.devices) == 2
    got = zarr.open_array("g.zarr", mode="r")[:]
    np.testing.assert_allclose(got, x.T @ x, rtol=1e-12, atol=1e-10)
    assert leftovers(".") == []


# -- the runtime's entry point and its cancellation ------------------------------------------
def test_cancel_stops_a_run_from_another_thread(rng):
    """Executor.cancel() is the public way to stop a run: the run under way stops at its
    next operation and raises."""
    from oocgemm.storage.memory import NumpySink, NumpySource

    a, b = rand(rng, (200, 100)), rand(rng, (100, 120))
    plan = oocgemm.plan(a, b, device="cpu", tile=(20, 30, 25))
    out = poisoned((200, 120))
    gemm, started, calls = CpuExecutor._gemm, threading.Event(), {"n": 0}

    def slow(self, op):
        calls["n"] += 1
        started.set()
        time.sleep(0.01)
        return gemm(self, op)

    executor = CpuExecutor(plan, {"A": NumpySource(a), "B": NumpySource(b)}, NumpySink(out))
    errors: list[BaseException] = []

    def run():
        try:
            executor.run()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CpuExecutor, "_gemm", slow)
        thread = threading.Thread(target=run)
        thread.start()
        assert started.wait(5)
        executor.cancel()
        thread.join(10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], oocgemm.OOCGemmError)
    assert calls["n"] < plan.grid[0] * plan.grid[1] * plan.grid[2]  # it stopped early


def test_a_failure_cancels_the_other_devices_through_cancel(rng, workdir, monkeypatch):
    a, b = rand(rng, (400, 100)), rand(rng, (100, 120))
    cancelled, cancel = [], CpuExecutor.cancel

    def recorded(self):
        cancelled.append(self)
        cancel(self)

    fail_on_call(monkeypatch, CpuExecutor, "_gemm", 8, OSError("device on fire"), delay=0.002)
    monkeypatch.setattr(CpuExecutor, "cancel", recorded)
    with pytest.raises(oocgemm.ExecutionError, match="device on fire"):
        oocgemm.multiply(a, b, device=THREE, tile=(20, 30, 25))
    assert cancelled  # the runs under way were stopped through the public method


def test_the_product_hands_the_runtime_data_not_closures(rng, monkeypatch):
    """One runtime entry point for one device or several, given the plan, the run's I/O
    and the devices' names: nothing the product layer defines as a function."""
    import inspect

    import oocgemm.product
    from oocgemm.runtime import execute

    seen = []
    real = execute.execute

    def recording(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(oocgemm.product, "execute", recording)
    a, b = rand(rng, (120, 90)), rand(rng, (90, 100))
    for device in ("cpu", ["cpu", "cpu"]):
        assert_gemm(oocgemm.multiply(a, b, device=device, tile=(30, 25, 45)).out, a, b)
    assert len(seen) == 2
    for args, kwargs in seen:
        for value in (*args, *kwargs.values()):
            assert not (inspect.isfunction(value) or inspect.ismethod(value)), value
    source = inspect.getsource(oocgemm.product)
    assert "runtime.multi_device" not in source and "executor_class" not in source


@pytest.mark.parametrize("argv, want", [
    (["multiply", "a.zarr", "b.zarr", "-o", "c.zarr"], [0]),  # auto: the first GPU, if any
    (["gram", "x.zarr", "-o", "g.npy", "--device=cuda:1"], [1]),
    (["plan", "a.npy", "b.npy", "--device", "cuda:all"], None),
    (["multiply", "a", "b", "--device", "cuda:0,cuda:1"], [0, 1]),
    (["multiply", "a", "b", "--device", "cpu"], False),
    (["multiply", "a", "b", "--device", "cuda:x"], False),  # the parser says what is wrong
    (["multiply", "--help"], False),
    (["random", "x.zarr", "--shape", "8x8"], False),
    ([], False),
])
def test_the_gpus_a_command_line_will_start(argv, want):
    """The command starts these GPUs' driver and contexts beside its imports."""
    from oocgemm.devices import command_gpus

    assert command_gpus(argv) == want


def test_the_command_starts_no_gpu_where_the_machine_has_no_driver():
    from oocgemm.cuda import startup

    if os.path.exists("/proc/driver/nvidia/gpus"):
        pytest.skip("this machine has an NVIDIA driver")
    assert startup.early([0]) is None

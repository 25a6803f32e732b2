"""A process made ready for its first product (oocgemm.warmup.warm), and dask workers made
ready as they start (oocgemm.dask.WarmUp)."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time

import pytest

import oocgemm
import oocgemm.api
import oocgemm.dask as odask
from oocgemm import cuda
from oocgemm.warmup import warm


def _leftovers() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), "oocgemm-warm-*"))


def test_warm_runs_each_kind_of_product_and_leaves_nothing(monkeypatch):
    ran = []
    real = oocgemm.api.multiply

    def spy(a, b, **kw):
        ran.append((os.path.basename(a), os.path.basename(b), kw))
        return real(a, b, **kw)

    monkeypatch.setattr(oocgemm.api, "multiply", spy)
    before = set(_leftovers())
    steps = warm(device="cpu", memory_limit="64MB")
    assert set(steps) == {"start", "zarr", "gram", "total"}
    assert steps["total"] >= steps["zarr"] + steps["gram"] > 0
    assert [(a, b, kw.get("trans_a", False)) for a, b, kw in ran] == [
        ("a.zarr", "b.zarr", False), ("a.zarr", "a.zarr", True)]
    assert all(kw["device"] == "cpu" and kw["memory_limit"] == "64MB" for *_, kw in ran)
    assert set(_leftovers()) == before
    assert "cupy" not in sys.modules or cuda.device_count() > 0


def test_warm_says_what_is_wrong_before_any_work():
    with pytest.raises(oocgemm.OptionError):
        warm(device="cpu", memory_limt="1GB")
    with pytest.raises(oocgemm.DeviceError):
        warm(device="tpu")
    with pytest.raises(oocgemm.OptionError):
        odask.WarmUp(device="cpu", colour="blue")


def test_workers_are_warmed_as_they_start():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        client.register_plugin(odask.WarmUp(device="cpu"))
        times = client.run(odask.plugin.warm_times)
        assert len(times) == 2
        assert all(t["zarr"] > 0 and t["gram"] > 0 for t in times.values())
        cluster.scale(3)  # a worker that joins later is warmed too
        client.wait_for_workers(3)
        deadline = time.monotonic() + 60
        while True:  # its plugin runs as it registers: wait for its setup to end
            times = client.run(odask.plugin.warm_times)
            if len(times) == 3 and all(t.get("total", 0) > 0 for t in times.values()):
                break
            assert time.monotonic() < deadline, times
            time.sleep(0.2)


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_warm_starts_the_gpu():
    from oocgemm.cuda import startup

    steps = warm(device="cuda:0")
    assert steps["zarr"] > 0 and steps["gram"] > 0
    done = startup.times(0)
    assert {"context", "cublas", "pinned"} <= set(done)

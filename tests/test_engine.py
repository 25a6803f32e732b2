"""oocgemm.Engine: products sharing options and the device resources kept between runs,
freed when it closes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm import cuda


def test_its_options_and_a_calls_own(rng):
    a, b = rand(rng, (70, 50)), rand(rng, (50, 60))
    with oocgemm.Engine(device="cpu", tile=(16, 16, 16)) as engine:
        assert engine.plan(a, b).tile == (16, 16, 16)
        assert engine.plan(a, b, tile=(32, 32, 32)).tile == (32, 32, 32)  # the call's wins
        r = engine.multiply(a, b, alpha=-2.0)
        assert_gemm(r.out, a, b, alpha=-2.0)
        one_shot = oocgemm.multiply(a, b, alpha=-2.0, device="cpu", tile=(16, 16, 16))
        np.testing.assert_array_equal(r.out, one_shot.out)
        assert engine.resources("cpu") is None  # a CPU keeps nothing between runs
    assert engine.closed and "closed" in repr(engine)


def test_bad_options_and_calls_are_refused(rng):
    a = rand(rng, (8, 8))
    with pytest.raises(oocgemm.OptionError, match="unknown options"):
        oocgemm.Engine(memory_limt="1GB")
    with pytest.raises(oocgemm.OptionError, match="memory_limit"):
        oocgemm.Engine(memory_limit="lots")
    engine = oocgemm.Engine(device="cpu")
    with pytest.raises(oocgemm.OptionError, match="its own engine"):
        engine.multiply(a, a, engine=engine)
    with pytest.raises(oocgemm.OptionError, match="must be an oocgemm.Engine"):
        oocgemm.multiply(a, a, device="cpu", engine="fast")
    engine.close()
    engine.close()  # twice: harmless
    for call in (engine.plan, engine.multiply):
        with pytest.raises(oocgemm.OptionError, match="closed"):
            call(a, a)
    with pytest.raises(oocgemm.OptionError, match="closed"):  # through multiply too
        oocgemm.multiply(a, a, device="cpu", engine=engine)


def test_no_close_under_a_run_and_runs_from_several_threads(rng):
    a, b = rand(rng, (96, 64)), rand(rng, (64, 80))
    started, go_on = threading.Event(), threading.Event()

    def held(event):
        started.set()
        go_on.wait(10)

    engine = oocgemm.Engine(device="cpu", tile=(32, 32, 32))
    results = {}
    threads = [threading.Thread(target=lambda: results.update(held=engine.multiply(
                   a, b, progress=held))),
               threading.Thread(target=lambda: results.update(free=engine.multiply(b.T, a.T)))]
    for t in threads:
        t.start()
    assert started.wait(10)
    with pytest.raises(oocgemm.OptionError, match="still under way"):
        engine.close()
    go_on.set()
    for t in threads:
        t.join(30)
    assert_gemm(results["held"].out, a, b)
    assert_gemm(results["free"].out, b.T, a.T)
    engine.close()
    assert engine.closed


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_an_engine_keeps_and_frees_its_gpu_resources(rng):
    from oocgemm.cuda.context import PROCESS, memory_in_use

    a, b = rand(rng, (700, 300)), rand(rng, (300, 500))
    process_pinned = PROCESS.pinned.cached()
    with oocgemm.Engine(device="cuda", tile=(256, 256, 128)) as engine:
        for kernel in ("cublas", "dmma", "cublas"):
            assert_gemm(engine.multiply(a, b, kernel=kernel).out, a, b)
        held = engine.resources("cuda")
        assert held.pinned.cached() > 0 and held.pinned.in_use() == 0  # kept for the next
        assert held.kernels  # the dmma instances compiled for it
        assert memory_in_use(0, held)[1] == 0
    assert held.pinned.cached() == 0 and not held.kernels  # freed on close
    assert PROCESS.pinned.cached() == process_pinned  # the process's pool untouched


@pytest.mark.parametrize("device", ["gpu", ["cpu", "cuda:0"], "cuda:x"])
def test_a_device_that_cannot_run_is_refused_when_the_engine_is_made(device):
    with pytest.raises(oocgemm.DeviceError):
        oocgemm.Engine(device=device)


@pytest.mark.skipif(cuda.device_count() > 0, reason="a machine without a GPU")
def test_a_gpu_engine_on_a_machine_without_one_is_refused_when_made():
    with pytest.raises(oocgemm.DeviceError, match="cuda"):
        oocgemm.Engine(device="cuda")

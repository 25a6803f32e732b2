"""Each name kernel= takes is a strategy (oocgemm.strategies) that the planner, the staging
policies and the CPU executor ask, rather than branching on the name."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import rand

import oocgemm
from oocgemm.kernel_catalog import CHOICES, KERNELS
from oocgemm.ozaki import MAX_DEPTH
from oocgemm.strategies import CudaKernel, Native, Ozaki, strategy_of


def test_every_name_has_its_strategy():
    assert type(strategy_of(None)) is Native and strategy_of("cublas") == Native()
    assert {type(strategy_of(name)) for name in KERNELS} == {CudaKernel}
    assert strategy_of("ozaki") == Ozaki("ozaki", None)
    assert strategy_of("ozaki:16").moduli == 16
    assert all(strategy_of(name).name == name for name in CHOICES)


@pytest.mark.parametrize("name", CHOICES)
def test_what_each_says(name):
    s = strategy_of(name)
    assert ("cpu" in s.devices) == (name in ("cublas", "ozaki"))
    assert s.halves_gram == (name == "cublas")
    assert s.in_core == (not s.emulated)
    assert s.max_depth(staged=False) is None
    assert s.max_depth(staged=True) == (MAX_DEPTH if s.emulated else None)
    assert (s.converted(64, 64, 64) is not None) == s.emulated


def test_the_cpu_staging_follows_the_strategy(rng):
    a = rand(rng, (40, 30))
    native = oocgemm.plan(a, a, trans_b=True, device="cpu")
    emulated = oocgemm.plan(a, a, trans_b=True, device="cpu", kernel="ozaki")
    assert (native.staging.split_last, emulated.staging.split_last) == (4, 1)
    assert native.symmetric and not emulated.symmetric  # X X^T halves on the native GEMM only
    np.testing.assert_allclose(oocgemm.multiply(a, a.T, device="cpu", kernel="ozaki").out,
                               a @ a.T, rtol=1e-13)


def test_every_strategy_has_a_gpu_launch():
    """oocgemm.cuda.launch says how a GPU runs each strategy (importable without CuPy): a
    strategy class added without its launch fails here, not on a GPU."""
    from oocgemm import strategies
    from oocgemm.cuda.launch import LAUNCHES, Cublas, Emulated, Kernel, launch_of

    classes = {c for c in vars(strategies).values()
               if isinstance(c, type) and issubclass(c, Native)}
    assert set(LAUNCHES) == classes
    kinds = {name: type(launch_of(strategy_of(name))) for name in CHOICES}
    assert kinds["cublas"] is Cublas and kinds["ozaki"] is Emulated
    assert {kinds[name] for name in KERNELS} == {Kernel}
    assert [launch_of(strategy_of(name)).waits_across_streams for name in CHOICES] == [
        strategy_of(name).emulated for name in CHOICES]

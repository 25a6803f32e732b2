"""The GPU benchmarks (benchmarks/): the FMA-peak kernels, ``python -m benchmarks kernels`` and
``power``. Skipped where no GPU is found."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from oocgemm import cuda
from oocgemm.errors import OptionError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


def test_fma_peak_is_plausible():
    from benchmarks import fma
    from benchmarks.kernel_rates import _nominal_fma_gflops

    rate = fma.fma_peak("float64", seconds=0.05)
    assert 1e11 < rate < 2e14  # between a laptop GPU and twice an H100's FP64 tensor peak
    nominal = _nominal_fma_gflops(np.dtype("float64"))
    if nominal is not None:  # flops counted right: no more than every FMA unit at the top clock
        assert rate / 1e9 <= 1.05 * nominal


def test_kernels_prints_rates_resources_and_the_peak():
    from benchmarks.cli import main
    from benchmarks.kernel_rates import _nominal_fma_gflops

    result = CliRunner().invoke(main, ["kernels", "--size", "256", "--cases", "naive,regblock"])
    assert result.exit_code == 0, result.output
    assert "FMA peak of the CUDA cores" in result.output
    assert "regblock" in result.output and "naive" in result.output and "WRONG" not in result.output
    if _nominal_fma_gflops(np.dtype("float64")) is not None:
        assert "of the nominal" in result.output


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fma_outer_computes_its_outer_products(dtype):
    """fma_outer does the FMAs it is timed for: each accumulator ends at its start plus iters
    times the sum of its two products (so nothing is folded away), on random operands."""
    from benchmarks import fma

    threads, iters = 512, 37
    src = fma.fma_outer_operands(threads, "random", dtype, seed=3)
    out = fma.fma_outer_run(src, iters).get()
    rows, values = fma.fma_outer_shape()
    r = rows // 2
    s = src.get().astype(np.float64)
    a, b, acc = s[:, :rows], s[:, rows:2 * rows], s[:, 2 * rows:values].reshape(-1, r, r)
    step = sum(a[:, h * r:(h + 1) * r, None] * b[:, None, h * r:(h + 1) * r] for h in range(2))
    want = (acc + iters * step).sum(axis=(1, 2))
    rtol = 1e-11 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol * np.abs(want).max())
    const = fma.fma_outer_operands(threads, "constant", dtype).get()
    assert (const[:, :2 * rows] == 1).all() and (const[:, 2 * rows:] == 0).all()
    assert 1e11 < fma.fma_outer(dtype, seconds=0.05) < 2e14


def test_square_rates_agree_with_cublas():
    from benchmarks.baselines import square_rates

    rates = square_rates(["regblock", "dmma"], 512, repeat=1, seed=5)
    assert set(rates) == {"cublas", "regblock", "dmma"}
    assert all(e["seconds"] > 0 and e["max_rel_error"] < 1e-12 for e in rates.values()), rates


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi")
def test_kernel_power_reports_every_case():
    from benchmarks.kernel_rates import kernel_power

    res = kernel_power(512, kernels=["regblock"], seconds=0.4)
    entries = res["entries"]
    assert list(entries) == ["fma_peak", "fma_outer", "fma_outer:const", "cublas", "regblock",
                             "regblock:l1", "regblock:loop"]
    assert res["idle"]["samples"] > 0
    for name, e in entries.items():
        assert e["tflops"] > 0 and e["samples"] > 0, (name, e)
        assert 0 < e["clock_mhz"] < 5000 and 0 < e["power_w"] < 5000, (name, e)
    assert entries["regblock"]["correct"] and entries["cublas"]["correct"]
    assert "correct" not in entries["regblock:loop"]  # a measuring build: wrong on purpose
    assert entries["fma_peak"]["of_fma_peak"] == 1.0


@pytest.mark.parametrize("power", [False, True])
def test_kernel_benchmarks_refuse_a_size_beyond_gpu_memory(power):
    from benchmarks.kernel_rates import kernel_benchmark, kernel_power

    with pytest.raises(OptionError, match="of GPU memory"):
        if power:
            kernel_power(1 << 20, kernels=["regblock"], seconds=0.1)
        else:
            kernel_benchmark((1 << 20,), kernels=["regblock"])

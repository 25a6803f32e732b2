"""Freivalds' check: a product verified without recomputing it, streaming its operands."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, rand, reference
from click.testing import CliRunner

import oocgemm
from oocgemm.cli import main
from oocgemm.errors import ExecutionError, OptionError, ShapeError


def test_catches_one_element_off_by_1e6_of_the_largest_in_4096(rng):
    """The issue's figure: a 4096² float64 product, one element changed by 1e-6 of the largest,
    two rounds; and the clean product passes far inside its tolerance."""
    a, b = rand(rng, (4096, 4096)), rand(rng, (4096, 4096))
    c = a @ b
    clean = oocgemm.verify(a, b, c, seed=1)
    assert clean and clean.worst_ratio < 1e-2
    i, j = 1234, 3210
    c[i, j] += 1e-6 * np.abs(c).max()
    report = oocgemm.verify(a, b, c, seed=1)
    assert not report and report.worst_row == i
    assert "FAILED" in str(report) and report.worst_ratio > 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, True)])
def test_passes_clean_results_across_dtypes(rng, dtype, trans_a, trans_b):
    m, k, n = 300, 1000, 250
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c0 = rand(rng, (m, n), dtype)
    alpha, beta = (1.5 - 0.5j, 0.25j) if dtype.startswith("complex") else (1.5, -0.75)
    r = oocgemm.multiply(a, b, c=c0, alpha=alpha, beta=beta, trans_a=trans_a,
                         trans_b=trans_b, device="cpu", tile=(128, 96, 300))
    report = oocgemm.verify(a, b, r.out, alpha=alpha, beta=beta, c_in=c0, trans_a=trans_a,
                            trans_b=trans_b)
    assert report, str(report)
    wrong = r.out.copy()  # an error well above what the dtype's rounding may carry
    wrong[7, 11] += (0.2 if dtype in ("float32", "complex64") else 1e-6) * np.abs(wrong).max()
    assert not oocgemm.verify(a, b, wrong, alpha=alpha, beta=beta, c_in=c0,
                              trans_a=trans_a, trans_b=trans_b)


def test_an_error_in_one_element_is_caught_whatever_the_vectors(rng):
    a, b = rand(rng, (300, 1000), "float32"), rand(rng, (1000, 250), "float32")
    wrong = oocgemm.multiply(a, b, device="cpu").out
    wrong[7, 11] += 0.2 * np.abs(wrong).max()
    missed = [seed for seed in range(200) if oocgemm.verify(a, b, wrong, seed=seed)]
    assert missed == []  # random signs: the error shows in full in row 7 of C x


def test_float32_positive_data_with_long_sums(rng):
    """All-positive float32 data with K = 20000: rounding that a correct product carries
    stays within the tolerance."""
    a = rng.random((64, 20000), dtype=np.float32)
    b = rng.random((20000, 48), dtype=np.float32)
    assert oocgemm.verify(a, b, a @ b, rounds=4)


def test_zarr_inputs_streamed_in_chunk_bands(rng, workdir, monkeypatch):
    import oocgemm.freivalds as v

    monkeypatch.setattr(v, "BAND_BYTES", 8 * 40 * 8)  # a few rows a band: many bands
    a, b = rand(rng, (90, 40)), rand(rng, (40, 70))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype=x.dtype, chunks=(16, 16))[:] = x
    oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cpu", tile=(32, 32, 16))
    assert oocgemm.verify("a.zarr", "b.zarr", "c.zarr")
    z = zarr.open_array("c.zarr", mode="r+")
    z[89, 69] = z[89, 69] + 1.0
    report = oocgemm.verify("a.zarr", "b.zarr", "c.zarr")
    assert not report and report.worst_row == 89 and report.worst_rows[0] <= 89


def test_nan_in_c_fails(rng):
    a, b = rand(rng, (20, 10)), rand(rng, (10, 15))
    c = a @ b
    c[3, 4] = np.nan
    assert not oocgemm.verify(a, b, c)


def test_rows_whose_inputs_side_is_not_finite_cannot_be_checked(rng, workdir):
    """An inf in a, or a product that overflows: those rows of C cannot be checked. The
    report says so (not 'FAILED': C is what numpy gives), with no numpy warnings; multiply
    with verify commits nothing and says why. C's own inf where the inputs are finite still
    fails."""
    import warnings

    a, b = rand(rng, (20, 10)), rand(rng, (10, 15))
    bad = a.copy()
    bad[3, 2] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with np.errstate(invalid="ignore"):
            c = bad @ b
        report = oocgemm.verify(bad, b, c)
        assert not report and report.unchecked == 1 and report.worst_row == 3
        assert "cannot check 1 row(s)" in str(report)
        with np.errstate(over="ignore"):
            c = (a @ b) * 1e308  # the product overflows: infs in C, as multiply's
        report = oocgemm.verify(a, b, c, alpha=1e308)
        assert not report and report.unchecked > 0 and "cannot check" in str(report)
        c = a @ b
        c[5, 5] = np.inf
        report = oocgemm.verify(a, b, c)
        assert not report and report.unchecked == 0 and "FAILED" in str(report)
    # (np.errstate: the product's own inf * 0 warns, as numpy's a @ b)
    with np.errstate(invalid="ignore"), pytest.raises(
            ExecutionError, match="could not be checked, so nothing was committed"):
        oocgemm.multiply(bad, b, "c.npy", device="cpu", verify=True)
    assert leftovers(".") == [] and not (workdir / "c.npy").exists()


def test_multiply_verify_commits_only_a_checked_product(rng, workdir, monkeypatch):
    a, b, c0 = rand(rng, (60, 40)), rand(rng, (40, 50)), rand(rng, (60, 50))
    np.save("c.npy", c0)
    r = oocgemm.multiply(a, b, "c.npy", beta=2.0, device="cpu", verify=True, tile=(16, 16, 16))
    assert r.verified and r.summary()["verified"]["ok"]  # in place: C_in read before the run
    np.testing.assert_allclose(np.load("c.npy"), reference(a, b, c0, beta=2.0), rtol=1e-12,
                               atol=1e-12)

    from oocgemm.runtime.cpu import CpuExecutor

    real = CpuExecutor._gemm

    def wrong(self, op):  # a fault that produces a plausible but wrong product
        real(self, op)
        if op.key == (1, 2) and op.q == 0:
            self.view(op.dst, (16, 16))[3, 3] += 1.0

    monkeypatch.setattr(CpuExecutor, "_gemm", wrong)
    with pytest.raises(ExecutionError, match="failed its check"):
        oocgemm.multiply(a, b, "d.zarr", device="cpu", verify=True, tile=(16, 16, 16))
    assert leftovers(".") == [] and not (workdir / "d.zarr").exists()


def test_bad_arguments():
    a, b = np.ones((3, 4)), np.ones((4, 5))
    with pytest.raises(ShapeError):
        oocgemm.verify(a, b, np.ones((3, 4)))
    with pytest.raises(OptionError, match="c_in"):
        oocgemm.verify(a, b, np.ones((3, 5)), beta=1.0)
    with pytest.raises(OptionError, match="rounds"):
        oocgemm.verify(a, b, np.ones((3, 5)), rounds=0)
    with pytest.raises(OptionError, match="verify"):
        oocgemm.multiply(a, b, device="cpu", verify="yes")


def test_the_public_signature_shows_only_what_a_user_passes():
    import inspect

    params = inspect.signature(oocgemm.verify).parameters
    assert list(params) == ["a", "b", "c", "alpha", "beta", "c_in", "trans_a", "trans_b",
                            "rounds", "seed", "storage_options"]


def test_cli_verify(rng, workdir):
    a, b = rand(rng, (30, 20)), rand(rng, (20, 25))
    np.save("a.npy", a)
    np.save("b.npy", b)
    ok = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device",
                                   "cpu", "--verify"])
    assert ok.exit_code == 0 and "verify: passed" in ok.output, ok.output
    assert CliRunner().invoke(main, ["verify", "a.npy", "b.npy", "c.npy"]).exit_code == 0
    c = np.load("c.npy")
    c[0, 0] += 1.0
    np.save("c.npy", c)
    bad = CliRunner().invoke(main, ["verify", "a.npy", "b.npy", "c.npy", "--json"])
    assert bad.exit_code == 1 and '"ok": false' in bad.output
    err = CliRunner().invoke(main, ["verify", "a.npy", "b.npy", "missing.npy"])
    assert err.exit_code == 2 and "error:" in err.output


def test_multiply_checks_its_product_with_the_runs_own_sources(rng, workdir, monkeypatch):
    """verify=True reads A and B through the run's open sources (issue 52): the inputs are
    opened once, by the run; the check opens only the product it checks."""
    import oocgemm.freivalds
    import oocgemm.lifecycle.run
    import oocgemm.storage

    a, b = rand(rng, (70, 40)), rand(rng, (40, 30))
    np.save("a.npy", a)
    np.save("b.npy", b)
    opened = []
    for module in (oocgemm.storage, oocgemm.freivalds, oocgemm.lifecycle.run):
        real = module.open_source

        def recording(obj, role, *args, _real=real, **kwargs):
            opened.append(role)
            return _real(obj, role, *args, **kwargs)

        monkeypatch.setattr(module, "open_source", recording)
    result = oocgemm.multiply("a.npy", "b.npy", "c.npy", device="cpu", verify=True)
    assert result.verified and sorted(opened) == ["a", "b", "c"]  # the run's, and the check's
    assert_gemm(np.load("c.npy"), a, b)
    opened.clear()  # the function of the same name still opens what it is given
    assert oocgemm.verify("a.npy", "b.npy", "c.npy") and opened == ["a", "b", "c"]

"""Ozaki scheme II's CPU reference (issue 21): float64 block products from exact integer
products modulo small moduli, against exact and higher-precision references."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import oocgemm
from oocgemm import ozaki


def _spread(rng, shape, bits: int) -> np.ndarray:
    """Normal values times 2^u, u uniform in [-bits/2, bits/2]: exponents spread over ``bits``."""
    return np.ldexp(rng.standard_normal(shape), rng.integers(-bits // 2, bits // 2 + 1, shape))


def _error(c, a, b) -> float:
    """max |C - C_ref| / (|A| |B|), the reference in extended precision."""
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    scale = np.abs(a) @ np.abs(b)
    return float(np.max(np.abs(c - ref) / np.where(scale > 0, scale, 1)))


def test_the_moduli_are_pairwise_coprime_and_their_residues_fit_int8():
    assert all(math.gcd(x, y) == 1 for i, x in enumerate(ozaki.MODULI)
               for y in ozaki.MODULI[i + 1:])
    assert max(ozaki.MODULI) == 256 and len(ozaki.MODULI) >= 30
    x = np.arange(-5000.0, 5000.0)
    for m in ozaki.MODULI:
        r = ozaki._residues(x, m)
        assert r.dtype == np.int8 and np.all(np.fmod(x - r, m) == 0)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (33, 64, 17)])
def test_the_result_is_the_exact_product_correctly_rounded(rng, shape):
    w, r, h = shape
    # 24-bit significands: the scaling to integers loses nothing, so the only rounding is the
    # final one, of the exact sum
    a = np.ldexp(rng.integers(-2**23, 2**23, (w, r)).astype(float), rng.integers(-15, 15, (w, r)))
    b = np.ldexp(rng.integers(-2**23, 2**23, (r, h)).astype(float), rng.integers(-15, 15, (r, h)))
    c, how = ozaki.gemm(a, b)
    assert not how.native
    for i in range(w):
        for j in range(h):
            exact = sum(Fraction(a[i, k]) * Fraction(b[k, j]) for k in range(r))
            assert c[i, j] == float(exact)  # Fraction -> float rounds to nearest


@pytest.mark.parametrize("bits", [0, 8, 30])
@pytest.mark.parametrize("shape", [(40, 300, 30), (17, 1000, 9)])
def test_never_less_accurate_than_native(rng, bits, shape):
    w, r, h = shape
    a, b = _spread(rng, (w, r), bits), _spread(rng, (r, h), bits)
    c, how = ozaki.gemm(a, b)
    assert not how.native and len(how.moduli) <= 32
    assert _error(c, a, b) <= max(_error(a @ b, a, b), 2.0**-53)


def test_the_moduli_follow_the_exponent_range():
    rng = np.random.default_rng(5)
    narrow = ozaki.plan_block(np.ones((4, 100)), np.ones((100, 4)))
    wide = ozaki.plan_block(_spread(rng, (4, 100), 30), _spread(rng, (100, 4), 30))
    assert narrow.bits_a == narrow.bits_b == 53
    assert wide.bits_a > 53 + 20 and len(wide.moduli) > len(narrow.moduli)
    assert math.prod(narrow.moduli) > 2 * 100 * 2**(53 + 53)


def test_given_moduli_trade_accuracy_for_fewer_products(rng):
    a, b = rng.standard_normal((20, 200)), rng.standard_normal((200, 10))
    few, how = ozaki.gemm(a, b, moduli=8)
    assert len(how.moduli) == 8 and how.bits_a < 53
    assert _error(few, a, b) > _error(ozaki.gemm(a, b)[0], a, b)
    assert _error(few, a, b) < 2.0**(-how.bits_a + 2)
    with pytest.raises(oocgemm.OptionError, match="moduli must be"):
        ozaki.gemm(a, b, moduli=0)


def test_zeros_and_overflow_as_native(rng):
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    a[2] = 0
    b[:, 1] = 0
    c, _ = ozaki.gemm(a, b)
    assert np.all(c[2] == 0) and np.all(c[:, 1] == 0)
    big = np.full((2, 3), 2.0**600)
    c, how = ozaki.gemm(big, big.T)
    assert not how.native and np.all(np.isinf(c)) and np.all(c > 0)


def test_infinities_nan_and_huge_ranges_fall_back_to_native_and_say_so(rng):
    a, b = rng.standard_normal((5, 6)), rng.standard_normal((6, 3))
    a[1, 2], b[3, 0] = np.nan, np.inf
    c, how = ozaki.gemm(a, b)
    assert how.native and "NaN" in how.reason
    np.testing.assert_array_equal(c, a @ b)  # NaN where native has NaN
    a = rng.standard_normal((5, 6))
    a[0, 0] = 2.0**300
    c, how = ozaki.gemm(a, rng.standard_normal((6, 3)))
    assert how.native and "exponent range" in how.reason

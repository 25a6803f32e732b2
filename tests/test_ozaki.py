"""Ozaki scheme II's CPU reference (issue 21): float64 block products from exact integer
products modulo small moduli, against exact and higher-precision references."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path

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


def _exact(a, b) -> ozaki.Emulation:
    """The emulation that keeps every element's 53 bits (the rule's with d = 0, whatever the
    depth): the exact product, rounded once."""
    bits_a, bits_b = 53 + ozaki.analyse(a, 1).spread, 53 + ozaki.analyse(b, 0).spread
    return ozaki.Emulation(bits_a, bits_b, ozaki.moduli_for(bits_a, bits_b, a.shape[1]))


def _balanced_digits(x: int, moduli) -> list[int]:
    """The balanced mixed-radix digits of the integer ``x`` (Python's exact arithmetic)."""
    out = []
    for m in moduli:
        v = (x + m // 2) % m - m // 2
        out.append(v)
        x = (x - v) // m
    assert x == 0  # x was in the window [-M/2, M/2)
    return out


def _oracle(a, b, how) -> np.ndarray:
    """The emulated product through Python's exact integers, rounded once (``float`` of an int
    rounds to nearest even): the reconstruction ozaki.py had before its integer kernels, as
    the reference they must equal bit for bit."""
    sa, sb = ozaki.shifts(a, how.bits_a, 1), ozaki.shifts(b, how.bits_b, 0)
    ia = [[int(v) for v in row] for row in np.rint(np.ldexp(a, sa))]
    ib = [[int(v) for v in col] for col in np.rint(np.ldexp(b, sb)).T]
    return np.array([[math.ldexp(float(sum(x * y for x, y in zip(row, col))), -int(ea + eb))
                      for col, eb in zip(ib, sb[0])] for row, ea in zip(ia, sa[:, 0])])


def test_the_moduli_are_pairwise_coprime_and_their_residues_fit_int8(rng):
    assert all(math.gcd(x, y) == 1 for i, x in enumerate(ozaki.MODULI)
               for y in ozaki.MODULI[i + 1:])
    assert max(ozaki.MODULI) == 256 and len(ozaki.MODULI) >= 30
    # small integers, and integers of up to 113 bits (53 significant, then zeros)
    x = np.concatenate([np.arange(-5000.0, 5000.0),
                        np.ldexp(rng.integers(-2**53 + 1, 2**53, 2000).astype(float),
                                 rng.integers(0, 61, 2000))])
    r = ozaki.residues(x[None], np.zeros((1, 1), np.int32), ozaki.MODULI)
    assert r.dtype == np.int8 and r.shape == (len(ozaki.MODULI), 1, x.size)
    for m, rm in zip(ozaki.MODULI, r[:, 0]):
        assert all((int(v) - int(u)) % m == 0 for v, u in zip(x, rm))
        assert rm.min() >= -(m // 2) and rm.max() < (m + 1) // 2


def test_garner_digits_are_those_of_the_integer_sign_included(rng):
    moduli = ozaki.MODULI[:12]
    half = math.prod(moduli) // 2
    xs = [0, 1, -1, half - 1, -half, 2**31, -2**40]
    xs += [int(v) * 2**40 + int(u) for v, u in zip(rng.integers(-2**40, 2**40, 200),
                                                   rng.integers(0, 2**40, 200))]
    # each product an int32 of the residue's class, as the int8 GEMMs give them
    c = [np.array([x % m - m * int(rng.integers(0, 2**20)) for x in xs], dtype=np.int32)
         for m in moduli]
    digits = np.empty((len(moduli), len(xs)), dtype=np.int8)
    for k in range(len(moduli)):
        digits[k] = ozaki.digit(k, c[k], digits, moduli)
    for n, x in enumerate(xs):
        assert [int(v) for v in digits[:, n]] == _balanced_digits(x, moduli)


def _hard_roundings(rng, moduli) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Integers halfway between two doubles, just off halfway (by 1 far below: the sticky bit),
    exact, tiny and the window's ends, as Garner's digits; exponents; the rounded values."""
    xs = []
    for _ in range(100):
        mantissa, k = int(rng.integers(2**52, 2**53)), int(rng.integers(1, 100))
        tie = (2 * mantissa + 1) << k
        xs += [tie, -tie, tie + 1, tie - 1, tie + (1 << (k - 1)), mantissa << k]
    xs += [0, 1, -7, 2**53 + 1, math.prod(moduli) // 2 - 1, -(math.prod(moduli) // 2)]
    digits = np.array([_balanced_digits(x, moduli) for x in xs], dtype=np.int8).T
    exps = rng.integers(-300, 300, len(xs))
    return digits, exps, np.array([math.ldexp(float(x), int(e)) for x, e in zip(xs, exps)])


def test_rounding_from_the_digits_is_correct_ties_included(rng):
    moduli = ozaki.MODULI[:22]
    digits, exps, want = _hard_roundings(rng, moduli)
    np.testing.assert_array_equal(ozaki.rounded(digits, moduli, exps), want)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 13, 5), (33, 64, 17)])
def test_the_result_is_the_exact_product_correctly_rounded(rng, shape):
    w, r, h = shape
    # 24-bit significands: the scaling to integers loses nothing, so the only rounding is the
    # final one, of the exact sum
    a = np.ldexp(rng.integers(-2**23, 2**23, (w, r)).astype(float), rng.integers(-15, 15, (w, r)))
    b = np.ldexp(rng.integers(-2**23, 2**23, (r, h)).astype(float), rng.integers(-15, 15, (r, h)))
    c, how = ozaki.gemm(a, b, how=_exact(a, b))
    for i in range(w):
        for j in range(h):
            exact = sum(Fraction(a[i, k]) * Fraction(b[k, j]) for k in range(r))
            assert c[i, j] == float(exact)  # Fraction -> float rounds to nearest


def _gamma(r: int) -> float:
    """Native DGEMM's error bound for sums of ``r`` products: ``r u / (1 - r u)``."""
    u = 2.0**-53
    return r * u / (1 - r * u)


@pytest.mark.parametrize("bits", [0, 8])
@pytest.mark.parametrize("shape", [(40, 300, 30), (17, 1000, 9)])
def test_the_rule_stays_within_natives_error_bound(rng, bits, shape):
    """Element for element, |C - AB| <= gamma_r |A||B|, with fewer moduli than keeping every
    element's 53 bits; on random inputs, no less accurate than native DGEMM measured."""
    w, r, h = shape
    a, b = _spread(rng, (w, r), bits), _spread(rng, (r, h), bits)
    c, how = ozaki.gemm(a, b)
    assert not how.native and len(how.moduli) < len(_exact(a, b).moduli)
    assert _error(c, a, b) <= _gamma(r)
    assert _error(c, a, b) <= max(_error(a @ b, a, b), 2.0**-53)


def test_the_bound_holds_where_a_fixed_count_of_moduli_breaks_it(rng):
    """Rows with one large element and the rest 2^-30 of it, against columns that are zero
    where the large ones are: |A||B| is made of the tiny elements alone, which the rule keeps
    to their own precision and 16 moduli (bits counted from each row's largest) round away."""
    r = 512
    a = np.ldexp(rng.uniform(1, 2, (8, r)), -30)
    a[:, 0] = 1.0
    b = rng.standard_normal((r, 6))
    b[0] = 0.0
    c, how = ozaki.gemm(a, b)
    assert not how.native and how.bits_a == 53 + 30 - 7  # floor(log2 512) - 2
    assert _error(c, a, b) <= _gamma(r)
    assert _error(ozaki.gemm(a, b, moduli=16)[0], a, b) > 100 * _gamma(r)


def test_panels_that_need_more_moduli_than_pay_run_native(rng):
    a, b = _spread(rng, (20, 300), 30), _spread(rng, (300, 10), 30)
    c, how = ozaki.gemm(a, b)
    assert how.native and f"past {ozaki.RULE_MODULI}" in how.reason
    np.testing.assert_array_equal(c, a @ b)
    assert len(_exact(a, b).moduli) > ozaki.RULE_MODULI


@pytest.mark.parametrize("bits", [0, 8, 30, 55])
def test_the_result_is_the_exact_integer_product_rounded_once(rng, bits):
    for _ in range(6):
        w, r, h = rng.integers(1, 30, 3)
        a, b = _spread(rng, (w, r), bits), _spread(rng, (r, h), bits)
        for how in {ozaki.plan_block(a, b), _exact(a, b)}:
            if not how.native:
                np.testing.assert_array_equal(ozaki.gemm(a, b, how=how)[0],
                                              _oracle(a, b, how))


def test_exact_ties_round_to_even(rng):
    # rows x + 1/2 with x an integer of 53 bits: halfway between two doubles, rounded to even
    x = rng.integers(2**52, 2**53, 40).astype(float)
    a = np.stack([x, np.full_like(x, 0.5)], axis=1)
    c, how = ozaki.gemm(a, np.ones((2, 3)), how=_exact(a, np.ones((2, 3))))
    assert how.bits_a == 53 + 53
    want = [float(Fraction(int(v)) + Fraction(1, 2)) for v in x]
    np.testing.assert_array_equal(c, np.repeat(np.array(want)[:, None], 3, axis=1))


def test_deep_blocks_run_in_slices_with_the_same_result(rng, monkeypatch):
    a, b = _spread(rng, (9, 50), 8), _spread(rng, (50, 7), 8)
    whole, _ = ozaki.gemm(a, b)
    monkeypatch.setattr(ozaki, "MAX_DEPTH", 7)  # 8 slices, the last of 1
    np.testing.assert_array_equal(ozaki.gemm(a, b)[0], whole)
    np.testing.assert_array_equal(whole, _oracle(a, b, ozaki.plan_block(a, b)))
    monkeypatch.undo()
    # the deepest int32 sums: each slice's near 2^31, so the sum so far must be reduced first
    r = ozaki.MAX_DEPTH + 10
    for m in (256, 255):
        c = ozaki._product(np.full((1, r), -128, np.int8), np.full((r, 1), -128, np.int8), m)
        assert c.dtype == np.int32 and (int(c[0, 0]) - r * 2**14) % m == 0


def test_the_moduli_follow_the_exponent_range_and_the_depth():
    rng = np.random.default_rng(5)
    narrow = ozaki.plan_block(np.ones((4, 100)), np.ones((100, 4)))
    wide = ozaki.plan_block(_spread(rng, (4, 100), 4), _spread(rng, (100, 4), 4))
    deep = ozaki.plan_block(np.ones((4, 5000)), np.ones((5000, 4)))
    assert narrow.bits_a == narrow.bits_b == 53 - 4  # floor(log2 100) - 2
    assert deep.bits_a == 53 - 10
    assert wide.bits_a > 53 + 10 and len(wide.moduli) > len(narrow.moduli)
    assert math.prod(narrow.moduli) > 2 * 100 * 2**(49 + 49)
    assert math.prod(narrow.moduli[:-1]) <= 2 * 100 * 2**(49 + 49)  # the fewest
    assert ozaki.rule_bits(7, 3) == ozaki.rule_bits(7, 1) == 60  # d = 0: every bit kept


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


# kernels/ozaki.cu's element functions, compiled for the CPU as plain C++, each run over its
# elements as its kernel runs them
_DRIVER = r"""
#include <math.h>
#include "ozaki.cu"
extern "C" {
void tables(int* moduli, int* weights, int* inverses)
{
    const OzakiTables& t = ozaki_tables();
    for (int k = 0; k < OZAKI_MAX_MODULI; ++k) {
        moduli[k] = t.moduli[k];
        inverses[k] = t.inverses[k];
        for (int j = 0; j < k; ++j) weights[k * OZAKI_MAX_MODULI + j] = t.weights[k][j];
    }
}
void stats(int outer, int depth, const double* x, long long so, long long sk, int* emax,
           int* summary)
{
    for (long long o = 0; o < outer; ++o) {
        OzakiStats s;
        for (long long k = 0; k < depth; ++k) ozaki_stats_add(s, x[o * so + k * sk]);
        ozaki_stats_store(s, &emax[o], summary);
    }
}
void residues(int outer, int depth, int depth_pad, const double* x, long long so, long long sk,
              const int* emax, int bits, int first, int n, signed char* out)
{
    for (long long o = 0; o < outer; ++o)
        for (long long k = 0; k < depth_pad; ++k)
            ozaki_residues_at(k < depth ? x[o * so + k * sk] : 0.0, k < depth, bits - emax[o],
                              first, n, out + o * depth_pad + k, (long long)outer * depth_pad);
}
#define FINISH(N)                                                                              \
void finish##N(int rows, int cols, const int* prod, long long ldp, long long plane, int n,     \
               const int* emax_a, int bits_a, const int* emax_b, int bits_b, double alpha,     \
               double beta, double* c, long long ldc)                                          \
{                                                                                              \
    for (long long i = 0; i < rows; ++i)                                                       \
        for (long long j = 0; j < cols; ++j)                                                   \
            c[i * ldc + j] = ozaki_finish_at<N>(prod + i * ldp + j, plane, n,                  \
                                                emax_a[i] - bits_a + emax_b[j] - bits_b,       \
                                                alpha, beta, c + i * ldc + j);                 \
}
FINISH(16)
FINISH(24)
FINISH(36)
}
"""


@pytest.fixture(scope="module")
def kernel_code(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler on the PATH")
    folder = tmp_path_factory.mktemp("ozaki_cu")
    (folder / "driver.cpp").write_text(_DRIVER)
    kernels = Path(__file__).resolve().parents[1] / "kernels"
    subprocess.run([cxx, "-std=c++17", "-O2", "-shared", "-fPIC", f"-I{kernels}", "-o",
                    str(folder / "ozaki.so"), str(folder / "driver.cpp")], check=True)
    lib = ctypes.CDLL(str(folder / "ozaki.so"))
    i32, i64, ptr, f64 = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_double
    lib.tables.argtypes = [ptr, ptr, ptr]
    lib.stats.argtypes = [i32, i32, ptr, i64, i64, ptr, ptr]
    lib.residues.argtypes = [i32, i32, i32, ptr, i64, i64, ptr, i32, i32, i32, ptr]
    for finish in (lib.finish16, lib.finish24, lib.finish36):
        finish.argtypes = [i32, i32, ptr, i64, i64, i32, ptr, i32, ptr, i32, f64, f64, ptr, i64]
    return lib


def _ints(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)


def test_the_cuda_tables_are_the_moduli_and_garners_constants(kernel_code):
    count = len(ozaki.MODULI)
    moduli, inverses = np.zeros(count, np.int32), np.zeros(count, np.int32)
    weights = np.zeros((count, count), np.int32)
    kernel_code.tables(moduli.ctypes.data, weights.ctypes.data, inverses.ctypes.data)
    assert tuple(moduli) == ozaki.MODULI
    garner_weights, garner_inverses = ozaki._garner(ozaki.MODULI)
    assert tuple(inverses) == garner_inverses
    assert all(tuple(weights[k, :k]) == garner_weights[k] for k in range(count))


def _stats(kernel_code, x, axis) -> tuple[np.ndarray, np.ndarray]:
    """The C++ stats of the rows (axis 1) or columns (axis 0) of ``x`` (a view into a wider
    buffer), read through strides as the kernels read a panel."""
    so, sk = (x.strides[0] // 8, 1) if axis == 1 else (1, x.strides[0] // 8)
    outer, depth = (x.shape[0], x.shape[1]) if axis == 1 else (x.shape[1], x.shape[0])
    emax, summary = np.zeros(outer, np.int32), np.zeros(2, np.int32)
    kernel_code.stats(outer, depth, x.ctypes.data, so, sk, emax.ctypes.data,
                      summary.ctypes.data)
    return emax, summary


@pytest.mark.parametrize("bits", [0, 30, 48])
def test_the_cuda_stats_and_residues_give_the_cpu_reference_bits(kernel_code, rng, bits):
    """Stats and residues of kernels/ozaki.cu (compiled for the CPU) against numpy, bit for
    bit: operands with leading dimensions wider than their rows, a zero row, K padded, the
    residues computed in two calls (the moduli a later block adds to a converted panel); the
    bits of the exact product, and those of the most moduli 'ozaki:N' takes."""
    w, r, h = 23, 41, 17
    a_store, b_store = _spread(rng, (w, r + 3), bits), _spread(rng, (r, h + 5), bits)
    a, b = a_store[:, :r], b_store[:, :h]
    a[4] = 0
    for how in (_exact(a, b), ozaki.plan_block(a, b, ozaki.MAX_MODULI)):  # the most bits
        _check_stats_and_residues(kernel_code, a, b, how)


def _check_stats_and_residues(kernel_code, a, b, how) -> None:
    r = a.shape[1]
    panels = {"A": (a, 1, how.bits_a), "B": (b, 0, how.bits_b)}
    pad = r + 7
    for x, axis, bits_x in panels.values():
        emax, summary = _stats(kernel_code, x, axis)
        want = ozaki.analyse(x, axis)
        np.testing.assert_array_equal(emax, want.emax.ravel())
        assert summary.tolist() == [want.spread, 0]
        outer = x.shape[0] if axis == 1 else x.shape[1]
        got = np.full((len(how.moduli), outer, pad), 99, np.int8)
        so, sk = (x.strides[0] // 8, 1) if axis == 1 else (1, x.strides[0] // 8)
        for first, n in ((0, 5), (5, len(how.moduli) - 5)):
            kernel_code.residues(outer, r, pad, x.ctypes.data, so, sk, emax.ctypes.data, bits_x,
                                 first, n, got.ctypes.data)
        shift = bits_x - want.emax
        residues = ozaki.residues(x, shift, how.moduli)
        np.testing.assert_array_equal(got[:, :, :r],
                                      residues if axis == 1 else residues.transpose(0, 2, 1))
        assert not got[:, :, r:].any()


def test_the_cuda_stats_see_infinities_and_nan(kernel_code, rng):
    x = rng.standard_normal((6, 9))
    x[2, 3], x[4, 0] = np.inf, np.nan
    for axis in (0, 1):
        _, summary = _stats(kernel_code, x, axis)
        assert summary[1] == 1 and not ozaki.analyse(x, axis).finite


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-1.5, 0.25), (1.0, 1.0)])
@pytest.mark.parametrize("bits", [0, 30])
def test_the_cuda_finish_gives_the_cpu_executors_bits(kernel_code, rng, bits, alpha, beta):
    """The fused finish (Garner's digits from the int32 products, the rounding, then alpha and
    beta) against ozaki.gemm and the CPU executor's arithmetic, bit for bit; beta == 0 never
    reads a poisoned C. Every instance that holds the moduli gives the same bits."""
    w, r, h = 19, 300, 13
    a, b = _spread(rng, (w, r), bits), _spread(rng, (r, h), bits)
    for how in (_exact(a, b), ozaki.plan_block(a, b), ozaki.plan_block(a, b, 16)):
        if how.native:  # the rule, on the wide range
            continue
        n = len(how.moduli)
        pa, pb = ozaki.analyse(a, 1), ozaki.analyse(b, 0)
        ra = ozaki.residues(a, how.bits_a - pa.emax, how.moduli)
        rb = ozaki.residues(b, how.bits_b - pb.emax, how.moduli)
        ldp = h + 3
        products = np.zeros((n, w, ldp), np.int32)
        for k, m in enumerate(how.moduli):
            products[k, :, :h] = ozaki._product(ra[k], rb[k], m)
        c = rng.standard_normal((w, h + 2))
        if beta == 0:
            c[:] = np.nan
        p, _ = ozaki.gemm(a, b, how=how)
        want = alpha * p if beta == 0 else beta * c[:, :h] + alpha * p
        for finish in ((kernel_code.finish36,) + ((kernel_code.finish24,) if n <= 24 else ())
                       + ((kernel_code.finish16,) if n <= 16 else ())):
            got = c.copy()
            finish(w, h, products.ctypes.data, ldp, w * ldp, n, _ints(pa.emax.ravel()).ctypes.data,
                   how.bits_a, _ints(pb.emax.ravel()).ctypes.data, how.bits_b, alpha, beta,
                   got.ctypes.data, h + 2)
            np.testing.assert_array_equal(got[:, :h].view(np.int64), want.view(np.int64))
            np.testing.assert_array_equal(got[:, h:], c[:, h:])


@pytest.mark.parametrize("count", [22, 36])
def test_the_cuda_rounding_is_correct_ties_included(kernel_code, rng, count):
    """Products whose digits are those of hard roundings (ties, sticky bits), through the
    fused finish: the correctly rounded values."""
    moduli = ozaki.MODULI[:count]
    digits, exps, want = _hard_roundings(rng, moduli)
    values = [sum(int(v) * math.prod(moduli[:k]) for k, v in enumerate(column))
              for column in digits.T]
    # each product an int32 of its class, as the int8 GEMMs give them
    products = _ints([[x % m - m * int(rng.integers(0, 2**20)) for x in values] for m in moduli])
    emax_a, emax_b = _ints(exps), _ints([0])
    out = np.empty(len(values))
    kernel_code.finish36(len(values), 1, products.ctypes.data, 1, len(values), count,
                         emax_a.ctypes.data, 0, emax_b.ctypes.data, 0, 1.0, 0.0,
                         out.ctypes.data, 1)
    np.testing.assert_array_equal(out, want)


# -- kernel='ozaki' in the out-of-core schedule (the CPU executor) -------------------------------

def _panels(a, b, splits) -> np.ndarray:
    """What the schedule computes with one K panel a block: the correctly rounded product of
    each panel, summed in float64 in panel order."""
    total = None
    for k0, k1 in zip(splits, splits[1:]):
        part = ozaki.gemm(a[:, k0:k1], b[k0:k1])[0]
        total = part if total is None else total + part
    return total


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_the_kernel_runs_every_block_emulated(rng, workdir, trans_a, trans_b):
    """Ragged blocks, transposed operands, a Zarr output: one K panel, so every element is
    the correctly rounded product, bitwise; the result counts the emulated GEMMs."""
    import zarr

    a, b = _spread(rng, (45, 70), 8), _spread(rng, (70, 38), 8)
    x = np.ascontiguousarray(a.T) if trans_a else a
    y = np.ascontiguousarray(b.T) if trans_b else b
    r = oocgemm.multiply(x, y, "c.zarr", trans_a=trans_a, trans_b=trans_b, device="cpu",
                         kernel="ozaki", tile=(16, 16, 70))
    got = zarr.open_array("c.zarr", mode="r")[...]
    np.testing.assert_array_equal(got, ozaki.gemm(a, b)[0])
    p, q, _ = r.plan.grid
    assert sum(r.emulation.values()) == p * q
    assert all(key.startswith("ozaki, ") for key in r.emulation)
    assert _error(got, a, b) <= _error(a @ b, a, b)


def test_the_kernel_keeps_blas_semantics_panel_by_panel(rng):
    """Several K panels, alpha and beta: each panel's product correctly rounded, scaled and
    added as the native path does; beta == 0 never reads a poisoned C."""
    a, b, c = _spread(rng, (40, 90), 8), _spread(rng, (90, 30), 8), rng.standard_normal((40, 30))
    r = oocgemm.multiply(a, b, c=c, alpha=-1.5, beta=0.25, device="cpu", kernel="ozaki",
                         tile=(40, 30, 30))
    assert r.plan.k_splits == (0, 30, 60, 90)
    want = 0.25 * c  # the first panel: C scaled, then alpha times its product added
    for k0, k1 in zip(r.plan.k_splits, r.plan.k_splits[1:]):
        want = want + -1.5 * ozaki.gemm(a[:, k0:k1], b[k0:k1])[0]
    np.testing.assert_array_equal(r.out, want)
    poisoned = np.full((40, 30), np.nan)
    oocgemm.multiply(a, b, poisoned, device="cpu", kernel="ozaki", tile=(40, 30, 30))
    np.testing.assert_array_equal(poisoned, _panels(a, b, r.plan.k_splits))


def test_the_kernel_says_which_blocks_ran_native(rng):
    a, b = rng.standard_normal((32, 20)), rng.standard_normal((20, 24))
    a[3, 4] = np.inf
    r = oocgemm.multiply(a, b, device="cpu", kernel="ozaki", tile=(16, 24, 20))
    native = {k: n for k, n in r.emulation.items() if k.startswith("native")}
    assert sum(native.values()) == 1 and "infinities" in next(iter(native))
    np.testing.assert_array_equal(np.isinf(r.out), np.isinf(a @ b))


def test_other_dtypes_stay_on_their_native_gemm(rng):
    """The scheme emulates float64: float32 products stay on SGEMM (complex ones on their
    own GEMM), emulating nothing."""
    for dtype in (np.float32, np.complex128):
        a = rng.standard_normal((8, 8)).astype(dtype)
        r = oocgemm.multiply(a, a, device="cpu", kernel="ozaki:16")
        assert r.plan.kernel == "cublas" and r.emulation == {}
        np.testing.assert_allclose(r.out, a @ a, rtol=1e-5)


def test_the_kernel_is_in_the_json_of_plan_and_result(rng):
    a = rng.standard_normal((20, 20))
    r = oocgemm.multiply(a, a, device="cpu", kernel="ozaki")
    summary = r.summary()
    assert summary["kernel"] == "ozaki" and sum(summary["emulation"].values()) == 1
    assert oocgemm.multiply(a, a, device="cpu").summary()["emulation"] == {}


def test_fewer_moduli_by_name(rng):
    """'ozaki:N' runs every block with N moduli: 16 stay within 4x of native DGEMM's error on
    these inputs (benchmarks/ozaki_moduli.py), 12 do not; the name is checked."""
    a, b = _spread(rng, (32, 2048), 8), _spread(rng, (2048, 24), 8)
    native = _error(a @ b, a, b)
    r16 = oocgemm.multiply(a, b, device="cpu", kernel="ozaki:16", tile=(32, 24, 2048))
    r12 = oocgemm.multiply(a, b, device="cpu", kernel="ozaki:12", tile=(32, 24, 2048))
    assert r16.emulation == {"ozaki, 16 moduli": 1} and r16.plan.kernel == "ozaki:16"
    assert _error(r16.out, a, b) <= 4 * native < _error(r12.out, a, b)
    np.testing.assert_array_equal(r16.out, ozaki.gemm(a, b, moduli=16)[0])
    for bad in ("ozaki:0", "ozaki:x", "ozaki:37", "ozaki:99"):
        with pytest.raises(oocgemm.OptionError, match="ozaki:N"):
            oocgemm.multiply(a, b, device="cpu", kernel=bad)


# -- the GPU's plans (no GPU needed: the planner is pure) ----------------------------------------

def _gpu_plan(kernel, tile, k=40000, limit=64 << 30):
    from oocgemm.devices import Device
    from oocgemm.planning import Operand, Plan, Problem, cuda_model
    from oocgemm.runtime.cuda_executor import CudaExecutor

    def operand(shape):
        return Operand(shape, None, False, "x", zero_copy=True)

    prob = Problem(m=5000, n=3000, k=k, itemsize=8, dtype="float64", a=operand((5000, k)),
                   b=operand((k, 3000)), c=None, out=operand((5000, 3000)), alpha=1.0, beta=0.0,
                   trans_a=False, trans_b=False)
    model = cuda_model()
    return Plan(problem=prob, device=Device("cuda", 0), model=model, tile=tile, memory_limit=limit,
                host_memory_limit=limit, staged=True, kernel=kernel,
                staging=CudaExecutor.staging(prob, model, kernel))


def test_an_emulating_gpu_plan_counts_its_converted_panels():
    """Each A and B slot keeps its panel's residues (a byte a modulus, K padded to 16) and
    its rows' exponents beside it, and two chunks of int32 products are kept: all in the
    plan's device bytes, and named when they do not fit."""
    w, h, r = 1000, 700, 1234
    native, emulated = _gpu_plan("cublas", (w, h, r)), _gpu_plan("ozaki:16", (w, h, r))
    buf = emulated.buffers
    assert (emulated.staging.n_a, emulated.staging.n_b, emulated.staging.ramp) == (2, 2, 0)
    assert buf.a_converted == 16 * w * 1248 + 4 * w and buf.b_converted == 16 * h * 1248 + 4 * h
    assert buf.emulation == 2 * 4 * 16 * w * 700  # w < 2048 rows a chunk; h a multiple of 4
    assert emulated.device_bytes == (2 * buf.c + 2 * (buf.a + buf.a_converted)
                                     + 2 * (buf.b + buf.b_converted) + buf.emulation)
    assert native.buffers.emulation == 0
    exact = _gpu_plan("ozaki", (w, h, r)).buffers  # room for the most moduli the rule takes
    assert exact.a_converted == ozaki.reserved_moduli(None) * w * 1248 + 4 * w
    with pytest.raises(oocgemm.BudgetError, match="converted A 2x"):
        _gpu_plan("ozaki:16", (w, h, r), limit=emulated.device_bytes - 1).validate()


def test_an_emulating_gpu_plan_keeps_its_k_panels_exact_in_int32():
    """K panels of at most MAX_DEPTH, so that the int8 products sum exactly in int32: the
    planner picks no deeper one, and a deeper tile is refused."""
    from oocgemm.planning import choose_tile

    deep = ozaki.MAX_DEPTH + 1000
    plan = _gpu_plan("ozaki:16", (64, 64, 64), k=deep)
    staging = {key: getattr(plan.staging, key) for key in (
        "n_stage", "n_out", "split_last", "ramp", "tail_panels", "n_a", "n_b", "min_stripes")}
    tile = choose_tile(plan.problem, plan.model, 64 << 30, 64 << 30, staged=True,
                       strategy=plan.strategy, **staging)
    assert tile[2] <= ozaki.MAX_DEPTH
    with pytest.raises(oocgemm.OptionError, match="at most 131071"):
        _gpu_plan("ozaki:16", (64, 64, deep), k=deep).validate()
    _gpu_plan("cublas", (64, 64, deep), k=deep).validate()


def test_the_model_charges_the_finish_per_k_panel():
    """Emulated plans gain from deep K panels, which native ones hardly do: the finish runs
    once per K panel over the whole of C."""
    def compute(kernel, r):
        return _gpu_plan(kernel, (2500, 3000, r)).prediction.compute

    assert compute("ozaki:16", 2000) / compute("ozaki:16", 20000) > 1.1
    assert compute("cublas", 2000) / compute("cublas", 20000) < 1.1

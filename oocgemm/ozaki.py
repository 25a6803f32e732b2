"""Ozaki scheme II: a float64 block product from exact integer products modulo small moduli
(issue 21). This is the CPU reference of the arithmetic; the GPU is to run the same steps with
int8 tensor-core GEMMs and match it bit for bit.

For ``C = A @ B`` (A: w x r, B: r x h, float64):

1. **Scale to integers.** Row i of A is scaled by ``2^(p_a - E_i)``, where ``2^E_i`` bounds
   the row's magnitudes (``frexp`` of its largest), and rounded to the nearest integer:
   ``A'_ik = rint(A_ik 2^(p_a - E_i))``, so ``|A'| <= 2^p_a``. Column j of B likewise with
   ``p_b``. Scaling by a power of two is exact and ``rint`` is exact, so A' and B' are float64
   integers; the only error of the method is this rounding, ``2^(E_i - p_a - 1)`` at most per
   element of A (the final rounding aside).
2. **Residues.** For moduli ``m_1..m_N`` (pairwise coprime, at most 256), the residues
   ``A'_l = A' mod m_l`` in the symmetric range ``[-m_l/2, m_l/2)`` fit int8. ``fmod`` of
   float64 integers is exact (IEEE), on the CPU and the GPU alike.
3. **Exact products.** ``C_l = A'_l @ B'_l``: sums of ``r`` products of at most ``2^14``, exact
   in int32 for ``r <= 2^17`` (int8 tensor cores); on the CPU, exact in float64 BLAS as well
   (every partial sum is an integer below ``2^53``, whatever the order).
4. **Reconstruction.** The Chinese remainder theorem gives ``A'B' mod M`` (``M = prod m_l``)
   from the ``C_l mod m_l``; moduli with ``M > 2 r 2^(p_a + p_b)`` make it ``A'B'`` itself, in
   the symmetric range. Here in exact integers (Python's); on the GPU in multi-word integers.
5. **Back to float64.** ``C_ij = A'B'_ij 2^(E_i - p_a + F_j - p_b)``, rounded once to nearest
   (``float`` of an integer is correctly rounded; the power of two is exact unless the result
   is subnormal).

So the result is the exactly rounded product of the scaled, rounded operands: its error is
that of representing each row of A (column of B) on ``p_a`` (``p_b``) bits below its largest
element. ``p = 53 + spread`` bits, with ``spread`` the exponent range of the row's nonzero
elements (capped), keeps every element's own 53 bits; the moduli follow from the bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import OptionError


def _coprime_moduli(limit: int = 256, count: int = 40) -> tuple[int, ...]:
    """The greedy choice from ``limit`` down of ``count`` pairwise coprime numbers."""
    chosen: list[int] = []
    m = limit
    while len(chosen) < count and m > 1:
        if all(math.gcd(m, c) == 1 for c in chosen):
            chosen.append(m)
        m -= 1
    return tuple(chosen)


#: The moduli, largest first: pairwise coprime, at most 256, so that residues in the symmetric
#: range fit int8.
MODULI: tuple[int, ...] = _coprime_moduli()

#: The most bits an operand is given (beyond: its block falls back to native DGEMM).
MAX_BITS = 53 + 60


@dataclass(frozen=True)
class Emulation:
    """How one block was (or is to be) emulated."""

    bits_a: int
    """Bits of each row of A below its largest element (p_a)."""
    bits_b: int
    """Bits of each column of B (p_b)."""
    moduli: tuple[int, ...]
    """The moduli used; empty where the block fell back to native DGEMM."""
    reason: str = ""
    """Why the block fell back to native DGEMM ('' where it did not)."""

    @property
    def native(self) -> bool:
        return not self.moduli


def moduli_for(bits_a: int, bits_b: int, r: int) -> tuple[int, ...]:
    """The fewest moduli (largest first) whose product exceeds ``2 r 2^(bits_a + bits_b)``:
    enough for the exact integer product of a block with ``r`` columns of A."""
    need = bits_a + bits_b + max(r, 1).bit_length() + 1
    product, chosen = 1, []
    for m in MODULI:
        if product.bit_length() > need:
            break
        chosen.append(m)
        product *= m
    if product.bit_length() <= need:
        raise OptionError(f"ozaki: {bits_a} + {bits_b} bits over {r} terms need more than the "
                          f"{len(MODULI)} moduli there are")
    return tuple(chosen)


def _spread(x: np.ndarray, axis: int) -> int:
    """The largest exponent range among the nonzero elements of a row (axis 1) or column
    (axis 0) of ``x``."""
    mags = np.abs(x)
    nonzero = mags > 0
    if not nonzero.any():
        return 0
    _, exps = np.frexp(np.where(nonzero, mags, 1.0))
    hi = np.where(nonzero, exps, np.iinfo(np.int32).min).max(axis=axis)
    lo = np.where(nonzero, exps, np.iinfo(np.int32).max).min(axis=axis)
    valid = hi >= lo
    return int((hi - lo)[valid].max()) if valid.any() else 0


def plan_block(a: np.ndarray, b: np.ndarray, moduli: int | None = None) -> Emulation:
    """How to emulate ``a @ b``: the bits that keep each element's 53 bits below its row's
    (column's) largest, and the moduli for them; or native DGEMM, with the reason, where the
    operands are not finite or need more bits than ``MAX_BITS``. ``moduli``: use that many
    moduli instead, the bits split evenly between A and B."""
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return Emulation(0, 0, (), "infinities or NaN (native DGEMM propagates them)")
    r = a.shape[1]
    if moduli is not None:
        if not 1 <= moduli <= len(MODULI):
            raise OptionError(f"moduli must be 1 to {len(MODULI)}, got {moduli}")
        product = math.prod(MODULI[:moduli])
        bits = (product.bit_length() - 3 - max(r, 1).bit_length()) // 2
        if bits < 1:
            raise OptionError(f"{moduli} moduli leave no bits for {r} terms")
        return Emulation(bits, bits, MODULI[:moduli])
    bits_a, bits_b = 53 + _spread(a, 1), 53 + _spread(b, 0)
    if max(bits_a, bits_b) > MAX_BITS:
        return Emulation(bits_a, bits_b, (),
                         f"an exponent range of {max(bits_a, bits_b) - 53} bits in a row or "
                         f"column (at most {MAX_BITS - 53} emulated)")
    return Emulation(bits_a, bits_b, moduli_for(bits_a, bits_b, r))


def _scaled(x: np.ndarray, bits: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``x`` scaled per row (axis 1) or column (axis 0) to integers of at most ``bits`` bits,
    and the shift of each row (column): x ~ scaled * 2^-shift."""
    largest = np.abs(x).max(axis=axis, keepdims=True) if x.size else np.zeros((1, 1))
    _, exps = np.frexp(largest)  # |x| < 2^exps along the row (column); 0 for a zero row
    shift = (bits - exps).astype(np.int64)
    return np.rint(np.ldexp(x, shift)), shift


def _residues(x: np.ndarray, m: int) -> np.ndarray:
    """``x mod m`` in ``[-m/2, m/2)`` (exact: ``fmod`` of float64 integers), as int8."""
    r = np.fmod(x, m)  # in (-m, m), the sign of x
    r = np.where(r >= m / 2, r - m, r)
    r = np.where(r < -m / 2, r + m, r)
    return r.astype(np.int8)


def gemm(a: np.ndarray, b: np.ndarray, moduli: int | None = None
         ) -> tuple[np.ndarray, Emulation]:
    """``a @ b`` (float64) by Ozaki scheme II, and how it was done; native where
    :func:`plan_block` says so."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    how = plan_block(a, b, moduli)
    if how.native:
        return a @ b, how
    ia, shift_a = _scaled(a, how.bits_a, 1)
    ib, shift_b = _scaled(b, how.bits_b, 0)
    m_all = math.prod(how.moduli)
    total = np.zeros(a.shape[0] * b.shape[1], dtype=object)
    for m in how.moduli:
        # exact: integers below 2^53 whatever the summation order
        c = (_residues(ia, m).astype(np.float64) @ _residues(ib, m).astype(np.float64))
        c = np.fmod(c, m).astype(np.int64).ravel()
        rest = m_all // m
        weight = rest * pow(rest, -1, m)  # 1 mod m, 0 mod the other moduli
        total += c.astype(object) * weight
    out = np.empty(total.shape, dtype=np.float64)
    half = m_all // 2
    exps = (-(shift_a + shift_b)).ravel()  # the scale of each element of C
    for n, value in enumerate(total):
        v = int(value) % m_all
        if v >= half:
            v -= m_all
        try:
            out[n] = math.ldexp(float(v), int(exps[n]))
        except OverflowError:  # beyond float64, as native DGEMM overflows
            out[n] = math.copysign(math.inf, v)
    return out.reshape(a.shape[0], b.shape[1]), how

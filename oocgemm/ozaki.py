"""Ozaki scheme II: a float64 block product from exact integer products modulo small moduli
(issue 21). This is the CPU reference of the arithmetic; the GPU is to run the same steps with
int8 tensor-core GEMMs and match it bit for bit.

For ``C = A @ B`` (A: w x r, B: r x h, float64), in steps that are each one elementwise pass
(one kernel of ``kernels/ozaki.cu``) but for the GEMMs, all exact but the last:

1. **Scale to integers** (:func:`shifts`, :func:`residues`). Row i of A is scaled by
   ``2^(p_a - E_i)``, where ``2^E_i`` bounds the row's magnitudes (``frexp`` of its largest),
   and rounded to the nearest integer: ``A'_ik = rint(A_ik 2^(p_a - E_i))``, so
   ``|A'| <= 2^p_a``. Column j of B likewise with ``p_b``. Scaling by a power of two is exact
   and ``rint`` is exact, so A' and B' are float64 integers; the only error of the method is
   this rounding, ``2^(E_i - p_a - 1)`` at most per element of A (the final rounding aside).
2. **Residues** (:func:`residues`). For moduli ``m_0..m_(N-1)`` (pairwise coprime, at most
   256, ``m_0 = 256``), ``A' mod m`` in ``[-(m//2), (m+1)//2)`` fits int8; int64 arithmetic
   on ``A' = s 2^e`` computes it.
3. **Exact products** (:func:`_product`). ``C_l = A'_l @ B'_l``: sums of ``r`` products of at
   most ``2^14``, exact in int32 for ``r <= MAX_DEPTH`` (int8 tensor cores; float64 BLAS
   here, exact as well).
4. **Garner's digits** (:func:`digit`). The balanced mixed-radix digits ``v_k`` of
   ``A'B' = sum v_k P_k`` (``P_k = m_0 ... m_(k-1)``), one modulus at a time, in int32 and
   int64; moduli with ``M = prod m_l > 2 r 2^(p_a + p_b)`` make them the digits of ``A'B'``
   itself, sign included.
5. **One rounding** (:func:`rounded`). ``|A'B'|`` in 26-bit limbs by Horner's rule over the
   digits, its top 104 bits and a sticky bit, one float64 addition (the rounding to nearest,
   ties to even), and ``ldexp`` by ``E_i - p_a + F_j - p_b`` (exact unless the result is
   subnormal).

So the result is the exactly rounded product of the scaled, rounded operands: its error is
that of representing each row of A (column of B) on ``p_a`` (``p_b``) bits below its largest
element, and the final rounding. How many bits (:func:`rule_bits`): every nonzero element of a
row whose exponent range is ``spread`` is at least ``2^(E_i - spread - 1)``, so rounding it at
``2^(E_i - p - 1)`` changes it by a relative ``2^(spread - p)`` at most. With
``p = 53 + spread - d``, ``d = max(floor(log2 r) - 2, 0)``, that is ``eps = 2^d u <= r u / 4``
(``u = 2^-53``), and the block's error is at most ``(u (1 + eps)^2 + 2 eps + eps^2) |A||B| <=
gamma_r |A||B|`` (``gamma_r = r u / (1 - r u)``): native DGEMM's own error bound, element for
element. (``d = 0`` keeps every element's 53 bits: the exact product, rounded once.) The moduli
follow from the bits; a panel that needs more than :data:`RULE_MODULI` runs native DGEMM, as
accurate and faster.
"""

from __future__ import annotations

import functools
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

#: The most moduli the rule (``kernel="ozaki"``) takes; a panel that needs more runs native
#: DGEMM. In the time of one DGEMM the H100's int8 tensor cores, under its power cap, run
#: fewer than 20 int8 GEMMs, so past 19 the emulation cannot keep up (docs/performance.md,
#: "Ozaki scheme II on the GPU").
RULE_MODULI = 19

#: The most moduli 'ozaki:N' takes (the GPU's largest finishing kernel, ``ozaki_finish36``).
MAX_MODULI = 36

#: The deepest block whose int8 x int8 products sum exactly in int32 (|residue| <= 128, so
#: r 2^14 < 2^31); deeper ones run in slices of this depth.
MAX_DEPTH = 2**17 - 1


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


def reserved_moduli(moduli: int | None) -> int:
    """The most moduli a block may use: ``moduli`` where given ('ozaki:N'), else the most the
    rule takes. What the GPU keeps room for."""
    return moduli if moduli is not None else RULE_MODULI


def rule_bits(spread: int, r: int) -> int:
    """The bits the rule gives the rows (columns) of an operand panel whose largest exponent
    range in a row is ``spread``, in a block of depth ``r``: ``53 + spread - d`` with
    ``d = max(floor(log2 r) - 2, 0)``, which keeps the block's error within native DGEMM's
    bound ``gamma_r |A||B|`` (the module's docstring)."""
    return 53 + spread - max(max(r, 1).bit_length() - 3, 0)


#: The GPU's converted panels pad K to this many elements (zeros), and the int32 products
#: C's columns to a multiple of ``N_ALIGN``: 16-byte rows, what the int8 tensor-core kernels
#: of cuBLAS want.
K_ALIGN, N_ALIGN = 16, 4

#: Rows of C whose int32 products (one plane a modulus) the GPU holds in each of its two
#: buffers: one chunk's products are finished while the next chunk's int8 GEMMs run. The
#: int8 GEMMs ran near their best rate with 2048 rows, and slower with fewer rows and a
#: shallower K (docs/performance.md, "Ozaki scheme II on the GPU").
CHUNK_ROWS = 2048


def padded(n: int, align: int) -> int:
    return -(-n // align) * align


@dataclass(frozen=True)
class Footprint:
    """GPU memory that emulated products keep beside a plan's slots (bytes)."""

    a: int
    """Each A slot's converted panel: its residues and its rows' exponents."""
    b: int
    """Each B slot's converted panel."""
    scratch: int
    """The int32 products of two chunks of C's rows, a plane a modulus each."""
    rows: int
    """Rows of C in a chunk."""


def footprint(w: int, h: int, r: int, moduli: int | None) -> Footprint:
    """What an emulated plan with tile (w, h, r) keeps on the GPU, with room for
    :func:`reserved_moduli` moduli."""
    n = reserved_moduli(moduli)
    depth = padded(r, K_ALIGN)
    rows = min(w, CHUNK_ROWS)
    return Footprint(a=n * w * depth + 4 * w, b=n * h * depth + 4 * h,
                     scratch=2 * 4 * n * rows * padded(h, N_ALIGN), rows=rows)


@dataclass(frozen=True)
class Panel:
    """What the emulation reads off an operand panel before converting it (the GPU's
    ``ozaki_stats_*`` kernels compute the same)."""

    emax: np.ndarray | None
    """The exponent (``frexp``) of each row's (axis 1) or column's (axis 0) largest magnitude,
    int32, kept as a dimension; 0 for a zero row. (None where it stays on the GPU.)"""
    spread: int
    """The largest exponent range among the nonzero elements of a row (column)."""
    finite: bool
    """No infinity or NaN anywhere."""


def analyse(x: np.ndarray, axis: int) -> Panel:
    """:class:`Panel` of the rows (``axis=1``) or columns (``axis=0``) of ``x``. A maximum,
    a minimum and ``frexp`` are exact, so any reduction order gives the same numbers."""
    mags = np.abs(x)
    finite = bool(np.isfinite(mags).all())
    mags = np.where(np.isfinite(mags), mags, 0.0) if not finite else mags
    emax = _largest_exponent(mags, axis)
    nonzero = mags > 0
    _, lows = np.frexp(np.where(nonzero, mags, np.inf).min(axis=axis, keepdims=True,
                                                            initial=np.inf))
    spreads = np.where(nonzero.any(axis=axis, keepdims=True), emax - lows, 0)
    return Panel(emax, int(spreads.max(initial=0)), finite)


def plan_pair(a: Panel, b: Panel, r: int, moduli: int | None = None) -> Emulation:
    """How to emulate the product of an A panel (``r`` columns) and a B panel, from what
    :func:`analyse` read off them: the bits of :func:`rule_bits`, within native DGEMM's
    error bound, and the moduli for them; or native DGEMM, with the reason, where the
    operands are not finite, a row's (column's) exponent range passes ``MAX_BITS - 53`` or
    the bits need more than ``RULE_MODULI`` moduli. ``moduli``: use that many moduli
    instead, the bits split evenly between A and B, at most ``MAX_BITS`` each (no bound: as
    accurate as the bits)."""
    if not (a.finite and b.finite):
        return Emulation(0, 0, (), "infinities or NaN (native DGEMM propagates them)")
    if moduli is not None:
        if not 1 <= moduli <= MAX_MODULI:
            raise OptionError(f"moduli must be 1 to {MAX_MODULI}, got {moduli}")
        product = math.prod(MODULI[:moduli])
        # at most MAX_BITS, like the rule: the GPU tables 2^e mod m for e up to MAX_BITS - 53
        bits = min((product.bit_length() - 3 - max(r, 1).bit_length()) // 2, MAX_BITS)
        if bits < 1:
            raise OptionError(f"{moduli} moduli leave no bits for {r} terms")
        return Emulation(bits, bits, MODULI[:moduli])
    bits_a, bits_b = rule_bits(a.spread, r), rule_bits(b.spread, r)
    if max(a.spread, b.spread) > MAX_BITS - 53:
        return Emulation(bits_a, bits_b, (),
                         f"an exponent range of {max(a.spread, b.spread)} bits in a row or "
                         f"column (at most {MAX_BITS - 53} emulated)")
    chosen = moduli_for(bits_a, bits_b, r)
    if len(chosen) > RULE_MODULI:
        return Emulation(bits_a, bits_b, (),
                         f"{len(chosen)} moduli needed (past {RULE_MODULI}, native DGEMM is "
                         f"faster)")
    return Emulation(bits_a, bits_b, chosen)


def plan_block(a: np.ndarray, b: np.ndarray, moduli: int | None = None) -> Emulation:
    """:func:`plan_pair` for the block ``a @ b``."""
    return plan_pair(analyse(a, 1), analyse(b, 0), a.shape[1], moduli)


def shifts(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The shift of each row (axis 1) or column (axis 0) of ``x`` (int32, kept as a dimension):
    ``2^shift`` brings the row's largest magnitude into ``[2^(bits-1), 2^bits)`` (a zero row:
    ``bits``)."""
    return bits - _largest_exponent(np.abs(x), axis)


def _largest_exponent(mags: np.ndarray, axis: int) -> np.ndarray:
    """The ``frexp`` exponent of the largest of ``mags`` along ``axis`` (int32, kept as a
    dimension; 0 where all are zero). A maximum and ``frexp`` are exact, so any reduction
    order gives the same numbers."""
    _, exps = np.frexp(mags.max(axis=axis, keepdims=True, initial=0.0))
    return exps.astype(np.int32)


def _balanced_mod(x: np.ndarray, m: int) -> np.ndarray:
    """``x mod m`` in ``[-(m//2), (m+1)//2)``, as int8 (int64 ``x``, ``m <= 256``): the floor
    modulo of ``x + m//2``, less ``m//2``. numpy divides by a constant with a multiply
    (libdivide) but computes ``%`` with a division: ``y - (y // m) m`` is several times
    faster than ``y % m`` (docs/performance.md, "Figures moved from the code's docstrings")."""
    y = x + m // 2
    return (y - (y // m) * m - m // 2).astype(np.int8)


def residues(x: np.ndarray, shift: np.ndarray, moduli: tuple[int, ...]) -> np.ndarray:
    """``x' = rint(x 2^shift)`` modulo each modulus, in ``[-(m//2), (m+1)//2)``, as int8
    (moduli x rows x columns). All exact, in integers: ``x'`` (a float64 integer of up to
    ``bits`` bits) is ``s 2^e`` with ``|s| < 2^53`` an int64 and ``e >= 0``, and
    ``x' mod m = s (2^e mod m) mod m``, a product below ``2^61``. (``fmod`` of the float64 is
    exact too, but much slower in numpy; any exact method gives these residues.)"""
    scaled = np.rint(np.ldexp(x, shift))
    _, top = np.frexp(scaled)
    e = np.maximum(top - 53, 0)
    s = np.ldexp(scaled, -e).astype(np.int64)
    out = np.empty((len(moduli), *x.shape), dtype=np.int8)
    powers = range(int(e.max(initial=0)) + 1)
    for n, m in enumerate(moduli):
        out[n] = _balanced_mod(s * np.take([pow(2, p, m) for p in powers], e), m)
    return out


def _product(ra: np.ndarray, rb: np.ndarray, m: int) -> np.ndarray:
    """``ra @ rb`` for int8 residues modulo ``m``, exact, as int32: the int32 that int8 tensor
    cores give. float64 BLAS runs it (numpy's integer matmul has no BLAS and is far
    slower); every partial sum is an integer of at most ``MAX_DEPTH 2^14 < 2^31``, so exact
    in float64 whatever the order, and the int32 is the same number. Deeper blocks run in
    slices of ``MAX_DEPTH``, the sum so far reduced modulo ``m`` before each slice is added:
    the result is then another int32 of the same class modulo ``m``, which is all that
    :func:`digit` reads."""
    c = (ra[:, :MAX_DEPTH].astype(np.float64) @ rb[:MAX_DEPTH].astype(np.float64)
         ).astype(np.int32)
    for k in range(MAX_DEPTH, ra.shape[1], MAX_DEPTH):
        part = (ra[:, k:k + MAX_DEPTH].astype(np.float64)
                @ rb[k:k + MAX_DEPTH].astype(np.float64)).astype(np.int32)
        c = c % m + part
    return c


@functools.lru_cache
def _garner(moduli: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Garner's constants: ``weights[k][j] = P_j mod m_k`` for ``j < k`` and
    ``inverses[k] = P_k^-1 mod m_k``, where ``P_k = m_0 ... m_(k-1)``."""
    weights = tuple(tuple(math.prod(moduli[:j]) % m for j in range(k))
                    for k, m in enumerate(moduli))
    inverses = tuple(pow(math.prod(moduli[:k]) % m, -1, m) for k, m in enumerate(moduli))
    return weights, inverses


def digit(k: int, c: np.ndarray, digits: np.ndarray, moduli: tuple[int, ...]) -> np.ndarray:
    """Garner's ``k``-th mixed-radix digit of the product, ``v_k`` in ``[-(m_k//2),
    (m_k+1)//2)`` (int8), from ``c = A'B' mod m_k`` (any int32 of the class) and the digits
    before it (``digits[:k]``): ``A'B' = sum v_k P_k``. With balanced digits this sum ranges
    over ``[-M/2, M/2)`` (only ``m_0 = 256`` is even), which holds ``A'B'`` by the choice of
    moduli, so the digits are those of the product itself, sign included. Exact in integers:
    ``t = sum_j v_j (P_j mod m_k)`` is below ``2^21`` (int32), and ``(c - t) P_k^-1`` below
    ``2^40`` (int64), reduced by one floor modulo."""
    m = moduli[k]
    weights, inverses = _garner(moduli)
    t = np.zeros(c.shape, dtype=np.int32)
    for j in range(k):
        t += digits[j] * np.int32(weights[k][j])
    return _balanced_mod((c.astype(np.int64) - t) * inverses[k], m)


#: Bits of a limb of :func:`rounded`'s exact integers: a limb times a radix below ``2^24``
#: plus a carry stays below ``2^51`` in int64, and two limbs make an integer exact in float64.
LIMB = 26

#: Elements of C that :func:`gemm` rounds at a time, which bounds the memory of the limbs (up
#: to 13 int64 an element) and keeps them in cache.
ROUNDED_ELEMENTS = 2**16


def _groups(digits: np.ndarray, moduli: tuple[int, ...]) -> list[tuple[np.ndarray, int]]:
    """The digits three at a time, low first: ``(D_g, R_g)`` with
    ``D_g = v_3g + m_3g (v_3g+1 + m_3g+1 v_3g+2)`` (int64, ``|D_g| < R_g / 2``) and
    ``R_g = m_3g m_3g+1 m_3g+2 < 2^24``, so that ``A'B' = D_0 + R_0 (D_1 + R_1 (...))``."""
    out = []
    for g in range(0, len(moduli), 3):
        value = np.zeros(digits.shape[1:], dtype=np.int64)
        for k in reversed(range(g, min(g + 3, len(moduli)))):
            value = value * moduli[k] + digits[k]
        out.append((value, math.prod(moduli[g:g + 3])))
    return out


def rounded(digits: np.ndarray, moduli: tuple[int, ...], exps: np.ndarray) -> np.ndarray:
    """``(sum_k v_k P_k) 2^exps`` correctly rounded to float64 (ties to even; rounded twice where
    subnormal), from Garner's digits. Integers throughout but for one float64 addition and
    ``ldexp``, so the GPU gets the same bits whatever its order of integer operations:

    1. The sign is that of the top nonzero group (balanced digits: it outweighs all below).
    2. ``|A'B'|`` by Horner's rule over the groups, from the top, in limbs of ``LIMB`` bits
       (int64, low limb first; the arithmetic shift carries borrows of negative groups).
    3. The top nonzero limb ``t`` and the three below it (zeros below limb 0) make
       ``a = L_t 2^26 + L_t-1`` and ``b = L_t-2 2^26 + L_t-3`` (exact, below ``2^52``); any
       nonzero limb further down sets the last bit of ``b`` (a sticky bit: ``b``'s exact bits
       reach at least 2 below the 53 kept, so this decides ties as the discarded limbs would).
    4. ``fl(a 2^52 + b)``, the one rounding, times the sign, then
       ``ldexp(., LIMB (t - 3) + exps)``.
    """
    groups = _groups(digits, moduli)
    sign = np.zeros(digits.shape[1:], dtype=np.int64)
    for value, _ in groups:
        sign = np.where(value != 0, np.sign(value), sign)
    limbs = np.zeros((math.prod(moduli).bit_length() // LIMB + 1, *digits.shape[1:]),
                     dtype=np.int64)
    bound = 1
    for value, radix in reversed(groups):
        bound *= radix  # |the suffix so far| < bound: the limbs above stay zero
        carry = sign * value
        for i in range(bound.bit_length() // LIMB + 1):
            x = limbs[i] * radix + carry
            limbs[i] = x & ((1 << LIMB) - 1)
            carry = x >> LIMB
    nonzero = limbs != 0
    top = len(limbs) - 1 - np.argmax(nonzero[::-1], axis=0)  # 0 where all limbs are
    padded = np.concatenate([np.zeros((3, *limbs.shape[1:]), dtype=np.int64), limbs])
    below = np.concatenate([np.zeros((4, *limbs.shape[1:]), dtype=bool),
                            np.logical_or.accumulate(nonzero, axis=0)])

    def at(index: np.ndarray, array: np.ndarray) -> np.ndarray:
        return np.take_along_axis(array, index[None], axis=0)[0]

    a = at(top + 3, padded) << LIMB | at(top + 2, padded)
    b = at(top + 1, padded) << LIMB | at(top, padded) | at(top, below)
    value = a.astype(np.float64) * 2.0**(2 * LIMB) + b.astype(np.float64)
    return np.ldexp(sign * value, LIMB * (top - 3) + exps)


def gemm(a: np.ndarray, b: np.ndarray, moduli: int | None = None, *,
         how: Emulation | None = None) -> tuple[np.ndarray, Emulation]:
    """``a @ b`` (float64) by Ozaki scheme II, and how it was done; native where
    :func:`plan_block` says so. ``how``: emulate as that says instead (decided on the whole
    panels a row stripe ``a`` of a block comes from: the shifts are per row, so the stripe's
    rows get those of the whole panel)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if how is None:
        how = plan_block(a, b, moduli)
    if how.native:
        return a @ b, how
    shift_a, shift_b = shifts(a, how.bits_a, 1), shifts(b, how.bits_b, 0)
    ra, rb = residues(a, shift_a, how.moduli), residues(b, shift_b, how.moduli)
    digits = np.empty((len(how.moduli), a.shape[0], b.shape[1]), dtype=np.int8)
    for k, m in enumerate(how.moduli):
        digits[k] = digit(k, _product(ra[k], rb[k], m), digits, how.moduli)
    exps = -(shift_a + shift_b)
    out = np.empty(digits.shape[1:])
    rows = max(1, ROUNDED_ELEMENTS // max(b.shape[1], 1))
    with np.errstate(over="ignore"):  # beyond float64: infinity, as native DGEMM overflows
        for i in range(0, a.shape[0], rows):
            out[i:i + rows] = rounded(digits[:, i:i + rows], how.moduli, exps[i:i + rows])
    return out, how

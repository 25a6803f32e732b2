"""Check a product without recomputing it: Freivalds' test.

For random vectors x, ``C x`` must equal ``alpha op(A) (op(B) x) + beta C_in x``. Each side costs
a few matrix-vector products, O(n²) time, and the matrices are streamed in bands of whole stored
rows (whole chunk rows for Zarr, so that each chunk is decoded once), so memory stays bounded
whatever their size. A wrong element of C changes its row of ``C x`` unless x is orthogonal to
the error, which random normal vectors almost never are; ``rounds`` independent vectors make
that chance vanish.

The tolerance is the rounding a correct product and the check itself carry, row by row, in
its probabilistic form (rounding errors of a sum of K terms grow like sqrt(K) eps, not K eps;
Higham and Mary 2019): ``LAMBDA sqrt(K + 2) eps_c |alpha| (|A| (|B| |x|))`` for the product
computed in the compute dtype (eps_c its machine epsilon), ``LAMBDA eps_c |C| |x|`` for C
rounded to its dtype, ``2 LAMBDA eps_c |beta| |C_in| |x|``, and the check's own float64 sums. A
correct float64 4096² product sits about 1e-5 of it; one element changed by 1e-6 of the largest
is about 300 |x_j| times over it, so two rounds miss it with probability under 1e-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import OptionError, ShapeError
from .storage import MatrixSource, open_source
from .typing import MatrixLike, Scalar

#: Bytes of one band of stored rows read at a time (rounded to whole chunk rows).
BAND_BYTES = 256 << 20
#: How many standard deviations of accumulated rounding the tolerance allows.
LAMBDA = 8.0


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`; truthy exactly when the check passed."""

    ok: bool
    rounds: int
    worst_ratio: float
    """Largest residual over its tolerance, over rows and rounds (<= 1 passes)."""
    worst_row: int
    """The row of C where that is (-1 for an empty product)."""
    worst_rows: tuple[int, int]
    """The band of C's stored rows (its chunk rows, or a band of this check) holding it."""
    residual: float
    """The residual there, |C x - (alpha A B x + beta C_in x)|."""
    tolerance: float
    """Its tolerance."""
    unchecked: int = 0
    """Rows of C the test cannot check: their side ``alpha A B x + beta C_in x`` is not
    finite (an inf or NaN in the inputs, or an overflow). Not passed while any is."""

    def __bool__(self) -> bool:
        return self.ok

    @property
    def inconclusive(self) -> bool:
        """Nothing it checked failed, but some rows it could not check (:attr:`unchecked`)."""
        return bool(self.unchecked) and self.worst_ratio <= 1.0

    def __str__(self) -> str:
        where = (f"worst at row {self.worst_row} (rows {self.worst_rows[0]}:{self.worst_rows[1]}): "
                 f"residual {self.residual:.3g} against tolerance {self.tolerance:.3g}, "
                 f"ratio {self.worst_ratio:.3g}")
        outcome = ("passed" if self.ok else
                   f"cannot check {self.unchecked} row(s): not finite on the inputs' side (inf "
                   f"or NaN in a, b or c_in, or an overflow)" if self.inconclusive else "FAILED")
        return f"verify: {outcome} ({self.rounds} random vectors); {where}"


def _bands(src, rows_total: int, cols: int):
    """Row ranges of whole stored rows, whole chunk rows where the source has chunks, about
    BAND_BYTES each."""
    itemsize = np.dtype(src.dtype).itemsize
    step = max(1, BAND_BYTES // max(1, cols * itemsize))
    if src.chunks:
        unit = src.chunks[0]
        step = max(unit, step // unit * unit)
    for lo in range(0, rows_total, step):
        yield lo, min(lo + step, rows_total)


def _read(src, lo: int, hi: int, cols: int, dtype) -> np.ndarray:
    band = np.empty((hi - lo, cols), dtype=dtype)
    src.read((lo, hi), (0, cols), band)
    return band


def _apply(src, x: np.ndarray, transposed: bool, dtype, x_abs: np.ndarray | None = None):
    """(M @ x, |M| @ x_abs) in one pass, M the stored matrix or its transpose, read in bands
    of whole stored rows; ``x_abs`` defaults to |x|."""
    rows, cols = src.shape
    out_rows = cols if transposed else rows
    y = np.zeros((out_rows, x.shape[1]), dtype=dtype)
    y_abs = np.zeros((out_rows, x.shape[1]), dtype=np.float64)
    x_abs = np.abs(x) if x_abs is None else x_abs
    for lo, hi in _bands(src, rows, cols):
        band = _read(src, lo, hi, cols, dtype)
        if transposed:
            y += band.T @ x[lo:hi]
            y_abs += np.abs(band).T @ x_abs[lo:hi]
        else:
            y[lo:hi] = band @ x
            y_abs[lo:hi] = np.abs(band) @ x_abs
    return y, y_abs


def random_vectors(n: int, rounds: int, complex_: bool, seed) -> np.ndarray:
    """Random signs (and signs times i): every entry of x has the same magnitude, so an error
    in one element of C shows in full in its row of ``C x``. (Gaussian entries near zero hid
    an error of a fifth of max|C| in one element from two rounds in 1.4% of the draws.)"""
    rng = np.random.default_rng(seed)
    x = rng.choice((-1.0, 1.0), size=(n, rounds))
    if complex_:
        x = x + 1j * rng.choice((-1.0, 1.0), size=(n, rounds))
    return x


class CInSide:
    """What the check needs of ``beta C_in`` (or nothing), computed before C is overwritten
    when C is updated in place."""

    def __init__(self, value=None, value_abs=None):
        self.value, self.value_abs = value, value_abs


def prepare_c_in(c_in, x: np.ndarray, *, storage_options=None) -> CInSide:
    """``C_in x`` and ``|C_in| |x|`` (for a product that will overwrite C_in in place)."""
    if c_in is None:
        return CInSide()
    src = open_source(c_in, "c_in", storage_options)
    try:
        complex_ = np.dtype(src.dtype).kind == "c" or x.dtype.kind == "c"
        return CInSide(*_apply(src, x, False, _wide(complex_)))
    finally:
        src.close()


def _wide(complex_: bool) -> np.dtype:
    """The dtype the check computes in."""
    return np.dtype(np.complex128 if complex_ else np.float64)


def verify(a: MatrixLike, b: MatrixLike, c: MatrixLike, *, alpha: Scalar = 1.0,
           beta: Scalar = 0.0, c_in: MatrixLike | None = None, trans_a: bool = False,
           trans_b: bool = False, rounds: int = 2, seed: int | None = None,
           storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """Freivalds' check that ``c == alpha * op(a) @ op(b) + beta * c_in``.

    Parameters are those of :func:`oocgemm.multiply` (paths, URLs or arrays); ``c`` is the
    product to check and ``c_in`` the C it was computed from (needed when ``beta != 0``).
    ``rounds`` random vectors (2 make a wrong result pass with negligible probability);
    ``seed`` makes them reproducible.

    Returns a :class:`VerifyReport`, truthy exactly when the check passes.
    """
    return verify_run(a, b, c, alpha=alpha, beta=beta, c_in=c_in, trans_a=trans_a,
                      trans_b=trans_b, rounds=rounds, seed=seed,
                      storage_options=storage_options)


def verify_run(a: MatrixLike, b: MatrixLike, c: MatrixLike, *, alpha: Scalar = 1.0,
               beta: Scalar = 0.0, c_in: MatrixLike | None = None, trans_a: bool = False,
               trans_b: bool = False, rounds: int = 2, seed: int | None = None,
               storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """:func:`verify`: the operands opened, checked (:func:`verify_sources`) and closed."""
    fs = None if storage_options is None else dict(storage_options)
    srcs = {"a": open_source(a, "a", fs), "b": open_source(b, "b", fs),
            "c": open_source(c, "c", fs)}
    try:
        return verify_sources(srcs["a"], srcs["b"], srcs["c"], alpha=alpha, beta=beta,
                              c_in=c_in, trans_a=trans_a, trans_b=trans_b, rounds=rounds,
                              seed=seed, storage_options=fs)
    finally:
        for src in srcs.values():
            src.close()


def verify_sources(a: MatrixSource, b: MatrixSource, c: MatrixSource, *, alpha: Scalar = 1.0,
                   beta: Scalar = 0.0, c_in: MatrixLike | None = None,
                   trans_a: bool = False, trans_b: bool = False, rounds: int = 2,
                   seed: int | None = None, vectors: np.ndarray | None = None,
                   c_in_side: CInSide | None = None,
                   storage_options: Mapping[str, Any] | None = None) -> VerifyReport:
    """:func:`verify` of operands already open (sources, :mod:`oocgemm.storage`: a run's own,
    which ``multiply(verify=True)`` checks its product with before the commit, left open).
    ``vectors`` (:func:`random_vectors`) and ``c_in_side`` (:func:`prepare_c_in`) may be
    taken before the product is computed: an update in place overwrites C_in."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise OptionError(f"rounds must be a positive integer, got {rounds!r}")
    from .arguments import check_dtype, check_matrix, scalar

    alpha, beta = scalar("alpha", alpha), scalar("beta", beta)
    if beta != 0 and c_in is None and c_in_side is None:
        raise OptionError("beta != 0: pass c_in=, the C the product was computed from")
    srcs = {"a": a, "b": b, "c": c}
    for role, src in srcs.items():
        check_matrix(role, src)
        check_dtype(role, src.dtype)
    m, k = a.shape[::-1] if trans_a else a.shape
    k2, n = b.shape[::-1] if trans_b else b.shape
    if k != k2 or tuple(c.shape) != (m, n):
        raise ShapeError(f"op(a) is {(m, k)}, op(b) is {(k2, n)}, c is "
                         f"{tuple(c.shape)}: not a product of these shapes")
    compute = np.result_type(a.dtype, b.dtype)
    complex_ = (compute.kind == "c" or np.dtype(c.dtype).kind == "c"
                or isinstance(alpha, complex) or isinstance(beta, complex))
    wide = _wide(complex_)
    x = vectors if vectors is not None else random_vectors(n, rounds, complex_, seed)
    fs = None if storage_options is None else dict(storage_options)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return _judged(srcs, x, alpha, beta, c_in, trans_a, trans_b, k, n, rounds, wide,
                       compute, fs, c_in_side)


def _judged(srcs, x, alpha, beta, c_in, trans_a, trans_b, k, n, rounds, wide, compute, fs,
            c_in_side) -> VerifyReport:
    """:func:`verify`'s sides and their comparison, row by row (non-finite values are
    judged, not warned of)."""
    bx, bx_abs = _apply(srcs["b"], x, trans_b, wide)
    abx, abx_abs = _apply(srcs["a"], bx, trans_a, wide, x_abs=bx_abs)
    cx, cx_abs = _apply(srcs["c"], x, False, wide)
    want = alpha * abx
    eps_c = np.finfo(compute).eps
    eps = np.finfo(np.float64).eps
    size = abs(alpha) * abx_abs  # x's entries are of one magnitude: bounds every |C_ij|
    tol_in = LAMBDA * np.sqrt(k + 2) * (eps_c + eps) * size
    if beta != 0:
        side = c_in_side if c_in_side is not None else prepare_c_in(
            c_in, x, storage_options=fs)
        want = want + beta * side.value
        size = size + abs(beta) * side.value_abs
        tol_in = tol_in + LAMBDA * 2 * eps_c * abs(beta) * side.value_abs
    tol = tol_in + LAMBDA * (eps_c + np.sqrt(n + 2) * eps) * cx_abs + np.finfo(np.float64).tiny
    residual = np.abs(cx - want)
    # A row whose inputs' side is not finite, or whose terms may overflow, cannot be checked
    # (counted apart); elsewhere a ratio that is not finite is C's doing (a NaN or inf in
    # it), and fails the check.
    checkable = (np.isfinite(want) & np.isfinite(size)).all(axis=1)  # by row
    ratio = residual / tol
    ratio = np.where(checkable[:, None], np.where(np.isfinite(ratio), ratio, np.inf), 0.0)
    if ratio.size == 0:
        return VerifyReport(True, rounds, 0.0, -1, (0, 0), 0.0, 0.0)
    unchecked = int(np.count_nonzero(~checkable))
    row, col = (int(i) for i in np.unravel_index(int(np.argmax(ratio)), ratio.shape))
    if unchecked and ratio[row, col] <= 1.0:  # point at the first row it cannot check
        row, col = int(np.flatnonzero(~checkable)[0]), 0
    rows_of_c = int(srcs["c"].shape[0])
    unit = int(srcs["c"].chunks[0]) if srcs["c"].chunks else max(1, rows_of_c)
    band = (int(row // unit * unit), min(rows_of_c, int(row // unit + 1) * unit))
    worst = float(ratio[row, col])
    return VerifyReport(ok=bool(worst <= 1.0 and not unchecked), rounds=rounds,
                        worst_ratio=worst, worst_row=int(row), worst_rows=band,
                        residual=float(residual[row, col]), tolerance=float(tol[row, col]),
                        unchecked=unchecked)

"""How many moduli Ozaki scheme II needs to be as accurate as native DGEMM (issue 21).

    python -m benchmarks.ozaki_moduli R    # blocks of 64 x R x 64

For inputs with exponents spread over 2^0, 2^8 and 2^30, the error max |C - C_ref| / (|A||B|)
(C_ref in np.longdouble) of native DGEMM, of ``oocgemm.ozaki.gemm`` with the moduli its rule
chooses (exact products, rounded once), and with 12 to 22 moduli given (``moduli=``: the
operands rounded to the bits those moduli hold), the last as multiples of native's error.
"""

from __future__ import annotations

import sys

import numpy as np

from oocgemm import ozaki


def spread(rng, shape, bits: int) -> np.ndarray:
    """Normal values times 2^u, u uniform in [-bits/2, bits/2]."""
    return np.ldexp(rng.standard_normal(shape), rng.integers(-bits // 2, bits // 2 + 1, shape))


def error(c, ref, scale) -> float:
    return float(np.max(np.abs(c - ref) / np.where(scale > 0, scale, 1)))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    r = int(argv[0]) if argv else 4096
    rng = np.random.default_rng(0)
    for bits in (0, 8, 30):
        a, b = spread(rng, (64, r), bits), spread(rng, (r, 64), bits)
        ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
        scale = np.abs(a) @ np.abs(b)
        native = error(a @ b, ref, scale)
        exact, how = ozaki.gemm(a, b)
        row = [f"spread 2^{bits}: native {native:.1e}; the rule: {len(how.moduli)} moduli, "
               f"{error(exact, ref, scale) / native:.2g}x;"]
        for m in range(12, 23):
            row.append(f"{m}: {error(ozaki.gemm(a, b, moduli=m)[0], ref, scale) / native:.2g}x")
        print(" ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

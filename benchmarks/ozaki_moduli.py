"""How many moduli Ozaki scheme II needs to be as accurate as native DGEMM (issue 21).

    python -m benchmarks.ozaki_moduli R    # blocks of 64 x R x 64

For inputs with exponents spread over 2^0, 2^8 and 2^30, the error max |C - C_ref| / (|A||B|)
(C_ref in np.longdouble) of native DGEMM, of ``oocgemm.ozaki.gemm`` with the moduli its rule
chooses (exact products, rounded once), and with 12 to 22 moduli given (``moduli=``: the
operands rounded to the bits those moduli hold), the last as multiples of native's error.
"""

import sys

import numpy as np

from oocgemm import ozaki


def spread(rng, shape, bits):
    return np.ldexp(rng.standard_normal(shape), rng.integers(-bits // 2, bits // 2 + 1, shape))
def err(c, a, b, ref, scale):
    return float(np.max(np.abs(c - ref) / np.where(scale > 0, scale, 1)))
rng = np.random.default_rng(0)
w, r, h = 64, int(sys.argv[1]), 64
for bits in (0, 8, 30):
    a, b = spread(rng, (w, r), bits), spread(rng, (r, h), bits)
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    scale = np.abs(a) @ np.abs(b)
    native = err(a @ b, a, b, ref, scale)
    auto, how = ozaki.gemm(a, b)
    row = [f"spread 2^{bits}: native {native:.1e}; auto {len(how.moduli)} moduli {err(auto,a,b,ref,scale):.1e};"]
    for m in range(12, 23, 1):
        c, h2 = ozaki.gemm(a, b, moduli=m)
        e = err(c, a, b, ref, scale)
        row.append(f"{m}:{e/native:.2g}x")
    print(" ".join(row), flush=True)

"""Quickstart: two matrices on disk, their product on disk, checked against numpy.

    python examples/quickstart.py [WORKDIR]

Writes a.zarr (600x400), b.npy (400x500) and c.zarr under WORKDIR (a temporary directory by
default), multiplies them with a small memory limit so that the product runs in many blocks,
prints the plan and the result, and checks C against numpy.
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np
import zarr

import oocgemm


def main(workdir: str) -> float:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((600, 400))
    b = rng.standard_normal((400, 500))
    a_path, b_path, c_path = (os.path.join(workdir, name) for name in ("a.zarr", "b.npy", "c.zarr"))
    stored = zarr.create_array(a_path, shape=a.shape, chunks=(100, 100), dtype=a.dtype,
                               overwrite=True)
    stored[:] = a
    np.save(b_path, b)

    # A 2 MB budget forces a tiling into several C blocks and K panels.
    print(oocgemm.plan(a_path, b_path, device="cpu", memory_limit="2MB"))
    result = oocgemm.multiply(a_path, b_path, out=c_path, device="cpu", memory_limit="2MB",
                              overwrite=True)
    print(result)

    c = zarr.open_array(c_path, mode="r")[:]
    error = float(np.abs(c - a @ b).max() / np.abs(a @ b).max())
    print(f"max relative error against numpy: {error:.2e}")
    if error > 1e-12:
        raise SystemExit(f"quickstart: result differs from numpy ({error:.2e})")
    return error


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)

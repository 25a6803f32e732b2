"""device='cuda' against the CPU executor; skipped where no GPU is found."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


CASES = [
    # dtype, (m, n, k), tile, alpha, beta, trans_a, trans_b
    ("float64", (37, 23, 41), (8, 8, 8), 1.0, 0.0, False, False),
    ("float64", (37, 23, 41), (8, 8, 8), -1.5, 0.5, True, True),
    ("float64", (64, 48, 80), None, 1.0, 1.0, False, True),
    ("float32", (64, 48, 80), (16, 32, 8), 2.0, -1.0, True, False),
    ("complex128", (20, 30, 10), (7, 9, 4), 1 - 1j, 0.5, False, False),
    ("float64", (1, 1, 1), None, 1.0, 0.0, False, False),
    ("float64", (30, 20, 0), None, 1.0, 2.0, False, False),    # K == 0: beta * C
    ("float64", (30, 20, 10), (8, 8, 8), 0.0, -2.0, False, False),  # alpha == 0
]


@pytest.mark.parametrize("dtype,shape,tile,alpha,beta,trans_a,trans_b", CASES)
def test_cuda_matches_cpu(rng, dtype, shape, tile, alpha, beta, trans_a, trans_b):
    m, n, k = shape
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    c = rand(rng, (m, n), dtype) if beta != 0 else poisoned((m, n), dtype)
    if alpha == 0:
        a, b = poisoned(a.shape, dtype), poisoned(b.shape, dtype)
    kw = dict(c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, tile=tile)
    gpu = oocgemm.multiply(a, b, poisoned((m, n), dtype), device="cuda", **kw)
    cpu = oocgemm.multiply(a, b, device="cpu", **kw)
    assert gpu.plan.staged and str(gpu.plan.device).startswith("cuda")
    check = dict(alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype)
    assert_gemm(gpu.out, a, b, c, **check)
    assert_gemm(cpu.out, a, b, c, **check)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(gpu.out, cpu.out, rtol=rtol, atol=rtol * max(1, k))
    assert len(gpu.events) == len(gpu.plan.schedule.ops)


def test_cuda_zarr_round_trip(rng, workdir):
    import zarr

    a, b = rand(rng, (50, 40)), rand(rng, (40, 30))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 16))[:] = a
    r = oocgemm.multiply("a.zarr", b, "c.zarr", device="cuda", tile=(16, 16, 16))
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)
    assert r.bytes["h2d"] > 0 and r.bytes["d2h"] > 0


def test_cuda_small_memory_limit(rng):
    a, b = rand(rng, (64, 64)), rand(rng, (64, 64))
    r = oocgemm.multiply(a, b, device="cuda", memory_limit="60KB")  # two whole C's need 64 KB
    assert r.plan.device_bytes <= 60_000 and r.plan.n_blocks > 1
    assert_gemm(r.out, a, b)

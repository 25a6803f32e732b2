"""The kernels of kernels/ on a GPU: against the float64 reference (and so cuBLAS) on ragged
shapes, every transpose, alpha/beta case and access path, alone and inside the out-of-core
pipeline. Skipped where no GPU is found."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda
from oocgemm import kernel_catalog as catalog
from oocgemm.errors import KernelError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]

NAMES = list(catalog.KERNELS)
SHAPES = [(1, 1, 1), (7, 13, 5), (129, 131, 17), (200, 130, 1001), (256, 256, 256),
          (300, 64, 3)]
SCALARS = [(1.0, 0.0), (-0.5, 0.0), (1.5, 1.0), (2.0, -0.75)]


def _launch(name, a, b, c, alpha, beta, trans_a, trans_b, *, offset: int = 0):
    """Run kernel ``name`` on host arrays through device copies; ``offset`` (elements) shifts
    every operand off its 16-byte alignment, forcing the scalar access path."""
    import cupy

    from oocgemm.cuda import kernels

    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    dev = {}
    for key, x in (("a", a), ("b", b), ("c", c)):
        buf = cupy.empty(x.size + offset, dtype=x.dtype)
        buf[offset:] = cupy.asarray(x).ravel()
        dev[key] = buf
    size = c.dtype.itemsize
    kernels.gemm(name, m, n, k, alpha, dev["a"].data.ptr + offset * size, a.shape[1],
                 dev["b"].data.ptr + offset * size, b.shape[1], beta,
                 dev["c"].data.ptr + offset * size, n, dtype=c.dtype, trans_a=trans_a,
                 trans_b=trans_b)
    cupy.cuda.Device().synchronize()
    return cupy.asnumpy(dev["c"][offset:]).reshape(m, n)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_all_cases(rng, name, shape):
    m, n, k = shape
    for dtype in catalog.KERNELS[name].dtypes:
        for (alpha, beta), trans_a, trans_b in itertools.product(SCALARS, (False, True),
                                                                 (False, True)):
            a = rand(rng, (k, m) if trans_a else (m, k), dtype)
            b = rand(rng, (n, k) if trans_b else (k, n), dtype)
            c = rand(rng, (m, n), dtype) if beta != 0 else poisoned((m, n), dtype)
            for offset in (0, 1):
                got = _launch(name, a, b, c, alpha, beta, trans_a, trans_b, offset=offset)
                assert_gemm(got, a, b, c, alpha=alpha, beta=beta, trans_a=trans_a,
                            trans_b=trans_b, dtype=dtype)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_agrees_with_cublas_at_size(rng, name):
    import cupy

    from benchmarks.in_core import gemm_arrays

    a = cupy.asarray(rand(rng, (1000, 1000)))
    b = cupy.asarray(rand(rng, (1000, 1000)))
    c = cupy.full((1000, 1000), cupy.nan)
    gemm_arrays(name, a, b, c)
    ref = cupy.matmul(a, b)
    assert float(cupy.abs(c - ref).max()) / float(cupy.abs(ref).max()) < 1e-12


@pytest.mark.parametrize("name", NAMES)
def test_kernel_in_the_pipeline(rng, name):
    """Every block of a many-block out-of-core product runs the kernel (ragged tiles, stripes
    of the tail panels, C updated in place with beta)."""
    m, n, k = 301, 257, 523
    for trans_a, trans_b in ((False, False), (True, True)):
        a = rand(rng, (k, m) if trans_a else (m, k))
        b = rand(rng, (n, k) if trans_b else (k, n))
        c = rand(rng, (m, n))
        r = oocgemm.multiply(a, b, poisoned((m, n)), c=c, alpha=0.75, beta=-1.25,
                             trans_a=trans_a, trans_b=trans_b, device="cuda", kernel=name,
                             tile=(128, 96, 64))
        assert r.plan.kernel == name and r.plan.grid[0] * r.plan.grid[1] > 4
        assert_gemm(r.out, a, b, c, alpha=0.75, beta=-1.25, trans_a=trans_a, trans_b=trans_b)


def test_kernel_and_cublas_pipelines_agree(rng):
    a, b = rand(rng, (700, 900)), rand(rng, (900, 500))
    ref = oocgemm.multiply(a, b, device="cuda", tile=(256, 256, 256)).out
    got = oocgemm.multiply(a, b, device="cuda", tile=(256, 256, 256), kernel="dmma").out
    np.testing.assert_allclose(got, ref, rtol=1e-11, atol=1e-11 * 900)


def test_compile_error_carries_the_log(tmp_path, monkeypatch):
    from oocgemm.cuda import kernels

    broken = tmp_path / "kernels"
    broken.mkdir()
    (broken / "naive.cu").write_text(
        "template <typename T, bool TA, bool TB, bool VEC>\n"
        "__global__ void naive_gemm(int M, int N, int K, T alpha, const T* A, int lda,\n"
        "    const T* B, int ldb, T beta, T* C, int ldc) { this_is_not_cuda; }\n")
    monkeypatch.setenv("OOCGEMM_KERNELS", str(broken))
    with pytest.raises(KernelError, match="this_is_not_cuda"):
        kernels.function("naive", "float64", False, False, False)


def test_measuring_build_is_kept_apart_from_the_product(rng):
    """A build of `python -m benchmarks power` computes something else (on purpose), and the
    product's build, compiled after it, is still right: the defines key the compile cache."""
    import cupy

    from benchmarks.in_core import gemm_arrays

    a, b = rand(rng, (256, 256)), rand(rng, (256, 256))
    ref = a @ b
    da, db = cupy.asarray(a), cupy.asarray(b)
    for name in ("opt", "regblock"):
        c = cupy.full((256, 256), cupy.nan)
        gemm_arrays(name, da, db, c, defines=(("OOCGEMM_STAGING", 2),))
        assert not np.allclose(cupy.asnumpy(c), ref)
        c.fill(cupy.nan)
        gemm_arrays(name, da, db, c)
        np.testing.assert_allclose(cupy.asnumpy(c), ref, rtol=1e-12, atol=1e-12)

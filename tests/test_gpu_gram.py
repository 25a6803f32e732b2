"""Gram products on a GPU: X read once for both roles, the blocks on and above the diagonal
computed (SYRK on a diagonal block's rows, its lower triangle mirrored on the device, a block
above the diagonal transposed on the device into the block across), bitwise symmetric, the
same answer as the CPU executor's. Skipped where no GPU is found."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("trans_a", [True, False])
@pytest.mark.parametrize("tile", [(64, 64, 96), None])
def test_gram_on_the_gpu(rng, dtype, trans_a, tile):
    x = rand(rng, (517, 203) if trans_a else (203, 517), dtype)
    out = poisoned((203, 203), dtype)
    result = oocgemm.multiply(x, x, out, device="cuda", trans_a=trans_a, trans_b=not trans_a,
                              tile=tile)
    assert result.plan.staged and result.plan.symmetric
    assert np.array_equal(out, out.T)
    assert_gemm(out, x, x, trans_a=trans_a, trans_b=not trans_a, dtype=dtype)
    gemm_flops = sum(e.flops for e in result.events if e.kind == "gemm")
    assert gemm_flops == result.plan.flops < result.plan.problem.flops * 0.75
    assert len(result.events) == len(result.plan.schedule.ops)


@pytest.mark.parametrize("alpha,beta", [(0.5, 1.0), (-2.0, -0.5)])
def test_gram_alpha_beta_c_on_the_gpu(rng, alpha, beta):
    x = rand(rng, (300, 150))
    c = rand(rng, (150, 150))
    out = poisoned((150, 150))
    oocgemm.multiply(x, x, out, c=c, alpha=alpha, beta=beta, device="cuda", trans_a=True,
                     tile=(64, 64, 100))
    assert_gemm(out, x, x, c, alpha=alpha, beta=beta, trans_a=True)


def test_gram_zarr_on_the_gpu_reads_each_chunk_once(rng, workdir):
    zarr = pytest.importorskip("zarr")
    x = rand(rng, (2000, 300))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(256, 300))[:] = x
    result = oocgemm.multiply("x.zarr", "x.zarr", device="cuda", trans_a=True,
                              tile=(128, 128, 512))
    assert result.chunks["A"]["decodes"] == result.chunks["A"]["chunks"]
    assert np.array_equal(result.out, result.out.T)
    cpu = oocgemm.multiply("x.zarr", "x.zarr", device="cpu", trans_a=True, tile=(128, 128, 512))
    np.testing.assert_allclose(result.out, cpu.out, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("rows", [40960, 39001])  # whole chunks, and a ragged last one
def test_tall_skinny_gram_decodes_chunks_into_the_pinned_ring(rng, workdir, rows):
    """X^T X of a tall zstd X whose chunks span its columns: the planner's plan decodes each
    chunk once, on a reader thread, straight into a pinned ring buffer (no decoded chunk
    held, nothing copied out of one); the same C as the CPU's, bitwise symmetric."""
    zarr = pytest.importorskip("zarr")
    x = rand(rng, (rows, 256))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(4096, 256),
                      compressors=zarr.codecs.ZstdCodec(level=1))[:] = x
    out = poisoned((256, 256))
    result = oocgemm.multiply("x.zarr", "x.zarr", out, device="cuda", trans_a=True)
    assert result.plan.io.into_ring == ("A", "B"), str(result.plan)
    report = result.chunks["A"]
    assert report["into_ring"] and report["decodes"] == report["chunks"] == -(-rows // 4096)
    assert report["peak_bytes"] == 0 and report["copy_seconds"] == 0
    assert np.array_equal(out, out.T)
    assert_gemm(out, x, x, trans_a=True)


def test_gram_on_every_gpu(rng):
    if cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = rand(rng, (400, 256))
    one = oocgemm.multiply(x, x, device="cuda:0", trans_a=True, tile=(64, 64, 128))
    every = oocgemm.multiply(x, x, device="cuda:all", trans_a=True, tile=(64, 64, 128))
    assert np.array_equal(one.out, every.out)

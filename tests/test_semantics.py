"""GEMM semantics (BLAS xGEMM rules) and ragged / degenerate shapes, on the CPU executor."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, poisoned, rand

import oocgemm

ALPHAS = [1.0, 2.5, -0.75, 0.0]
BETAS = [0.0, 1.0, -0.5, 2.0]


def operands(rng, m, n, k, trans_a=False, trans_b=False, dtype="float64"):
    a = rand(rng, (k, m) if trans_a else (m, k), dtype)
    b = rand(rng, (n, k) if trans_b else (k, n), dtype)
    return a, b


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_alpha_beta_transposes(rng, alpha, beta, trans_a, trans_b):
    m, n, k = 13, 11, 17
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    if alpha == 0:  # BLAS: A and B are not referenced; NaN would leak through NaN * 0
        a, b = poisoned(a.shape), poisoned(b.shape)
    # BLAS: beta == 0 means C is not referenced
    c = rand(rng, (m, n)) if beta != 0 else poisoned((m, n))
    out = poisoned((m, n))
    r = oocgemm.multiply(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                         trans_b=trans_b, tile=(4, 3, 5), device="cpu")
    assert r.out is out
    assert_gemm(out, a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
    assert r.plan.grid == ((4, 4, 4) if alpha != 0 else (4, 4, 0))


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
@pytest.mark.parametrize("alpha", [1.0, -2.0])
def test_default_output_is_a_new_numpy_array(rng, alpha, beta):
    a, b = operands(rng, 9, 14, 6)
    c = rand(rng, (9, 14))
    r = oocgemm.multiply(a, b, c=c, alpha=alpha, beta=beta, tile=(2, 5, 4), device="cpu")
    assert type(r.out) is np.ndarray and r.out.dtype == np.float64
    assert_gemm(r.out, a, b, c, alpha=alpha, beta=beta)


def test_beta_zero_never_reads_c_even_when_c_is_given(rng):
    a, b = operands(rng, 8, 7, 5)
    c = poisoned((8, 7))
    r = oocgemm.multiply(a, b, c=c, beta=0.0, tile=(3, 3, 2), device="cpu")
    assert_gemm(r.out, a, b)
    assert all(e.operand != "C" or e.kind != "read" for e in r.events)


def test_beta_zero_ignores_poisoned_existing_out_array(rng):
    a, b = operands(rng, 10, 6, 7)
    out = poisoned((10, 6))
    oocgemm.multiply(a, b, out, tile=(3, 4, 2), device="cpu")
    assert_gemm(out, a, b)


@pytest.mark.parametrize("suffix", [".npy", ".zarr"])
def test_beta_zero_ignores_poisoned_existing_out_path(rng, workdir, suffix):
    a, b = operands(rng, 10, 6, 7)
    if suffix == ".npy":
        np.save("out.npy", poisoned((10, 6)))
    else:
        zarr.create_array("out.zarr", shape=(10, 6), dtype="f8",
                          chunks=(3, 3))[:] = poisoned((10, 6))
    r = oocgemm.multiply(a, b, "out" + suffix, overwrite=True, tile=(3, 4, 2), device="cpu")
    assert_gemm(r.out[:], a, b)


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_alpha_zero_reads_neither_a_nor_b(rng, beta):
    m, n, k = 9, 8, 11
    a, b = poisoned((m, k)), poisoned((k, n))
    c = rand(rng, (m, n))
    out = poisoned((m, n))
    r = oocgemm.multiply(a, b, out, c=c, alpha=0.0, beta=beta, tile=(4, 3, 5), device="cpu")
    np.testing.assert_array_equal(out, beta * c)  # exact: no product is computed
    assert r.flops == 0
    assert not [e for e in r.events if e.operand in ("A", "B") or e.kind == "gemm"]


def test_alpha_zero_never_opens_a_corrupt_chunk(rng, workdir):
    """A and B are Zarr arrays whose chunks are garbage: reading them would fail."""
    m, n, k = 12, 10, 9
    for name, shape in (("a.zarr", (m, k)), ("b.zarr", (k, n))):
        z = zarr.create_array(name, shape=shape, dtype="f8", chunks=(4, 4))
        z[:] = rand(rng, shape)
    for chunk in (workdir / "a.zarr" / "c").rglob("*"):
        if chunk.is_file():
            chunk.write_bytes(b"not a chunk")
    c = rand(rng, (m, n))
    r = oocgemm.multiply("a.zarr", "b.zarr", c=c, alpha=0.0, beta=-1.5, tile=(5, 4, 3),
                         device="cpu")
    np.testing.assert_array_equal(r.out, -1.5 * c)
    with pytest.raises(oocgemm.OOCGemmError, match="corrupt or truncated"):
        oocgemm.multiply("a.zarr", "b.zarr", tile=(5, 4, 3), device="cpu")


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_k_zero_gives_beta_c(rng, beta):
    m, n = 7, 5
    a, b = np.empty((m, 0)), np.empty((0, n))
    c = rand(rng, (m, n)) if beta != 0 else poisoned((m, n))
    out = poisoned((m, n))
    r = oocgemm.multiply(a, b, out, c=c, beta=beta, tile=(3, 2, 4), device="cpu")
    np.testing.assert_array_equal(out, beta * c if beta != 0 else np.zeros((m, n)))
    assert r.flops == 0


@pytest.mark.parametrize("trans_a", [False, True])
def test_k_zero_transposed(rng, trans_a):
    a = np.empty((0, 6)) if trans_a else np.empty((6, 0))
    b = np.empty((0, 4))
    c = rand(rng, (6, 4))
    r = oocgemm.multiply(a, b, c=c, alpha=3.0, beta=0.25, trans_a=trans_a, device="cpu")
    np.testing.assert_array_equal(r.out, 0.25 * c)


@pytest.mark.parametrize("out_kind", [None, ".npy", ".zarr"])
@pytest.mark.parametrize("m,n,k", [(0, 5, 4), (5, 0, 4), (0, 0, 3), (0, 5, 0)])
def test_empty_output(rng, workdir, m, n, k, out_kind):
    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    c = rand(rng, (m, n))
    out = None if out_kind is None else "out" + out_kind
    r = oocgemm.multiply(a, b, out, c=c, beta=0.5, device="cpu")
    assert r.out.shape == (m, n)
    assert r.flops == 0 and r.plan.n_blocks == 0


SHAPES = [
    # (m, n, k, tile)
    (1, 1, 1, None),
    (1, 1, 1, (1, 1, 1)),
    (1, 1, 1, (8, 8, 8)),
    (1, 9, 1, (1, 2, 1)),
    (9, 1, 1, (2, 1, 1)),
    (6, 7, 1, (4, 3, 1)),
    (1, 1, 13, (1, 1, 4)),
    (37, 23, 41, None),
    (37, 23, 41, (3, 5, 2)),       # 13 x 5 blocks, 21 panels
    (37, 23, 41, (37, 23, 41)),    # one block, one panel
    (37, 23, 41, (100, 200, 300)),  # tile larger than the matrix
    (37, 23, 41, (37, 1, 41)),
    (29, 31, 2, (7, 11, 1)),
    (2, 3, 43, (1, 1, 7)),
]


@pytest.mark.parametrize("trans", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("m,n,k,tile", SHAPES)
def test_ragged_shapes_and_tiles(rng, m, n, k, tile, trans):
    trans_a, trans_b = trans
    a, b = operands(rng, m, n, k, trans_a, trans_b)
    c = rand(rng, (m, n))
    out = poisoned((m, n))
    r = oocgemm.multiply(a, b, out, c=c, alpha=1.5, beta=-0.5, trans_a=trans_a,
                         trans_b=trans_b, tile=tile, device="cpu")
    assert_gemm(out, a, b, c, alpha=1.5, beta=-0.5, trans_a=trans_a, trans_b=trans_b)
    w, h, rr = r.plan.tile
    assert w <= max(m, 1) and h <= max(n, 1) and rr <= max(k, 1)
    if tile is not None:
        assert r.plan.tile == (min(tile[0], m), min(tile[1], n), min(tile[2], k))
    p, q, nk = r.plan.grid
    assert (p, q, nk) == (-(-m // w), -(-n // h), -(-k // rr))
    assert len({(e.key, e.q) for e in r.events if e.kind == "gemm"}) == p * q * nk
    assert sum(e.flops for e in r.events) == 2 * m * n * k
    assert sum(e.kind == "write" for e in r.events) >= p * q


def test_tiny_tile_many_blocks_and_panels(rng):
    m, n, k = 37, 23, 41
    a, b = operands(rng, m, n, k)
    r = oocgemm.multiply(a, b, tile=(3, 5, 2), device="cpu")
    assert r.plan.grid == (13, 5, 21)
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("limit", [6000, "6KB", "8KiB", 20_000])
def test_small_memory_limit_forces_many_blocks(rng, limit):
    m, n, k = 37, 23, 41
    a, b = operands(rng, m, n, k)
    c = rand(rng, (m, n))
    r = oocgemm.multiply(a, b, c=c, beta=1.0, memory_limit=limit, device="cpu")
    assert r.plan.device_bytes <= r.plan.memory_limit <= 20_480
    p, q, nk = r.plan.grid
    assert p * q > 1 and nk > 1
    assert_gemm(r.out, a, b, c, beta=1.0)


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False)])
def test_transposes_of_non_square(rng, trans_a, trans_b):
    """op(a) is 19x8, op(b) 8x26: a wrong transpose cannot pass by accident."""
    a, b = operands(rng, 19, 26, 8, trans_a, trans_b)
    r = oocgemm.multiply(a, b, trans_a=trans_a, trans_b=trans_b, tile=(5, 7, 3), device="cpu")
    assert r.out.shape == (19, 26)
    assert_gemm(r.out, a, b, trans_a=trans_a, trans_b=trans_b)


def test_numpy_scalars_and_ints_as_alpha_beta(rng):
    a, b = operands(rng, 6, 5, 4)
    c = rand(rng, (6, 5))
    r = oocgemm.multiply(a, b, c=c, alpha=np.float32(2), beta=-1, tile=(2, 2, 2), device="cpu")
    assert_gemm(r.out, a, b, c, alpha=2.0, beta=-1.0)

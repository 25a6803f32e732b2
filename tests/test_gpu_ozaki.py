"""kernel='ozaki' on the GPU (issue 21): the out-of-core pipeline emulating its block products
on int8 tensor cores gives the CPU executor's bits, block for block; skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import poisoned
from test_ozaki import _error, _gamma, _spread

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]


CASES = [
    # kernel, (m, n, k), tile, alpha, beta, trans_a, trans_b, exponent spread
    ("ozaki:16", (300, 257, 700), (128, 96, 256), 1.0, 0.0, False, False, 8),
    ("ozaki:16", (300, 257, 700), (128, 96, 256), -1.5, 0.25, True, True, 8),
    ("ozaki", (200, 130, 530), (64, 64, 200), 1.0, 1.0, False, True, 2),
    ("ozaki", (97, 61, 1000), (97, 61, 1000), 2.0, 0.0, True, False, 0),
    ("ozaki:24", (150, 170, 333), (64, 128, 128), 0.5, -1.0, False, False, 60),
]


@pytest.mark.parametrize("kernel,shape,tile,alpha,beta,trans_a,trans_b,spread", CASES)
def test_the_gpu_gives_the_cpu_references_bits(rng, kernel, shape, tile, alpha, beta, trans_a,
                                               trans_b, spread):
    """Ragged blocks over several K panels, every GEMM option, exponents spread over up to
    2^60: the same bits as the CPU executor (which runs the same blocks unstaged: no row
    stripes, hence fewer GEMMs), the same kinds of emulation (and of native fallback), and as
    accurate as native DGEMM (the rule: within its error bound; 16 moduli: within 4x of its
    error)."""
    m, n, k = shape
    a = _spread(rng, (k, m) if trans_a else (m, k), spread)
    b = _spread(rng, (n, k) if trans_b else (k, n), spread)
    c = rng.standard_normal((m, n)) if beta != 0 else poisoned((m, n), "float64")
    kw = dict(c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, tile=tile,
              kernel=kernel)
    gpu = oocgemm.multiply(a, b, poisoned((m, n), "float64"), device="cuda", **kw)
    cpu = oocgemm.multiply(a, b, device="cpu", **kw)
    assert gpu.plan.staged and gpu.plan.k_splits == cpu.plan.k_splits
    assert sum(gpu.emulation.values()) > 1 and set(gpu.emulation) == set(cpu.emulation)
    assert any(key.startswith("ozaki, ") for key in gpu.emulation), gpu.emulation
    assert kernel == "ozaki" or all(key.startswith("ozaki, ") for key in gpu.emulation)
    np.testing.assert_array_equal(gpu.out.view(np.int64), cpu.out.view(np.int64))
    assert set(gpu.emulation_seconds) == {"convert", "int8 gemm", "finish"}
    if beta == 0:  # alpha a power of two: out / alpha is the product as computed
        x, y = (a.T if trans_a else a), (b.T if trans_b else b)
        bound = _gamma(k) if kernel == "ozaki" else 4 * _error(x @ y, x, y)
        assert _error(gpu.out / alpha, x, y) <= bound


def test_zarr_to_zarr_on_the_gpu(rng, workdir):
    """A compressed Zarr output written through the chunk writer, several blocks."""
    import zarr

    a, b = _spread(rng, (260, 300), 8), _spread(rng, (300, 190), 8)
    zarr.create_array("a.zarr", data=a, chunks=(64, 100))
    zarr.create_array("b.zarr", data=b, chunks=(100, 64))
    gpu = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cuda", kernel="ozaki:16",
                           tile=(128, 128, 300))
    cpu = oocgemm.multiply(a, b, device="cpu", kernel="ozaki:16", tile=(128, 128, 300))
    got = zarr.open_array("c.zarr", mode="r")[...]
    np.testing.assert_array_equal(got.view(np.int64), cpu.out.view(np.int64))
    assert set(gpu.emulation) == {"ozaki, 16 moduli"}


def test_panels_that_need_native_dgemm_say_so(rng):
    """Infinities and NaN, and an exponent range past the emulated one: those blocks run
    cuBLAS DGEMM and the result counts them with their reasons; the others stay emulated."""
    a, b = rng.standard_normal((96, 80)), rng.standard_normal((80, 64))
    a[5, 7] = np.inf
    a[70, 2] = 2.0**400
    r = oocgemm.multiply(a, b, device="cuda", kernel="ozaki", tile=(32, 64, 80))
    native = {key: count for key, count in r.emulation.items() if key.startswith("native")}
    assert sorted(native) == sorted(["native: infinities or NaN (native DGEMM propagates "
                                     "them)", next(k for k in native if "exponent range" in k)])
    emulated = {key for key in r.emulation if key.startswith("ozaki")}
    assert len(emulated) == 1 and len(r.emulation) == 3  # the middle block
    want = a @ b
    np.testing.assert_array_equal(np.isinf(r.out), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(r.out[finite], want[finite], rtol=1e-12, atol=1e-10)


def test_a_converted_panel_serves_every_gemm_that_reads_it(rng):
    """One A panel, four C blocks along N: A is converted once (its slot keeps it), each B
    panel once; the result is still the CPU's."""
    from oocgemm.cuda import ozaki as gpu_ozaki

    converted = []
    original = gpu_ozaki.Emulator._convert

    def counting(self, panel, bits, n, chunk):
        if panel.done < n or panel.bits != bits:
            converted.append(panel.key)
        return original(self, panel, bits, n, chunk)

    a, b = rng.standard_normal((64, 128)), rng.standard_normal((128, 256))
    try:
        gpu_ozaki.Emulator._convert = counting
        gpu = oocgemm.multiply(a, b, device="cuda", kernel="ozaki:16", tile=(64, 64, 128))
    finally:
        gpu_ozaki.Emulator._convert = original
    assert sorted(converted) == sorted([("A", 0, 0)] + [("B", 0, j) for j in range(4)])
    cpu = oocgemm.multiply(a, b, device="cpu", kernel="ozaki:16", tile=(64, 64, 128))
    np.testing.assert_array_equal(gpu.out, cpu.out)

"""One product on several GPUs of one machine (``device='cuda:all'`` or a list): each GPU
runs its own executor on the C block groups it takes, into one output; skipped where fewer
than two GPUs are found."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, poisoned, rand
from test_devices import _blocks_by_device

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() < 2, reason="fewer than two CUDA GPUs")]


@pytest.mark.parametrize("out", [None, "c.zarr", "array"])
def test_every_gpu_takes_blocks(rng, workdir, out):
    a, b = rand(rng, (1500, 700)), rand(rng, (700, 1300))
    target = poisoned((1500, 1300)) if out == "array" else out
    r = oocgemm.multiply(a, b, target, device="cuda:all", tile=(256, 256, 256),
                         out_options={"chunks": (128, 256), "compressors": "zstd:1"}
                         if out == "c.zarr" else None)
    got = {None: r.out, "array": target}.get(out)
    if got is None:
        got = zarr.open_array(out, mode="r")[...]
    assert_gemm(got, a, b)
    p, q, _ = r.plan.grid
    gpus = [f"cuda:{i}" for i in range(cuda.device_count())]
    assert set(r.devices) == set(gpus)
    assert all(r.devices[g]["blocks"] > 0 for g in gpus)  # 36 blocks: every GPU took some
    assert sum(d["blocks"] for d in r.devices.values()) == p * q
    owned = _blocks_by_device(r)
    assert sum(len(x) for x in owned.values()) == p * q
    one = oocgemm.multiply(a, b, device="cuda:0", tile=(256, 256, 256))
    np.testing.assert_array_equal(np.asarray(got), one.out)  # as one GPU computes it
    assert leftovers(".") == []


def test_a_list_of_gpus_updates_in_place(rng, workdir):
    a, b, old = rand(rng, (900, 400)), rand(rng, (400, 700)), rand(rng, (900, 700))
    np.save("c.npy", old)
    r = oocgemm.multiply(a, b, "c.npy", beta=-0.5, device=["cuda:1", "cuda:0"],
                         tile=(128, 128, 128))
    assert_gemm(np.load("c.npy"), a, b, old, beta=-0.5)
    assert set(r.devices) == {"cuda:0", "cuda:1"}


def test_zarr_inputs_on_every_gpu(rng, workdir):
    a, b = rand(rng, (1024, 512)), rand(rng, (512, 768))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype=x.dtype, chunks=(128, 128),
                          compressors=zarr.codecs.ZstdCodec(level=1))[:] = x
    r = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cuda:all", tile=(256, 256, 128))
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)
    assert len(r.devices) == cuda.device_count()
    assert r.timeline is not None and "cuda:1/" in " ".join(e.lane for e in r.events)


def test_a_tall_skinny_gram_splits_k_among_the_gpus(rng, workdir):
    """One C block, K long: each GPU computes a partial C over its part of K, summed once;
    bitwise symmetric, each chunk decoded once in all."""
    x = rand(rng, (40000, 256))
    zarr.create_array("x.zarr", shape=x.shape, dtype=x.dtype, chunks=(4000, 256))[:] = x
    r = oocgemm.gram("x.zarr", device="cuda:all", tile=(256, 256, 4000))
    np.testing.assert_allclose(r.out, x.T @ x, rtol=1e-11, atol=1e-8)
    assert np.array_equal(r.out, r.out.T)
    gpus = [f"cuda:{i}" for i in range(cuda.device_count())]
    assert set(r.devices) == set(gpus)
    assert all(r.devices[g]["flops"] > 0 for g in gpus)
    assert r.bytes["decoded"] == x.nbytes

"""C compressed on the GPU (nvCOMP) before it goes down (``gpu_encode=True``, the default,
or ``OOCGEMM_GPU_ENCODE=1``): the product zarr reads back equals numpy's, on ragged shapes
whose stripes cut chunks, v2 and v3; with False (``=0``) the host encodes; skipped where no
GPU (or no nvCOMP) is found."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm import cuda

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@pytest.fixture
def gpu_encode(monkeypatch):
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "1")


def nvcomp_or_skip():
    from oocgemm.cuda import nvcomp

    if nvcomp.library() is None:
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu12/13) is not installed")
    return nvcomp


def chunk_files(path):
    return [os.path.join(root, f) for root, _, files in os.walk(path)
            for f in files if f.replace(".", "").isdigit()]


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("tile", [(512, 384, 256), None])
def test_c_compressed_on_the_gpu(rng, workdir, gpu_encode, fmt, tile):
    """Several C blocks (tile given) or the in-core shape (none): every chunk of C is
    nvCOMP's frames, and the product is numpy's."""
    nvcomp = nvcomp_or_skip()
    a, b = rand(rng, (1000, 700)), rand(rng, (700, 900))
    r = oocgemm.multiply(a, b, "c.zarr", device="cuda", tile=tile,
                         out_options={"compressors": "zstd", "chunks": (128, 192),
                                      "zarr_format": fmt})
    assert r.out_encoder == f"nvCOMP {nvcomp.version()} zstd on the GPU"
    got = zarr.open_array("c.zarr", mode="r")
    assert_gemm(got[:], a, b)
    files = chunk_files("c.zarr")
    assert len(files) == 8 * 5
    with open(files[0], "rb") as f:
        assert f.read().count(ZSTD_MAGIC) >= 2


def test_the_gpu_encodes_by_default_and_the_host_when_asked(rng, workdir, monkeypatch):
    """OOCGEMM_GPU_ENCODE unset: the GPU's encoder; =0, or gpu_encode=False: the host's, the
    same product; gpu_encode=True over OOCGEMM_GPU_ENCODE=0: the GPU's (the option wins)."""
    nvcomp = nvcomp_or_skip()
    gpu = f"nvCOMP {nvcomp.version()} zstd on the GPU"
    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    monkeypatch.delenv("OOCGEMM_GPU_ENCODE", raising=False)
    for env, option, encoder in ((None, None, gpu), (None, False, None), ("0", None, None),
                                 ("0", True, gpu)):
        if env is not None:
            monkeypatch.setenv("OOCGEMM_GPU_ENCODE", env)
        r = oocgemm.multiply(a, b, "c.zarr", device="cuda", overwrite=True, gpu_encode=option,
                             out_options={"compressors": "zstd", "chunks": (64, 64)})
        assert r.out_encoder == encoder
        assert r.plan.io.gpu_encode is (option if option is not None else env != "0")
        assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)


def test_a_checksummed_output_is_encoded_on_the_host(rng, workdir, gpu_encode):
    nvcomp_or_skip()
    a, b = rand(rng, (300, 200)), rand(rng, (200, 260))
    r = oocgemm.multiply(a, b, "c.zarr", device="cuda",
                         out_options={"compressors": zarr.codecs.ZstdCodec(checksum=True),
                                      "chunks": (64, 64)})
    assert r.out_encoder is None
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)


def test_a_journaled_run_from_files(rng, workdir, gpu_encode):
    """A run from files is journaled (its blocks from GPU frames without a checksum): the
    product is whole, and the journal goes with the commit."""
    nvcomp_or_skip()
    a, b = rand(rng, (640, 300)), rand(rng, (300, 512))
    np.save("a.npy", a)
    np.save("b.npy", b)
    r = oocgemm.multiply("a.npy", "b.npy", "c.zarr", device="cuda", tile=(256, 256, 128),
                         out_options={"compressors": "zstd", "chunks": (128, 128)})
    assert r.out_encoder is not None
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)
    assert not [f for f in os.listdir(".") if "partial" in f]


@pytest.mark.parametrize("mode", ["last", "frames"])
def test_the_gpu_and_the_host_share_the_frames(rng, workdir, monkeypatch, mode):
    """OOCGEMM_GPU_ENCODE=last: the GPU compresses part of the last block's stripes, the
    host's encoders the others, a stripe each; =frames: the host all of them. One chunk's
    file may hold frames of both."""
    nvcomp = nvcomp_or_skip()
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", mode)
    a, b = rand(rng, (1000, 700)), rand(rng, (700, 900))
    r = oocgemm.multiply(a, b, "c.zarr", device="cuda", tile=(512, 384, 256),
                         out_options={"compressors": "zstd", "chunks": (128, 192)})
    if mode == "last":
        assert r.out_encoder.startswith(f"nvCOMP {nvcomp.version()} zstd on the GPU for ")
    else:
        assert r.out_encoder is None
    assert_gemm(zarr.open_array("c.zarr", mode="r")[:], a, b)

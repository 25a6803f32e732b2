"""``benchmarks.gpu_decode_product``: the frames of a panel tile it in the order its decoded
frames are placed (CPU, decoded with numcodecs, against zarr's read), regions that cut frames
are refused, and on a GPU the pipeline's product equals numpy's (small stores of both
layouts)."""

from __future__ import annotations

import numcodecs
import numpy as np
import pytest
import zarr

from benchmarks import gpu_decode_product as G
from benchmarks.common import BenchError
from benchmarks.zarr_stores import make_store
from oocgemm import cuda


def _stores(tmp_path, layout, n=2048, chunk=1024):
    paths = []
    for name, seed in (("a", 1), ("b", 2)):
        path = str(tmp_path / f"{layout}-{name}.zarr")
        make_store(path, n=n, chunk=chunk, layout=layout, seed=seed, threads=2)
        paths.append(path)
    return paths


@pytest.mark.parametrize("layout, frames", [("v3", 1), ("v3-sharded", 4)])
def test_a_regions_frames_placed_as_the_pipeline_places_them(tmp_path, layout, frames):
    a_path, _ = _stores(tmp_path, layout)
    store, want = G.Store(a_path), zarr.open_array(a_path)[:]
    zstd = numcodecs.Zstd()
    for rows, cols in (((1024, 2048), (0, 1024)), ((0, 1024), (0, 2048))):
        region = store.region(rows, cols)
        decoded = []
        for path, off, nb in region.frames:
            with open(path, "rb") as f:
                f.seek(off)
                decoded.append(np.frombuffer(zstd.decode(f.read(nb)), np.float64))
        (gr, gc), (th, tw) = region.grid, region.tile
        assert len(region.frames) == gr * gc == frames * (cols[1] - cols[0]) // 1024
        placed = np.stack(decoded).reshape(gr, gc, th, tw).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(placed.reshape(gr * th, gc * tw),
                                      want[slice(*rows), slice(*cols)])
    with pytest.raises(BenchError, match="not whole frames"):
        store.region((0, 1000), (0, 1024))


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
@pytest.mark.parametrize("layout", ["v3", "v3-sharded"])
def test_the_pipelines_product(tmp_path, layout):
    from oocgemm.cuda import nvcomp

    if nvcomp.library() is None:
        pytest.skip("nvCOMP (nvidia-libnvcomp-cu12/13) is not installed")
    a_path, b_path = _stores(tmp_path, layout)
    want = zarr.open_array(a_path)[:] @ zarr.open_array(b_path)[:]
    pipe = G.Pipeline(G.Store(a_path), G.Store(b_path), rows=1024, threads=4)
    try:
        pipe.run()
        np.testing.assert_allclose(pipe.out, want, rtol=1e-12, atol=1e-9)
        pipe.out.fill(np.nan)
        pipe.run()  # the buffers again: the same product
        np.testing.assert_allclose(pipe.out, want, rtol=1e-12, atol=1e-9)
    finally:
        pipe.close()

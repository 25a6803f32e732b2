"""A thin last block row (``Plan.last_rows``): the run's last block row cut so that what is
final at its end, and is then encoded and written while nothing else runs, is a thin row. The
splits, the plans that may not take one, the cost model's choice (a compressed output's
encoders, metadata only at n = 32768), and products with one forced (``THIN_GAIN`` below
zero takes the best candidate) equal to numpy's: ragged, transposed, beta with a poisoned
output, compressed Zarr outputs, staged replays, a resumed run and several executors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, interrupt_write, poisoned, rand

import oocgemm
from oocgemm.errors import OptionError
from oocgemm.options import Options
from oocgemm.planning import Problem, cuda_model, finish
from oocgemm.product import plan_product
from oocgemm.runtime.staging import staging_for
from oocgemm.storage import npy
from oocgemm.storage.run import open_run


@pytest.fixture
def thin(monkeypatch):
    """Every plan that may take a thin last block row takes its best candidate."""
    monkeypatch.setattr(finish, "THIN_GAIN", -1e9)


def test_the_last_block_row_is_cut(rng):
    a, b = rand(rng, (1000, 64)), rand(rng, (64, 300))
    plan = oocgemm.plan(a, b, device="cpu", tile=(512, 300, 64))
    assert plan.last_rows == 0 and plan.row_splits == (0, 512, 1000)
    cut = dataclasses.replace(plan, last_rows=128).validate()
    assert cut.row_splits == (0, 512, 872, 1000) and cut.grid[:2] == (3, 1)
    # a thin row as tall as the last block row (or taller) cuts nothing
    assert dataclasses.replace(plan, last_rows=488).row_splits == (0, 512, 1000)
    assert cut.schedule.ops and cut.prediction.total > 0


def test_plans_that_take_no_thin_row(rng, workdir):
    x = rand(rng, (96, 40))
    gram = oocgemm.plan(x, x, trans_a=True, device="cpu", tile=(16, 16, 40))
    assert gram.symmetric
    with pytest.raises(OptionError, match="symmetric"):
        dataclasses.replace(gram, last_rows=8).validate()
    assert finish.with_thin_end(gram) is gram
    small = oocgemm.plan(x, x.T, device="cpu")  # one block whose drain is nothing to cut
    assert small.grid[:2] == (1, 1) and small.last_rows == 0


def problem_32768(compressors, out_chunks=(4096, 4096)):
    """n = 32768 zstd inputs of 4096² chunks (metadata only), a new Zarr output."""
    n = 32768
    arrays = [zarr.create_array(f"{x}.zarr", shape=(n, n), dtype="f8", chunks=(4096, 4096),
                                overwrite=True)
              for x in "ab"]
    with open_run(*arrays, "c.zarr", out_options={"chunks": out_chunks,
                                                   "compressors": compressors}) as io:
        a, b, c, out = io.operands()
    return Problem(m=n, n=n, k=n, itemsize=8, dtype="float64", a=a, b=b, c=c, out=out)


def cuda_plan(problem, memory=16 << 30, host=32 << 30):
    model = cuda_model()
    return plan_product(problem, Options.of("test"), "cuda:0", "cublas", model, memory, host,
                        staging_for("cuda", problem, model, "cublas"))


def test_the_model_cuts_a_compressed_outputs_last_block(workdir):
    """16 GiB of GPU memory: two C blocks of 16384 x 32768, the last one's 32 chunks of 128
    MiB compressed after the run's last GEMM (1.1 s at the host encoders' 3.9 GB/s). A thin
    last row of a multiple of the output's chunk rows ends the run sooner for a pass over B
    more; the model takes the best candidate, by THIN_GAIN at least."""
    problem = problem_32768("zstd")
    assert problem.out.encoded
    plan = cuda_plan(problem)
    assert plan.tile[:2] == (16384, 32768) and plan.last_rows
    assert plan.last_rows % 4096 == 0 and 2 * plan.last_rows <= 16384
    whole = dataclasses.replace(plan, last_rows=0)
    assert plan.prediction.encode == whole.prediction.encode > 0
    assert plan.prediction.drain < whole.prediction.drain
    assert plan.prediction.total <= whole.prediction.total * (1 - finish.THIN_GAIN)
    others = [dataclasses.replace(plan, last_rows=rows) for rows in (4096, 8192)]
    assert plan.prediction.total == min(p.prediction.total for p in others)
    # B is loaded once more: the thin row's pass
    assert plan.counts.traffic["read"] > whole.counts.traffic["read"]


def test_the_encoders_drain_is_modelled(workdir):
    """An uncompressed output charges no encoders; a compressed one its bytes at the encoders'
    rate, and a last block's end at least one chunk on one thread."""
    plain, packed = (cuda_plan(problem_32768(c)) for c in (None, "zstd"))
    assert not plain.problem.out.encoded and plain.prediction.encode == 0
    n_bytes = 32768 * 32768 * 8
    assert packed.prediction.encode == pytest.approx(n_bytes / cuda_model().encode)
    whole = dataclasses.replace(packed, last_rows=0).prediction
    assert whole.drain >= 16384 * 32768 * 8 / cuda_model().encode
    assert "decode+encode" in whole.describe()


SHAPES = [((300, 70, 250), (128, 96, 32), 16), ((517, 33, 129), (200, 129, 33), 40),
          ((64, 50, 40), (32, 40, 50), 16)]


@pytest.mark.parametrize("shape,tile,rows", SHAPES)
@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True)])
def test_products_with_a_thin_last_row(rng, thin, shape, tile, rows, trans):
    m, k, n = shape
    a = rand(rng, (k, m) if trans[0] else (m, k))
    b = rand(rng, (n, k) if trans[1] else (k, n))
    c = rand(rng, (m, n))
    out = poisoned((m, n))
    given = finish.finished(oocgemm.plan(a, b, device="cpu", tile=tile, trans_a=trans[0],
                                         trans_b=trans[1]), last_rows=rows)
    assert given.row_splits[-2] == m - rows and given.last_rows == rows
    r = oocgemm.multiply(a, b, out, c=c, alpha=0.5, beta=-2.0, trans_a=trans[0],
                         trans_b=trans[1], device="cpu", tile=tile)
    assert r.plan.last_rows and r.plan.row_splits[-1] - r.plan.row_splits[-2] < tile[0]
    assert_gemm(out, a, b, c, alpha=0.5, beta=-2.0, trans_a=trans[0], trans_b=trans[1])


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_compressed_zarr_output_with_a_thin_last_row(rng, workdir, thin, fmt):
    """The thin row a multiple of the output's chunk rows and of A's: no chunk of either is
    cut by it."""
    a, b = rand(rng, (512, 96)), rand(rng, (96, 300))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype="f8", chunks=(64, 48))[...] = x
    r = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cpu", tile=(256, 300, 48),
                         out_options={"chunks": (64, 100), "compressors": "zstd",
                                      "zarr_format": fmt})
    assert r.plan.problem.out.encoded
    assert r.plan.last_rows in (64, 128)
    assert r.plan.row_splits == (0, 256, 512 - r.plan.last_rows, 512)
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)


def test_a_staged_replay_with_a_thin_last_row(rng, workdir, thin):
    """The CUDA executor's schedule (staged: rings, uploads, row stripes of the last block)
    replayed by the CPU executor."""
    from oocgemm.runtime.cpu import CpuExecutor
    from oocgemm.storage.memory import NumpySink, NumpySource

    a, b = rand(rng, (333, 90)), rand(rng, (90, 200))
    plan = oocgemm.plan(a, b, device="cpu", tile=(160, 200, 45))
    plan = finish.finished(dataclasses.replace(plan, staged=True, stripe=64, n_stage=3,
                                               n_out=2, split_last=3, tail_panels=2))
    assert plan.last_rows and plan.grid[0] == 4  # 160, 160, 13 - last_rows, last_rows
    out = poisoned((333, 200))
    CpuExecutor(plan, {"A": NumpySource(a), "B": NumpySource(b)}, NumpySink(out)).run()
    assert_gemm(out, a, b)


def test_a_run_with_a_thin_last_row_resumes_with_it(rng, workdir, monkeypatch):
    """The interrupted run's thin row comes from its journal, whatever the planner would
    choose now: the same blocks, the same bits."""
    a, b = rng.standard_normal((320, 200)), rng.standard_normal((200, 240))
    np.save("a.npy", a)
    np.save("b.npy", b)
    kw = dict(device="cpu", tile=(128, 120, 40))
    monkeypatch.setattr(finish, "THIN_GAIN", -1e9)
    real = interrupt_write(monkeypatch, npy.NpySink, at=3)
    with pytest.raises(KeyboardInterrupt):
        oocgemm.multiply("a.npy", "b.npy", "c.npy", **kw)
    monkeypatch.setattr(npy.NpySink, "write", real)
    monkeypatch.setattr(finish, "THIN_GAIN", 1e9)  # no thin row would be chosen now
    r = oocgemm.multiply("a.npy", "b.npy", "c.npy", resume=True, **kw)
    assert r.resumed == 2 and r.plan.last_rows
    whole = oocgemm.multiply("a.npy", "b.npy", "d.npy", **kw)  # unresumed, with no thin row
    assert whole.plan.last_rows == 0
    np.testing.assert_allclose(np.load("c.npy"), a @ b, rtol=1e-12, atol=1e-12)


def test_several_executors_with_a_thin_last_row(rng, workdir, thin):
    a, b = rand(rng, (300, 64)), rand(rng, (64, 220))
    r = oocgemm.multiply(a, b, "c.npy", device=["cpu", "cpu"], tile=(128, 110, 64))
    assert r.plan.last_rows
    assert_gemm(np.load("c.npy"), a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("env", [{}, {"OOCGEMM_GPU_ENCODE": "1"}, {"OOCGEMM_GPU_DECODE": "1"}])
def test_a_thin_last_row_on_the_gpu(rng, workdir, thin, monkeypatch, env):
    """The CUDA executor with a thin last row: zstd inputs decoded by the host (or the
    GPU), a zstd output compressed by the host's encoders (or the GPU's)."""
    from oocgemm import cuda
    from oocgemm.cuda import nvcomp

    if cuda.device_count() == 0:
        pytest.skip("no CUDA GPU (or no CuPy)")
    if env and nvcomp.library() is None:
        pytest.skip("nvCOMP is not installed")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    a, b = rand(rng, (1024, 256)), rand(rng, (256, 640))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype="f8", chunks=(128, 128))[...] = x
    r = oocgemm.multiply("a.zarr", "b.zarr", "c.zarr", device="cuda", tile=(512, 640, 128),
                         out_options={"chunks": (128, 128), "compressors": "zstd"})
    assert r.plan.last_rows and r.plan.last_rows % 128 == 0 and r.plan.grid[0] == 3
    assert r.plan.gpu_decode == (("A", "B") if "OOCGEMM_GPU_DECODE" in env else ())
    assert_gemm(zarr.open_array("c.zarr", mode="r")[...], a, b)

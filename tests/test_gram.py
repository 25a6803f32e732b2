"""Gram products, ``X^T X`` and ``X X^T``: one stored matrix on both sides is read and decoded
once, and only the C blocks on and above the diagonal are computed (a diagonal block's upper
triangle, mirrored), each block above the diagonal written transposed across it. The result
is bitwise symmetric; alpha, beta and c keep BLAS semantics."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, interrupt_write, poisoned, rand
from test_chunks import LAYOUTS, CountingStore, write
from zarr.storage import LocalStore

import oocgemm
from oocgemm.planning import OpKind, check_schedule
from oocgemm.planning.check import ScheduleError
from oocgemm.planning.schedule import Schedule, triangle, triangle_index
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.memory import NumpySink, NumpySource


def gram(x, trans_a: bool):
    """The reference: X^T X (trans_a) or X X^T, in float64 / complex128."""
    wide = np.complex128 if np.iscomplexobj(x) else np.float64
    x = np.asarray(x).astype(wide)
    return x.T @ x if trans_a else x @ x.T


def sides(trans_a: bool) -> dict:
    return dict(trans_a=trans_a, trans_b=not trans_a)


def computed_blocks(result) -> set:
    return {e.key for e in result.events if e.kind == "gemm"}


# ---- one operand, one read --------------------------------------------------------------------
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("trans_a", [True, False])
def test_each_chunk_is_fetched_once(rng, workdir, layout, trans_a):
    """X stored with chunks that cut the blocks and ragged edges: every stored object is
    fetched once for both roles, whatever the layout and whichever side is transposed."""
    shape = (150, 45) if trans_a else (45, 150)
    chunks = (32, 20) if trans_a else (20, 32)
    x = rand(rng, shape)
    write("x.zarr", x, chunks, layout)
    store = CountingStore(LocalStore("x.zarr", read_only=True))
    zx = zarr.open_array(store, mode="r")
    result = oocgemm.multiply(zx, zx, device="cpu", tile=(16, 16, 40), **sides(trans_a))
    assert result.plan.problem.shared and result.plan.symmetric
    assert set(store.fetches.values()) == {1}  # an object, or a shard's byte range, once
    assert result.chunks["A"]["decodes"] == result.chunks["A"]["chunks"]
    assert "B" not in result.chunks  # one reader for both roles
    np.testing.assert_allclose(result.out, gram(x, trans_a), rtol=1e-12, atol=1e-11)
    assert np.array_equal(result.out, result.out.T)


@pytest.mark.parametrize("trans_a", [True, False])
def test_an_uncompressed_x_is_read_once_too(rng, workdir, trans_a):
    """X in plain chunk files (what ``oocgemm random`` writes), whose parts could be sliced
    out of its files block by block: read at its grain instead, each chunk once for both
    roles, and counted in ``result.chunks``."""
    shape = (600, 90) if trans_a else (90, 600)
    x = rand(rng, shape)
    z = zarr.create_array("x.zarr", shape=shape, dtype="f8", compressors=None,
                          chunks=(128, 90) if trans_a else (90, 128))
    z[...] = x
    result = oocgemm.multiply("x.zarr", "x.zarr", device="cpu", tile=(32, 32, 128),
                              **sides(trans_a))
    assert result.plan.symmetric and result.plan.grid[0] > 1
    chunks = result.chunks["A"]
    assert chunks["decodes"] == chunks["chunks"] == 5
    assert result.bytes["storage_read"] == 5 * 128 * 90 * 8  # each chunk file once, whole
    np.testing.assert_allclose(result.out, gram(x, trans_a), rtol=1e-12, atol=1e-11)
    assert np.array_equal(result.out, result.out.T)


def test_two_different_matrices_are_read_each_their_own(rng, workdir):
    x = rand(rng, (90, 40))
    write("x.zarr", x, (30, 40), "v3")
    write("y.zarr", x, (30, 40), "v3")  # the same values, another matrix
    result = oocgemm.multiply("x.zarr", "y.zarr", device="cpu", trans_a=True, tile=(16, 16, 30))
    assert not result.plan.problem.shared and not result.plan.symmetric
    assert set(result.chunks) == {"A", "B"}
    assert len(computed_blocks(result)) == result.plan.grid[0] * result.plan.grid[1]
    assert_gemm(result.out, x, x, trans_a=True)


@pytest.mark.parametrize("how", ["path", "symlink", "url", "zarr", "memmap", "numpy", "dask"])
def test_the_same_operand_however_given(rng, workdir, how):
    """Path and path, a link and its target, a URL and its path, one array object twice:
    found to be one matrix; the product is the symmetric Gram matrix."""
    x = rand(rng, (120, 36))
    np.save("x.npy", x)
    write("x.zarr", x, (40, 36), "v3")
    if how == "path":
        a = b = "x.zarr"
    elif how == "symlink":
        os.symlink("x.zarr", "link.zarr")
        a, b = "x.zarr", "link.zarr"
    elif how == "url":
        a, b = "x.zarr", "file://" + os.path.abspath("x.zarr")
    elif how == "zarr":
        a = b = zarr.open_array("x.zarr", mode="r")
    elif how == "memmap":
        a, b = np.load("x.npy", mmap_mode="r"), np.load("x.npy", mmap_mode="r")
    elif how == "numpy":
        a = b = x
    else:
        da = pytest.importorskip("dask.array")
        a = b = da.from_zarr("x.zarr")
    plan = oocgemm.plan(a, b, device="cpu", trans_a=True, tile=(12, 12, 50))
    assert plan.problem.shared and plan.symmetric, how
    assert "one stored matrix" in str(plan)
    result = oocgemm.multiply(a, b, device="cpu", trans_a=True, tile=(12, 12, 50))
    np.testing.assert_allclose(result.out, gram(x, True), rtol=1e-12, atol=1e-11)
    assert np.array_equal(result.out, result.out.T)


@pytest.mark.parametrize("how", ["x.T, x", "x, x.T", "memmap.T, memmap"])
def test_a_numpy_transposed_view_is_the_same_matrix_read_transposed(rng, workdir, how):
    """``multiply(x.T, x)`` as a numpy user writes it: found to be X^T X (X read once, C
    exactly symmetric), as ``multiply(x, x, trans_a=True)``."""
    x = rand(rng, (150, 40))
    if how.startswith("memmap"):
        np.save("x.npy", x)
        x = np.load("x.npy", mmap_mode="r")
    a, b = (x, x.T) if how == "x, x.T" else (x.T, x)
    plan = oocgemm.plan(a, b, device="cpu", tile=(16, 16, 50))
    assert plan.problem.shared and plan.symmetric
    result = oocgemm.multiply(a, b, device="cpu", tile=(16, 16, 50))
    want = np.asarray(a) @ np.asarray(b)
    np.testing.assert_allclose(result.out, want, rtol=1e-12, atol=1e-11)
    assert np.array_equal(result.out, result.out.T)
    assert not oocgemm.plan(x.T.copy(), x, device="cpu").problem.shared  # a copy: another


@pytest.mark.parametrize("how", ["x.T, x", "x, x.T"])
def test_a_dask_transpose_is_the_same_matrix_read_transposed(rng, how):
    """``multiply(x.T, x)`` of a dask array (its transpose's graph by name), as
    ``oocgemm.dask.matmul`` finds it: the same entry point (issue 52), X^T X or X X^T."""
    import dask.array as da

    x = da.from_array(rand(rng, (150, 40)), chunks=(50, 40))
    a, b = (x, x.T) if how == "x, x.T" else (x.T, x)
    plan = oocgemm.plan(a, b, device="cpu", tile=(16, 16, 50))
    assert plan.problem.shared and plan.symmetric
    result = oocgemm.multiply(a, b, device="cpu", tile=(16, 16, 50))
    np.testing.assert_allclose(result.out, np.asarray(a) @ np.asarray(b), rtol=1e-12,
                               atol=1e-11)
    assert np.array_equal(result.out, result.out.T)
    assert not oocgemm.plan(x.T + 0, x, device="cpu").problem.shared  # another graph


def test_a_copy_is_another_matrix(rng):
    x = rand(rng, (60, 20))
    plan = oocgemm.plan(x, x.copy(), device="cpu", trans_a=True)
    assert not plan.problem.shared and not plan.symmetric


# ---- half the work ------------------------------------------------------------------------------
def test_a_4x4_grid_computes_10_blocks(rng):
    """The GEMM events' flops are those of the 6 blocks above the diagonal and the upper
    triangles (diagonal included) of the 4 on it; the plan and the result say the same."""
    w, k = 16, 70
    x = rand(rng, (k, 4 * w))
    result = oocgemm.multiply(x, x, device="cpu", trans_a=True, tile=(w, w, 32))
    assert result.plan.grid[:2] == (4, 4)
    assert computed_blocks(result) == {(i, j) for i in range(4) for j in range(i, 4)}
    want = 6 * 2 * w * w * k + 4 * k * w * (w + 1)
    gemm_flops = sum(e.flops for e in result.events if e.kind == "gemm")
    assert gemm_flops == want == result.plan.flops == result.flops
    assert result.plan.summary()["flops"] == want
    assert result.timeline.flops == want
    assert result.plan.problem.flops == 16 * 2 * w * w * k  # the product's, in full
    written = {e.key for e in result.events if e.kind == "write"}
    assert written == {(i, j) for i in range(4) for j in range(4)}
    np.testing.assert_allclose(result.out, gram(x, True), rtol=1e-12, atol=1e-11)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("trans_a", [True, False])
def test_bitwise_symmetric(rng, dtype, trans_a):
    """C == C.T bit for bit (complex: the plain transpose: symmetric, not Hermitian)."""
    x = rand(rng, (97, 53) if trans_a else (53, 97), dtype)
    result = oocgemm.multiply(x, x, device="cpu", tile=(20, 20, 30), **sides(trans_a))
    assert result.plan.symmetric
    assert np.array_equal(result.out, result.out.T)
    assert_gemm(result.out, x, x, **sides(trans_a))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0), (-2.0, -0.5), (1.5 - 1j, 2j)])
def test_alpha_beta_c(rng, dtype, alpha, beta):
    """Each computed block meets c's block on both sides of the diagonal: c need not be
    symmetric; out is poisoned before the run."""
    if isinstance(alpha, complex) and np.dtype(dtype).kind != "c":
        pytest.skip("complex scalars need complex operands")
    x = rand(rng, (80, 45), dtype)
    c = rand(rng, (45, 45), dtype)
    out = poisoned((45, 45), dtype)
    result = oocgemm.multiply(x, x, out, c=c, alpha=alpha, beta=beta, device="cpu",
                              trans_a=True, tile=(16, 16, 25))
    assert result.plan.symmetric
    assert_gemm(out, x, x, c, alpha=alpha, beta=beta, trans_a=True)
    symmetric_c = c + c.T
    out2 = poisoned((45, 45), dtype)
    oocgemm.multiply(x, x, out2, c=symmetric_c, alpha=alpha, beta=beta, device="cpu",
                     trans_a=True, tile=(16, 16, 25))
    assert np.array_equal(out2, out2.T)


def test_update_in_place(rng):
    """c is out: every element of C is read before its own is written."""
    x = rand(rng, (64, 40))
    c = rand(rng, (40, 40))
    before = c.copy()
    oocgemm.multiply(x, x, c, c=c, alpha=0.5, beta=2.0, device="cpu", trans_a=True,
                     tile=(16, 16, 20))
    assert_gemm(c, x, x, before, alpha=0.5, beta=2.0, trans_a=True)


def test_stored_output_with_c(rng, workdir):
    x = rand(rng, (70, 33))
    c = rand(rng, (33, 33))
    write("x.zarr", x, (20, 33), "v3-zstd")
    write("c.zarr", c, (10, 10), "v3")
    result = oocgemm.multiply("x.zarr", "x.zarr", "out.zarr", c="c.zarr", beta=-1.0,
                              device="cpu", trans_a=True, tile=(12, 12, 30))
    assert result.plan.symmetric
    assert_gemm(zarr.open_array("out.zarr")[:], x, x, c, beta=-1.0, trans_a=True)


def test_a_tile_that_is_not_square_computes_in_full(rng):
    x = rand(rng, (50, 30))
    result = oocgemm.multiply(x, x, device="cpu", trans_a=True, tile=(10, 15, 20))
    assert result.plan.problem.shared and not result.plan.symmetric
    assert_gemm(result.out, x, x, trans_a=True)


def test_emulated_kernel_computes_in_full(rng):
    x = rand(rng, (50, 30))
    result = oocgemm.multiply(x, x, device="cpu", trans_a=True, kernel="ozaki")
    assert not result.plan.symmetric
    assert_gemm(result.out, x, x, trans_a=True)


def test_two_cpu_executors(rng):
    x = rand(rng, (90, 64))
    one = oocgemm.multiply(x, x, device="cpu", trans_a=True, tile=(16, 16, 30))
    two = oocgemm.multiply(x, x, device=["cpu", "cpu"], trans_a=True, tile=(16, 16, 30))
    assert two.plan.symmetric
    assert np.array_equal(one.out, two.out)  # every block computed as on one device


# ---- the schedule -------------------------------------------------------------------------------
def test_triangle_order():
    for p in range(1, 7):
        order = list(triangle(p))
        assert sorted(order) == [(i, j) for i in range(p) for j in range(i, p)]
        assert [triangle_index(i, j, p) for i, j in order] == list(range(len(order)))
        assert order[-1] == (p - 1, p - 1)  # ends on the diagonal: no block goes across last
        if p > 1:  # ...and the block before it too
            assert order[-2] == (p - 2, p - 2)
        assert all(abs(x[0] - y[0]) + abs(x[1] - y[1]) == 1  # neighbours, but between rows
                   for x, y in zip(order, order[1:]) if x[0] == y[0])


def staged(plan, **kw):
    """The plan with the CUDA executor's kind of staging: stripes, a ramp, a striped tail."""
    staging = dataclasses.replace(plan.staging, n_stage=3, n_out=2, split_last=3,
                                  split_blocks="every", tail_panels=2, n_a=3, n_b=3, ramp=1,
                                  min_stripes=2)
    return dataclasses.replace(plan, staged=True, stripe=4 * plan.tile[0], staging=staging, **kw)


@pytest.mark.parametrize("beta", [0.0, 0.75])
@pytest.mark.parametrize("trans_a", [True, False])
def test_staged_schedule_on_the_cpu(rng, beta, trans_a):
    """The staged schedule the GPU runs (stripes, a T slot for the blocks across, MIRRORs
    stripe by stripe), proved by the checker and replayed by the CPU executor."""
    x = rand(rng, (140, 70) if trans_a else (70, 140))
    c = rand(rng, (70, 70))
    plan = staged(oocgemm.plan(x, x, c=c if beta else None, beta=beta, device="cpu",
                               tile=(24, 24, 40), **sides(trans_a)))
    check_schedule(plan.schedule, plan)
    assert plan.counts == plan.schedule.counts()
    kinds = plan.schedule.counts().ops
    assert kinds[OpKind.TRANSPOSE] == 3 and kinds[OpKind.MIRROR] >= 3 * 3  # 3 stripes or more
    out = poisoned((70, 70))
    src = NumpySource(x)
    sources = {"A": src, "B": src} | ({"C": NumpySource(c)} if beta else {})
    CpuExecutor(plan, sources, NumpySink(out)).run()
    assert_gemm(out, x, x, c if beta else None, beta=beta, **sides(trans_a))
    if not beta:
        assert np.array_equal(out, out.T)


def without(plan, kind: OpKind, nth: int = 0) -> Schedule:
    """The plan's schedule less its ``nth`` operation of ``kind`` (dependencies renumbered)."""
    ops = list(plan.schedule.ops)
    drop = [op.index for op in ops if op.kind is kind][nth]
    kept = []
    for op in ops:
        if op.index == drop:
            continue
        deps = tuple(d - (d > drop) for d in op.deps if d != drop)
        kept.append(dataclasses.replace(op, index=len(kept), deps=deps))
    return dataclasses.replace(plan.schedule, ops=tuple(kept))


@pytest.mark.parametrize("kind", [OpKind.MIRROR, OpKind.TRANSPOSE])
def test_the_checker_misses_no_mirror(rng, kind):
    x = rand(rng, (60, 48))
    plan = oocgemm.plan(x, x, device="cpu", trans_a=True, tile=(16, 16, 30))
    check_schedule(plan.schedule, plan)
    with pytest.raises(ScheduleError):
        check_schedule(without(plan, kind), plan)


def test_the_checker_wants_upper_gemms_on_the_diagonal_only(rng):
    x = rand(rng, (60, 48))
    plan = oocgemm.plan(x, x, device="cpu", trans_a=True, tile=(16, 16, 30))
    ops = list(plan.schedule.ops)
    at = next(op.index for op in ops if op.kind is OpKind.GEMM and op.upper)
    ops[at] = dataclasses.replace(ops[at], upper=False)
    with pytest.raises(ScheduleError, match="upper"):
        check_schedule(dataclasses.replace(plan.schedule, ops=tuple(ops)), plan)


# ---- the named entry points ---------------------------------------------------------------------
def test_gram_entry_point(rng, workdir):
    x = rand(rng, (90, 40))
    write("x.zarr", x, (30, 40), "v3-zstd")
    inner = oocgemm.gram("x.zarr", "g.zarr", device="cpu", tile=(16, 16, 30))
    outer = oocgemm.gram("x.zarr", device="cpu", outer=True)
    assert inner.plan.symmetric and outer.plan.symmetric
    np.testing.assert_allclose(zarr.open_array("g.zarr")[:], gram(x, True), rtol=1e-12,
                               atol=1e-11)
    np.testing.assert_allclose(outer.out, gram(x, False), rtol=1e-12, atol=1e-11)
    with pytest.raises(oocgemm.OptionError, match="outer"):
        oocgemm.gram("x.zarr", device="cpu", trans_a=True)


def test_gram_command(rng, workdir):
    from click.testing import CliRunner

    from oocgemm.cli import main

    x = rand(rng, (80, 30))
    np.save("x.npy", x)
    done = CliRunner().invoke(main, ["gram", "x.npy", "-o", "g.npy", "--device", "cpu", "-q"])
    assert done.exit_code == 0, done.output
    g = np.load("g.npy")
    assert np.array_equal(g, g.T)
    np.testing.assert_allclose(g, gram(x, True), rtol=1e-12, atol=1e-11)
    refused = CliRunner().invoke(main, ["gram", "x.npy", "-o", "h.npy", "--trans-a"])
    assert refused.exit_code == 2 and "--trans-a" in refused.output
    assert not os.path.exists("h.npy")
    flags = CliRunner().invoke(main, ["gram", "--help"]).output.partition("Options:")[2]
    assert "--outer" in flags and "--trans-a" not in flags and "--trans-b" not in flags


@pytest.mark.parametrize("tile", [(16, 16, 16), (32, 16, 8), (20, 20, 20), (16, 16, 8),
                                  (8, 8, 16)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True), (True, False),
                                             (False, True)])
def test_one_matrix_in_both_roles_any_product(rng, tile, trans_a, trans_b):
    """x @ x, x^T @ x^T and the Gram products, whatever the tile: a panel held for one role
    serves the other where it is the same region, and is never evicted by the other role's
    load in the same step; the checker proves the schedules (the GPU's staging too)."""
    x = rand(rng, (64, 64))
    result = oocgemm.multiply(x, x, device="cpu", tile=tile, trans_a=trans_a, trans_b=trans_b)
    plan = result.plan
    assert plan.problem.shared
    check_schedule(plan.schedule, plan)
    check_schedule(staged(plan).schedule, staged(plan))
    assert plan.counts == plan.schedule.counts()
    assert_gemm(result.out, x, x, trans_a=trans_a, trans_b=trans_b)


def test_an_interrupted_gram_product_resumes_bitwise(rng, workdir, monkeypatch):
    """Ctrl-C after a few blocks are written (a block above the diagonal with or without its
    transpose): resume=True keeps the pairs that are whole and computes the rest; the result
    is bitwise the uninterrupted one."""
    from oocgemm.storage import npy

    x = rand(rng, (150, 64))
    np.save("x.npy", x)
    whole = oocgemm.gram("x.npy", "whole.npy", device="cpu", tile=(16, 16, 50))
    real = interrupt_write(monkeypatch, npy.NpySink, at=6)
    with pytest.raises(KeyboardInterrupt):
        oocgemm.gram("x.npy", "g.npy", device="cpu", tile=(16, 16, 50))
    monkeypatch.setattr(npy.NpySink, "write", real)
    resumed = oocgemm.gram("x.npy", "g.npy", device="cpu", tile=(16, 16, 50), resume=True)
    assert 0 < resumed.resumed < whole.plan.n_blocks
    assert len(computed_blocks(resumed)) == whole.plan.n_blocks - resumed.resumed
    assert np.array_equal(np.load("g.npy"), np.load("whole.npy"))


def test_a_gram_product_that_runs_out_of_memory_plans_again_symmetric(rng, workdir,
                                                                       monkeypatch):
    """A replan after memory ran out keeps the product symmetric (square blocks)."""
    from test_memory_pressure import _failing

    x = rand(rng, (200, 150))
    _failing(monkeypatch, CpuExecutor, "_gemm", MemoryError("injected"), after=5)
    with pytest.warns(RuntimeWarning, match="host memory ran out"):
        result = oocgemm.gram(x, device="cpu", memory_limit="400KB")
    assert len(result.replanned) == 1 and result.plan.symmetric
    assert result.plan.tile[0] == result.plan.tile[1]
    assert np.array_equal(result.out, result.out.T)
    assert_gemm(result.out, x, x, trans_a=True)


@pytest.mark.parametrize("out", ["g.npy", "g.zarr"])
def test_a_stored_output_updated_in_place(rng, workdir, out):
    """beta != 0 without c: the existing output is C, read as each block is written."""
    x = rand(rng, (70, 40))
    c = rand(rng, (40, 40))
    if out.endswith(".npy"):
        np.save(out, c)
    else:
        zarr.create_array(out, shape=c.shape, dtype=c.dtype, chunks=(16, 16))[:] = c
    result = oocgemm.gram(x, out, beta=0.5, alpha=-1.0, device="cpu", tile=(16, 16, 30))
    assert result.plan.symmetric
    got = np.load(out) if out.endswith(".npy") else zarr.open_array(out)[:]
    assert_gemm(got, x, x, c, alpha=-1.0, beta=0.5, trans_a=True)

"""The planner: it reads no data, respects the budgets, aligns tiles to chunks, explains itself."""

from __future__ import annotations

import re

import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import rand

import oocgemm
from oocgemm.planning import OpKind
from oocgemm.storage.dask_arrays import DaskSource
from oocgemm.storage.memory import NumpySource
from oocgemm.storage.zarr_store import ZarrSource


@pytest.fixture
def no_reads(monkeypatch):
    """Every source's read() fails: whatever calls it is caught."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{self.name} was read")

    for cls in (NumpySource, ZarrSource, DaskSource):
        monkeypatch.setattr(cls, "read", refuse)


def test_plan_reads_no_data(rng, workdir, no_reads):
    x = rand(rng, (30, 20))
    np.save("a.npy", x)
    zarr.create_array("b.zarr", shape=(20, 25), dtype="f8", chunks=(8, 8))[:] = rand(rng, (20, 25))
    np.save("c.npy", rand(rng, (30, 25)))
    d = da.from_array(rand(rng, (20, 25)), chunks=(5, 5))
    for a, b in (("a.npy", "b.zarr"), (x, d), (np.load("a.npy", mmap_mode="r"), "b.zarr")):
        p = oocgemm.plan(a, b, c="c.npy", beta=0.5, device="cpu")
        assert p.problem.m == 30 and p.problem.n == 25 and p.problem.k == 20
        str(p)
        p.summary()
    with pytest.raises(oocgemm.OOCGemmError, match="was read"):  # the fixture does bite
        oocgemm.multiply("a.npy", "b.zarr", device="cpu")


def test_plan_works_on_a_npy_with_garbage_data(rng, workdir):
    """A valid header over garbage bytes: plan() never looks past the header."""
    np.save("a.npy", rand(rng, (40, 30)))
    raw = bytearray(open("a.npy", "rb").read())
    header = len(raw) - 40 * 30 * 8
    raw[header:] = bytes([0xFF]) * (len(raw) - header)  # NaN bit patterns everywhere
    open("a.npy", "wb").write(bytes(raw))
    p = oocgemm.plan("a.npy", rand(rng, (30, 10)), device="cpu")
    assert p.problem.k == 30
    r = oocgemm.multiply("a.npy", rand(rng, (30, 10)), device="cpu")  # the data is garbage...
    assert np.isnan(r.out).all()  # ...which a run does read


def test_plan_on_a_dask_array_that_cannot_be_computed(rng):
    def explode(block):
        raise RuntimeError("computed")

    b = da.from_array(rand(rng, (12, 9)), chunks=(4, 3)).map_blocks(explode, dtype="f8")
    p = oocgemm.plan(rand(rng, (7, 12)), b, device="cpu", tile=(3, 3, 4))
    assert p.grid == (3, 3, 3)
    with pytest.raises(oocgemm.ExecutionError, match="computed"):
        oocgemm.multiply(rand(rng, (7, 12)), b, device="cpu", tile=(3, 3, 4))


def test_plan_on_huge_metadata_only_zarr(workdir):
    """A 200k x 200k product, planned from metadata alone (the arrays hold no chunks)."""
    zarr.create_array("a.zarr", shape=(200_000, 150_000), dtype="f4", chunks=(1024, 1024))
    zarr.create_array("b.zarr", shape=(150_000, 200_000), dtype="f4", chunks=(1024, 1024))
    p = oocgemm.plan("a.zarr", "b.zarr", "c.zarr", device="cpu", memory_limit="2GB")
    assert p.device_bytes <= 2 * 10**9
    w, h, r = p.tile
    assert w % 1024 == 0 and h % 1024 == 0 and r % 1024 == 0
    assert p.problem.flops == 2 * 200_000 * 200_000 * 150_000


def aligned(size, chunk, extent):
    return size % chunk == 0 or size == extent


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("m,k,n", [(300, 200, 260), (256, 320, 192), (1000, 1000, 1000),
                                   (450, 130, 700)])
@pytest.mark.parametrize("limit", ["1MB", "4MB", "16MB", None])
def test_tiles_align_to_input_chunks(workdir, fmt, m, k, n, limit):
    zarr.create_array("a.zarr", shape=(m, k), dtype="f8", chunks=(64, 64), zarr_format=fmt)
    zarr.create_array("b.zarr", shape=(k, n), dtype="f8", chunks=(64, 64), zarr_format=fmt)
    p = oocgemm.plan("a.zarr", "b.zarr", "c.zarr", device="cpu", memory_limit=limit)
    w, h, r = p.tile
    assert max(w, h, r) > 64  # the budget allows tiles bigger than a chunk
    assert aligned(w, 64, m) and aligned(h, 64, n) and aligned(r, 64, k), p.tile
    assert p.device_bytes <= p.memory_limit


@pytest.mark.parametrize("limit", ["400KB", "1MB", None])
def test_tiles_align_to_transposed_chunks(workdir, limit):
    # A is stored K x M = 200 x 300 with chunks (32, 64): along M the chunks are 64, along K 32
    zarr.create_array("at.zarr", shape=(200, 300), dtype="f8", chunks=(32, 64))
    zarr.create_array("b.zarr", shape=(200, 260), dtype="f8", chunks=(32, 64))
    p = oocgemm.plan("at.zarr", "b.zarr", device="cpu", memory_limit=limit, trans_a=True)
    w, h, r = p.tile
    assert aligned(w, 64, 300) and aligned(r, 32, 200) and aligned(h, 64, 260), p.tile


@pytest.mark.parametrize("limit", ["400KB", "1MB", "4MB"])
def test_tiles_align_to_a_given_zarr_output(workdir, limit):
    zarr.create_array("a.zarr", shape=(300, 200), dtype="f8", chunks=(64, 64))
    zarr.create_array("b.zarr", shape=(200, 260), dtype="f8", chunks=(64, 64))
    out = zarr.create_array("o.zarr", shape=(300, 260), dtype="f8", chunks=(48, 40))
    p = oocgemm.plan("a.zarr", "b.zarr", out, device="cpu", memory_limit=limit)
    w, h, r = p.tile
    assert aligned(w, 48, 300) and aligned(h, 40, 260) and aligned(r, 64, 200), p.tile


@pytest.mark.parametrize("limit", [2_000, 10_000, 100_000, 1_000_000, "3MiB"])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_plan_respects_memory_limit(rng, limit, beta):
    a, b, c = rand(rng, (120, 90)), rand(rng, (90, 110)), rand(rng, (120, 110))
    p = oocgemm.plan(a, b, c=c, beta=beta, memory_limit=limit, device="cpu")
    assert p.device_bytes <= p.memory_limit
    assert p.host_bytes <= p.host_memory_limit
    assert p.memory_limit == (limit if isinstance(limit, int) else 3 << 20)
    p.validate()


def test_smaller_budgets_give_more_blocks(rng):
    a, b = rand(rng, (200, 150)), rand(rng, (150, 180))
    counts = [oocgemm.plan(a, b, memory_limit=lim, device="cpu").grid
              for lim in (5_000_000, 200_000, 20_000)]
    blocks = [p * q * nk for p, q, nk in counts]
    assert blocks[0] <= blocks[1] <= blocks[2] and blocks[0] < blocks[2]


def test_str_and_summary(rng):
    a, b = rand(rng, (37, 41)), rand(rng, (41, 23))
    p = oocgemm.plan(a, b, c=rand(rng, (37, 23)), alpha=2.0, beta=-0.5, tile=(5, 6, 7),
                     device="cpu")
    text = str(p)
    assert "w=5 h=6 r=7" in text and "(tile)" in text
    assert "8x4 C blocks, 6 K panels each" in text
    assert f"{len(p.schedule.ops)} operations" in text
    assert "C[37x23]" in text and "float64" in text and "K=41" in text
    assert re.search(r"predicted\s+\S+", text)
    s = p.summary()
    assert s["tile"] == {"w": 5, "h": 6, "r": 7}
    assert s["grid"] == {"row_blocks": 8, "col_blocks": 4, "k_panels": 6}
    assert s["operations"] == len(p.schedule.ops)
    assert s["flops"] == 2 * 37 * 23 * 41
    assert s["device_bytes"] == p.device_bytes <= s["memory_limit"]


def test_planner_choice_is_reported(rng):
    p = oocgemm.plan(rand(rng, (30, 20)), rand(rng, (20, 10)), device="cpu")
    assert p.chosen_by == "planner" and "(planner)" in str(p)
    assert p.prediction.total > 0


def test_plan_and_multiply_agree(rng):
    a, b = rand(rng, (40, 33)), rand(rng, (33, 27))
    p = oocgemm.plan(a, b, memory_limit="30KB", device="cpu")
    r = oocgemm.multiply(a, b, memory_limit="30KB", device="cpu")
    assert r.plan.tile == p.tile and r.plan.grid == p.grid
    assert len(r.events) == len(p.schedule.ops)
    np.testing.assert_allclose(r.out, a @ b, rtol=1e-12, atol=1e-12)


def test_plan_ignores_unknown_keywords_like_overwrite(rng):
    p = oocgemm.plan(rand(rng, (3, 2)), rand(rng, (2, 4)), device="cpu", overwrite=True,
                     progress=False)
    assert p.problem.m == 3


@pytest.mark.parametrize("shape, tile, staged, stripe, min_stripes", [
    ((300, 200, 250), (64, 48, 32), False, 0, 1),
    ((300, 200, 250), (64, 48, 32), True, 64 * 8, 4),
    ((1000, 900, 800), (256, 128, 64), True, 4096, 10),
    ((1000, 900, 800), (1000, 900, 800), True, 1 << 20, 10),
])
def test_prediction_charges_every_operation(rng, shape, tile, staged, stripe, min_stripes):
    """The per-operation overhead the planner charges counts the stripes of staged loads:
    within a factor of 1.5 of the schedule's real count (it does not see panels kept in a
    slot from one block to the next), each at the model's cost of one."""
    import dataclasses

    m, k, n = shape
    plan = oocgemm.plan(np.empty((m, k)), np.empty((k, n)), device="cpu", tile=tile)
    if staged:
        plan = dataclasses.replace(plan, staged=True, stripe=stripe, staging=dataclasses.replace(
            plan.staging, min_stripes=min_stripes, n_stage=4, n_out=2))
    estimate = plan.prediction.operations
    assert plan.prediction.overhead == estimate * plan.model.op_overhead
    assert plan.counts.total / 1.5 <= estimate <= plan.counts.total * 1.5


def test_a_kept_operand_is_decoded_once():
    """A kept in host memory (``cache``), without a chunk report: the prediction decodes its
    chunks once, however often its panels are loaded."""
    from oocgemm.planning import cpu_model
    from oocgemm.planning.problem import Operand, Problem
    from oocgemm.planning.tiling import predict

    prob = Problem(m=400, n=200, k=300, itemsize=8, dtype="float64",
                   a=Operand((400, 300), chunks=(100, 100), on_disk=True),
                   b=Operand((300, 200)), out=Operand((400, 200)))
    model = cpu_model()
    kept = predict(prob, (100, 100, 100), model, staged=False, cache=("A",))
    assert kept.decode == 400 * 300 * 8 / model.decode
    reloaded = predict(prob, (100, 100, 100), model, staged=False)
    assert reloaded.decode == 2 * kept.decode  # an A panel for each of 2 block columns


def test_many_small_frames_decode_slower_on_the_host():
    """The same bytes in frames a quarter the size cost the host's decoders 4x the frames'
    share (``DeviceModel.decode_frame``): shards of small chunks against whole chunks."""
    from oocgemm.planning import cuda_model
    from oocgemm.planning.problem import Operand, Problem
    from oocgemm.planning.tiling import predict

    model = cuda_model()

    def decode(frames):
        prob = Problem(m=4096, n=512, k=4096, itemsize=8, dtype="float64",
                       a=Operand((4096, 4096), chunks=(1024, 1024), on_disk=True,
                                 zstd_frames=frames),
                       b=Operand((4096, 512)), out=Operand((4096, 512)))
        return predict(prob, (4096, 512, 4096), model, staged=True).decode

    nbytes = 4096 * 4096 * 8
    whole, small = decode((1024, 1024)), decode((512, 512))
    assert whole == pytest.approx(nbytes / model.decode + 16 * model.decode_frame)
    assert small - whole == pytest.approx(48 * model.decode_frame) and model.decode_frame > 0


@pytest.mark.parametrize("m,k,n", [(64, 64, 64), (1000, 3, 7), (5000, 200, 30), (3, 4000, 5),
                                   (300, 2000, 100), (1536, 64, 1024)])
def test_in_place_products_take_one_tile_without_a_search(rng, monkeypatch, m, k, n):
    """Operands in memory in a BLAS layout and C computed where it goes: no tile moves a
    byte, so the planner takes the whole product as one tile without searching (no tile's
    time predicted), computed in one GEMM. The cost model agrees: no smaller tile is
    predicted faster."""
    from oocgemm.planning import tiling
    from oocgemm.planning.tiling import predict

    a, b = rand(rng, (m, k)), rand(rng, (k, n))
    predicted = []
    monkeypatch.setattr(tiling, "predict", lambda *args, **kw: predicted.append(args[1]))
    tiling.choose_tile(oocgemm.plan(a, b, device="cpu").problem, tiling_model(), 1 << 40,
                       1 << 40, staged=False)
    assert predicted == []
    monkeypatch.undo()
    plan = oocgemm.plan(a, b, device="cpu")
    assert plan.tile == (m, n, k)
    # nothing to write as it becomes final: the one block's one panel is one GEMM
    assert plan.staging.split_last == 1
    assert [op.kind for op in plan.schedule.ops].count(OpKind.GEMM) == 1
    s = plan.staging
    settings = dict(staged=False, split_last=s.split_last, ramp=s.ramp, tail=s.tail_panels,
                    stripe=plan.stripe, min_stripes=s.min_stripes)
    whole = predict(plan.problem, plan.tile, plan.model, **settings).total
    for tile in ((m, n, max(1, k // 2)), (max(1, m // 2), n, k), (m, max(1, n // 3), k),
                 (max(1, m // 4), max(1, n // 2), max(1, k // 4))):
        assert whole <= predict(plan.problem, tile, plan.model, **settings).total, tile


def tiling_model():
    return oocgemm.plan(np.ones((2, 2)), np.ones((2, 2)), device="cpu").model


def test_device_models_are_made_once_per_machine(monkeypatch):
    """cuda_model() and cpu_model() are the same object each call (a small product's plan
    asked for one each time), and the CPU's follows the cores the process may use."""
    from oocgemm import machine
    from oocgemm.planning.model import cpu_model, cuda_model

    assert cuda_model() is cuda_model()
    here = cpu_model()
    assert cpu_model() is here and here.flops == 35e9 * machine.cores()
    monkeypatch.setattr(machine, "cores", lambda: 99)  # an affinity set to other cores
    other = cpu_model()
    assert other is not here and other.flops == 35e9 * 99


def _planned_both_ways(monkeypatch, problem, device, kernel, mem, host):
    """plan_product's tile (or its refusal) with the search's floors, and without them (each
    block's every depth predicted, as before the floors)."""
    from oocgemm.backends import backend_of
    from oocgemm.devices import Device
    from oocgemm.planning import tiling
    from oocgemm.planning.planner import Facts, plan_product

    backend = backend_of(device)
    model = backend.model()
    facts = Facts(device=Device.named(device), kernel=kernel, model=model, memory_limit=mem,
                  host_memory_limit=host, staging=backend.staging(problem, model, kernel))
    answers = []
    for floors in (True, False):
        if not floors:
            monkeypatch.setattr(tiling, "_resource_floor", lambda *args, **kwargs: 0.0)
        try:
            plan = plan_product(problem, facts)
            answers.append(plan.tile)
        except oocgemm.BudgetError as exc:
            answers.append(str(exc))
    monkeypatch.undo()
    return answers


@pytest.mark.parametrize("device,kernel", [("cpu", "numpy"), ("cuda:0", "cublas"),
                                           ("cuda:0", "ozaki"), ("cpu", "ozaki")])
def test_the_search_floors_never_change_the_tile(rng, workdir, monkeypatch, device, kernel):
    """choose_tile passes over the blocks whose floor (their busiest resource at any depth)
    is above a time it already has: the tile it picks is the one it picks with every
    block's depths predicted, over operands in memory, in compressed Zarr chunks (ragged,
    transposed, 32768² as in the benchmarks), a Gram product, beta != 0, alpha == 0, and
    budgets from a few chunks to all of it."""
    from oocgemm.kernel_catalog import check_kernel

    if kernel == "numpy":
        kernel = check_kernel(None, np.dtype("float64"))
    zarr.create_array("a.zarr", shape=(9000, 7001), dtype="f8", chunks=(1000, 700))
    zarr.create_array("b.zarr", shape=(7001, 5003), dtype="f4", chunks=(512, 1024))
    zarr.create_array("x.zarr", shape=(20000, 3000), dtype="f8", chunks=(4096, 3000))
    zarr.create_array("big.zarr", shape=(32768, 32768), dtype="f8", chunks=(4096, 4096))
    problems = [
        oocgemm.plan(rand(rng, (1000, 777)), rand(rng, (777, 1313)), device="cpu").problem,
        oocgemm.plan("a.zarr", "b.zarr", device="cpu").problem,
        oocgemm.plan("b.zarr", "a.zarr", trans_a=True, trans_b=True, device="cpu").problem,
        oocgemm.plan("x.zarr", "x.zarr", trans_a=True, device="cpu").problem,  # Gram
        oocgemm.plan(rand(rng, (600, 900)), rand(rng, (900, 700)), c=rand(rng, (600, 700)),
                     beta=0.5, device="cpu").problem,
        oocgemm.plan("a.zarr", "b.zarr", alpha=0.0, device="cpu").problem,
        oocgemm.plan("big.zarr", "big.zarr", "c.zarr", device="cpu").problem,
    ]
    tiles = set()
    for problem in problems:
        for mem, host in ((128 << 20, 1 << 30), (512 << 20, 64 << 30), (16 << 30, 4 << 30)):
            with_floors, without = _planned_both_ways(monkeypatch, problem, device, kernel,
                                                      mem, host)
            assert with_floors == without, (problem, mem, host)
            tiles.add(with_floors)
    assert len(tiles) >= 12  # budgets and shapes that plan differently, each compared
    refusals = set()  # budgets too small: the same refusal, which the floors speed up too
    for mem, host in ((16 << 10, 64 << 30), (64 << 10, 64 << 30), (32 << 20, 64 << 10)):
        with_floors, without = _planned_both_ways(monkeypatch, problems[0], device, kernel,
                                                  mem, host)
        assert with_floors == without, (mem, host)
        refusals.add(with_floors if isinstance(with_floors, str) else None)
    assert len(refusals - {None}) >= 1
    # and the floor is one: no depth of a block is predicted below it
    from oocgemm.planning import cpu_model, cuda_model, tiling
    from oocgemm.strategies import strategy_of

    model = cuda_model() if device == "cuda:0" else cpu_model()
    for problem in problems:
        m, n, k = problem.m, problem.n, problem.k
        for w, h in ((m, n), (max(1, m // 3), n), (m, max(1, n // 5)), (64, 96)):
            strategy = strategy_of(kernel)
            floor = tiling._resource_floor(problem, (w, h), model, staged=device != "cpu",
                                           strategy=strategy, symmetric=False)
            for r in (1, 64, max(1, k // 2), k):
                total = tiling.predict(problem, (w, h, r), model, staged=device != "cpu",
                                       strategy=strategy).total
                assert 0 < floor <= total, (problem, (w, h, r))


def _evict(folder: str) -> bool:
    """Ask the OS to drop ``folder``'s files from its page cache; whether it did."""
    import os

    for root, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages stay cached until written back
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return ZarrSource(zarr.open_array(folder, mode="r"), "x").cached_fraction() == 0.0


def _warm(folder: str) -> None:
    import os

    for root, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                f.read()


def test_inputs_in_the_page_cache_are_predicted_at_memory_speed_and_planned_alike(rng,
                                                                                 workdir):
    """``oocgemm plan`` hears which stored inputs the page cache holds: their reads at the
    host's memory rate in the prediction, the blocks chosen as for storage (the same bits
    warm and cold)."""
    for name in ("a", "b"):
        zarr.create_array(f"{name}.zarr", shape=(600, 600), chunks=(200, 200), dtype="f8",
                          compressors=None)[...] = rand(rng, (600, 600))
    options = dict(device="cpu", memory_limit="2MB")
    _warm("a.zarr")
    _warm("b.zarr")
    warm = oocgemm.plan("a.zarr", "b.zarr", "c.zarr", **options)
    if not (_evict("a.zarr") and _evict("b.zarr")):
        pytest.skip("the OS keeps these files in its page cache")
    cold = oocgemm.plan("a.zarr", "b.zarr", "c.zarr", **options)
    assert warm.problem.a.cached and warm.problem.b.cached
    assert not cold.problem.a.cached and not cold.problem.b.cached
    assert warm.tile == cold.tile and warm.schedule.ops == cold.schedule.ops
    assert warm.prediction.storage_read < cold.prediction.storage_read / 2
    assert warm.prediction.total < cold.prediction.total


"""One planner (issue 52): the decisions made in named passes from facts, each recorded in the
plan; plans made again through replan(); what a device kind means asked of its backend."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.backends import BACKENDS, Backend, CudaBackend, backend_of, device_index
from oocgemm.lifecycle.run import open_run
from oocgemm.planning import OpKind, Problem, cuda_model
from oocgemm.planning.planner import Facts, make_plan, replan


def _problem(a, b) -> Problem:
    with open_run(a, b, None) as io:
        m, n, k = io.shape
        op_a, op_b, op_c, out = io.operands()
        return Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=op_a, b=op_b, c=op_c,
                       out=out, alpha=1.0, beta=0.0, shared=io.shared)


def _cuda_facts(problem: Problem, **changes) -> Facts:
    """Facts of a GPU that is not here (planning needs none)."""
    model = cuda_model()
    facts = Facts(device="cuda:0", kernel="cublas", model=model, memory_limit=1 << 30,
                  host_memory_limit=1 << 30,
                  staging=backend_of("cuda").staging(problem, model, "cublas"))
    return dataclasses.replace(facts, **changes)


def _zstd(name: str, rng, shape, chunks):
    z = zarr.create_array(name, shape=shape, dtype="f8", chunks=chunks,
                          compressors=zarr.codecs.ZstdCodec(level=1))
    z[:] = rand(rng, shape)
    return name


def test_each_pass_says_what_it_chose_in_the_printed_plan(rng, workdir):
    np.save("a.npy", rand(rng, (300, 200)))
    np.save("b.npy", rand(rng, (200, 100)))
    searched = oocgemm.plan("a.npy", "b.npy", device="cpu", memory_limit="300KB")
    given = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(64, 64, 64))
    for plan, said in ((searched, "tile: the planner's search"),
                       (given, "tile: the user's (tile=)")):
        assert plan.decisions[0].startswith(said)
        assert said in str(plan) and plan.summary()["decisions"] == list(plan.decisions)
    assert "decided" in str(searched)


def test_finishing_a_plan_for_its_tile_says_what_it_chose(rng, workdir):
    """The stripes (staged plans), the chunks kept decoded and the ring decodes, after the
    tile, once each however often the plan was finished again."""
    x = zarr.create_array("x.zarr", shape=(600, 400), dtype="f8", chunks=(100, 100))
    x[:] = rand(rng, (600, 400))
    gram = oocgemm.plan("x.zarr", "x.zarr", trans_a=True, device="cpu", memory_limit="400KB")
    steps = [d.partition(":")[0] for d in gram.decisions]
    assert steps[:2] == ["tile", "kept chunks"] and steps.count("kept chunks") == 1
    assert "A and B kept in host memory" in gram.decisions[1]
    problem = _problem("x.zarr", rand(rng, (400, 300)))
    staged = make_plan(problem, _cuda_facts(problem, memory_limit=2 << 20))
    assert [d.partition(":")[0] for d in staged.decisions][:2] == ["tile", "stripes"]
    again = replan(staged, tile=(200, 100, 100), why="a smaller tile")
    assert [d.partition(":")[0] for d in again.decisions].count("stripes") == 1


def test_the_page_cache_is_a_fact_of_the_prediction_not_of_the_blocks(rng, workdir):
    a, b = rand(rng, (400, 300)), rand(rng, (300, 200))
    np.save("a.npy", a)
    np.save("b.npy", b)
    problem = _problem("a.npy", "b.npy")
    cold = make_plan(problem, _cuda_facts(problem))
    warm = make_plan(problem, _cuda_facts(problem, cached=frozenset({"A", "B"})))
    assert warm.tile == cold.tile and warm.schedule.ops == cold.schedule.ops
    assert warm.decisions[-1].startswith("page cache: A and B held")
    assert not any(d.startswith("page cache") for d in cold.decisions)
    assert warm.prediction.total < cold.prediction.total
    # and a product of files just written (in the page cache) runs as planned
    result = oocgemm.multiply("a.npy", "b.npy", device="cpu")
    assert_gemm(result.out, a, b)


@pytest.mark.parametrize("mode, found, decodes, said", [
    (False, True, False, None),
    ("auto", False, False, "gpu decode: on the host: nvCOMP is not found"),
    (True, False, True, "gpu decode: A on the device: asked"),
])
def test_who_decodes_the_inputs_follows_the_facts(rng, workdir, mode, found, decodes, said):
    problem = _problem(_zstd("a.zarr", rng, (512, 256), (128, 128)),
                       _zstd("b.zarr", rng, (256, 384), (128, 128)))
    plan = make_plan(problem, _cuda_facts(problem, gpu_decode=mode, decoder_found=found,
                                          memory_limit=2 << 20))
    assert bool(plan.gpu_decode) == decodes
    if said is None:
        assert not any(d.startswith("gpu decode") for d in plan.decisions)
    else:
        assert any(d.startswith(said) for d in plan.decisions), plan.decisions
    with pytest.raises(oocgemm.OptionError, match="gpu_decode"):
        make_plan(problem, _cuda_facts(problem, gpu_decode="sometimes"))


def test_replan_makes_a_plan_again_and_says_why(rng, workdir):
    np.save("a.npy", rand(rng, (300, 200)))
    np.save("b.npy", rand(rng, (200, 100)))
    plan = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(100, 50, 100))
    resumed = replan(plan, tile=(60, 50, 40), chosen_by="resume", why="the run's tile")
    assert resumed.tile == (60, 50, 40) and resumed.chosen_by == "resume"
    assert resumed.decisions[-1] == "replan: the run's tile"
    done = replan(resumed, done=((0, 0),), why="1 block kept")
    assert done.done == ((0, 0),) and done.tile == resumed.tile
    assert done.counts.total < resumed.counts.total
    smaller = replan(plan, memory_limit=plan.device_bytes // 4,
                     host_memory_limit=plan.host_memory_limit, why="out of memory")
    assert smaller.device_bytes <= plan.device_bytes // 4 and smaller.done == ()
    assert smaller.chosen_by.startswith("planner, again")
    with pytest.raises(oocgemm.BudgetError, match="out of memory; and no smaller plan fits"):
        replan(plan, memory_limit=8, why="out of memory")
    group = replan(plan, blocks=((1, 0), (2, 1)), why="a group")
    assert {op.key for op in group.schedule.ops if op.kind is OpKind.GEMM} == {(1, 0), (2, 1)}


def test_a_kind_of_device_is_asked_of_its_backend():
    assert BACKENDS["cpu"].kind == "cpu" and BACKENDS["cuda"].kind == "cuda"
    assert type(backend_of("cuda:1")) is CudaBackend and type(backend_of("cpu#2")) is Backend
    assert backend_of(oocgemm.devices.Device("cuda", 1)) is BACKENDS["cuda"]
    assert device_index("cuda:3") == 3 and device_index("cpu#2") == device_index("cuda") == 0
    cpu = backend_of("cpu")
    assert not cpu.staged and not cpu.decodes and cpu.working_memory_is_host
    assert cpu.resources() is None and cpu.free_memory(0) is None and not cpu.decoder_found()
    assert cpu.executor_class().__name__ == "CpuExecutor"
    with pytest.raises(oocgemm.DeviceError, match="unknown executor 'tpu'"):
        backend_of("tpu:0")


def test_the_staging_settings_are_the_plans_fields_with_its_defaults():
    """An executor's staging travels typed (issue 52): every setting is a field of the plan
    with the same default, so a setting an executor leaves alone is the plan's."""
    from oocgemm.planning import Plan
    from oocgemm.planning.staging import StagingSettings

    defaults = StagingSettings().plan_fields()
    assert defaults == {name: Plan.__dataclass_fields__[name].default for name in defaults}
    cpu = backend_of("cpu").staging(None, backend_of("cpu").model(), "cublas")
    assert not cpu.staged and cpu.settings.split_blocks == "last"
    assert "ramp_granule" not in cpu.settings.tiling()


def test_a_page_cache_that_takes_all_of_c_is_told_to_the_prediction_only(rng, workdir):
    """Where the OS page cache takes all of C's writes before it holds writers to the disk's
    rate, C is stored at the host's rate in the prediction; the blocks stay those planned
    for the disk (the same bits either way)."""
    np.save("a.npy", rand(rng, (600, 300)))
    np.save("b.npy", rand(rng, (300, 500)))
    with open_run("a.npy", "b.npy", "c.npy") as io:
        m, n, k = io.shape
        op_a, op_b, op_c, out = io.operands()
        problem = Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=op_a, b=op_b,
                          c=op_c, out=out, alpha=1.0, beta=0.0, shared=io.shared)
    c_bytes = m * n * 8
    to_disk = make_plan(problem, _cuda_facts(problem, write_back=c_bytes - 1))
    taken = make_plan(problem, _cuda_facts(problem, write_back=c_bytes))
    assert taken.tile == to_disk.tile and taken.schedule.ops == to_disk.schedule.ops
    assert taken.prediction.storage_write < to_disk.prediction.storage_write
    assert any("C's" in d and "taken by it" in d for d in taken.decisions)
    assert not any("C's" in d for d in to_disk.decisions)


def test_npy_inputs_the_page_cache_holds_are_told_to_the_prediction(rng, workdir):
    np.save("a.npy", rand(rng, (400, 300)))  # just written: its pages are in the cache
    np.save("b.npy", rand(rng, (300, 200)))
    plan = oocgemm.plan("a.npy", "b.npy", device="cpu")
    assert any(d.startswith("page cache: A and B held") for d in plan.decisions)

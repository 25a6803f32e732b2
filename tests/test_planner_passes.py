"""One planner (issue 52): the decisions made in named passes from facts, each recorded in the
plan; plans made again through replan(); what a device kind means asked of its backend."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.backends import BACKENDS, Backend, CudaBackend, backend_of
from oocgemm.devices import Device
from oocgemm.lifecycle.run import open_run, output_facts
from oocgemm.planning import OpKind, Problem, cuda_model
from oocgemm.planning.planner import Facts, OutputFacts, gpu_encode_pass, make_plan, replan


def _problem(a, b) -> Problem:
    with open_run(a, b, None) as io:
        m, n, k = io.shape
        op_a, op_b, op_c, out = io.operands()
        return Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=op_a, b=op_b, c=op_c,
                       out=out, alpha=1.0, beta=0.0, shared=io.shared)


def _cuda_facts(problem: Problem, **changes) -> Facts:
    """Facts of a GPU that is not here (planning needs none)."""
    model = cuda_model()
    facts = Facts(device=Device("cuda", 0), kernel="cublas", model=model, memory_limit=1 << 30,
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
    assert bool(plan.io.gpu_decode) == decodes
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
    assert done.work.done == ((0, 0),) and done.tile == resumed.tile
    assert done.counts.total < resumed.counts.total
    smaller = replan(plan, memory_limit=plan.device_bytes // 4,
                     host_memory_limit=plan.host_memory_limit, why="out of memory")
    assert smaller.device_bytes <= plan.device_bytes // 4 and smaller.work.done == ()
    assert smaller.chosen_by.startswith("planner, again")
    with pytest.raises(oocgemm.BudgetError, match="out of memory; and no smaller plan fits"):
        replan(plan, memory_limit=8, why="out of memory")
    group = replan(plan, blocks=((1, 0), (2, 1)), why="a group")
    assert {op.key for op in group.schedule.ops if op.kind is OpKind.GEMM} == {(1, 0), (2, 1)}


def test_a_plan_is_made_of_typed_parts(rng, workdir):
    """A plan's I/O choices and its work are parts of their own (issue 52): a group made
    again sets the work's blocks and keeps the I/O as it was; a resume sets the work's done
    blocks and keeps the group."""
    from oocgemm.planning import IOChoices, Work

    np.save("a.npy", rand(rng, (300, 200)))
    np.save("b.npy", rand(rng, (200, 100)))
    plan = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(100, 50, 100))
    assert type(plan.io) is IOChoices and type(plan.work) is Work and plan.work == Work()
    assert not hasattr(plan, "gpu_decode") and not hasattr(plan, "blocks")
    group = replan(plan, blocks=[(1, 0), (2, 1)], why="a group")
    assert group.work == Work(blocks=((1, 0), (2, 1))) and group.io == plan.io
    resumed = replan(group, done=[(1, 0)], why="a resume")
    assert resumed.work == Work(done=((1, 0),), blocks=((1, 0), (2, 1)))
    assert resumed.io == plan.io and "(1 blocks done before, resumed)" in str(resumed)


def test_a_kind_of_device_is_asked_of_its_backend():
    assert BACKENDS["cpu"].kind == "cpu" and BACKENDS["cuda"].kind == "cuda"
    assert type(backend_of("cuda:1")) is CudaBackend and type(backend_of("cpu#2")) is Backend
    assert backend_of(Device("cuda", 1)) is BACKENDS["cuda"]
    assert Device.named("cuda:3") == Device("cuda", 3) and Device.named("cuda") == Device("cuda")
    assert Device.named("cpu#2") == Device("cpu") and str(Device.named("cpu#2")) == "cpu"
    cpu = backend_of("cpu")
    assert not cpu.staged and not cpu.decodes and cpu.working_memory_is_host
    assert cpu.resources() is None and cpu.free_memory(0) is None and not cpu.decoder_found()
    assert cpu.executor_class().__name__ == "CpuExecutor"
    with pytest.raises(oocgemm.DeviceError, match="unknown executor 'tpu'"):
        backend_of("tpu:0")


def test_the_plan_is_made_for_a_device_and_made_again_for_another(rng, workdir):
    """The plan's device is typed (issue 52): a Device, named as before in what it prints."""
    from oocgemm.runtime.multi_device import Share

    np.save("a.npy", rand(rng, (300, 200)))
    np.save("b.npy", rand(rng, (200, 100)))
    cpu = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(100, 50, 100))
    assert type(cpu.device) is Device and cpu.device == Device("cpu")
    problem = _problem("a.npy", "b.npy")
    gpu = make_plan(problem, _cuda_facts(problem))
    assert gpu.device == Device("cuda", 0) and gpu.summary()["device"] == "cuda:0"
    other = replan(gpu, device=Device("cuda", 1), why="run on cuda:1")
    assert other.device == Device("cuda", 1) and other.device.index == 1
    assert other.summary()["device"] == "cuda:1" and "  device      cuda:1" in str(other)
    second = Share(cpu, cpu.n_blocks).on("cpu#1")  # a second CPU executor: the CPU
    assert second.device == Device("cpu") and second.summary()["device"] == "cpu"


def test_the_staging_settings_are_one_part_of_the_plan_replaced_whole(rng, workdir):
    """An executor's staging travels typed (issue 52): the plan holds the backend's settings
    as one part (no flat copy of them), which the passes that change them for a tile (the
    in-core shape, a replan with the executor's settings, the CPU's resident panels)
    replace whole."""
    from oocgemm.planning import Plan
    from oocgemm.planning.staging import StagingSettings

    names = {f.name for f in dataclasses.fields(StagingSettings)}
    assert Plan.__dataclass_fields__["staging"].default == StagingSettings()
    assert not names & set(Plan.__dataclass_fields__)
    cpu = backend_of("cpu").staging(None, backend_of("cpu").model(), "cublas")
    assert not cpu.staged and cpu.settings.split_blocks == "last"
    assert "ramp_granule" not in cpu.settings.tiling()
    np.save("a.npy", rand(rng, (600, 400)))
    np.save("b.npy", rand(rng, (400, 300)))
    problem = _problem("a.npy", "b.npy")
    facts = _cuda_facts(problem)
    settings = facts.staging.settings
    in_core = make_plan(problem, facts)
    assert in_core.in_core and isinstance(in_core.staging, StagingSettings)
    assert (in_core.staging.n_a, in_core.staging.n_b, in_core.staging.ramp) == (1, 1, 0)
    assert in_core.staging == dataclasses.replace(  # the rest is the executor's
        settings, n_a=1, n_b=1, tail_panels=1, ramp=0, split_last=in_core.staging.split_last,
        min_stripes=in_core.staging.min_stripes, n_stage=in_core.staging.n_stage,
        n_out=in_core.staging.n_out)
    panelled = replan(in_core, staging=settings, tile=(200, 100, 100), why="panels again")
    assert not panelled.in_core and panelled.staging == settings  # nothing of in-core's left
    kept = oocgemm.plan(rand(rng, (300, 200)), rand(rng, (200, 100)), device="cpu",
                        tile=(100, 50, 50))
    p, q, nk = kept.grid
    assert (kept.staging.n_a, kept.staging.n_b) == (p * nk, q * nk)  # a slot per panel
    assert dataclasses.replace(kept.staging, n_a=2, n_b=2) == cpu.settings


# -- who compresses C (the GPU encode pass, once the output is open) ------------------------
@dataclasses.dataclass(frozen=True)
class _NvcompSizes:
    """nvCOMP's buffers as the CUDA backend states them (``nvcomp.Sizes``), here given: the
    library is not loaded on a machine without a GPU, and the pass takes them as facts."""

    host: int = 64 << 10
    device: int = 1 << 20

    def host_bytes(self, rows, cols) -> int:
        return self.host

    def device_bytes(self, stripes) -> int:
        return self.device


@contextlib.contextmanager
def _opened_for_a_gpu(rng, out_options=None, gpu_encode=True, **facts):
    """A product of 512 x 300 @ 300 x 384 into a new Zarr output planned for a GPU that is
    not here (tile 256 x 256 x 100; ``gpu_encode`` as a GPU's plan takes it by default), the
    output opened for its plan and the plan's writer made, as a run does: (io, plan,
    writer)."""
    a, b = rand(rng, (512, 300)), rand(rng, (300, 384))
    options = out_options or {"compressors": "zstd", "chunks": (128, 128)}
    with open_run(a, b, "c.zarr", out_options=options) as io:
        m, n, k = io.shape
        op_a, op_b, op_c, out = io.operands()
        problem = Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=op_a, b=op_b,
                          c=op_c, out=out, alpha=1.0, beta=0.0, shared=io.shared)
        plan = make_plan(problem, _cuda_facts(problem, tile=(256, 256, 100),
                                              gpu_encode=gpu_encode, **facts))
        plan = io.begin(plan, overwrite=False, resume_=False, attributes={})
        try:
            yield io, plan, io.writer(plan)
        finally:
            io.sink.abort()


def _encoded(plan, writer, **facts):
    """The GPU encode pass on ``plan`` for ``writer``, the writer's facts changed by
    ``facts`` (nvCOMP's sizes)."""
    return gpu_encode_pass(plan, dataclasses.replace(output_facts(plan, writer), **facts))


def _said(plan) -> str:
    """The GPU encode pass's decision, as the plan records and shows it."""
    said = [d for d in plan.decisions if d.startswith("gpu encode: ")]
    assert len(said) == 1, plan.decisions
    assert said[0] in str(plan) and said[0] in plan.summary()["decisions"]
    return said[0]


def test_the_gpu_encodes_every_stripe_of_c_where_nvcomp_is_found(rng, workdir):
    with _opened_for_a_gpu(rng) as (io, plan, writer):
        assert output_facts(plan, writer).frame_chunks == (128, 128)  # the output's, opened
        encoded = _encoded(plan, writer, encoder=_NvcompSizes())
    ops = encoded.schedule.ops
    downs = {op.index for op in ops if op.kind is OpKind.DOWNLOAD}
    frames = encoded.io.c_frames
    assert frames is not None and frames.downloads == downs and not frames.host
    assert frames.writes == {op.index for op in ops
                             if op.kind is OpKind.WRITE and op.deps[0] in downs}
    assert frames.stripes == tuple(ops[i].region for i in sorted(downs))
    assert frames.ring == _NvcompSizes().host
    assert _said(encoded) == (f"gpu encode: every stripe of C ({len(downs)}) compressed on "
                              f"the GPU (nvCOMP)")
    assert plan.io.c_frames is None and not any(d.startswith("gpu encode") for d in plan.decisions)
    assert encoded.schedule is plan.schedule  # built once, not again for the decision
    # a plan made again forgets it: its run decides again, for its own writer
    again = replan(encoded, blocks=((1, 1),), why="a group")
    assert again.io.c_frames is None
    assert not any(d.startswith("gpu encode") for d in again.decisions)


def test_the_gpu_encodes_nothing_without_nvcomp(rng, workdir):
    """Without nvCOMP (True: C's chunks encoded whole; 'last': every stripe by the host's
    encoders); through the run's I/O, with the backend's facts, where it is not found here."""
    from oocgemm.cuda import nvcomp

    with _opened_for_a_gpu(rng) as (io, plan, writer):
        off = _encoded(plan, writer, encoder=None)
        asked = dataclasses.replace(plan.io, gpu_encode="last")
        last = _encoded(dataclasses.replace(plan, io=asked), writer, encoder=None)
        if nvcomp.library() is None:
            assert io.encoded(plan, writer) == off
    assert off.io.c_frames is None
    assert _said(off) == ("gpu encode: off: nvCOMP not found; the host encodes C's chunks "
                          "whole")
    assert last.io.c_frames is not None and last.io.c_frames.host and not last.io.c_frames.downloads
    assert _said(last) == ("gpu encode: every stripe of C made into frames by the host's "
                           "encoders: nvCOMP not found (gpu_encode='last')")


@pytest.mark.parametrize("budget", ["memory_limit", "host_memory_limit"])
def test_the_gpu_encodes_nothing_where_nvcomps_buffers_do_not_fit(rng, workdir, budget):
    with _opened_for_a_gpu(rng) as (io, plan, writer):
        if budget == "memory_limit":  # nvCOMP's device buffers beside the plan's
            room = plan.memory_limit - plan.device_bytes
            fits, over = _NvcompSizes(device=room), _NvcompSizes(device=room + 1)
        else:  # each output ring buffer grown to hold a stripe's frames
            room = plan.host_memory_limit - plan.host_bytes
            ring = plan.buffers.out_ring + room // plan.staging.n_out
            fits, over = _NvcompSizes(host=ring), _NvcompSizes(host=ring + 1)
        encoded, refused = (_encoded(plan, writer, encoder=sizes) for sizes in (fits, over))
    assert encoded.io.c_frames is not None and encoded.io.c_frames.downloads
    assert refused.io.c_frames is None
    assert _said(refused).startswith(f"gpu encode: off: nvCOMP's buffers would not fit "
                                     f"{budget}=")


def test_c_not_stored_from_frames_is_encoded_whole_on_the_host(rng, workdir):
    """An output that takes no frames (a checksum), and blocks that cut the output's
    chunks: C's chunks encoded whole, whatever nvCOMP."""
    from oocgemm.lifecycle.run import chunk_writer

    checksum = {"compressors": zarr.codecs.ZstdCodec(checksum=True), "chunks": (128, 128)}
    with _opened_for_a_gpu(rng, out_options=checksum) as (io, plan, writer):
        assert output_facts(plan, writer) == OutputFacts(frame_chunks=None)
        unframed = _encoded(plan, writer, encoder=_NvcompSizes())
    assert unframed.io.c_frames is None
    assert _said(unframed).startswith("gpu encode: C not stored from zstd frames: the output "
                                      "takes none")
    with _opened_for_a_gpu(rng) as (io, plan, writer):
        cut = replan(plan, tile=(192, 256, 100), why="blocks that cut the chunks")
        encoded = _encoded(cut, chunk_writer(plan, io.sink), encoder=_NvcompSizes())
    assert encoded.io.c_frames is None
    assert _said(encoded) == ("gpu encode: C not stored from zstd frames: the C blocks cut "
                              "the output's chunks of 128x128; the host encodes its chunks "
                              "whole")


@pytest.mark.parametrize("mode, said", [
    (False, "gpu encode: off (gpu_encode=False): the host encodes C's chunks whole"),
    ("frames", "gpu encode: every stripe of C made into frames by the host's encoders "
               "(gpu_encode='frames')"),
    ("last", "gpu encode: 2 of the last C block's 4 stripes compressed on the GPU (nvCOMP), "
             "the others made into frames by the host's encoders, a stripe each "
             "(gpu_encode='last')"),
])
def test_who_compresses_c_follows_gpu_encode(rng, workdir, mode, said):
    with _opened_for_a_gpu(rng, gpu_encode=mode) as (io, plan, writer):
        assert plan.io.gpu_encode == mode
        encoded = _encoded(plan, writer, encoder=_NvcompSizes())
    assert _said(encoded) == said
    frames = encoded.io.c_frames
    assert (frames is None) == (mode is False)
    if mode == "last":  # of the last block's four stripes: the second and the fourth
        downs = [op for op in encoded.schedule.ops if op.kind is OpKind.DOWNLOAD]
        last = [op.index for op in downs if op.key == downs[-1].key]
        assert frames.host and frames.downloads == {last[1], last[3]}


def test_a_cpu_plan_is_left_to_its_host(rng, workdir):
    """An unstaged plan (the CPU's) stores C as its host encodes it: nothing to decide, the
    same plan (a CPU run's result.plan is the plan it was given)."""
    a, b = rand(rng, (64, 48)), rand(rng, (48, 32))
    plan = oocgemm.plan(a, b, device="cpu")
    assert gpu_encode_pass(plan, OutputFacts((32, 32), _NvcompSizes())) is plan


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

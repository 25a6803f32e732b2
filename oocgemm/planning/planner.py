"""The planner: every decision of a product's plan, made here, in named passes, from facts.

:func:`make_plan` takes a :class:`~oocgemm.planning.problem.Problem` and the :class:`Facts`
that the run's I/O and the device's backend gathered (budgets, the executor's staging, the
user's tile, whether nvCOMP is found, which inputs the page cache holds), and runs the
passes in order:

1. ``tile``: the user's tile (with advice where the planner's own is far faster), the
   in-core shape, or the search (:func:`plan_product`); then the plan is finished for its
   tile (stripes, ring decodes, kept chunks: :func:`~oocgemm.planning.finish.finished`);
2. ``gpu decode``: which zstd inputs the device decodes (:func:`decoded_on_device`);
3. ``page cache``: the inputs the page cache holds read at the host's memory rate in the
   prediction (:func:`told_cached`), the blocks chosen as for storage;
4. ``gpu encode``: which of C's stripes the GPU compresses (:func:`gpu_encode_pass`), made
   once the output is open, for each plan a run executes, from the facts of its writer
   (:class:`OutputFacts`): whether C can be stored from frames, and in which chunks, is
   known only then.

Each pass records what it chose and why in :attr:`Plan.decisions
<oocgemm.planning.plan.Plan.decisions>` (``print(plan)`` and ``plan.summary()`` show them).
Plans made again for a run under way (a resume's tile, a group of blocks for one of several
devices, smaller blocks after memory ran short) come from :func:`replan`. Nothing here
reads storage or touches a device.
"""

from __future__ import annotations

import dataclasses
import numbers
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from ..devices import Device
from ..errors import BudgetError, OptionError
from ..strategies import strategy_of
from ..units import format_seconds, format_size
from .chunks import on_chunk_edges
from .finish import FINISHING, finished, on_object_edges, with_tile_advice
from .model import DeviceModel
from .plan import CFrames, IOChoices, Plan, kept_built, with_gpu_decode
from .problem import Problem
from .schedule import Op, OpKind
from .staging import Staging, StagingSettings
from .tiling import choose_tile, in_core_shape, in_place


@dataclass(frozen=True)
class Facts:
    """What the planner's decisions need to know beside the problem, gathered before it runs
    by the run's I/O and the device's backend."""

    device: Device
    """The device the plan is made for."""
    kernel: str
    """The per-block GEMM (checked against the dtype and the device)."""
    model: DeviceModel
    """The device's rates."""
    memory_limit: int
    """Bytes of the device's buffers (GPU memory, or the CPU's working buffers)."""
    host_memory_limit: int
    """Bytes of host staging and read buffers."""
    staging: Staging
    """The executor's staging."""
    tile: tuple[int, int, int] | None = None
    """The user's tile, or None for the planner's."""
    gpu_decode: bool | str = False
    """True decodes the inputs' zstd frames on the device wherever the plan allows, False on
    the host (where the device cannot decode), 'auto' where the model predicts it faster."""
    gpu_encode: bool | str = False
    """Who compresses C where a run stores it from zstd frames (:attr:`Plan.io.gpu_encode
    <oocgemm.planning.plan.IOChoices.gpu_encode>`): False where the device cannot encode."""
    decoder_found: bool = False
    """The device's zstd decoder (nvCOMP) is found."""
    cached: frozenset[str] = frozenset()
    """The stored inputs ('A', 'B') the OS page cache holds."""
    write_back: int = 0
    """Bytes of writes the OS page cache takes now before it holds the writers to the
    disk's rate (0: unknown, or an output not in local files)."""
    given_limits: tuple = (None, None)
    """memory_limit and host_memory_limit as the user spelled them (for the hints of a
    BudgetError), or None."""
    notes: tuple[str, ...] = ()
    """What the plan notes of how the facts came to be (a GPU's decoding or encoding asked
    for on the CPU)."""

    def key(self) -> tuple:
        """What :func:`plan_product` reads of the facts (the cache's key)."""
        return (self.device, self.kernel, self.model, self.memory_limit,
                self.host_memory_limit, self.staging.staged,
                self.staging.settings, self.tile, self.gpu_encode)


def make_plan(problem: Problem, facts: Facts) -> Plan:
    """The plan of ``problem`` under ``facts``: the passes of this module in order, each
    decision recorded in the plan, but the last (:func:`gpu_encode_pass`, which takes facts
    of the open output). A plan of one block and one panel made before from the same
    problem and facts is taken from :data:`SMALL_PLANS`."""
    key = _plan_key(problem, facts)
    plan = SMALL_PLANS.get(key)
    if plan is None:
        plan = plan_product(problem, facts)
        if key is not None and _one_block(plan):
            SMALL_PLANS.put(key, plan)
    plan = told_cached(gpu_decode_pass(problem, facts, plan), facts.cached, facts.write_back)
    return dataclasses.replace(plan, notes=plan.notes + facts.notes) if facts.notes else plan


def replan(plan: Plan, *, why: str, tile: tuple[int, int, int] | None = None,
           memory_limit: int | None = None, host_memory_limit: int | None = None,
           staging: StagingSettings | None = None, blocks: tuple | None = None,
           done: tuple | None = None, problem: Problem | None = None,
           device: Device | None = None, chosen_by: str | None = None) -> Plan:
    """``plan`` made again for a run under way, ``why`` said in its decisions: with another
    ``tile`` (a resume's: the interrupted run's; kept as given), or the best tile under other
    budgets (memory ran short: every block computed again), with the executor's ``staging``
    settings (a plan leaving the in-core shape); or the same tile for only ``blocks`` (a
    group for one of several devices), with ``done`` blocks skipped (a resume), for another
    ``problem`` (a part of K) or ``device``; ``chosen_by`` says who chose its tile. A tile
    given or chosen again finishes the plan again (its ring decodes and kept chunks decided
    anew, decoded on the host: the tile given may be the plan's own, to finish it again for
    its ``blocks``)."""
    changes: dict = {}
    work = plan.work
    if staging is not None:
        changes.update(in_core=False, staging=staging)
    if problem is not None:
        changes["problem"] = problem
    if device is not None:
        changes["device"] = device
    if memory_limit is not None or host_memory_limit is not None:
        mem = plan.memory_limit if memory_limit is None else memory_limit
        host = plan.host_memory_limit if host_memory_limit is None else host_memory_limit
        trial = dataclasses.replace(plan, **changes)
        try:
            tile = choose_tile(trial.problem, trial.model, mem, host, staged=trial.staged,
                               strategy=trial.strategy, symmetric=trial.symmetric,
                               **trial.staging.tiling())
        except BudgetError as budget:
            raise BudgetError(f"{why}; and no smaller plan fits: {budget}") from None
        changes.update(memory_limit=mem, host_memory_limit=host,
                       chosen_by="planner, again after running out of memory")
        work = dataclasses.replace(work, done=())
    if tile is not None:
        changes["tile"] = tile
    if chosen_by is not None:
        changes["chosen_by"] = chosen_by
    if blocks is not None:
        work = dataclasses.replace(work, blocks=tuple(blocks))
    if done is not None:
        work = dataclasses.replace(work, done=tuple(done))
    # who compresses C was decided for the run of another plan (and another writer): the
    # run of this one decides it again (gpu_encode_pass)
    changes.update(work=work, io=dataclasses.replace(plan.io, c_frames=None), decisions=tuple(
        d for d in plan.decisions if not d.startswith(ENCODING)))
    again = dataclasses.replace(plan, **changes)
    if tile is not None:
        again = finished(again)
    return _decided(again, "replan", why)


# -- pass 1: the tile -----------------------------------------------------------------------
def plan_product(problem: Problem, facts: Facts, in_core: bool = True) -> Plan:
    """The plan of ``problem`` under ``facts`` before the device's decoding is weighed: the
    user's tile (advised against where the planner's own is far faster), or the planner's
    choice (``in_core``: the in-core shape where it applies), finished for its tile."""
    if problem.shared and problem.a.sliced:
        # One matrix in both roles whose chunk files could be sliced block by block: read at
        # its grain instead, each chunk once for both roles, where a chunk fits the budgets
        # (else sliced, holding no chunk: under a budget smaller than one)
        whole = dataclasses.replace(problem, a=dataclasses.replace(problem.a, sliced=False),
                                    b=dataclasses.replace(problem.b, sliced=False))
        try:
            return plan_product(whole, facts, in_core)
        except BudgetError:
            pass
    staging, kernel, model = facts.staging, facts.kernel, facts.model
    mem, host, tile = facts.memory_limit, facts.host_memory_limit, facts.tile
    # X^T X computes the blocks on and above the diagonal, with square blocks (a tile of
    # the user's that is not square computes the product in full, as they asked).
    strategy = strategy_of(kernel)  # (the kernel's name looked up here, once)
    symmetric = problem.gram and strategy.halves_gram and (
        tile is None or problem.clipped(tile)[0] == problem.clipped(tile)[1])
    settings: dict[str, Any] = dict(
        problem=problem, device=facts.device, model=model, memory_limit=mem,
        host_memory_limit=host, staged=staging.staged, kernel=kernel, symmetric=symmetric,
        io=IOChoices(gpu_encode=facts.gpu_encode), staging=staging.settings)
    if tile is not None:  # said in the plan where the planner's own choice is far faster
        given = finished(Plan(tile=problem.clipped(tile), chosen_by="tile", **settings))
        return _decided(with_tile_advice(
            given, lambda: plan_product(problem, dataclasses.replace(facts, tile=None),
                                        in_core)), "tile", "the user's (tile=)")
    shape = in_core_shape(problem, model, mem, staged=staging.staged, strategy=strategy,
                          symmetric=symmetric, settings=staging.settings) if in_core else None
    if shape is not None:  # A, B and C on the device at once: no tile to search for
        try:
            return _decided(finished(Plan(**{**settings, **shape})), "tile",
                            "the in-core shape: A, B and C fit on the device at once")
        except BudgetError:  # its staging does not fit the host budget
            pass
    try:
        tile = choose_tile(problem, model, mem, host, staged=staging.staged,
                           strategy=strategy, symmetric=symmetric, **staging.settings.tiling())
    except BudgetError as exc:
        memory, host_memory = facts.given_limits
        raise BudgetError(str(exc) + _unit_hint(memory_limit=memory,
                                                host_memory_limit=host_memory)) from None
    if (in_place(problem, staging.staged) and not symmetric
            and tile == (problem.m, problem.n, problem.k)):
        # One block computed where it goes: its last panel in one GEMM (row stripes let a
        # last block be written as it becomes final, and nothing is written here). On the
        # CPU, row stripes' several GEMMs took longer than one (docs/performance.md,
        # "Figures moved from the code's docstrings").
        settings["staging"] = dataclasses.replace(staging.settings, split_last=1)
    plan = finished(Plan(tile=tile, **settings))
    return _decided(plan, "tile", f"the planner's search under the budgets (predicted "
                                  f"{format_seconds(plan.prediction.total)}, "
                                  f"{plan.prediction.bound}-bound)")


def _unit_hint(**limits) -> str:
    """A question for budgets given as a bare number under 1 MiB: bytes, or a unit forgotten?"""
    for name, value in limits.items():
        bare = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().isdigit())
        if bare and int(value) < (1 << 20):
            return (f". {name}={value} is bytes (a bare number): did you mean "
                    f"'{int(value)}MB' or '{int(value)}GB'?")
    return ""


# -- pass 2: who decodes the inputs ---------------------------------------------------------
def gpu_decode_pass(problem: Problem, facts: Facts, plan: Plan) -> Plan:
    """``plan`` with the zstd inputs the device decodes, after ``facts.gpu_decode``: the
    host's where it is False (the device cannot decode), or (with 'auto') nvCOMP is not found;
    else the plan that decodes on the device (with 'auto': where the model predicts it
    faster). An in-core plan is weighed against the panelled plan decoding on the device."""
    mode = facts.gpu_decode
    if not (isinstance(mode, bool) or mode == "auto"):
        raise OptionError(f"gpu_decode={mode!r}: 'auto', True or False")
    if mode is False:
        return plan
    if mode == "auto" and not facts.decoder_found:
        return _decided(plan, "gpu decode", "on the host: nvCOMP is not found")
    # In core, A and B are each one panel: decoding them on the device takes the panelled
    # plan, which the choice weighs against the in-core one.
    base = plan_product(problem, facts, in_core=False) if _in_core_decodable(plan) else plan
    if not decodable(base):
        return plan
    chosen = decoded_on_device(base, choose=mode == "auto",
                               cached=mode == "auto" and facts.cached == {"A", "B"}, host=plan)
    if chosen.io.gpu_decode:
        why = ("asked (gpu_decode=True)" if mode is True else
               f"predicted {format_seconds(chosen.prediction.total)} against "
               f"{format_seconds(plan.prediction.total)} decoding on the host")
        return _decided(chosen, "gpu decode",
                        f"{' and '.join(chosen.io.gpu_decode)} on the device: {why}")
    return _decided(chosen, "gpu decode", "on the host: " + (
        "predicted faster" if mode == "auto" else "no tile on the stored objects' edges fits"))


def decodable(plan: Plan) -> tuple[str, ...]:
    """The inputs of ``plan`` that a device could decode (zstd frames, chunked): none where
    the plan is not staged, is in core, or takes one matrix in both roles."""
    if plan.problem.shared or not plan.staged or plan.in_core:
        return ()
    return _zstd_inputs(plan.problem)


def _zstd_inputs(prob: Problem) -> tuple[str, ...]:
    """The inputs stored as chunks of zstd frames (:attr:`Operand.zstd_frames
    <oocgemm.planning.problem.Operand.zstd_frames>`)."""
    return tuple(name for name, x in (("A", prob.a), ("B", prob.b))
                 if x.zstd_frames is not None and x.chunks is not None)


#: Seconds of host decoding below which an in-core plan is not weighed against decoding
#: on the device: the device's route has costs the model does not count (nvCOMP's buffers,
#: the decoder's tables), and a tenth of a second is all there is to gain.
IN_CORE_DECODE_FLOOR = 0.1


def _in_core_decodable(plan: Plan) -> bool:
    """An in-core plan whose inputs a device could decode, in a panelled plan, and whose
    host decoding is worth weighing against that."""
    prob = plan.problem
    return (plan.in_core and not prob.shared and plan.chosen_by != "tile"
            and bool(_zstd_inputs(prob))
            and plan.prediction.decode >= IN_CORE_DECODE_FLOOR)  # (numpy inputs: not asked)


def decoded_on_device(plan: Plan, choose: bool = False, cached: bool = False,
                      host: Plan | None = None) -> Plan:
    """``plan`` with its operands of zstd frames decoded on the device
    (:func:`~oocgemm.planning.with_gpu_decode`): both where both can be, else the one that
    can. The planner's tile gives way to the nearest on the stored objects' edges that fits
    the budgets (:func:`~oocgemm.planning.finish.on_object_edges`); a tile the user gave
    does not. ``choose``: only where the model predicts it faster than ``host`` (which
    decodes on the host; ``plan`` where not given, else the plan to keep where decoding on
    the device is not faster: an in-core plan): with the inputs' files in the page cache
    (``cached``: their reads at the host's memory rate), or from a disk at the model's
    storage rate (a reload of an operand decoded on the device reads its objects again).
    Where no plan decodes on the device, ``host`` (``plan``)."""
    host = plan if host is None else host
    able = decodable(plan)
    if not able:
        return host
    # Where both inputs can, the model's choice is both or neither: with one on the host, a
    # kept operand's decoding all comes in the first block row, which the model's overlap of
    # resources does not see (A alone on the GPU was far slower than both, barely quicker
    # than neither: docs/performance.md, "Who decodes the inputs").
    candidates = []
    for operands in [able] + ([(name,) for name in able] if len(able) == 2 and not choose
                              else []):
        tiles = [plan.tile] if plan.chosen_by == "tile" else on_object_edges(plan, operands)
        for tile in tiles:
            try:
                trial = plan if tile == plan.tile else finished(dataclasses.replace(
                    plan, tile=tile, chosen_by="planner, on the stored objects' edges"))
                candidates.append(with_gpu_decode(trial, operands))
                break
            except (OptionError, BudgetError):
                continue
        if candidates and not choose:
            return candidates[0]
    if not choose:
        return host

    def seconds(p: Plan) -> float:  # cached: storage read at the host's memory rate
        if cached:
            p = dataclasses.replace(p, model=dataclasses.replace(
                p.model, storage_read=p.model.memory_copy))
        return p.prediction.total

    return min([host] + candidates, key=seconds)


# -- pass 3: the page cache -----------------------------------------------------------------
def told_cached(plan: Plan, cached, write_back: int = 0) -> Plan:
    """``plan``, its prediction told which stored inputs the OS page cache holds (``cached``:
    'A', 'B'; read at the host's memory rate), and whether it takes all of C's writes
    (``write_back``: the bytes it takes before it holds the writers to the disk's rate; C
    written at the model's ``cache_write`` rate, the OS writing it back behind the call);
    its blocks chosen as for storage, so that a product plans the same bits warm and cold
    (:attr:`Operand.cached <oocgemm.planning.problem.Operand.cached>`)."""
    prob = plan.problem
    held = {role: dataclasses.replace(getattr(prob, role), cached=True)
            for role, name in (("a", "A"), ("b", "B"))
            if getattr(prob, role).on_disk and name in cached}
    c_bytes = prob.m * prob.n * prob.itemsize
    out = prob.out
    taken = out is not None and out.on_disk and 0 < c_bytes <= write_back
    if out is not None and taken:
        held["out"] = dataclasses.replace(out, cached=True)
    if not held:
        return plan
    told = dataclasses.replace(plan, problem=dataclasses.replace(prob, **held))
    names = " and ".join(sorted(name for name in cached
                                if getattr(prob, name.lower()).on_disk))
    said = [f"{names} held: read at the host's memory rate in the prediction (the blocks "
            f"as for storage)"] if names else []
    if taken:
        said.append(f"C's {format_size(c_bytes)} taken by it before the OS holds writers "
                    f"to the disk's rate ({format_size(write_back)}): written at the host's "
                    f"rate in the prediction, the OS writing it back behind the call")
    return _decided(told, "page cache", "; ".join(said))


# -- pass 4: who compresses C, once the output is open ---------------------------------------
class EncoderSizes(Protocol):
    """nvCOMP's buffers for stripes of C in the output's framing: what the device's encoder
    of C's stripes holds (the device's backend's: :meth:`Backend.encoder
    <oocgemm.backends.Backend.encoder>`)."""

    def host_bytes(self, rows: tuple[int, int], cols: tuple[int, int]) -> int:
        """Pinned bytes the frames of the stripe ``rows`` x ``cols`` of C take in an output
        ring buffer (frames, their sizes and statuses)."""
        ...

    def device_bytes(self, stripes: tuple) -> int:
        """Device bytes an encoder of ``stripes`` ((rows, cols) of C each) holds."""
        ...


@dataclass(frozen=True)
class OutputFacts:
    """What :func:`gpu_encode_pass` needs to know beside the plan: facts of the open output
    and of the writer a run of the plan writes it through (:func:`output_facts
    <oocgemm.lifecycle.run.output_facts>` gathers them)."""

    frame_chunks: tuple[int, int] | None
    """The output's chunks (rows, columns), where the run's writer stores them from zstd
    frames; None where it stores C as arrays only."""
    encoder: EncoderSizes | None = None
    """nvCOMP's buffers for stripes of C in the output's framing; None where nvCOMP is not
    found."""


#: The share of the run's last C block's stripes that ``gpu_encode='last'`` has the
#: GPU compress, the rest the host's: in proportion to their rates, nvCOMP's the higher
#: (docs/performance.md, "Figures moved from the code's docstrings").
GPU_SHARE = 0.6

#: How the GPU encode pass's decisions start (:attr:`Plan.decisions`): one per plan.
ENCODING = "gpu encode: "


def gpu_encode_pass(plan: Plan, facts: OutputFacts) -> Plan:
    """``plan`` with who compresses C's stripes decided (:attr:`Plan.io.c_frames
    <oocgemm.planning.plan.IOChoices.c_frames>`) and recorded, as :attr:`Plan.io.gpu_encode
    <oocgemm.planning.plan.IOChoices.gpu_encode>` asks: True (the default), the GPU every stripe
    (nvCOMP); 'last', :data:`GPU_SHARE` of the last C block's stripes on the GPU and the
    others on the host's encoders, a stripe each; 'frames', every stripe on the host's
    encoders; False, none (C's chunks gathered and encoded whole on the host, as where C is
    not stored from frames: :func:`unframed`). Without nvCOMP, or where its buffers would
    not fit the plan's budgets, the GPU compresses nothing (with True: C's chunks whole).
    An unstaged plan (the CPU's) is returned as it is: its host encodes C.

    The one pass that :func:`make_plan` does not run: whether C can be stored from frames,
    and in which chunks, is a fact of the open output (a new output's chunks follow the
    plan's tile: :func:`~oocgemm.lifecycle.outputs.output_layout`; whether it takes frames,
    of its codec and where it is created) and of the writer made for the run. So the run's
    I/O asks it once the output is open, for each plan that an executor runs
    (:meth:`RunIO.encoded <oocgemm.lifecycle.run.RunIO.encoded>`: the product's, a group's
    on one of several devices, a plan made again after memory ran short); a plan made
    again (:func:`replan`) forgets it."""
    if not plan.staged:
        return plan
    mode = plan.io.gpu_encode
    if mode not in (True, "last", "frames"):
        return _encoding(plan, None, "off (gpu_encode=False): the host encodes C's chunks "
                                     "whole")
    why = unframed(plan, facts.frame_chunks)
    if why is not None:
        return _encoding(plan, None, f"C not stored from zstd frames: {why}; the host "
                                     f"encodes its chunks whole")
    downs = [op for op in plan.schedule.ops if op.kind is OpKind.DOWNLOAD]
    mine = _gpu_stripes(mode, downs)
    stripes = tuple(op.region for op in mine)
    ring, off = 0, None
    if mine and facts.encoder is None:
        off = "nvCOMP not found"
    elif mine:
        assert facts.encoder is not None
        ring = max(facts.encoder.host_bytes(*s) for s in stripes)
        off = _over_budgets(plan, facts.encoder.device_bytes(stripes), ring)
    if off is not None:
        mine, stripes, ring = [], (), 0
    if not mine and mode is True:
        return _encoding(plan, None, f"off: {off or 'no stripe of C goes down'}; the host "
                                     f"encodes C's chunks whole")
    indices = frozenset(op.index for op in mine)
    writes = frozenset(op.index for op in plan.schedule.ops
                       if op.kind is OpKind.WRITE and op.deps and op.deps[0] in indices)
    frames = CFrames(indices, writes, stripes, ring, host=mode is not True)
    return _encoding(plan, frames, _shared_out(mode, frames, downs, off))


def unframed(plan: Plan, chunks: tuple[int, int] | None) -> str | None:
    """Why a run of ``plan`` cannot store C from zstd frames into an output whose writer
    stores its ``chunks`` from frames (None: the output takes none); None where it can: a
    staged plan (C leaves through the output ring, stripe by stripe) whose WRITEs store the
    stripes as they come (no C added on the host), its C blocks starting on the chunks' edges
    (a group planned again on one of several devices writes blocks inside the writer's,
    which may cut its chunks)."""
    if chunks is None:
        return ("the output takes none (only a Zarr array this run creates on a local disk, "
                "its chunks zstd without a checksum, takes them)")
    if not plan.staged:
        return "the plan is not staged: C does not go down stripe by stripe"
    if any(op.beta != 0 for op in plan.schedule.ops if op.kind is OpKind.WRITE):
        return "C is added on the host as it is written"
    prob = plan.problem
    if not on_chunk_edges((plan.row_splits, plan.col_splits), chunks, (prob.m, prob.n)):
        return f"the C blocks cut the output's chunks of {chunks[0]}x{chunks[1]}"
    return None


def _gpu_stripes(mode, downs: list[Op]) -> list[Op]:
    """The DOWNLOADs whose stripes ``mode`` (:attr:`Plan.io.gpu_encode
    <oocgemm.planning.plan.IOChoices.gpu_encode>`) asks the GPU to compress."""
    if mode is True:
        return downs
    if mode == "last" and downs:
        last = [op for op in downs if op.key == downs[-1].key]
        return [op for k, op in enumerate(last)
                if int((k + 1) * GPU_SHARE) > int(k * GPU_SHARE)]
    return []


def _over_budgets(plan: Plan, device: int, ring: int) -> str | None:
    """Which budget nvCOMP's buffers would not fit beside ``plan``'s (``device`` bytes on
    the device, and output ring buffers of ``ring`` bytes), in words; None where both fit."""
    if plan.device_bytes + device > plan.memory_limit:
        return (f"nvCOMP's buffers would not fit memory_limit={format_size(plan.memory_limit)}"
                f" ({format_size(device)} beside the plan's {format_size(plan.device_bytes)})")
    more = plan.staging.n_out * max(0, ring - plan.buffers.out_ring)
    if plan.host_bytes + more > plan.host_memory_limit:
        return (f"nvCOMP's buffers would not fit host_memory_limit="
                f"{format_size(plan.host_memory_limit)} ({plan.staging.n_out} output ring "
                f"buffers of {format_size(ring)} beside the plan's {format_size(plan.host_bytes)})")
    return None


def _shared_out(mode, frames: CFrames, downs: list[Op], off: str | None) -> str:
    """What :func:`gpu_encode_pass` chose where C is stored from frames, in words."""
    asked = f" (gpu_encode={mode!r})"
    if not frames.host:
        return f"every stripe of C ({len(frames.downloads)}) compressed on the GPU (nvCOMP)"
    if frames.downloads:
        last = sum(op.key == downs[-1].key for op in downs)
        return (f"{len(frames.downloads)} of the last C block's {last} stripes compressed on "
                f"the GPU (nvCOMP), the others made into frames by the host's encoders, a "
                f"stripe each" + asked)
    return ("every stripe of C made into frames by the host's encoders"
            + (f": {off}" if off else "") + asked)


def _encoding(plan: Plan, frames: CFrames | None, why: str) -> Plan:
    """``plan`` with ``frames`` (:attr:`Plan.io.c_frames
    <oocgemm.planning.plan.IOChoices.c_frames>`) and why recorded, in place of an earlier
    decision of the pass; its schedule, built already, kept."""
    decisions = tuple(d for d in plan.decisions if not d.startswith(ENCODING))
    return kept_built(plan, io=dataclasses.replace(plan.io, c_frames=frames),
                      decisions=decisions + (ENCODING + why,))


def _decided(plan: Plan, step: str, why: str) -> Plan:
    """``plan`` with what ``step`` chose and why recorded (:attr:`Plan.decisions`); the tile
    before what finishing the plan for it chose (:data:`~oocgemm.planning.finish.FINISHING`),
    in the order they were made."""
    said = f"{step}: {why}"
    if step != "tile":
        return dataclasses.replace(plan, decisions=plan.decisions + (said,))
    before = tuple(d for d in plan.decisions if not d.startswith(FINISHING))
    after = tuple(d for d in plan.decisions if d.startswith(FINISHING))
    return dataclasses.replace(plan, decisions=before + (said,) + after)


# -- plans of small products, kept ----------------------------------------------------------
class PlanCache:
    """The last few plans of one C block and one K panel, by what made them
    (:func:`plan_product` is a pure function of its arguments, and a plan with its schedule
    is immutable): a loop of small products of one shape plans once. Planning and building
    the schedule are a noticeable share of a small product's call (docs/performance.md,
    "Figures moved from the code's docstrings"); a product of many blocks runs for seconds,
    and its plans (schedules of thousands of operations) are not kept."""

    def __init__(self, size: int = 16):
        self.size = size
        self._plans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> Plan | None:
        if key is None:
            return None
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
            return plan

    def put(self, key, plan: Plan) -> None:
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


#: The process's plans of small products (:class:`PlanCache`).
SMALL_PLANS = PlanCache()


def _one_block(plan: Plan) -> bool:
    """One C block and one K panel: a schedule of a few operations."""
    prob = plan.problem
    return plan.tile[0] >= prob.m and plan.tile[1] >= prob.n and plan.tile[2] >= prob.k


def _plan_key(problem: Problem, facts: Facts):
    """What :func:`plan_product` reads of its arguments, hashable; None where a part is not
    (such a plan is made each time)."""
    try:
        return _Key((problem, type(problem.alpha), type(problem.beta), facts.key()))
    except TypeError:  # a part that cannot be hashed
        return None


class _Key:
    """A plan's key with its hash taken once: hashing the problem (its operands, nested
    dataclasses) is most of what a cache hit costs, and a lookup hashes its key twice."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash \
            and self.parts == other.parts

"""One product, ``out = alpha * op(a) @ op(b) + beta * c``, as an object with a life:
made (its options checked, its operands and output target opened and checked), planned
(:meth:`Product.plan`: the plan, from the facts of that I/O, without reading a byte),
executed (:meth:`Product.execute`: exactly that plan, then the output committed), closed
(:meth:`Product.close`, or the end of a ``with`` block: what it opened is released).

The stateful form, in the manner of nvmath-python's ``Matmul``; :func:`oocgemm.multiply`,
:func:`oocgemm.plan`, :class:`oocgemm.Engine`, the command line and ``oocgemm.dask`` are thin
wrappers over it::

    with oocgemm.Product("a.zarr", "b.zarr", "c.zarr", device="cuda") as product:
        print(product.plan())          # read nothing yet
        result = product.execute()     # runs the plan printed above

The run's I/O is opened and checked by :func:`~oocgemm.lifecycle.run.open_run` (the operands,
the output target, aliasing); the plan is made by :mod:`oocgemm.planning` (which never
touches storage) with the executor's staging handed over as data
(:mod:`oocgemm.runtime.staging`); the runtime (:func:`oocgemm.runtime.execute.execute`: one
executor, or one per device) replays the plan's schedule, planning again with smaller
blocks when memory runs short; the output is checked when asked and committed; the result
says what happened.
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import machine
from .arguments import flag, scalar
from .devices import Device, device_names, planned_for, resolve_device
from .errors import BudgetError, ExecutionError, OptionError
from .kernel_catalog import check_kernel
from .labels import labelled
from .lifecycle.run import RunIO, chunk_counts, open_run
from .options import Options
from .planning import (
    STAGING,
    Plan,
    Problem,
    choose_tile,
    cpu_model,
    cuda_model,
    finished,
    in_core_shape,
    in_place,
    on_object_edges,
    with_gpu_decode,
    with_tile_advice,
)
from .result import Result
from .runtime.execute import execute
from .runtime.staging import Staging, staging_for
from .storage.identity import seen_through
from .strategies import strategy_of
from .typing import MatrixLike, Scalar
from .units import echo_size, format_size, parse_size

__all__ = ["Product"]


class Product:
    """The product ``out = alpha * op(a) @ op(b) + beta * c`` of :func:`oocgemm.multiply`,
    in steps: :meth:`plan`, :meth:`execute`, :meth:`close` (a context manager too).

    Parameters
    ----------
    a, b, out, c, alpha, beta, trans_a, trans_b
        As for :func:`oocgemm.multiply`.
    options
        An :class:`~oocgemm.options.Options`, or a dict of option names, as the keywords.
    **keywords
        The options by name (:class:`~oocgemm.options.Options`: those of :func:`multiply`
        beside the operands and scalars); they take precedence over ``options``.

    Making it checks the options, the device, the operands and the output target and
    opens them (nothing is read but what describes them); what is opened is released by
    :meth:`close`, by the end of a ``with`` block, by a step that fails, or once
    :meth:`execute` has committed the output.

    Raises
    ------
    OOCGemmError
        As :func:`oocgemm.multiply`: each check at the step that makes it.
    """

    def __init__(self, a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
                 c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
                 trans_a: bool = False, trans_b: bool = False,
                 options: Options | Mapping[str, Any] | None = None, **keywords: Any):
        if isinstance(options, Options) and not keywords:
            self.options = options
        else:
            given = options.keywords() if isinstance(options, Options) else dict(options or {})
            self.options = Options.of("Product()", **{**given, **keywords})
        #: Several devices (their names), or None for one.
        self.devices = device_names(self.options.device)
        alpha, beta = scalar("alpha", alpha), scalar("beta", beta)
        trans_a, trans_b = flag("trans_a", trans_a), flag("trans_b", trans_b)
        # x.T of a numpy x beside x: x itself, read transposed (a Gram product found)
        a, trans_a, b, trans_b = seen_through(a, trans_a, b, trans_b)
        #: The device the plan is made for (the first of several).
        self.device: Device = resolve_device(planned_for(self.devices, self.options.device))
        if self.device.kind == "cuda":  # contexts and cuBLAS start while the inputs open
            from .cuda import startup

            startup.ahead([int(d.partition(":")[2] or 0) for d in self.devices]
                          if self.devices else [self.device.index])
        self._io: RunIO = open_run(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                                   trans_b=trans_b, out_options=self.options.out_options,
                                   storage_options=self.options.storage_options)
        self._scalars = (alpha, beta, trans_a, trans_b)
        self._plan: Plan | None = None
        #: The budgets the plan was made within (memory_limit, host_memory_limit), bytes.
        self._limits: tuple[int, int] | None = None
        self._held: set[str] | None = None  # the inputs the page cache holds (_cached)
        self._executed = False
        #: True once what it opened is released; it plans and runs nothing more.
        self.closed = False

    def __repr__(self) -> str:
        state = ("closed" if self.closed else "executed" if self._executed
                 else "planned" if self._plan is not None else "open")
        m, n, k = self._io.shape
        return f"Product({m}x{k} @ {k}x{n} -> {self._io.name}, {self.device}, {state})"

    # -- the steps -------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The validated :class:`~oocgemm.planning.Plan` (made the first time; the same
        object after), without reading any data. Print it for a summary; ``plan.schedule``
        lists the block operations; :meth:`execute` runs exactly it."""
        self._check_open()
        if self._plan is None:
            try:
                self._plan = self._make_plan()
            except BaseException as exc:  # no plan: what was opened is released now
                self._release(exc)
                if isinstance(exc, BudgetError) and self._limits is not None:
                    raise BudgetError(_in_users_units(str(exc), self.options, *self._limits)
                                      ) from None
                raise
        return self._plan

    def execute(self) -> Result:
        """Run the plan (:meth:`plan`'s, made now if it was not), check the product where
        ``verify`` asks, commit the output and release what was opened. Once per product.

        Returns
        -------
        Result
            ``result.out`` holds the product; ``result.plan`` the plan that ran to the end
            (``plan()``'s, or smaller blocks after memory ran short).

        Raises
        ------
        InputError
            An input named by a local path was rewritten, replaced or removed since the
            product was made (its shape and layout were read then); nothing is computed.
        """
        plan_ = self.plan()
        if self._executed:
            raise OptionError("this Product has run; make another for another run")
        self._executed = True
        o, io = self.options, self._io
        try:
            resources = o.engine.resources(self.device.kind) if o.engine is not None else None
            check = _Check(plan_, io) if o.verify else None  # C_in's part before it changes
            plan_ = io.begin(plan_, overwrite=o.overwrite, resume_=o.resume,
                             attributes=_attributes(plan_.problem))
            run = execute(plan_, io, self.devices, progress=o.progress,
                          record=bool(o.events), resources=resources)
            report = check.run(io.sink.array()) if check is not None else None
            result_out = io.commit()
        except BaseException as exc:
            self._release(exc)
            raise
        self.close()
        if io.out is None:  # a new array: an xarray input's labels on its rows and columns
            result_out = labelled(result_out, io.given["a"], io.given["b"], *self._scalars[2:])
        log = run.log
        # a resumed run's schedule skips the blocks kept: its flops are its GEMMs' only
        flops = run.plan.counts.flops if run.plan.done else run.plan.flops
        return Result(out=result_out, plan=run.plan, seconds=run.seconds, flops=flops,
                      bytes={**io.storage_bytes(), **log.traffic()}, log=log,
                      started_at=log.started_at, chunks=chunk_counts(run.readers),
                      verified=report, resumed=len(run.plan.done), replanned=run.replanned,
                      devices=run.shares, emulation=dict(log.notes),
                      emulation_seconds=dict(log.timed), out_name=io.name,
                      out_encoder=log.encoder)

    def close(self) -> None:
        """Release what the product opened (its sources; an output it began and did not
        commit is removed). Closing twice is harmless."""
        self._release(None)

    def __enter__(self) -> Product:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        self._release(exc)

    # -- inside ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise OptionError("this Product is closed" + (" (it has run)" if self._executed
                                                           else ""))

    def _release(self, exc: BaseException | None) -> None:
        if not self.closed:
            self.closed = True
            self._io.__exit__(type(exc) if exc is not None else None, exc,
                              exc.__traceback__ if exc is not None else None)

    def _make_plan(self) -> Plan:
        alpha, beta, trans_a, trans_b = self._scalars
        io = self._io
        m, n, k = io.shape
        op_a, op_b, op_c, op_out = io.operands()
        problem = Problem(m=m, n=n, k=k, itemsize=io.dtype.itemsize, dtype=io.dtype.name,
                          a=op_a, b=op_b, c=op_c, out=op_out, alpha=alpha, beta=beta,
                          trans_a=trans_a, trans_b=trans_b, shared=io.shared)
        kernel = check_kernel(self.options.kernel, np.dtype(problem.dtype))
        if self.device.kind not in strategy_of(kernel).devices:
            raise OptionError(f"kernel={kernel!r} is a CUDA kernel, but the device is "
                              f"{self.device}; leave kernel unset on the CPU")
        model, mem, host = _budgets(self.device, self.options)
        self._limits = (mem, host)
        staging = staging_for(self.device.kind, problem, model, kernel)
        args = (problem, self.options, str(self.device), kernel, model, mem, host, staging)
        key = _plan_key(*args)
        plan = SMALL_PLANS.get(key)
        if plan is None:
            plan = plan_product(*args)
            if key is not None and _one_block(plan):
                SMALL_PLANS.put(key, plan)
        for advice in plan.warnings:
            _warn(advice)
        mode = gpu_decode_mode()
        if self.device.kind != "cuda" or mode == "0" or mode == "auto" and not _nvcomp_found():
            return self._told_cached(plan)
        # In core, A and B are each one panel: decoding them on the device takes the
        # panelled plan, which the choice weighs against the in-core one.
        base = plan_product(*args, in_core=False) if _in_core_decodable(plan) else plan
        if not decodable(base):
            return self._told_cached(plan)
        return self._told_cached(decoded_on_device(
            base, choose=mode == "auto", cached=mode == "auto" and self._cached() == {"A", "B"},
            host=plan))

    def _cached(self) -> set[str]:
        """The inputs ('A', 'B') the OS page cache holds: each source asked once (one matrix
        in both roles once), once per product."""
        if self._held is None:
            held = {"A"} if self._io.inputs_cached(("A",)) else set()
            if held if self._io.shared else self._io.inputs_cached(("B",)):
                held.add("B")
            self._held = held
        return self._held

    def _told_cached(self, plan: Plan) -> Plan:
        """``plan``, its prediction told which stored inputs the OS page cache holds (read
        at the host's memory rate); chosen as for storage (:attr:`Operand.cached
        <oocgemm.planning.problem.Operand.cached>`)."""
        prob = plan.problem
        held = {role: dataclasses.replace(getattr(prob, role), cached=True)
                for role, name in (("a", "A"), ("b", "B"))
                if getattr(prob, role).on_disk and name in self._cached()}
        if not held:
            return plan
        return dataclasses.replace(plan, problem=dataclasses.replace(prob, **held))


# ------------------------------------------------------------------------------------------
def _warn(message: str) -> None:
    """A RuntimeWarning, ``oocgemm: message``, pointing at the caller's line that led here
    (the first frame outside oocgemm)."""
    frame = inspect.currentframe()
    level, frame = 2, frame.f_back if frame is not None else None  # (2: _warn's caller)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("oocgemm"):
        frame, level = frame.f_back, level + 1
    warnings.warn("oocgemm: " + message, RuntimeWarning, stacklevel=level)


def gpu_decode_mode() -> str:
    """``OOCGEMM_GPU_DECODE``: '1' decodes the inputs' zstd frames on the GPU wherever the
    plan allows (:func:`decoded_on_device`), '0' on the host; 'auto' (or unset) on the GPU
    where the plan allows, nvCOMP is found and the cost model predicts it faster. OptionError
    for another value."""
    mode = os.environ.get("OOCGEMM_GPU_DECODE", "auto")
    if mode not in ("0", "1", "auto"):
        raise OptionError(f"OOCGEMM_GPU_DECODE={mode!r}: 0, 1 or auto")
    return mode


def _nvcomp_found() -> bool:
    from .cuda import nvcomp

    return nvcomp.library() is not None


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


def plan_product(problem: Problem, options: Options, device: str, kernel: str, model,
                 mem: int, host: int, staging: Staging, in_core: bool = True) -> Plan:
    """The plan of ``problem`` on ``device`` (its name) with ``kernel`` (checked), its cost
    ``model``, within the budgets ``mem`` and ``host`` (bytes), staged as ``staging`` says
    (the executor's, as data): the user's tile (``options.tile``), or the planner's choice
    (``in_core``: the in-core shape where it applies)."""
    if problem.shared and problem.a.sliced:
        # One matrix in both roles whose chunk files could be sliced block by block: read at
        # its grain instead, each chunk once for both roles, where a chunk fits the budgets
        # (else sliced, holding no chunk: under a budget smaller than one)
        whole = dataclasses.replace(problem, a=dataclasses.replace(problem.a, sliced=False),
                                    b=dataclasses.replace(problem.b, sliced=False))
        try:
            return plan_product(whole, options, device, kernel, model, mem, host, staging,
                                in_core)
        except BudgetError:
            pass
    # X^T X computes the blocks on and above the diagonal, with square blocks (a tile of
    # the user's that is not square computes the product in full, as they asked).
    tile = options.tile
    symmetric = problem.gram and strategy_of(kernel).halves_gram and (
        tile is None or problem.clipped(tile)[0] == problem.clipped(tile)[1])
    settings = dict(problem=problem, device=device, model=model, memory_limit=mem,
                    host_memory_limit=host, staged=staging.staged, kernel=kernel,
                    symmetric=symmetric, **staging.settings)
    if tile is not None:  # said in the plan where the planner's own choice is far faster
        return with_tile_advice(
            finished(Plan(tile=problem.clipped(tile), chosen_by="tile", **settings)),
            lambda: plan_product(problem, dataclasses.replace(options, tile=None), device,
                                 kernel, model, mem, host, staging, in_core))
    shape = in_core_shape(problem, model, mem, staged=staging.staged, kernel=kernel,
                          symmetric=symmetric, split_last=staging.settings.get("split_last", 1),
                          min_stripes=staging.settings.get("min_stripes", 1)) if in_core else None
    if shape is not None:  # A, B and C on the device at once: no tile to search for
        try:
            return finished(Plan(**{**settings, **shape}))
        except BudgetError:  # its staging does not fit the host budget
            pass
    try:
        tile = choose_tile(problem, model, mem, host, staged=staging.staged, kernel=kernel,
                           symmetric=symmetric, **{k: v for k, v in staging.settings.items()
                                                   if k in STAGING})
    except BudgetError as exc:
        raise BudgetError(str(exc) + _unit_hint(memory_limit=options.memory_limit,
                                                host_memory_limit=options.host_memory_limit)
                          ) from None
    if (in_place(problem, staging.staged) and not symmetric
            and tile == (problem.m, problem.n, problem.k)):
        # One block computed where it goes: its last panel in one GEMM (row stripes let a
        # last block be written as it becomes final, and nothing is written here). On the
        # CPU, row stripes' several GEMMs took longer than one (docs/performance.md,
        # "Figures moved from the code's docstrings").
        settings["split_last"] = 1
    return finished(Plan(tile=tile, **settings))


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


def _plan_key(problem: Problem, options: Options, device: str, kernel: str, model, mem: int,
              host: int, staging: Staging):
    """What :func:`plan_product` reads of its arguments, hashable; None where a part is not
    (such a plan is made each time)."""
    try:
        return _Key((problem, type(problem.alpha), type(problem.beta), options.tile, device,
                     kernel, model, mem, host, staging.staged,
                     tuple(sorted(staging.settings.items()))))
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


def _budgets(dev: Device, options: Options):
    """(device model, memory_limit, host_memory_limit) in bytes for a run on ``dev``."""
    if dev.kind == "cuda":
        from . import cuda

        free, total = cuda.memory_info(dev.index)
        mem = parse_size(options.memory_limit, total, name="memory_limit") or int(free * 0.9)
        if mem > free:
            raise BudgetError(f"memory_limit={echo_size(options.memory_limit, mem)} is more "
                              f"than the {format_size(free)} free on {dev}")
        model = cuda_model()
    else:
        total = machine.total_memory()
        mem = parse_size(options.memory_limit, total, name="memory_limit") or total // 4
        model = cpu_model()
    host = parse_size(options.host_memory_limit, machine.total_memory(),
                      name="host_memory_limit") or machine.total_memory() // 4
    return model, mem, host


def _in_users_units(message: str, options: Options, mem: int, host: int) -> str:
    """``message`` with the budgets it names (``memory_limit=977 KiB``, as the planner, which
    sees bytes only, writes them) in the user's own spelling beside their bytes
    (``memory_limit='1MB' (977 KiB)``: :func:`~oocgemm.units.echo_size`)."""
    for name, given, nbytes in (("host_memory_limit", options.host_memory_limit, host),
                                ("memory_limit", options.memory_limit, mem)):
        if given is None:  # a default: the planner's size is all there is to say
            continue
        # "memory_limit=" is not matched inside "host_memory_limit="; the replacement's
        # backslashes (a user's odd string) are kept as they are
        said = f"{name}={echo_size(given, nbytes)}".replace("\\", "\\\\")
        message = re.sub(rf"(?<!\w){name}={re.escape(format_size(nbytes))}", said, message)
    return message


def _unit_hint(**limits) -> str:
    """A question for budgets given as a bare number under 1 MiB: bytes, or a unit forgotten?"""
    for name, value in limits.items():
        bare = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().isdigit())
        if bare and int(value) < (1 << 20):
            return (f". {name}={value} is bytes (a bare number): did you mean "
                    f"'{int(value)}MB' or '{int(value)}GB'?")
    return ""


class _Check:
    """``multiply(verify=True)``: Freivalds' vectors drawn, and what C_in contributes taken,
    before the run (an update in place overwrites C_in); the check run on the product before
    it is committed."""

    def __init__(self, plan: Plan, io: RunIO):
        from .freivalds import prepare_c_in, random_vectors

        prob = plan.problem
        self.prob, self.io = prob, io
        complex_ = (prob.dtype.startswith("complex") or isinstance(prob.alpha, complex)
                    or isinstance(prob.beta, complex))
        self.x = random_vectors(prob.n, 2, complex_, None)
        c_in = (io.out if io.in_place else io.given["c"]) if prob.reads_c else None
        self.side = prepare_c_in(c_in, self.x, storage_options=io.storage_options)

    def run(self, product):
        """The report on ``product``; ExecutionError when it fails (nothing is committed)."""
        from .freivalds import verify_run

        prob, io = self.prob, self.io
        report = verify_run(io.given["a"], io.given["b"], product, alpha=prob.alpha,
                            beta=prob.beta, trans_a=prob.trans_a, trans_b=prob.trans_b,
                            rounds=2, storage_options=io.storage_options, c_in_side=self.side,
                            x=self.x, checking=True)
        if report.inconclusive:
            raise ExecutionError(f"the product could not be checked, so nothing was committed "
                                 f"(run without verify to keep it): {report}")
        if not report:
            raise ExecutionError(f"the product failed its check, so nothing was committed: "
                                 f"{report}")
        return report



def _attributes(prob: Problem) -> dict:
    """What a Zarr output records of the product that made it."""
    return {"m": prob.m, "n": prob.n, "k": prob.k, "alpha": _json_scalar(prob.alpha),
            "beta": _json_scalar(prob.beta), "trans_a": prob.trans_a, "trans_b": prob.trans_b}


def _json_scalar(x):
    return [x.real, x.imag] if isinstance(x, complex) else x

"""``multiply()``, ``plan()`` and ``gram()``: the short story of a run.

The options are checked (:class:`~oocgemm.options.Options`); the run's I/O is opened and
checked (:func:`~oocgemm.storage.run.open_run`: the operands, the output target, aliasing);
the plan is made from the facts of that I/O (:mod:`oocgemm.planning`, which never touches
storage); the executor (or one per device, :mod:`oocgemm.runtime.split`) replays the plan's
schedule, planning again with smaller blocks when memory runs short; the output is checked
when asked and committed; the result says what happened.
"""

from __future__ import annotations

import numbers
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import hostinfo
from .checks import flag, scalar
from .cuda.catalog import DEFAULT as DEFAULT_KERNEL
from .cuda.catalog import check_kernel, is_ozaki
from .errors import BudgetError, DeviceError, ExecutionError, MemoryPressureError, OptionError
from .hints import DeviceLike, MatrixLike, Scalar, Size
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
)
from .planning import smaller as smaller_plan
from .result import Result
from .runtime.base import executor_class
from .storage.run import RunIO, chunk_counts, open_run
from .units import format_size, parse_size

if TYPE_CHECKING:
    from .diagnostics.events import Event

__all__ = ["Device", "EngineLike", "MatrixLike", "Scalar", "device_names", "gram", "multiply",
           "plan", "resolve_device"]


class EngineLike(Protocol):
    """What a run takes from an :class:`oocgemm.Engine` (which imports this module)."""

    def resources(self, kind: str) -> Any: ...


@dataclass(frozen=True)
class Device:
    kind: str
    """'cpu' or 'cuda'."""
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


def device_names(device) -> list[str] | None:
    """The executors of a run on several devices: ``device`` a list of device names (the
    same kind; 'cpu' may repeat, as several CPU executors, named 'cpu#1', 'cpu#2'...) or
    'cuda:all'; None for one device."""
    from . import cuda

    if isinstance(device, str):
        if device.strip().lower() != "cuda:all":
            return None
        count = cuda.device_count()
        if count == 0:
            resolve_device("cuda")  # says why there is none
        return [f"cuda:{i}" for i in range(count)]
    if not isinstance(device, (list, tuple)) or not device:
        raise DeviceError(f"device must be a name ('auto', 'cpu', 'cuda', 'cuda:N', "
                          f"'cuda:all') or a list of them, got {device!r}")
    kinds = {str(d).strip().lower().partition(":")[0] for d in device}
    if "auto" in kinds or len(kinds) > 1:
        raise DeviceError(f"devices {list(device)}: all of one kind, GPUs ('cuda:N') or the "
                          f"CPU ('cpu')")
    resolved = [resolve_device(d) for d in device]
    if resolved[0].kind == "cuda":
        names = [f"cuda:{d.index}" for d in resolved]
        if len(set(names)) < len(names):
            raise DeviceError(f"devices {list(device)}: a GPU named twice")
        return names
    return [f"cpu#{n}" for n in range(len(resolved))]


def _planned_for(devices: list[str] | None, device):
    """The device a plan is made for: the first of several (each one's plan), or ``device``."""
    return devices[0].partition("#")[0] if devices else device


def resolve_device(device) -> Device:
    """'auto' (a GPU when CuPy sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    from . import cuda

    if not isinstance(device, str):
        raise DeviceError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    name = device.strip().lower()
    if name == "cpu":
        return Device("cpu")
    if name == "auto":
        return Device("cuda", 0) if cuda.device_count() > 0 else Device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise DeviceError(f"device {device!r}: expected 'cuda:N' with N a GPU number")
        index = int(index_text)
        count = cuda.device_count()
        if count == 0:
            why = ("CuPy is not installed (pip install 'oocgemm[cuda12]' or 'oocgemm[cuda13]')"
                   if not cuda.cupy_installed() else "no CUDA GPU was found")
            raise DeviceError(f"device {device!r}: {why}; use device='cpu' or 'auto'")
        if index >= count:
            raise DeviceError(f"device {device!r}: only {count} GPU(s) found "
                              f"(cuda:0..cuda:{count - 1})")
        return Device("cuda", index)
    raise DeviceError(f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


# ------------------------------------------------------------------------------------------
def plan(a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
         c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
         trans_a: bool = False, trans_b: bool = False, device: DeviceLike = "auto",
         memory_limit: Size = None, host_memory_limit: Size = None,
         tile: Sequence[int] | str | None = None, kernel: str | None = None,
         out_options: Mapping[str, Any] | None = None,
         storage_options: Mapping[str, Any] | None = None, **run_only: Any) -> Plan:
    """Plan ``out = alpha * op(a) @ op(b) + beta * c`` without reading any data.

    Takes the same arguments as :func:`multiply`; returns the validated
    :class:`~oocgemm.planning.Plan` (print it for a summary; ``plan.schedule`` lists the block
    operations).

    Raises
    ------
    OOCGemmError
        For any bad input, option or budget (see :func:`multiply`).
    """
    unknown = set(run_only) - RUN_ONLY
    if unknown:
        raise OptionError(f"plan() got unknown keyword arguments {sorted(unknown)}; it takes "
                          f"those of multiply()")
    options = Options.of("plan()", device=device, memory_limit=memory_limit,
                         host_memory_limit=host_memory_limit, tile=tile, kernel=kernel,
                         out_options=out_options, storage_options=storage_options)
    io, plan_, _ = _prepare(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                            trans_b=trans_b, options=options,
                            device=_planned_for(device_names(device), device))
    with io:  # nothing is read: the sources were opened for their shapes and chunks
        return plan_


#: Keywords of multiply() that only change how it runs; plan() accepts and ignores them.
RUN_ONLY = frozenset({"overwrite", "progress", "events", "verify", "resume", "engine"})


def multiply(a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
             c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
             trans_a: bool = False, trans_b: bool = False, device: DeviceLike = "auto",
             memory_limit: Size = None, host_memory_limit: Size = None,
             tile: Sequence[int] | str | None = None, kernel: str | None = None,
             overwrite: bool = False, progress: bool | Callable[[Event], object] | None = None,
             events: bool = True, out_options: Mapping[str, Any] | None = None,
             storage_options: Mapping[str, Any] | None = None, verify: bool = False,
             resume: bool = False, engine: EngineLike | None = None, **unknown: Any) -> Result:
    """Compute ``out = alpha * op(a) @ op(b) + beta * c`` block by block (BLAS xGEMM).

    Parameters
    ----------
    a, b
        Matrices: a path (a ``.zarr`` directory in Zarr format 2 or 3, a ``.npy`` file opened
        as a memmap), a URL of a Zarr array (``file://``, ``memory://``, ``s3://``, ``gs://``:
        whatever fsspec opens), a ``zarr.Array``, a numpy array or memmap (any strides), a
        CuPy array, or a dask array.
    out
        A path (created: ``.zarr`` as Zarr v3, or the format of the Zarr group it goes into,
        uncompressed, with chunks of at most 64 MiB that tile the C blocks; ``.npy`` as a
        memmap), a writable array of shape (M, N), or None for a new numpy array. A path is
        written under a temporary name and renamed when the last block is stored.
    c
        The matrix scaled by ``beta``. With ``beta != 0`` and ``c=None``, ``out`` must exist
        and is updated in place. With ``beta == 0``, C is never read.
    alpha, beta
        Scalars. ``alpha == 0`` (or K == 0) computes no product: A and B are not read.
    trans_a, trans_b
        Use the transpose of a / b; transposed operands are read in their stored layout.
    device
        'auto' (a GPU when CuPy sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'; or several:
        'cuda:all' (every GPU) or a list such as ``['cuda:0', 'cuda:1']``. With several, the
        plan is made for one device and its C blocks are handed out in groups (rows of
        blocks, or single blocks), each device taking the next group when it is free;
        ``result.devices`` says what each did. ``['cpu', 'cpu']`` runs two CPU executors.
    memory_limit
        Bytes, or a string like '8GB' or '80%', for the executor's block buffers (GPU memory
        for CUDA, the working buffers for the CPU). Defaults: 90% of free GPU memory, or a
        quarter of host memory.
    host_memory_limit
        Bytes or string bounding host staging and read buffers (default a quarter of host RAM).
    tile
        (w, h, r) to override the planner: C blocks of w×h, K panels of depth r.
    kernel
        The per-block GEMM. On a GPU: 'cublas' (the default, the fastest measured) or one
        of the kernels of ``kernels/``: 'naive', 'tiled', 'opt', 'regblock' (float32/float64),
        'dmma' (float64, FP64 tensor cores, compute capability 8.0+); those are not for the
        CPU. On a GPU or the CPU: 'ozaki' or 'ozaki:N', float64 products emulated with Ozaki
        scheme II from exact int8 GEMMs (N moduli; 'ozaki' takes as many as keep DGEMM's error
        bound), the same bits on both; other dtypes keep their GEMM (README, Python API:
        ``kernel``).
    overwrite
        Replace an existing output path.
    progress
        True for a progress bar on stderr, False for none, None for a bar only when stderr is
        a terminal and the run is predicted to take over two seconds, or a callable that
        receives each finished :class:`~oocgemm.diagnostics.Event`.
    out_options
        The layout of a new ``.zarr`` output: keywords of ``zarr.create_array`` (``chunks``,
        ``shards``, ``compressors``, ``filters``, ``serializer``, ``zarr_format``,
        ``dimension_names``, ``chunk_key_encoding``), checked before any work. ``compressors``
        may be a codec object (list) or a name like ``'zstd:3'``; C blocks align to the
        chunks (or shards).
    storage_options
        Options of the fsspec file system of URL inputs and outputs (credentials, endpoint).
    verify
        Check the product before it is committed with Freivalds' test (:func:`oocgemm.verify`,
        two random vectors, O(n²)): a product that fails it is not committed
        (``ExecutionError``); ``result.verified`` holds the report.
    resume
        Continue the interrupted run (Ctrl-C, SIGTERM, a crash, ``kill -9``) of this same
        product into this same output path: the C blocks it finished (each checked against the
        checksum it journaled) are kept, the others computed with the same tile and schedule,
        so the result is bitwise what an uninterrupted run gives. Refused (``OutputError``)
        when the inputs or the options changed; a fresh run when there is nothing to resume.
        Needs an output path and inputs stored as local files.
    engine
        The :class:`oocgemm.Engine` whose pinned memory, cuBLAS handles and compiled kernels
        the run uses (``engine.multiply`` passes itself); None: the process's, kept until
        it exits.
    events
        True (the default) to record one timed event per block operation (``result.events``,
        ``result.timeline``); False records none, to measure what recording costs
        (``result.bytes`` is counted either way; a ``progress`` callable still gets its events).

    Returns
    -------
    Result
        ``result.out`` holds the product; timings, traffic and the executed operations too.

    Raises
    ------
    OOCGemmError
        InputError (missing, corrupt, not a matrix), ShapeError, DTypeError, OutputError
        (exists, aliases an input), BudgetError (no tile fits), OptionError, DeviceError,
        ExecutionError (the run failed; nothing was committed).
    """
    _check_run_options(unknown, overwrite=overwrite, events=events, verify=verify,
                       resume=resume, engine=engine)
    options = Options.of("multiply()", device=device, memory_limit=memory_limit,
                         host_memory_limit=host_memory_limit, tile=tile, kernel=kernel,
                         out_options=out_options, storage_options=storage_options)
    devices = device_names(device)
    io, plan_, dev = _prepare(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                              trans_b=trans_b, options=options,
                              device=_planned_for(devices, device))
    with io:
        resources = engine.resources(dev.kind) if engine is not None else None
        check = _Check(plan_, io) if verify else None  # C_in's part taken before it changes
        plan_ = io.begin(plan_, overwrite=overwrite, resume_=resume,
                         attributes=_attributes(plan_.problem))
        run = _execute(plan_, io, dev, devices, progress=progress, record=bool(events),
                       resources=resources)
        report = check.run(io.sink.array()) if check is not None else None
        result_out = io.commit()
    log = run.log
    return Result(out=result_out, plan=run.plan, seconds=run.seconds, flops=run.plan.flops,
                  bytes={**io.storage_bytes(), **log.traffic()}, events=log.events(),
                  started_at=log.started_at, chunks=chunk_counts(run.readers),
                  verified=report, resumed=len(run.plan.done), replanned=run.replanned,
                  devices=run.shares, emulation=dict(log.notes),
                  emulation_seconds=dict(log.timed), out_name=io.name,
                  out_encoder=log.encoder)


def gram(x: MatrixLike, out: MatrixLike | None = None, *, outer: bool = False,
         **options: Any) -> Result:
    """The Gram matrix ``out = alpha * X^T X + beta * c`` (``outer=True``: ``X X^T``).

    ``multiply(x, x, trans_a=True)`` (or ``trans_b=True``) under another name: ``x`` is read
    and decoded once, only the C blocks on and above the diagonal are computed (half the
    flops), each block above the diagonal is also written transposed across it, and the
    result is exactly symmetric (``C == C.T`` bit for bit where ``c`` is symmetric or not
    read; a complex ``x`` gives the plain transpose's product: symmetric, not Hermitian).

    Parameters
    ----------
    x
        Any matrix :func:`multiply` takes (a path, a URL, an array).
    out
        As for :func:`multiply`.
    outer
        False: ``X^T X`` (the columns' inner products: samples x features gives features x
        features); True: ``X X^T``.
    **options
        Every keyword of :func:`multiply` but ``trans_a`` and ``trans_b``.

    Returns
    -------
    Result
        As :func:`multiply`; ``result.flops`` counts the flops done (about half of
        ``2 M N K``).
    """
    given = sorted({"trans_a", "trans_b"} & set(options))
    if given:
        raise OptionError(f"gram() takes outer=True or False, not {', '.join(given)}")
    outer = flag("outer", outer)
    return multiply(x, x, out, trans_a=not outer, trans_b=outer, **options)


def _check_run_options(unknown: dict, *, engine, **flags) -> None:
    """multiply()'s keywords that are not options of a plan, checked."""
    if unknown:
        raise OptionError(f"multiply() got unknown keyword arguments {sorted(unknown)}; "
                          f"see help(oocgemm.multiply)")
    for name, value in flags.items():
        flag(name, value)
    if engine is not None and not hasattr(engine, "resources"):
        raise OptionError(f"engine must be an oocgemm.Engine, got {type(engine).__name__}")


def _attributes(prob: Problem) -> dict:
    """What a Zarr output records of the product that made it."""
    return {"m": prob.m, "n": prob.n, "k": prob.k, "alpha": _json_scalar(prob.alpha),
            "beta": _json_scalar(prob.beta), "trans_a": prob.trans_a, "trans_b": prob.trans_b}


def _json_scalar(x):
    return [x.real, x.imag] if isinstance(x, complex) else x


# ------------------------------------------------------------------------------------------
def _prepare(a, b, out, *, c, alpha, beta, trans_a, trans_b, options: Options,
             device=None) -> tuple[RunIO, Plan, Device]:
    """The run's I/O opened and checked against ``options`` (checked already), and its plan
    for ``device`` (default: ``options.device``)."""
    alpha = scalar("alpha", alpha)
    beta = scalar("beta", beta)
    trans_a, trans_b = flag("trans_a", trans_a), flag("trans_b", trans_b)
    dev = resolve_device(options.device if device is None else device)
    io = open_run(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                  out_options=options.out_options, storage_options=options.storage_options)
    try:
        m, n, k = io.shape
        op_a, op_b, op_c, op_out = io.operands()
        problem = Problem(m=m, n=n, k=k, itemsize=io.dtype.itemsize, dtype=io.dtype.name,
                          a=op_a, b=op_b, c=op_c, out=op_out, alpha=alpha, beta=beta,
                          trans_a=trans_a, trans_b=trans_b, shared=io.shared)
        return io, _plan(problem, options, dev), dev
    except BaseException as exc:  # no plan: the sources are closed here, not by the caller
        io.__exit__(type(exc), exc, exc.__traceback__)
        raise


def _plan(problem: Problem, options: Options, dev: Device) -> Plan:
    """The plan of ``problem`` on ``dev`` within ``options``' budgets: the user's tile, or
    the planner's choice."""
    kernel = check_kernel(options.kernel, np.dtype(problem.dtype))
    if kernel != DEFAULT_KERNEL and not is_ozaki(kernel) and dev.kind != "cuda":
        raise OptionError(f"kernel={kernel!r} is a CUDA kernel, but the device is {dev}; "
                          "leave kernel unset on the CPU")
    model, mem, host = _budgets(dev, options)
    executor = executor_class(dev.kind)  # it owns its staging policy
    # X^T X computes the blocks on and above the diagonal, with square blocks (a tile of
    # the user's that is not square computes the product in full, as they asked).
    tile = options.tile
    symmetric = problem.gram and kernel == DEFAULT_KERNEL and (
        tile is None or problem.clipped(tile)[0] == problem.clipped(tile)[1])
    staging = executor.staging(problem, model, kernel)
    settings = dict(problem=problem, device=str(dev), model=model, memory_limit=mem,
                    host_memory_limit=host, staged=executor.STAGED, kernel=kernel,
                    symmetric=symmetric, **staging)
    if tile is not None:
        return finished(Plan(tile=problem.clipped(tile), chosen_by="tile", **settings))
    shape = in_core_shape(problem, model, mem, staged=executor.STAGED, kernel=kernel,
                          symmetric=symmetric, split_last=staging.get("split_last", 1),
                          min_stripes=staging.get("min_stripes", 1))
    if shape is not None:  # A, B and C on the device at once: no tile to search for
        try:
            return finished(Plan(**{**settings, **shape}))
        except BudgetError:  # its staging does not fit the host budget
            pass
    try:
        tile = choose_tile(problem, model, mem, host, staged=executor.STAGED, kernel=kernel,
                           symmetric=symmetric, **{k: v for k, v in staging.items()
                                                   if k in STAGING})
    except BudgetError as exc:
        raise BudgetError(str(exc) + _unit_hint(memory_limit=options.memory_limit,
                                                host_memory_limit=options.host_memory_limit)
                          ) from None
    return finished(Plan(tile=tile, **settings))


def _budgets(dev: Device, options: Options):
    """(device model, memory_limit, host_memory_limit) in bytes for a run on ``dev``."""
    if dev.kind == "cuda":
        from . import cuda

        free, total = cuda.memory_info(dev.index)
        mem = parse_size(options.memory_limit, total, name="memory_limit") or int(free * 0.9)
        if mem > free:
            raise BudgetError(f"memory_limit={format_size(mem)} is more than the "
                              f"{format_size(free)} free on {dev}")
        model = cuda_model()
    else:
        total = hostinfo.total_memory()
        mem = parse_size(options.memory_limit, total, name="memory_limit") or total // 4
        model = cpu_model()
    host = parse_size(options.host_memory_limit, hostinfo.total_memory(),
                      name="host_memory_limit") or hostinfo.total_memory() // 4
    return model, mem, host


def _unit_hint(**limits) -> str:
    """A question for budgets given as a bare number under 1 MiB: bytes, or a unit forgotten?"""
    for name, value in limits.items():
        bare = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().isdigit())
        if bare and int(value) < (1 << 20):
            return (f". {name}={value} is bytes (a bare number): did you mean "
                    f"'{int(value)}MB' or '{int(value)}GB'?")
    return ""


# ------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """What the executors did."""

    plan: Plan
    """The plan that ran to the end (smaller blocks after memory ran short)."""
    log: Any
    seconds: float
    readers: dict
    """The sources as the last run read them (chunk readers: their counts)."""
    replanned: list[str]
    shares: dict
    """Several devices: what each did."""


#: Times a run plans again with smaller blocks after running out of memory.
MAX_REPLANS = 3


def _execute(plan_: Plan, io: RunIO, dev: Device, devices: list[str] | None, *, progress,
             record: bool, resources) -> _Run:
    """Run ``plan_`` into ``io``'s sink: on several devices, or on one (when memory runs
    short: again, with smaller blocks, up to :data:`MAX_REPLANS` times)."""
    from .runtime.split import run_on_devices

    start = time.perf_counter()
    replanned: list[str] = []
    while True:
        on_event, bar = _progress(progress, plan_)
        readers = io.sources
        try:
            if devices:  # block groups handed out as each device is free
                log = run_on_devices(plan_, dev.kind, devices, io.sources, io.sink,
                                     readers=io.readers, writer=io.writer, on_event=on_event,
                                     record=record, resources=resources)
                return _Run(plan_, log, time.perf_counter() - start, readers, replanned,
                            log.share)
            readers = io.readers(plan_)
            writer = io.writer(plan_)
            try:
                log = executor_class(dev.kind)(plan_, readers, writer, on_event=on_event,
                                               record=record, resources=resources).run()
            except BaseException:
                writer.settle()  # nothing stored behind the run after this
                raise
            writer.flush()
            return _Run(plan_, log, time.perf_counter() - start, readers, replanned, {})
        except MemoryPressureError as exc:  # less memory than planned: smaller blocks
            if len(replanned) == MAX_REPLANS:
                raise
            plan_ = _smaller(plan_, exc, dev)
            replanned.append(f"{exc}; planned again with tile w={plan_.tile[0]} "
                             f"h={plan_.tile[1]} r={plan_.tile[2]} "
                             f"(memory_limit={format_size(plan_.memory_limit)}, "
                             f"host_memory_limit={format_size(plan_.host_memory_limit)}) "
                             f"and started again")
            warnings.warn("oocgemm: " + replanned[-1], RuntimeWarning, stacklevel=3)
            io.replanned(plan_)  # the blocks are others now
        finally:
            if bar is not None:
                bar.close()
            if readers is not io.sources:
                for src in readers.values():
                    src.close()


def _smaller(plan: Plan, exc: MemoryPressureError, device: Device) -> Plan:
    """The plan to go on with after ``exc``: half the budget of the memory that ran out (and
    no more than the GPU has free now), every block to compute."""
    mem, host = plan.memory_limit, plan.host_memory_limit
    if plan.in_core:  # panels again, with the executor's staging
        plan = replace(plan, in_core=False, **executor_class(device.kind).staging(
            plan.problem, plan.model, plan.kernel))
    if exc.where == "device" or (exc.where == "host" and device.kind == "cpu"):
        mem //= 2  # on the CPU, the working buffers are host memory
    if exc.where in ("host", "pinned"):
        host //= 2
    if exc.where == "pinned":
        mem //= 2  # a CUDA allocation of unknown kind: both
    if device.kind == "cuda":
        from . import cuda

        mem = min(mem, int(cuda.memory_info(device.index)[0] * 0.9))
    return smaller_plan(plan, mem, host, str(exc))


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
        from .freivalds import verify

        prob, io = self.prob, self.io
        report = verify(io.given["a"], io.given["b"], product, alpha=prob.alpha, beta=prob.beta,
                        trans_a=prob.trans_a, trans_b=prob.trans_b, rounds=2,
                        storage_options=io.storage_options, _c_in_side=self.side, _x=self.x,
                        _checking=True)
        if not report:
            raise ExecutionError(f"the product failed its check, so nothing was committed: "
                                 f"{report}")
        return report




def _progress(progress, plan_):
    """(on_event callback, bar to close) for the ``progress`` argument."""
    if callable(progress) and not isinstance(progress, bool):
        planned = getattr(progress, "planned", None)
        if planned is not None:  # told the plan its events' blocks belong to (and a replan)
            planned(plan_)
        return progress, None
    if progress is None:
        progress = sys.stderr.isatty() and plan_.prediction.total > 2.0
    if not progress:
        return None, None
    from .diagnostics.progress import ProgressBar

    bar = ProgressBar(plan_)
    return bar, bar

"""``multiply()`` and ``plan()``: normalise the arguments, plan, pick an executor, run."""

from __future__ import annotations

import dataclasses
import numbers
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from . import hostinfo
from .checks import check_dtype, check_matrix, scalar
from .cuda.catalog import DEFAULT as DEFAULT_KERNEL
from .cuda.catalog import check_kernel, is_ozaki
from .errors import (
    BudgetError,
    DeviceError,
    DTypeError,
    ExecutionError,
    MemoryPressureError,
    OptionError,
    OutputError,
    ShapeError,
)
from .hints import DeviceLike, MatrixLike, Scalar, Size
from .options import Options
from .planning import Operand, Plan, Problem, choose_tile, cpu_model, cuda_model, with_ring_decodes
from .result import Result
from .runtime.base import executor_class
from .storage import MatrixSource, exists, is_path, open_sink, open_source, urls
from .storage._files import signals_deferred
from .storage.identity import check_output, one_matrix
from .units import format_size, parse_size

if TYPE_CHECKING:
    from .diagnostics.events import Event

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
@dataclass
class _Prepared:
    plan: Plan
    sources: dict
    out: Any
    in_place: bool
    device: Device
    out_options: dict
    """Checked ``out_options`` of a new Zarr output (empty otherwise)."""
    storage_options: dict | None = None
    """fsspec options for URL inputs and outputs."""


#: The plan's staging settings that choose_tile takes (the buffers it must fit).
STAGING = ("readers", "n_stage", "n_out", "split_last", "ramp", "tail_panels", "n_a", "n_b",
           "min_stripes")


def _prepare(a, b, out, *, c, alpha, beta, trans_a, trans_b, options: Options,
              device=None) -> _Prepared:
    """Operands opened and checked against each other and ``options`` (checked already), and
    the plan for ``device`` (default: ``options.device``)."""
    device = options.device if device is None else device
    memory_limit, host_memory_limit = options.memory_limit, options.host_memory_limit
    tile, kernel = options.tile, options.kernel
    out_options, storage_options = options.out_options, options.storage_options
    alpha = scalar("alpha", alpha)
    beta = scalar("beta", beta)
    for name, flag in (("trans_a", trans_a), ("trans_b", trans_b)):
        if not isinstance(flag, (bool, np.bool_)):
            raise OptionError(f"{name} must be True or False, got {flag!r}")
    dev = resolve_device(device)
    a, b, c, out = (urls.local(os.fspath(x)) if is_path(x) else x for x in (a, b, c, out))
    if is_path(out) and not out.strip():
        raise OutputError("out is an empty path; name a .zarr or .npy output")
    if is_path(out) and not urls.is_url(out) and os.path.islink(out):
        out = os.path.realpath(out)  # the output goes where the link points; the link stays

    src_a = open_source(a, "a", storage_options)
    src_b = open_source(b, "b", storage_options)
    check_matrix("a", src_a)
    check_matrix("b", src_b)
    shared = one_matrix(a, src_a, b, src_b)  # by what is behind them, never by name
    if shared:  # one source for both roles: each chunk read and decoded once
        src_b.close()
        src_b = src_a
    m, k = src_a.shape[::-1] if trans_a else src_a.shape
    k2, n = src_b.shape[::-1] if trans_b else src_b.shape
    if k != k2:
        raise ShapeError(
            "inner dimensions differ: a is "
            f"{tuple(src_a.shape)}{' (transposed)' if trans_a else ''}, "
            f"b is {tuple(src_b.shape)}{' (transposed)' if trans_b else ''}: op(a) has {k} "
            f"columns, op(b) has {k2} rows")

    # C: read only when beta != 0 (BLAS); its shape is checked whenever it is given.
    in_place = False
    c_source = None
    if c is not None:
        c_source = open_source(c, "c", storage_options)
        check_matrix("c", c_source)
        if tuple(c_source.shape) != (m, n):
            raise ShapeError(f"c has shape {tuple(c_source.shape)}, expected {(m, n)} "
                             f"(op(a) is {(m, k)}, op(b) is {(k, n)})")
    if beta != 0 and c is None:
        if out is None or (is_path(out) and not exists(out, storage_options)):
            raise OptionError("beta != 0 reads C: pass c=..., or an existing out to update in "
                              "place")
        c_source = open_source(out, "out (read as c, beta != 0)", storage_options)
        check_matrix("out", c_source)
        if tuple(c_source.shape) != (m, n):
            what = f"out {os.fspath(out)!r}" if is_path(out) else "out"
            raise ShapeError(f"{what} has shape {tuple(c_source.shape)}, expected {(m, n)} (it is "
                             f"updated in place as c; op(a) is {(m, k)}, op(b) is {(k, n)})")
        in_place = True
    if out is not None:  # by what is behind out and the inputs, never by name
        read_c = ("c", c, c_source) if (c is not None and beta != 0) else None
        in_place |= check_output(out, [("a", a, src_a), ("b", b, src_b)], read_c)

    dtype_a = check_dtype("a", src_a.dtype)
    dtype_b = check_dtype("b", src_b.dtype)
    dtypes = [dtype_a, dtype_b]
    if c_source is not None and beta != 0:
        dtypes.append(check_dtype("c", c_source.dtype))
    dtype = np.result_type(*dtypes)
    if (isinstance(alpha, complex) or isinstance(beta, complex)) and dtype.kind != "c":
        raise DTypeError(f"alpha={alpha!r}, beta={beta!r}: complex scalars need complex operands, "
                         f"got {dtype}")

    kernel = check_kernel(kernel, dtype)
    if kernel != DEFAULT_KERNEL and not is_ozaki(kernel) and dev.kind != "cuda":
        raise OptionError(f"kernel={kernel!r} is a CUDA kernel, but the device is {dev}; "
                          "leave kernel unset on the CPU")

    out_operand = _check_out(out, (m, n), dtype)
    out_options = _check_out_options(out, out_options, (m, n), dtype, in_place)
    if out_options.get("chunks") is not None:  # align the C blocks to what a write rewrites
        out_operand = dataclasses.replace(
            out_operand, chunks=out_options.get("shards") or out_options["chunks"])

    if dev.kind == "cuda":
        from . import cuda

        free, total = cuda.memory_info(dev.index)
        model = cuda_model()
        mem = parse_size(memory_limit, total, name="memory_limit") or int(free * 0.9)
        if mem > free:
            raise BudgetError(f"memory_limit={format_size(mem)} is more than the "
                              f"{format_size(free)} free on {dev}")
    else:
        total = hostinfo.total_memory()
        model = cpu_model()
        mem = parse_size(memory_limit, total, name="memory_limit") or total // 4
    host = parse_size(host_memory_limit, hostinfo.total_memory(), name="host_memory_limit") or (
        hostinfo.total_memory() // 4)

    def operand(src: MatrixSource) -> Operand:
        rows, cols = src.shape
        in_place = src.view((0, rows), (0, cols), dtype) is not None
        return Operand((rows, cols), src.chunks, src.on_disk, src.name, zero_copy=in_place,
                       sliced=src.sliced, decodes_into=src.decodes_into)

    problem = Problem(
        m=m, n=n, k=k, itemsize=dtype.itemsize, dtype=dtype.name,
        a=operand(src_a), b=operand(src_b),
        c=operand(c_source) if (c_source is not None and beta != 0) else None,
        out=out_operand, alpha=alpha, beta=beta, trans_a=bool(trans_a), trans_b=bool(trans_b),
        shared=shared)
    executor = executor_class(dev.kind)  # it owns its staging policy
    # X^T X computes the blocks on and above the diagonal, with square blocks (a tile of
    # the user's that is not square computes the product in full, as they asked).
    symmetric = problem.gram and kernel == DEFAULT_KERNEL and (
        tile is None or problem.clipped(tile)[0] == problem.clipped(tile)[1])
    kwargs = dict(problem=problem, device=str(dev), model=model, memory_limit=mem,
                  host_memory_limit=host, staged=executor.STAGED, kernel=kernel,
                  symmetric=symmetric, **executor.staging(problem, model, kernel))
    staging = {k: kwargs[k] for k in STAGING if k in kwargs}
    if tile is not None:
        plan = Plan(tile=problem.clipped(tile), chosen_by="tile", **kwargs)
    else:
        try:
            tile = choose_tile(problem, model, mem, host, staged=executor.STAGED, kernel=kernel,
                               symmetric=symmetric, **staging)
        except BudgetError as exc:
            raise BudgetError(str(exc) + _unit_hint(memory_limit=memory_limit,
                                                    host_memory_limit=host_memory_limit)) from None
        plan = Plan(tile=tile, **kwargs)
    plan = _finished(plan)
    sources = {"A": src_a, "B": src_b}
    if problem.c is not None and c_source is not None:
        sources["C"] = c_source
    return _Prepared(plan=plan, sources=sources, out=out, in_place=in_place, device=dev,
                     out_options=out_options, storage_options=storage_options)


def _finished(plan: Plan) -> Plan:
    """A plan with its tile chosen: stripes no larger than its regions, validated against its
    budgets, with the operands it decodes into the ring or keeps in host memory chosen anew
    (a plan finished again, for another tile, decides them again)."""
    if plan.staged:  # small products need no 32 MB stripes
        w, h, r = plan.tile
        default = int(Plan.__dataclass_fields__["stripe"].default)  # type: ignore[arg-type]
        plan = dataclasses.replace(plan, stripe=min(default, max(w * r, r * h, w * h)))
    return _with_cache(with_ring_decodes(
        dataclasses.replace(plan, cache=(), into_ring=()).validate()))


def _unit_hint(**limits) -> str:
    """A question for budgets given as a bare number under 1 MiB: bytes, or a unit forgotten?"""
    for name, value in limits.items():
        bare = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
            isinstance(value, str) and value.strip().isdigit())
        if bare and int(value) < (1 << 20):
            return (f". {name}={value} is bytes (a bare number): did you mean "
                    f"'{int(value)}MB' or '{int(value)}GB'?")
    return ""


def _with_cache(plan: Plan) -> Plan:
    """Keep the decoded chunks of chunked on-disk operands (Zarr) in host memory for the whole
    run where they fit in what the rest leaves of host_memory_limit (a kept operand no longer
    needs its streaming window): every chunk is then read and decoded once, and the decoders
    run ahead of the executor as far as storage allows (on the H100: storage is 25-40x slower
    than PCIe). Those that streaming would decode more than once (panels reloaded, chunks cut
    by panel edges) come first, the most repeated decode bytes first; then the larger. A .npy
    memmap is left to the OS page cache, which already is that cache: a copy of it cost the
    GPU benchmark 60% of its rate from warm .npy files."""
    priority = {}
    for report in plan.chunk_reports():
        if report.operand in ("A", "B"):
            repeated = (report.decodes - report.n_chunks) * report.chunks[0] * report.chunks[1]
            priority[report.operand] = (repeated, plan.problem.operand_bytes(report.operand))
    chosen: tuple[str, ...] = ()
    ringed = set(plan.into_ring)  # decoded into the ring: nothing to keep
    for name in sorted((x for x in priority if x not in ringed), key=lambda x: priority[x],
                       reverse=True):
        kept = ("A", "B") if plan.problem.shared else (name,)  # one matrix: kept for both
        trial = dataclasses.replace(plan, cache=tuple(sorted(set(chosen + kept))))
        if trial.host_bytes <= plan.host_memory_limit:
            chosen = trial.cache
    if not chosen:
        return plan
    return dataclasses.replace(plan, cache=chosen).validate()


def chunk_readers(plan: Plan, sources: dict) -> dict:
    """The sources with every chunked on-disk one read at its grain
    (:class:`~oocgemm.storage.chunked.ChunkReader`): each chunk decoded once per load, or
    once per run for the operands the plan keeps."""
    from .planning.chunks import loads
    from .storage.base import ChunkedSource
    from .storage.chunked import ChunkReader

    # The CUDA executor's host threads mostly wait on copies: decode on every core there.
    decoders = max(plan.readers, hostinfo.cores()) if plan.staged else plan.readers
    wrapped = dict(sources)
    for name, src in sources.items():
        if name == "B" and plan.problem.shared:
            wrapped["B"] = wrapped["A"]  # one reader: each chunk decoded once for both roles
        elif (src.on_disk and src.chunks is not None and not src.sliced
              and isinstance(src, ChunkedSource)):
            roles = ("A", "B") if name == "A" and plan.problem.shared else (name,)
            wrapped[name] = ChunkReader(src, loads(plan.schedule.ops, roles, src.chunks),
                                        kept=name in plan.cache, decoders=decoders,
                                        gap=len(roles), into=name in plan.into_ring)
    return wrapped


def chunk_writer(plan: Plan, sink):
    """The sink written at its grain (:class:`~oocgemm.storage.chunked.ChunkWriter`) where
    the plan writes C blocks in row stripes that cut the output's chunks: each chunk encoded
    once, whole, instead of once per stripe. Else the sink itself."""
    from .planning.tiling import assembly_window
    from .storage.chunked import ChunkWriter

    if not plan.staged or not sink.on_disk or not sink.chunks:
        return sink
    budget = assembly_window(plan.problem, plan.tile,
                             plan.buffers.out_ring // plan.problem.itemsize,
                             plan.min_stripes, sink.chunks)
    if not budget:
        return sink
    return ChunkWriter(sink, plan.row_splits, plan.col_splits, budget=budget)


def _check_out_options(out, options, shape, dtype, in_place: bool) -> dict:
    """``out_options`` for a new Zarr output path, checked before any work (with the Zarr
    format of the group it goes into filled in); refused where the output is not created by
    this run (an array, a .npy file, an update in place)."""
    from .storage import kind_of_path
    from .storage.zarr_store import check_out_options

    zarr_path = is_path(out) and kind_of_path(os.fspath(out)) == "zarr"
    if options is None:  # a Zarr path is written anew (in place too): its group's format
        return check_out_options({}, shape, dtype, os.fspath(out)) if zarr_path else {}
    if not is_path(out) or kind_of_path(os.fspath(out)) != "zarr":
        raise OptionError("out_options sets the layout of a new Zarr output; out is "
                          + ("an array" if not is_path(out) else f"{os.fspath(out)!r}, not .zarr"))
    if in_place:
        raise OptionError("out_options: out is updated in place (beta != 0 without c), so its "
                          "layout is the existing array's")
    return check_out_options(options, shape, dtype, os.fspath(out))


def _out_layout(prep: _Prepared) -> dict:
    """The layout of a new Zarr output: the user's ``out_options``, with default chunks that
    tile the C blocks and the row stripes they are written in, at most 64 MiB each
    (:func:`~oocgemm.storage.zarr_store.output_chunks`), and the Zarr format of the group
    the output goes into; for an update in place, the existing array's own layout."""
    from .storage.zarr_store import ZarrSource, layout_of, output_chunks

    plan_ = prep.plan
    original = prep.sources.get("C")
    if prep.in_place and isinstance(original, ZarrSource):
        # An update in place keeps the user's array as it was: chunks, shards, codecs, fill
        # value, dimension names, attributes (it is written anew and swapped in on commit).
        return layout_of(original.array())
    options = dict(prep.out_options)
    if options.get("chunks") is None:
        w, h, _ = plan_.tile
        block = options.get("shards") or (w, h)
        rows = plan_.stripe_rows(w, h) if plan_.staged and not options.get("shards") else None
        options["chunks"] = output_chunks(block, plan_.problem.itemsize, rows)
    return options


def _check_out_path(path: str) -> None:
    """A local output path, checked before any work: something oocgemm can create or would
    have written itself (a Zarr array, a .npy file), never a directory that holds other
    things, in a directory it can write to. (One that holds an input is refused before:
    :func:`~oocgemm.storage.identity.check_output`.)"""
    from .storage import kind_of_path
    from .storage.zarr_store import is_zarr_array

    if not path.strip():
        raise OutputError("out is an empty path; name a .zarr or .npy output")
    kind = kind_of_path(path)
    if kind == "npy" and path.endswith(("/", os.sep)):
        raise OutputError(f"out {path!r}: a .npy output is a file, not a directory")
    if os.path.lexists(path):
        if kind == "zarr" and not is_zarr_array(path):
            raise OutputError(f"out {path!r} exists and is not a Zarr array; oocgemm replaces "
                              f"only a Zarr array or .npy file, never other files or folders")
        if kind == "npy" and not os.path.isfile(path):
            raise OutputError(f"out {path!r} exists and is not a file")
        if kind == "npy" and not path.lower().endswith(".npy") and not _is_npy_file(path):
            raise OutputError(f"out {path!r} exists and is not a .npy file; oocgemm replaces "
                              f"only a Zarr array or .npy file, never other files")
    elif not path.lower().rstrip("/\\").endswith((".zarr", ".npy")):
        from .storage.zarr_store import parent_group

        if parent_group(path) is None:  # inside a Zarr group any name is one of its arrays
            raise OutputError(f"out {path!r}: name a new output .zarr (a Zarr array) or .npy "
                              f"(a numpy file), or an array inside a Zarr group (g.zarr/C)")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"out {path!r}: the directory {parent!r} is not writable")


def _is_npy_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return False


def _check_out(out, shape, dtype) -> Operand:
    """Refuse outputs of the wrong kind, shape or dtype; describe the output."""
    if out is None:  # a new numpy array of the compute dtype
        need, free = shape[0] * shape[1] * dtype.itemsize, hostinfo.available_memory()
        if need > free:
            raise OutputError(f"out=None returns C in memory, but C needs {format_size(need)} and "
                              f"{format_size(free)} is available; pass a .zarr or .npy path as "
                              f"out")
        return Operand(shape, None, False, "result array", zero_copy=True)
    if is_path(out):
        path = os.fspath(out)
        if not urls.is_url(path):
            _check_out_path(path)
        return Operand(shape, None, True, path)
    if not hasattr(out, "shape") or len(out.shape) != 2:
        raise OutputError(f"out must be None, a path or a 2-D array, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ShapeError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    check_dtype("out", out.dtype)
    if np.dtype(out.dtype).kind != "c" and dtype.kind == "c":
        raise DTypeError(f"out has dtype {np.dtype(out.dtype)}, but the product is {dtype}")
    is_zarr = type(out).__module__.startswith("zarr")
    # align C blocks to what one write rewrites: the shard of a sharded array, else the chunk
    chunks = tuple(getattr(out, "shards", None) or out.chunks) if is_zarr else None
    in_place = (isinstance(out, np.ndarray) and not isinstance(out, np.memmap)
                and out.dtype == dtype and out.strides[1] == out.itemsize)
    return Operand(shape, chunks, is_zarr, "out array", zero_copy=in_place)


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
    :class:`~oocgemm.plan.Plan` (print it for a summary; ``plan.schedule`` lists the block
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
    prepared = _prepare(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                        options=options, device=_planned_for(device_names(device), device))
    return prepared.plan


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
        The per-block GEMM on a GPU: 'cublas' (the default, the fastest measured) or one of
        the kernels of ``kernels/``: 'naive', 'tiled', 'opt', 'regblock' (float32/float64),
        'dmma' (float64, FP64 tensor cores, compute capability 8.0+). Not for the CPU.
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
    if unknown:
        raise OptionError(f"multiply() got unknown keyword arguments {sorted(unknown)}; "
                          f"see help(oocgemm.multiply)")
    if not isinstance(overwrite, (bool, np.bool_)):
        raise OptionError(f"overwrite must be True or False, got {overwrite!r}")
    if not isinstance(events, (bool, np.bool_)):
        raise OptionError(f"events must be True or False, got {events!r}")
    if not isinstance(verify, (bool, np.bool_)):
        raise OptionError(f"verify must be True or False, got {verify!r}")
    if not isinstance(resume, (bool, np.bool_)):
        raise OptionError(f"resume must be True or False, got {resume!r}")
    if engine is not None and not hasattr(engine, "resources"):
        raise OptionError(f"engine must be an oocgemm.Engine, got {type(engine).__name__}")
    options = Options.of("multiply()", device=device, memory_limit=memory_limit,
                         host_memory_limit=host_memory_limit, tile=tile, kernel=kernel,
                         out_options=out_options, storage_options=storage_options)
    devices = device_names(device)
    prep = _prepare(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b,
                    options=options, device=_planned_for(devices, device))
    plan_ = prep.plan
    resources = engine.resources(prep.device.kind) if engine is not None else None

    prob = plan_.problem
    attributes = {"m": prob.m, "n": prob.n, "k": prob.k, "alpha": _json_scalar(prob.alpha),
                  "beta": _json_scalar(prob.beta), "trans_a": prob.trans_a,
                  "trans_b": prob.trans_b}
    signatures = _input_signatures(prep, a, b, c)
    journal = temporary = None
    if resume:
        if signatures is None:
            raise OptionError("resume=True needs an output path and inputs stored as local "
                              "files (.npy, .zarr)")
        prep, journal, temporary = _resume(prep, signatures)
        plan_ = prep.plan
    elif signatures is not None:
        from .storage.journal import candidates, writer_alive

        kept = candidates(os.fspath(prep.out))
        if kept and writer_alive(kept[0]):
            warnings.warn(f"oocgemm: another run of {os.fspath(prep.out)} is under way "
                          f"(it writes {kept[0]}); of the two, the one that commits last "
                          f"decides what the output holds", RuntimeWarning, stacklevel=2)
        elif kept:  # a run of this output was interrupted: say that it can be finished instead
            warnings.warn(f"oocgemm: {kept[0]} holds the blocks of an interrupted run of "
                          f"{os.fspath(prep.out)}: resume=True (--resume) finishes it instead of "
                          f"starting again; remove it when it is not wanted", RuntimeWarning,
                          stacklevel=2)
    layout = _out_layout(prep)
    fingerprint = None if signatures is None else _fingerprint(prep, signatures, layout)
    bar = sink = None
    sources = prep.sources
    check = _Check(prep, a, b, c, storage_options) if verify else None
    report = None
    committed = False
    replanned: list[str] = []
    shares: dict = {}
    from .storage.journal import Journal, JournaledSink

    try:
        with signals_deferred():
            sink = open_sink(prep.out, shape=(prob.m, prob.n), dtype=prob.dtype,
                             options=layout, overwrite=overwrite, in_place=prep.in_place,
                             attributes=attributes, storage_options=prep.storage_options,
                             temporary=temporary)
            c_in = prep.sources.get("C")
            if prep.in_place and hasattr(sink, "guard") and sink.path is None and \
                    hasattr(c_in, "lock"):  # a given zarr.Array read as C and written
                sink.guard(c_in)
            if fingerprint is not None:
                if journal is None:
                    assert sink.temporary_path is not None  # a fingerprint: a file output
                    journal = Journal(sink.temporary_path, {
                        "fingerprint": fingerprint, "schedule": _schedule_key(plan_)})
                sink = JournaledSink(sink, journal, plan_.row_splits, plan_.col_splits)
        start = time.perf_counter()
        if devices:  # several devices: block groups handed out as each device is free
            on_event, bar = _progress(progress, plan_)
            log = _run_on_devices(plan_, prep, devices, sink, on_event, events, resources)
            shares = log.share
        while not devices:  # one device (when memory runs short: again, with smaller blocks)
            on_event, bar = _progress(progress, plan_)
            sources = chunk_readers(plan_, prep.sources)
            writer = chunk_writer(plan_, sink)
            executor = executor_class(prep.device.kind)(plan_, sources, writer,
                                                        on_event=on_event, record=bool(events),
                                                        resources=resources)
            try:
                log = executor.run()
                writer.flush()
                break
            except MemoryPressureError as exc:  # less memory than planned: smaller blocks
                if bar is not None:
                    bar.close()
                    bar = None
                for src in sources.values():
                    src.close()
                if len(replanned) == MAX_REPLANS:
                    raise
                plan_ = _smaller(plan_, exc, prep.device)
                replanned.append(f"{exc}; planned again with tile w={plan_.tile[0]} "
                                 f"h={plan_.tile[1]} r={plan_.tile[2]} "
                                 f"(memory_limit={format_size(plan_.memory_limit)}, "
                                 f"host_memory_limit={format_size(plan_.host_memory_limit)}) "
                                 f"and started again")
                warnings.warn("oocgemm: " + replanned[-1], RuntimeWarning, stacklevel=2)
                if isinstance(sink, JournaledSink):  # the blocks are others now
                    sink = sink.regrid(plan_.row_splits, plan_.col_splits, {
                        "fingerprint": fingerprint, "schedule": _schedule_key(plan_)})
        seconds = time.perf_counter() - start
        if check is not None:
            report = check.run(sink.array())
            if not report:
                raise ExecutionError(f"the product failed its check, so nothing was committed: "
                                     f"{report}")
        with signals_deferred():  # a signal that arrives here is raised as the block ends
            result_out = sink.commit()
            committed = True
        if signatures is not None:
            _name_left_behind(os.fspath(prep.out))
    except BaseException as exc:
        if committed:  # an interrupt after the commit: the output is whole, and stays
            assert sink is not None
            where = os.fspath(prep.out) if is_path(prep.out) else sink.name
            exc.oocgemm_committed = where  # type: ignore[attr-defined]
            exc.add_note(f"oocgemm: {where} was complete and committed before this interrupt")
        elif sink is not None:
            with signals_deferred():
                if isinstance(exc, KeyboardInterrupt) and isinstance(sink, JournaledSink) \
                        and sink.keep():  # finished blocks stay, for resume=True
                    p, q, _ = plan_.grid
                    exc.oocgemm_resumable = (  # type: ignore[attr-defined]
                        sink.journal.temporary, len(sink.journal.blocks), p * q)
                    exc.add_note(f"oocgemm: {len(sink.journal.blocks)} of {p * q} C blocks "
                                 f"are kept in {sink.journal.temporary}; resume=True finishes "
                                 f"the product")
                else:
                    sink.abort()
        elif journal is not None:
            journal.close()
        raise
    finally:
        if bar is not None:
            bar.close()
        for src in sources.values():
            src.close()
    return Result(out=result_out, plan=plan_, seconds=seconds, flops=plan_.flops,
                  bytes={**_storage_bytes(prep.sources), **log.traffic()},
                  events=log.events(), started_at=log.started_at,
                  chunks=_chunk_counts(sources),
                  verified=report, resumed=len(plan_.done), replanned=replanned,
                  devices=shares, emulation=dict(log.notes),
                  emulation_seconds=dict(log.timed),
                  out_name=os.fspath(prep.out) if is_path(prep.out) else sink.name)


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
    if not isinstance(outer, (bool, np.bool_)):
        raise OptionError(f"outer must be True or False, got {outer!r}")
    return multiply(x, x, out, trans_a=not outer, trans_b=bool(outer), **options)


def _run_on_devices(plan_: Plan, prep: _Prepared, devices: list[str], sink, on_event, events,
                    resources):
    """The product on several executors (:mod:`oocgemm.runtime.split`): the merged log."""
    from .runtime.split import k_parts, run_k_parts, run_split

    runs = _Runs(prep.device.kind, on_event, events, resources)
    parts = k_parts(plan_, len(devices))
    if parts:  # one C block: its K split, the partials summed once
        return run_k_parts(plan_, prep.sources, devices, parts, sink, runs.run, runs.stop)
    writer = chunk_writer(plan_, sink)  # the groups' blocks share no chunk row band cell
    log = run_split(plan_, devices, lambda device_plan, name: runs.run(
        device_plan, prep.sources, writer), runs.stop)
    writer.flush()
    return log


class _Runs:
    """The executor runs of one product on several devices: :meth:`run` runs one plan from
    its sources (read at their grain) into a sink; :meth:`stop` cancels those under way."""

    def __init__(self, kind: str, on_event, events, resources):
        self.kind, self.on_event, self.events, self.resources = kind, on_event, events, resources
        self.running: set = set()

    def run(self, plan_: Plan, sources: dict, sink):
        readers = chunk_readers(plan_, sources)
        executor = executor_class(self.kind)(plan_, readers, sink, on_event=self.on_event,
                                             record=bool(self.events),
                                             resources=self.resources)
        self.running.add(executor)
        try:
            return executor.run()
        finally:
            self.running.discard(executor)
            for src in readers.values():
                src.close()

    def stop(self) -> None:
        for executor in list(self.running):
            executor._cancel.set()


#: Times a run plans again with smaller blocks after running out of memory.
MAX_REPLANS = 3


def _smaller(plan: Plan, exc: MemoryPressureError, device: Device) -> Plan:
    """The plan to go on with after ``exc``: half the budget of the memory that ran out (and
    no more than the GPU has free now), the best tile under it, every block to compute."""
    mem, host = plan.memory_limit, plan.host_memory_limit
    if exc.where == "device" or (exc.where == "host" and device.kind == "cpu"):
        mem //= 2  # on the CPU, the working buffers are host memory
    if exc.where in ("host", "pinned"):
        host //= 2
    if exc.where == "pinned":
        mem //= 2  # a CUDA allocation of unknown kind: both
    if device.kind == "cuda":
        from . import cuda

        mem = min(mem, int(cuda.memory_info(device.index)[0] * 0.9))
    staging = {k: getattr(plan, k) for k in STAGING}
    try:
        tile = choose_tile(plan.problem, plan.model, mem, host, staged=plan.staged,
                           kernel=plan.kernel, symmetric=plan.symmetric, **staging)
        return _finished(dataclasses.replace(plan, tile=tile, memory_limit=mem,
                                             host_memory_limit=host, done=(),
                                             chosen_by="planner, again after running out "
                                                       "of memory"))
    except BudgetError as budget:
        raise BudgetError(f"{exc}; and no smaller plan fits: {budget}") from None


def _name_left_behind(final: str) -> None:
    """Warn of the temporary outputs that earlier runs of ``final`` left, now that it is
    committed: oocgemm does not remove what this run did not write."""
    from .storage.journal import left_behind

    left = left_behind(final)
    if left:
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        warnings.warn(f"oocgemm: {final} is complete; {left[0]}{more}, left by an earlier "
                      f"run of it, is not needed any more: remove it", RuntimeWarning,
                      stacklevel=3)


def _input_signatures(prep: _Prepared, a, b, c) -> dict | None:
    """Each input's identity (path, and its files' sizes and modification times), for a
    run's journal; None where the run cannot be resumed: an output that is not a local path,
    or an input that is not a local file or folder."""
    from .storage.journal import signature

    if not is_path(prep.out) or urls.is_url(os.fspath(prep.out)):
        return None
    inputs = {"A": a, "B": b}
    if prep.plan.problem.reads_c:
        inputs["C"] = prep.out if prep.in_place else c
    signatures = {}
    for name, x in inputs.items():
        if not is_path(x) or urls.is_url(urls.local(os.fspath(x))):
            return None
        signatures[name] = signature(urls.local(os.fspath(x)))
    return signatures


def _fingerprint(prep: _Prepared, signatures: dict, layout: dict) -> dict:
    """What a run computes and from what, for its journal (:mod:`oocgemm.storage.journal`):
    its inputs' ``signatures`` (:func:`_input_signatures`), the problem, the output and its
    ``layout``."""
    prob = prep.plan.problem
    return {"inputs": signatures,
            "problem": {"m": prob.m, "n": prob.n, "k": prob.k, "dtype": prob.dtype,
                        "alpha": repr(prob.alpha), "beta": repr(prob.beta),
                        "trans_a": prob.trans_a, "trans_b": prob.trans_b},
            "out": {"path": os.path.abspath(os.fspath(prep.out)), "in_place": prep.in_place,
                    "layout": repr(sorted(layout.items()))}}


def _schedule_key(plan: Plan) -> dict:
    """What fixes the order of every block's sums: the same key, the same bits."""
    return {"device": plan.device.split(":")[0], "kernel": plan.kernel, "tile": list(plan.tile),
            "staged": plan.staged, "ramp": plan.ramp, "ramp_granule": plan.ramp_granule,
            "split_last": plan.split_last, "tail_panels": plan.tail_panels, "n_a": plan.n_a,
            "n_b": plan.n_b, "symmetric": plan.symmetric}


def _resume(prep: _Prepared, signatures: dict):
    """The interrupted run of this product to continue: (prep with the plan that finishes
    it, its locked journal, its temporary output), or (prep, None, None) when there is none.
    ``signatures``: the inputs' (:func:`_input_signatures`)."""
    from .storage.journal import Journal, candidates, verified

    changed, busy = [], []
    for temporary in candidates(os.fspath(prep.out)):
        try:
            journal = Journal(temporary)
        except BlockingIOError:
            busy.append(temporary)
            continue
        header = journal.header
        tile = tuple(header.get("schedule", {}).get("tile", prep.plan.tile))
        if prep.plan.chosen_by == "tile" and tile != tuple(prep.plan.tile):
            journal.close()  # the user asked for another tile: another sum order
            changed.append((temporary, [f"tile was {tile}, now {tuple(prep.plan.tile)}"]))
            continue
        try:  # the interrupted run's tile, which must fit this run's budgets
            plan = _finished(dataclasses.replace(prep.plan, tile=tile, chosen_by="resume"))
        except BudgetError:
            journal.close()
            raise
        forced = dataclasses.replace(prep, plan=plan)
        fingerprint = _fingerprint(forced, signatures, _out_layout(forced))
        differs = (_differences(header.get("fingerprint", {}), fingerprint)
                   or _differences(header.get("schedule", {}), _schedule_key(plan)))
        if differs:
            journal.close()
            changed.append((temporary, differs))
            continue
        done = verified(journal)
        journal.blocks = {block: journal.blocks[block] for block in done}
        if plan.symmetric:  # a block above the diagonal is done once it is written across too
            done = {(i, j) for i, j in done if i <= j and (j, i) in done}
        plan = dataclasses.replace(plan, done=tuple(sorted(done)))
        return dataclasses.replace(prep, plan=plan), journal, temporary
    if changed:
        temporary, differs = changed[0]
        raise OutputError(f"cannot resume: the interrupted run in {temporary!r} computed "
                          f"something else ({'; '.join(differs)}); run without resume to "
                          f"start again, and remove it")
    if busy:
        raise OutputError(f"cannot resume: another process is writing {busy[0]!r}")
    return prep, None, None


def _differences(was: dict, now: dict, where: str = "") -> list[str]:
    """What changed between two fingerprints, in words."""
    out = []
    for key in sorted(set(was) | set(now)):
        old, new = was.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += _differences(old, new, f"{where}{key} ")
        elif old != new:
            what = f"{where}{key}".strip()
            if where.startswith("inputs"):
                out.append(f"input {key} changed (or moved) since")
            else:
                out.append(f"{what} was {old}, now {new}")
    return out


class _Check:
    """``multiply(verify=True)``: Freivalds' vectors drawn, and what C_in contributes taken,
    before the run (an update in place overwrites C_in); the check run on the product before
    it is committed."""

    def __init__(self, prep: _Prepared, a, b, c, storage_options):
        from .freivalds import _vectors, prepare_c_in

        prob = prep.plan.problem
        self.prob, self.a, self.b, self.storage_options = prob, a, b, storage_options
        complex_ = (prob.dtype.startswith("complex") or isinstance(prob.alpha, complex)
                    or isinstance(prob.beta, complex))
        self.x = _vectors(prob.n, 2, complex_, None)
        c_in = (prep.out if prep.in_place else c) if prob.reads_c else None
        self.side = prepare_c_in(c_in, self.x, storage_options=storage_options)

    def run(self, product):
        from .freivalds import verify

        prob = self.prob
        return verify(self.a, self.b, product, alpha=prob.alpha, beta=prob.beta,
                      trans_a=prob.trans_a, trans_b=prob.trans_b, rounds=2,
                      storage_options=self.storage_options, _c_in_side=self.side, _x=self.x,
                      _checking=True)


def _storage_bytes(sources: dict) -> dict:
    """What the run took from storage, apart from what its READs copied into slots: the
    stored bytes read (compressed chunks, or a file's pages) and the bytes decoded, summed
    over the distinct sources (one matrix in both roles counts once)."""
    distinct = {id(src): src for src in sources.values()}.values()
    return {"storage_read": sum(src.bytes_read for src in distinct),
            "decoded": sum(src.decoded_bytes for src in distinct)}


def _chunk_counts(sources: dict) -> dict:
    """What the chunk readers did, per operand: chunks, decodes, decoded and peak bytes, the
    readers' time copying out of decoded chunks."""
    from .storage.chunked import ChunkReader

    counts: dict = {}
    seen: dict[int, str] = {}  # one reader for one matrix in both roles: reported once, as A
    for name, src in sources.items():
        if not isinstance(src, ChunkReader):
            continue
        if id(src) in seen:
            counts[seen[id(src)]]["roles"] += name
            continue
        seen[id(src)] = name
        counts[name] = {"chunks": src.n_chunks, "decodes": src.decodes,
                        "decoded_bytes": src.decoded_bytes, "peak_bytes": src.peak_bytes,
                        "kept": src.kept, "into_ring": src.into,
                        "copy_seconds": src.copy_seconds, "roles": name}
    return counts


def _json_scalar(x):
    return [x.real, x.imag] if isinstance(x, complex) else x


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

"""The options of a product beside its operands and scalars, defined here once
(:class:`Options`): those of its plan (where it runs, its budgets, its tile and kernel, who
decodes and encodes on a GPU, its output layout and its file systems) and those of its run
only (overwrite, progress, events, verify, resume, engine). :class:`oocgemm.Product` takes
them, and through it ``multiply``, ``plan``, :class:`oocgemm.Engine` and
``oocgemm.dask.matmul`` (the last two, a plan's only); ``multiply``'s keyword arguments and
the command line's flags are made from these fields (a field's ``cli`` metadata is its flag).
They are checked here, in one place, before any work (what needs the operands, such as a
kernel's dtypes, is checked where the operands are opened). An option left None that has a
setting (:mod:`oocgemm.settings`) takes the setting's value when the plan is made."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import settings
from .errors import OptionError
from .units import parse_size


def _run() -> dict:
    """A field that changes how a product runs, not its plan."""
    return {"run": True}


def _cli(*flags: str, **click: Any) -> dict:
    """A field's flag on the command line: its spellings and click's keywords (``metavar``,
    ``help``, ``is_flag``...; ``choices``, the words it takes); the field's name is the
    parameter's, its default the flag's."""
    return {"cli": {"flags": flags, **click}}


@dataclass(frozen=True)
class Options:
    """A product's options, normalised: ``tile`` a (w, h, r) of positive integers, the
    mappings copied into dicts; sizes and devices as given (their totals are the device's)."""

    device: Any = field(default="auto", metadata=_cli(
        "--device", metavar="DEVICE", show_default=True,
        help="auto, cpu, cuda or cuda:N (auto: a GPU when CuPy sees one); several: cuda:all "
             "or a list such as cuda:0,cuda:1."))
    """'auto', 'cpu', 'cuda', 'cuda:N', 'cuda:all', or a list of device names."""
    memory_limit: Any = field(default=None, metadata=_cli(
        "--memory-limit", metavar="SIZE",
        help="Budget of the block buffers (GPU memory, or the CPU's working buffers): bytes, "
             "'8GB', '512MiB' or '80%'. Default: 90% of free GPU memory, or a quarter of RAM."))
    """Bytes, a string like '16GB' or '80%' (of the device's memory), or None."""
    host_memory_limit: Any = field(default=None, metadata=_cli(
        "--host-memory-limit", metavar="SIZE",
        help="Budget of host staging and read buffers (default a quarter of RAM)."))
    """As ``memory_limit``, of host memory."""
    tile: tuple[int, int, int] | None = field(default=None, metadata=_cli(
        "--tile", metavar="W,H,R",
        help="Override the planner: C blocks of WxH, K panels of depth R."))
    """The C block and K panel (w, h, r), or None for the planner's choice."""
    kernel: str | None = field(default=None, metadata=_cli(
        "--kernel", metavar="NAME",
        help="Per-block GEMM on a GPU: cublas (default), naive, tiled, opt, regblock or dmma "
             "(kernels/); ozaki[:N]: float64 emulated on int8 products in exact integers, "
             "rounded once (GPU or CPU)."))
    """The per-block GEMM on a GPU ('cublas', 'dmma', ...), or None for the default."""
    gpu_decode: bool | str | None = field(default=None, metadata=_cli(
        "--gpu-decode", choices=("auto", "on", "off"),
        help="Who decodes inputs stored as zstd frames on a GPU: auto (the GPU where the "
             "model predicts it faster and nvCOMP is found), on (the GPU wherever the plan "
             "allows), off (the host). Default: $OOCGEMM_GPU_DECODE, else auto."))
    """Who decodes the inputs' zstd frames on a GPU run: 'auto', True (the GPU wherever the
    plan allows) or False (the host); 'on' and 'off' are True and False. None: the setting
    (:mod:`oocgemm.settings`: ``OOCGEMM_GPU_DECODE``, else 'auto'). A CPU run decodes on the
    host, and its plan notes a GPU asked for."""
    gpu_encode: bool | str | None = field(default=None, metadata=_cli(
        "--gpu-encode", choices=("on", "off", "last", "frames"),
        help="Who compresses a zstd OUT on a GPU run: on (the GPU, where nvCOMP is found), "
             "off (the host, whole chunks); last and frames are experimental shares. "
             "Default: $OOCGEMM_GPU_ENCODE, else on."))
    """Who compresses a zstd output on a GPU run: True (the GPU, a row stripe of C at a
    time, where nvCOMP is found and its buffers fit), False (the host, whole chunks), or the
    experimental 'last' and 'frames' (:func:`oocgemm.planning.planner.gpu_encode_pass`);
    'on' and 'off' are True and False. None: the setting (``OOCGEMM_GPU_ENCODE``, else True).
    A CPU run's host encodes, and its plan notes a GPU asked for."""
    out_options: dict | None = None
    """The layout of a new ``.zarr`` output (``zarr.create_array`` keywords); on the command
    line, ``--out-chunks``, ``--out-shards``, ``--out-compressor`` and ``--zarr-format``."""
    storage_options: dict | None = None
    """Options of the fsspec file system of URL inputs and outputs (not on the command
    line)."""
    # -- how it runs only ------------------------------------------------------------------
    overwrite: bool = field(default=False, metadata=_run() | _cli(
        "--overwrite", is_flag=True, help="Replace an existing OUT."))
    """Replace an existing output path."""
    progress: bool | Callable | None = field(default=None, metadata=_run())
    """True: a bar on stderr; False: none; None: a bar on a terminal for a run predicted to
    take over two seconds; or a callable that receives each finished event (on the command
    line, ``--quiet`` is False)."""
    events: bool = field(default=True, metadata=_run())
    """Record one timed event per block operation (not on the command line)."""
    verify: bool = field(default=False, metadata=_run() | _cli(
        "--verify", is_flag=True,
        help="Check the product (Freivalds' test) before committing it."))
    """Check the product with Freivalds' test before it is committed."""
    resume: bool = field(default=False, metadata=_run() | _cli(
        "--resume", is_flag=True,
        help="Finish the interrupted run of this same command: the C blocks it wrote are kept "
             "(checked against their checksums), the rest computed."))
    """Continue the interrupted run of this product into this output path."""
    engine: Any = field(default=None, metadata=_run())
    """The :class:`oocgemm.Engine` whose resources the run uses, or None for the process's
    (not on the command line)."""

    @classmethod
    def of(cls, where: str, names: tuple[str, ...] | None = None, **given: Any) -> Options:
        """The options ``given`` (by name), checked; OptionError for an unknown name (one not
        in ``names``: default, every option) or a value that cannot be one, naming ``where``
        they were given."""
        from .arguments import flag, parse_compressor  # (numpy: not for `oocgemm --help`)

        names = ALL if names is None else names
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise OptionError(f"{where}: unknown options {unknown}; it takes "
                              f"{', '.join(names)}" + _hints(unknown, names))
        for name in ("memory_limit", "host_memory_limit"):
            parse_size(given.get(name), 1 << 40, name=name)  # its spelling; the total later
        for name in ("out_options", "storage_options"):
            value = given.get(name)
            if value is not None and not isinstance(value, Mapping):
                raise OptionError(f"{name} must be a dict, got {type(value).__name__}")
            if value is not None:
                given[name] = dict(value)
        if given.get("tile") is not None:
            given["tile"] = parse_tile(given["tile"])
        kernel = given.get("kernel")
        if kernel is not None and not isinstance(kernel, str):
            raise OptionError(f"kernel must be a name, got {kernel!r}")
        if kernel is not None:
            from .kernel_catalog import check_kernel_name

            check_kernel_name(kernel)
        layout = given.get("out_options") or {}
        if isinstance(layout.get("compressors"), str):
            # its name and level now; the level's range with the Zarr format where it is
            # given (else the output's group picks it, later)
            if layout.get("zarr_format") in (2, 3):
                from .storage.zarr_store import compressor

                compressor(layout["compressors"], layout["zarr_format"])
            else:
                parse_compressor(layout["compressors"])
        for name in ("gpu_decode", "gpu_encode"):  # 'on' as True...; None: the setting's
            if given.get(name) is not None:
                given[name] = settings.parse(name, given[name])
        for name in ("overwrite", "events", "verify", "resume"):
            if name in given:
                given[name] = flag(name, given[name])
        progress = given.get("progress")
        if progress is not None and not callable(progress):
            try:
                given["progress"] = flag("progress", progress)
            except OptionError:
                raise OptionError(f"progress must be None, True, False or a callable, got "
                                  f"{progress!r}") from None
        engine = given.get("engine")
        if engine is not None and not hasattr(engine, "resources"):
            raise OptionError(f"engine must be an oocgemm.Engine, got {type(engine).__name__}")
        return cls(**given)

    def keywords(self) -> dict[str, Any]:
        """The options that differ from the defaults, by name (to hand on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}


#: Keywords of ``zarr.create_array`` (and dask's ``to_zarr``) that users pass to ``multiply``
#: itself, with the ``out_options`` key and the flag that set them (None: no flag).
LAYOUT_KEYWORDS: dict[str, tuple[str, str | None]] = {
    "chunks": ("chunks", "--out-chunks"), "shards": ("shards", "--out-shards"),
    "compressors": ("compressors", "--out-compressor"),
    "compressor": ("compressors", "--out-compressor"),
    "zarr_format": ("zarr_format", "--zarr-format"), "filters": ("filters", None),
    "serializer": ("serializer", None), "dimension_names": ("dimension_names", None),
    "chunk_key_encoding": ("chunk_key_encoding", None),
}


def _hints(unknown: list[str], names: tuple[str, ...]) -> str:
    """What was probably meant by each of the ``unknown`` option names: the layout of a new
    Zarr output (``out_options``), or a known name spelled nearly alike."""
    import difflib

    hints = []
    for name in unknown:
        if name in LAYOUT_KEYWORDS and "out_options" in names:
            key, cli = LAYOUT_KEYWORDS[name]
            hints.append(f"{name} is the layout of a new .zarr output: pass "
                         f"out_options={{{key!r}: ...}}"
                         + (f" ({cli} on the command line)" if cli else ""))
            continue
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            hints.append(f"did you mean {close[0]}?")
    return "".join("; " + hint for hint in hints)


#: The options by what they change: every one, those of a plan, those of a run only (which
#: ``plan`` accepts and ignores, and :class:`oocgemm.Engine` and ``oocgemm.dask.matmul``
#: refuse).
ALL = tuple(f.name for f in dataclasses.fields(Options))
RUN_ONLY = tuple(f.name for f in dataclasses.fields(Options) if f.metadata.get("run"))
PLANS = tuple(name for name in ALL if name not in RUN_ONLY)


def on_the_command_line() -> list[tuple[str, Any, dict]]:
    """(name, default, flag) of every option with a flag, in the order they are defined."""
    return [(f.name, f.default, f.metadata["cli"]) for f in dataclasses.fields(Options)
            if "cli" in f.metadata]


def parse_tile(tile) -> tuple[int, int, int]:
    """(w, h, r) from '8192,8192,4096', '8192x8192x4096' or a sequence of three."""
    if isinstance(tile, str):
        parts: list = tile.replace("x", ",").split(",")
    else:
        parts = list(tile) if isinstance(tile, (tuple, list)) else [tile]
    try:
        values = tuple(int(p) for p in parts)
        ok = (len(values) == 3 and all(float(p) == int(p) for p in parts)
              and not any(isinstance(p, bool) for p in parts))
    except (TypeError, ValueError):
        ok = False
    if not ok or min(values) < 1:
        raise OptionError(f"tile must be three positive integers (w, h, r), got {tile!r}")
    w, h, r = values
    return w, h, r

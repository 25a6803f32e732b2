"""The ``oocgemm`` command line: a thin layer over :mod:`oocgemm.api`.

    oocgemm random a.zarr --shape 20000x30000 --seed 1
    oocgemm random b.zarr --shape 30000x10000 --seed 2
    oocgemm plan a.zarr b.zarr -o c.zarr
    oocgemm multiply a.zarr b.zarr -o c.zarr --timeline run.json --plot run.png
    oocgemm timeline run.json
    oocgemm info

Errors that oocgemm raises on purpose (:class:`~oocgemm.OOCGemmError`) and usage errors print
``error: <message>`` on stderr and exit with status 2; an interrupt exits with 130. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import warnings
from typing import Any

import click

from .errors import OOCGemmError, OutputError
from .units import format_seconds, format_size
from .version import __version__

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 128 + signal.SIGTERM


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, batch schedulers), raised where SIGINT would be, so that
    a run stops the same way: lanes cancelled, temporary output removed, nothing committed."""


def _on_sigterm(signum, frame):
    raise _Terminated()


# ------------------------------------------------------------------------------------------
# The group: uniform error handling for every command
# ------------------------------------------------------------------------------------------
class _State:
    """What the running command has committed, for the interrupt message."""

    wrote: str | None = None


class ErrorHandlingGroup(click.Group):
    """A click group whose ``main`` turns expected errors (:class:`~oocgemm.OOCGemmError`,
    usage errors) into ``error: ...`` on stderr and exit 2, an interrupt into one line and exit
    130 (SIGTERM, raised as Ctrl-C's interrupt is: 143), and leaves anything else its
    traceback: the one wrapper of the ``oocgemm`` command line and of ``python -m
    benchmarks``."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: the help
            click.echo(exc.format_message(), err=True)
            code = EXIT_ERROR
        except click.ClickException as exc:
            _error(exc.format_message(), getattr(exc, "ctx", None))
            code = EXIT_ERROR
        except OOCGemmError as exc:
            _error(str(exc))
            code = EXIT_ERROR
        except (click.Abort, KeyboardInterrupt) as exc:
            # click turns KeyboardInterrupt (and EOF on a prompt) into Abort
            terminated = isinstance(exc, _Terminated) or isinstance(exc.__cause__, _Terminated)
            click.echo(self.interrupted(exc, "terminated" if terminated else "interrupted"),
                       err=True)
            code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        if standalone_mode:
            sys.exit(code)
        return code

    def interrupted(self, exc: BaseException, how: str) -> str:
        """The line an interrupt prints; ``how`` is 'interrupted' or 'terminated'."""
        return how


class OOCGemmGroup(ErrorHandlingGroup):
    """The ``oocgemm`` group: an interrupt also says what the command wrote, committed or
    kept for ``--resume``."""

    def main(self, *args, **kwargs):
        _State.wrote = None
        with warnings.catch_warnings():  # the hook is the command's only: put back after it
            warnings.showwarning = _show_warning
            return super().main(*args, **kwargs)

    def interrupted(self, exc: BaseException, how: str) -> str:
        committed = (getattr(exc, "oocgemm_committed", None)
                     or getattr(exc.__cause__, "oocgemm_committed", None))
        resumable = (getattr(exc, "oocgemm_resumable", None)
                     or getattr(exc.__cause__, "oocgemm_resumable", None))
        if committed:
            return f"{how} after the output was complete: {committed} holds the whole result"
        if resumable:
            partial, done, total = resumable
            return (f"{how}; {done} of {total} C blocks are kept in {partial}: run the same "
                    f"command with --resume to finish, or remove it")
        if _State.wrote:
            return f"{how} (after {_State.wrote} was written)"
        return f"{how}; no output was written"


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning on the command line: ``warning: <message>`` on one line of stderr, without
    Python's file, line number, category and source line (which name oocgemm's code, not
    what the user did)."""
    text = " ".join(str(message).split())
    click.echo(f"warning: {text.removeprefix('oocgemm: ')}", err=True)


def _error(message: str, ctx: click.Context | None = None) -> None:
    click.echo(f"error: {message}", err=True)
    if ctx is not None and ctx.command is not None:
        click.echo(f"(see '{ctx.command_path} --help')", err=True)


def echo_json(data) -> None:
    """JSON on stdout, and nothing else there (numpy scalars, complex numbers, tuples and sets
    written as JSON can hold them): the ``--json`` output of the CLI and of the benchmarks."""
    click.echo(json.dumps(data, indent=2, default=_json_default, allow_nan=True))


def _json_default(obj):
    if isinstance(obj, complex):
        return [obj.real, obj.imag]
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return str(obj)


# ------------------------------------------------------------------------------------------
# Parameter types
# ------------------------------------------------------------------------------------------
class PairType(click.ParamType):
    """Two positive integers written ``MxN`` (or ``M,N``)."""

    def __init__(self, metavar: str, example: str):
        self.name = metavar
        self._metavar = metavar
        self._example = example

    def get_metavar(self, param, ctx=None):  # click >= 8.2 passes ctx
        return self._metavar

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        text = str(value).strip().lower().replace("×", "x").replace(",", "x")
        parts = text.split("x")
        try:
            pair = tuple(int(p) for p in parts)
        except ValueError:
            pair = ()
        if len(pair) != 2 or min(pair) < 1:
            self.fail(f"expected two positive integers like {self._example}, got {value!r}",
                      param, ctx)
        return pair


class ScalarType(click.ParamType):
    """A real number, or a complex one like ``1+2j``."""

    name = "number"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float, complex)):
            return value
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            try:
                number = complex(text.replace(" ", "").replace("i", "j"))
            except ValueError:
                self.fail(f"expected a number (e.g. 2.5 or 1+2j), got {value!r}", param, ctx)
            if number.imag == 0:
                number = number.real
        if isinstance(number, float) and math.isnan(number):
            self.fail("must not be NaN", param, ctx)
        return number


SHAPE = PairType("MxN", "1000x2000")
CHUNKS = PairType("RxC", "1024x1024")
SCALAR = ScalarType()


def _flags(names) -> list:
    """The click options of these options of :class:`~oocgemm.options.Options`, made from
    their definitions there (the flag, its help, the field's default)."""
    from .options import on_the_command_line

    def keywords(spec: dict) -> dict[str, Any]:
        given: dict[str, Any] = {k: v for k, v in spec.items() if k not in ("flags", "choices")}
        if "choices" in spec:
            given["type"] = click.Choice(spec["choices"])
        return given

    return [click.option(*spec["flags"], name, default=default, **keywords(spec))
            for name, default, spec in on_the_command_line() if name in names]


def _product_options(func=None, *, transposes: bool = True):
    """The options that describe a product (shared by ``multiply``, ``plan`` and, without
    ``transposes``, ``gram``): its terms, the plan's options of
    :class:`~oocgemm.options.Options`, and ``out_options`` spelled as four flags."""
    if func is None:
        return lambda f: _product_options(f, transposes=transposes)
    from .options import PLANS

    options = [
        click.option("--alpha", type=SCALAR, default=1.0, show_default=True,
                     help="Scale of the product: C = alpha*op(A)@op(B) + beta*C."),
        click.option("--beta", type=SCALAR, default=0.0, show_default=True,
                     help="Scale of C. Non-zero reads C: from --c, else OUT is updated in place."),
        click.option("-c", "--c", "c", metavar="PATH", default=None,
                     help="The C matrix that --beta scales (.zarr or .npy)."),
        *([click.option("--trans-a", is_flag=True, help="Use the transpose of A."),
           click.option("--trans-b", is_flag=True, help="Use the transpose of B.")]
          if transposes else []),
        *_flags(PLANS),
        click.option("--out-chunks", type=CHUNKS, default=None,
                     help="Chunk shape of a new .zarr OUT (default: at most 64 MiB, tiling "
                          "the C blocks)."),
        click.option("--out-shards", type=CHUNKS, default=None,
                     help="Shard shape of a new .zarr OUT (Zarr v3; whole chunks)."),
        click.option("--out-compressor", metavar="NAME[:LEVEL]", default=None,
                     help="Compressor of a new .zarr OUT: none (default), zstd, gzip, blosc."),
        click.option("--zarr-format", type=click.Choice(["2", "3"]), default=None,
                     help="Zarr format of a new .zarr OUT (default 3, or its group's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _run_options(func):
    """The options of a run (shared by ``multiply`` and ``gram``): the run's options of
    :class:`~oocgemm.options.Options` that have a flag, and how the command reports."""
    from .options import RUN_ONLY

    options = [
        *_flags(RUN_ONLY),
        click.option("-q", "--quiet", is_flag=True,
                     help="No progress bar (it is drawn only on a terminal anyway); the "
                          "one-line summary stays."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print the run's summary as JSON on stdout (the progress bar stays "
                          "on stderr)."),
        click.option("--timeline", "timeline_path", metavar="PATH", default=None,
                     help="Save the run's timeline as Chrome trace JSON (open it in Perfetto "
                          "or chrome://tracing) and print its summary."),
        click.option("--plot", "plot_path", metavar="PATH", default=None,
                     help="Draw the timeline as a Gantt chart (.png, .svg, .pdf; needs "
                          "matplotlib) and print its summary."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _api_kwargs(out_chunks=None, out_shards=None, out_compressor=None, zarr_format=None,
                **given):
    """The keywords of :func:`oocgemm.multiply` for the flags ``given`` (by parameter name):
    the layout flags as ``out_options``, a comma-separated ``--device`` as a list."""
    layout = {name: value for name, value in (
        ("chunks", out_chunks), ("shards", out_shards), ("compressors", out_compressor),
        ("zarr_format", int(zarr_format) if zarr_format else None)) if value is not None}
    device = given.get("device", "auto")
    if "," in device:  # several devices: cuda:0,cuda:1 (or cpu,cpu)
        given["device"] = [d.strip() for d in device.split(",") if d.strip()]
    return {**given, "out_options": layout or None}


def _rate(flops_per_second: float) -> str:
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:.3g} TFLOP/s"
    return f"{flops_per_second / 1e9:.3g} GFLOP/s"


def _traffic(nbytes: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {format_size(v)}" for k, v in nbytes.items() if v)


def run() -> None:
    """The ``oocgemm`` command's process: :func:`main`, then its exit at once. What the
    command wrote is committed and its output flushed by then; freeing the GPU's memory
    pools, pinned buffers and threads is left to the OS (Python's own exit waits for it,
    tenths of a second), and a replaced output still being removed to a process of its own
    (:func:`~oocgemm.storage.files.hand_over`)."""
    code = main(prog_name="oocgemm", standalone_mode=False)
    files = sys.modules.get("oocgemm.storage.files")  # (never imported: nothing handed over)
    if files is not None:
        files.hand_over()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code if isinstance(code, int) else 0)


# ------------------------------------------------------------------------------------------
# Commands
# ------------------------------------------------------------------------------------------
@click.group(cls=OOCGemmGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                 "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="oocgemm")
def main():
    """Out-of-core dense matrix multiplication: C = alpha*op(A)@op(B) + beta*C between .zarr
    and .npy files larger than memory, on a GPU or the CPU."""


@main.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("-o", "--out", required=True, metavar="PATH",
              help="The output C (.zarr: Zarr v3 unless --zarr-format or its group says "
                   "otherwise; .npy). Written under a temporary name and renamed when complete.")
@_product_options
@_run_options
def multiply(a, b, out, quiet, as_json, timeline_path, plot_path, **given):
    """Compute OUT = alpha*op(A)@op(B) + beta*C, block by block.

    A and B are .zarr directories (Zarr format 2 or 3) or .npy files.
    """
    from .api import multiply as api_multiply

    # fail before the run, not after it
    _check_reports(timeline_path, plot_path, {"A": a, "B": b, "C": given.get("c"), "OUT": out})
    result = api_multiply(a, b, out, progress=False if quiet else None, **_api_kwargs(**given))
    _State.wrote = out
    timeline = _save_timeline(result, timeline_path, plot_path)
    if as_json:
        summary = result.summary()
        if summary.get("out") is None:
            summary["out"] = os.path.abspath(out)
        if timeline is not None:
            summary["timeline"] = timeline.to_dict()
        echo_json(summary)
        return
    prob = result.plan.problem
    if result.flops:
        speed = f"{_rate(result.flops / result.seconds) if result.seconds > 0 else 'inf'}"
        if result.resumed:  # the rate of this run's work, not of the blocks kept
            speed += f" ({result.work()})"
    elif result.resumed:
        speed = "nothing left to compute"
    else:
        speed = "no product computed (alpha == 0 or K == 0)"
    moved = _traffic(result.bytes)
    click.echo(f"wrote {out}: C[{prob.m}x{prob.n}] {prob.dtype} (K={prob.k}) on "
               f"{result.plan.device} in {format_seconds(result.seconds)}, {speed}"
               + (f"; moved {moved}" if moved else ""))
    if result.devices:
        blocks = sum(x["blocks"] for x in result.devices.values()) or 1
        click.echo("devices: " + ", ".join(
            f"{name} {x['blocks']} blocks ({x['blocks'] / blocks:.0%}) in "
            f"{format_seconds(x['seconds'])}" for name, x in sorted(result.devices.items())))
    for note in result.replanned:
        click.echo(f"note: {note}", err=True)
    if result.resumed:
        click.echo(f"resumed: {result.resumed} of {result.plan.n_blocks} C blocks were done "
                   f"before and kept")
    if result.verified is not None:
        click.echo(str(result.verified))
    if timeline is not None:
        click.echo(str(timeline))
        _echo_saved(timeline_path, plot_path)


@main.command("gram")
@click.argument("x", metavar="X")
@click.option("-o", "--out", required=True, metavar="PATH",
              help="Where the Gram matrix goes (.zarr or .npy).")
@click.option("--outer", is_flag=True, help="X X^T instead of X^T X.")
@_product_options(transposes=False)
@_run_options
@click.pass_context
def gram_command(ctx, x, outer, **rest):
    """Compute the Gram matrix OUT = alpha*X^T X + beta*C (--outer: X X^T).

    X is read once, and only the blocks on and above the diagonal are computed; OUT is
    exactly symmetric. The same as `multiply X X --trans-a` (or --trans-b with --outer).
    """
    ctx.invoke(multiply, a=x, b=x, trans_a=not outer, trans_b=outer, **rest)


def _check_reports(timeline_path, plot_path, data: dict) -> None:
    """The files a run writes after its product (``--timeline``, ``--plot``), checked before
    it: each in a directory that can be written, not a directory itself, not one of the
    run's matrices (``data``: its name -> path), not each other; a plot's format one that
    matplotlib writes, and matplotlib installed."""
    reports = {"the timeline": timeline_path, "the plot": plot_path}
    for what, path in reports.items():
        if path is not None:
            _check_writable(path, what, {**data, **{w: p for w, p in reports.items()
                                                    if w != what}})
    if plot_path is not None:
        from .diagnostics.plot import check_plot_path

        check_plot_path(plot_path)


def _check_writable(path, what: str, others: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"cannot write {what} to {path!r}: {folder!r} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {what} to {path!r}: the directory {folder!r} is not "
                          f"writable")
    if os.path.isdir(path):
        raise OutputError(f"cannot write {what} to {path!r}: it is a directory")
    for name, other in others.items():
        if other is not None and _same_path(path, other):
            raise OutputError(f"cannot write {what} to {path!r}: it is "
                              f"{name if name.startswith('the ') else name + ' of the product'}"
                              f"; name another file")


def _same_path(x, y) -> bool:
    return os.path.realpath(os.fspath(x)) == os.path.realpath(os.fspath(y))


def _save_timeline(result, timeline_path, plot_path):
    """Save and plot the run's timeline where asked; return it, or None when nothing was
    asked."""
    if timeline_path is None and plot_path is None:
        return None
    timeline = result.timeline
    if timeline_path is not None:
        timeline.save(timeline_path)
    if plot_path is not None:
        timeline.plot(plot_path)
    return timeline


def _echo_saved(timeline_path, plot_path) -> None:
    if timeline_path is not None:
        click.echo(f"timeline saved to {timeline_path} (open it in https://ui.perfetto.dev or "
                   f"chrome://tracing)")
    if plot_path is not None:
        click.echo(f"timeline plotted in {plot_path}")


@main.command("timeline")
@click.argument("trace", metavar="TRACE")
@click.option("--plot", "plot_path", metavar="PATH", default=None,
              help="Draw the timeline as a Gantt chart (.png, .svg, .pdf; needs matplotlib).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def timeline_command(trace, plot_path, as_json):
    """Summarise a timeline saved by 'multiply --timeline' (TRACE, a .json Chrome trace): busy
    time per lane, compute idle, exposed copy time, rates, the bound; --plot draws it."""
    from .diagnostics.timeline import Timeline

    if plot_path is not None:
        _check_writable(plot_path, "the plot", {"the timeline": trace})
        from .diagnostics.plot import check_plot_path

        check_plot_path(plot_path)
    timeline = Timeline.load(trace)
    if plot_path is not None:
        timeline.plot(plot_path)
    if as_json:
        echo_json(timeline.to_dict())
        return
    click.echo(str(timeline))
    _echo_saved(None, plot_path)


@main.command()
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.option("-o", "--out", default=None, metavar="PATH",
              help="The output multiply would write (its format changes the prediction).")
@_product_options
@click.option("--overwrite", is_flag=True, help="Accepted as in multiply; no effect here.")
@click.option("-q", "--quiet", is_flag=True, help="Accepted as in multiply; no effect here.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(a, b, out, overwrite, quiet, as_json, **given):
    """Show how multiply would tile OUT = alpha*op(A)@op(B) + beta*C (reads no data).

    Takes the same options as multiply.
    """
    from .api import plan as api_plan

    the_plan = api_plan(a, b, out, **_api_kwargs(**given))
    if as_json:
        echo_json(the_plan.summary())
    else:
        click.echo(str(the_plan))
    in_place = given["beta"] != 0 and given["c"] is None
    if out is not None and os.path.exists(out) and not (overwrite or in_place):
        click.echo(f"note: {out} exists; multiply will refuse it without --overwrite", err=True)


@main.command("verify")
@click.argument("a", metavar="A")
@click.argument("b", metavar="B")
@click.argument("c", metavar="C")
@click.option("--c-in", "c_in", metavar="PATH", default=None,
              help="The C the product was computed from (needed with --beta).")
@click.option("--alpha", type=SCALAR, default=1.0, show_default=True)
@click.option("--beta", type=SCALAR, default=0.0, show_default=True)
@click.option("--trans-a", is_flag=True, help="C was computed with the transpose of A.")
@click.option("--trans-b", is_flag=True, help="C was computed with the transpose of B.")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True,
              help="Random vectors to test with.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed of the random vectors (default: fresh ones).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def verify_command(ctx, a, b, c, c_in, alpha, beta, trans_a, trans_b, rounds, seed, as_json):
    """Check that C = alpha*op(A)@op(B) + beta*C_IN without recomputing it (Freivalds' test:
    a few matrix-vector products, reading each matrix once in bands). Exits 0 when the check
    passes, 1 when it fails."""
    import dataclasses as _dc

    from .freivalds import verify as api_verify

    report = api_verify(a, b, c, alpha=alpha, beta=beta, c_in=c_in, trans_a=trans_a,
                        trans_b=trans_b, rounds=rounds, seed=seed)
    if as_json:
        echo_json({**_dc.asdict(report), "ok": report.ok})
    else:
        click.echo(str(report))
    if not report:
        ctx.exit(1)


@main.command()
@click.argument("path", metavar="PATH")
@click.option("--shape", type=SHAPE, required=True, help="Rows x columns, e.g. 1000x2000.")
@click.option("--dtype", default="float64", show_default=True,
              help="float32, float64, complex64 or complex128.")
@click.option("--chunks", type=CHUNKS, default=None,
              help="Zarr chunk shape (default min(shape, 2048x2048)); .zarr only.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed (non-negative). Default: a fresh one, printed so that it can be reused.")
@click.option("--overwrite", is_flag=True, help="Replace an existing PATH.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no summary.")
def random(path, shape, dtype, chunks, seed, overwrite, quiet):
    """Write a random standard-normal matrix to PATH (.zarr or .npy).

    The matrix is generated and written band by band, so it may be larger than memory. The
    values depend only on the seed, the shape and the dtype: not on --chunks or the format
    (element (i, j) comes from position i*N+j of one seekable PCG64 stream).
    """
    from .random_matrices import write_random

    info = write_random(path, shape, dtype, chunks=chunks, seed=seed, overwrite=overwrite,
                        progress=False if quiet else None)
    _State.wrote = path
    if quiet:
        return
    layout = (f"zarr v3, chunks {info['chunks'][0]}x{info['chunks'][1]}" if info["format"] == "zarr"
              else "npy")
    click.echo(f"wrote {path}: {shape[0]}x{shape[1]} {info['dtype']} ({format_size(info['bytes'])},"
               f" {layout}), seed {info['seed']}, in {format_seconds(info['seconds'])}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
def info(as_json):
    """Versions, host cores and memory, the numpy BLAS, GPUs, and how long CUDA's start-up
    took (the context, cuBLAS, the first pinned buffers: what a process's first product
    pays once)."""
    from .info import describe_startup, system_info

    data = system_info()
    if as_json:
        echo_json(data)
        return
    v, host, blas, gpus = data["versions"], data["host"], data["blas"], data["gpus"]
    lines = [f"oocgemm {v['oocgemm']}", "versions"]
    for name in ("python", "numpy", "zarr", "dask", "click", "tqdm", "cupy"):
        value = v.get(name)
        if name == "cupy" and value is None:
            value = "not installed"
        lines.append(f"  {name:<10} {value or 'not found'}")
    lines.append("host")
    lines.append(f"  {'platform':<10} {host['platform']}")
    if host.get("cpu"):
        lines.append(f"  {'cpu':<10} {host['cpu']}")
    lines.append(f"  {'cores':<10} {host['cores']} usable ({host['logical_cpus']} logical)")
    lines.append(f"  {'memory':<10} {format_size(host['memory_total'])} total, "
                 f"{format_size(host['memory_available'])} available")
    blas_text = blas.get("name", "unknown") + (f" {blas['version']}" if blas.get("version") else "")
    if blas.get("configuration"):
        blas_text += f" ({blas['configuration']})"
    lines.append(f"  {'blas':<10} {blas_text}")
    for lib in blas.get("runtime", []):
        lines.append(f"  {'':<10} loaded: {lib.get('internal_api')} {lib.get('version')}, "
                     f"{lib.get('num_threads')} threads, {lib.get('architecture')}")
    if blas.get("threads_env"):
        settings = ", ".join(f"{k}={val}" for k, val in blas["threads_env"].items())
        lines.append(f"  {'':<10} {settings}")
    lines.append("gpus")
    if gpus["devices"]:
        if gpus.get("cuda_runtime"):
            lines.append(f"  CUDA runtime {gpus['cuda_runtime']}, driver {gpus.get('cuda_driver')}")
        for dev in gpus["devices"]:
            lines.append(f"  {dev['device']:<10} {dev['name']}, {format_size(dev['memory_total'])}"
                         f" ({format_size(dev['memory_free'])} free), compute capability "
                         f"{dev['compute_capability']}")
    else:
        lines.append(f"  none ({gpus.get('note', 'no CUDA GPU')})")
    lines.append(f"  CUDA start-up: {describe_startup(gpus)}")
    if gpus.get("error"):
        lines.append(f"  error while querying GPUs: {gpus['error']}")
    click.echo("\n".join(lines))


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="oocgemm")

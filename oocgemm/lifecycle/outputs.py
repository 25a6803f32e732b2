"""Output targets, checked before any work: what ``out`` may be, and the layout of a new one.

Nothing here writes: :func:`check_out` refuses outputs of the wrong kind, shape or dtype (and
paths oocgemm would not create or replace), :func:`check_out_options` checks the layout a user
asked for, and :func:`output_layout` fills in the rest of it once the plan's blocks are known.
That ``out`` shares no storage with an input is :func:`~oocgemm.storage.identity.check_output`.
"""

from __future__ import annotations

import os

import numpy as np

from .. import machine
from ..arguments import check_dtype
from ..errors import DTypeError, OptionError, OutputError, ShapeError
from ..planning import Operand, Plan
from ..storage import is_path, kind_of_path, urls
from ..storage.regions import ZarrRegion, write_unit
from ..units import format_size


def check_out(out, shape: tuple[int, int], dtype: np.dtype) -> Operand:
    """The output described for the planner; refused when it cannot take C."""
    if out is None:  # a new numpy array of the compute dtype
        need, free = shape[0] * shape[1] * dtype.itemsize, machine.available_memory()
        if need > free:
            raise OutputError(f"out=None returns C in memory, but C needs {format_size(need)} and "
                              f"{format_size(free)} is available; pass a .zarr or .npy path as "
                              f"out")
        return Operand(shape, None, False, "result array", zero_copy=True)
    if is_path(out):
        path = os.fspath(out)
        if not urls.is_url(path):
            check_out_path(path)
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
    chunks = write_unit(out) if is_zarr else None
    if isinstance(out, ZarrRegion):
        is_zarr, chunks = True, out.write_unit
    in_place = (isinstance(out, np.ndarray) and not isinstance(out, np.memmap)
                and out.dtype == dtype and out.strides[1] == out.itemsize)
    return Operand(shape, chunks, is_zarr, "out array", zero_copy=in_place)


def check_out_path(path: str) -> None:
    """A local output path, checked before any work: something oocgemm can create or would
    have written itself (a Zarr array, a .npy file), never a directory that holds other
    things, in a directory it can write to. (One that holds an input is refused before:
    :func:`~oocgemm.storage.identity.check_output`.)"""
    if not path.strip():
        raise OutputError("out is an empty path; name a .zarr or .npy output")
    kind = kind_of_path(path)
    if kind == "zip" or path.lower().endswith(".npz"):
        raise OutputError(f"out {path!r}: oocgemm does not write zip archives (.zip, .npz); "
                          f"write a .zarr or .npy output, and zip it after the run if needed")
    if kind == "npy" and path.endswith(("/", os.sep)):
        raise OutputError(f"out {path!r}: a .npy output is a file, not a directory")
    if os.path.lexists(path):
        _check_replaceable(path, kind)
    elif not path.lower().rstrip("/\\").endswith((".zarr", ".npy")):
        from ..storage.zarr_store import parent_group  # zarr is imported when a run needs it

        if parent_group(path) is None:  # inside a Zarr group any name is one of its arrays
            raise OutputError(f"out {path!r}: name a new output .zarr (a Zarr array) or .npy "
                              f"(a numpy file), or an array inside a Zarr group (g.zarr/C)")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"out {path!r}: the directory {parent!r} is not writable")


def _check_replaceable(path: str, kind: str) -> None:
    """An existing output path is one oocgemm may replace: a Zarr array or a .npy file."""
    from ..storage.zarr_store import is_zarr_array

    if kind == "zarr" and not is_zarr_array(path):
        raise OutputError(f"out {path!r} exists and is not a Zarr array; oocgemm replaces "
                          f"only a Zarr array or .npy file, never other files or folders")
    if kind == "npy" and not os.path.isfile(path):
        raise OutputError(f"out {path!r} exists and is not a file")
    if kind == "npy" and not path.lower().endswith(".npy") and not _is_npy_file(path):
        raise OutputError(f"out {path!r} exists and is not a .npy file; oocgemm replaces "
                          f"only a Zarr array or .npy file, never other files")


def _is_npy_file(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return False


def check_out_options(out, options, shape, dtype, in_place: bool) -> dict:
    """``out_options`` for a new Zarr output path, checked before any work (with the Zarr
    format of the group it goes into filled in); refused where the output is not created by
    this run (an array, a .npy file, an update in place). Zarr is imported for a Zarr
    output only (0.24 s of a first product into memory on the 2-core VM)."""
    zarr_path = is_path(out) and kind_of_path(os.fspath(out)) == "zarr"
    if options is None and not zarr_path:
        return {}
    from ..storage.zarr_store import check_zarr_options

    if options is None:  # a Zarr path is written anew (in place too): its group's format
        return check_zarr_options({}, shape, dtype, os.fspath(out))
    if not zarr_path:
        raise OptionError("out_options sets the layout of a new Zarr output; out is "
                          + ("an array" if not is_path(out) else f"{os.fspath(out)!r}, not .zarr"))
    if in_place:
        raise OptionError("out_options: out is updated in place (beta != 0 without c), so its "
                          "layout is the existing array's")
    return check_zarr_options(options, shape, dtype, os.fspath(out))


def output_layout(plan: Plan, out_options: dict, original=None) -> dict:
    """The layout of a new Zarr output: the user's ``out_options``, with default chunks that
    tile the C blocks and the row stripes they are written in, at most 64 MiB each
    (:func:`~oocgemm.storage.zarr_store.output_chunks`), and the Zarr format of the group
    the output goes into; for an update in place of the Zarr array ``original``, that
    array's own layout."""
    from ..storage.zarr_store import ZarrSource, layout_of, output_chunks

    if isinstance(original, ZarrSource):
        # An update in place keeps the user's array as it was: chunks, shards, codecs, fill
        # value, dimension names, attributes (it is written anew and swapped in on commit).
        return layout_of(original.array())
    options = dict(out_options)
    if options.get("chunks") is None:
        w, h, _ = plan.tile
        block = options.get("shards") or (w, h)
        rows = plan.stripe_rows(w, h) if plan.staged and not options.get("shards") else None
        options["chunks"] = output_chunks(block, plan.problem.itemsize, rows)
    return options

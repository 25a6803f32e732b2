"""Storage adapters: turn what the user passed (a path, an array) into sources and sinks."""

from __future__ import annotations

import os

import numpy as np

from ..errors import InputError, OutputError
from . import urls
from ._files import PARTIAL
from .base import MatrixSink, MatrixSource
from .memory import CupySink, CupySource, DaskSource, NumpySink, NumpySource

__all__ = ["MatrixSink", "MatrixSource", "exists", "open_source", "open_sink", "is_path",
           "kind_of_path"]


def is_path(obj) -> bool:
    return isinstance(obj, (str, os.PathLike))


def _module(obj) -> str:
    return type(obj).__module__.split(".")[0]


def kind_of_path(path: str) -> str:
    """'npy' or 'zarr', from the name (and, for existing paths, what is there)."""
    lower = path.lower().rstrip("/\\")
    if lower.endswith(".npy"):
        return "npy"
    if lower.endswith(".zarr") or os.path.isdir(path):
        return "zarr"
    if os.path.isfile(path):
        return "npy"
    return "zarr"


def exists(target, storage_options: dict | None = None) -> bool:
    """Whether a path or URL names something that exists."""
    target = urls.local(os.fspath(target))
    if urls.is_url(target):
        return urls.exists(target, storage_options)
    return os.path.exists(target)


def open_source(obj, role: str, storage_options: dict | None = None, *,
                incomplete_ok: bool = False) -> MatrixSource:
    """A readable matrix from a path (.zarr directory, .npy file), a URL of a Zarr array
    (``storage_options`` for its file system), a zarr/numpy/cupy/dask array.
    ``incomplete_ok`` accepts a Zarr array flagged incomplete (the product being checked
    before its commit); anything else an interrupted run left is refused.

    Raises
    ------
    InputError
        Missing path, unreadable or corrupt file, unsupported object.
    """
    if isinstance(obj, MatrixSource):  # opened already (a region, in a dask task)
        return obj
    if is_path(obj):
        path = urls.local(os.fspath(obj))
        if PARTIAL in os.path.basename(path.rstrip("/\\")):
            raise InputError(f"{role}: {path!r} is the temporary output of an oocgemm run that "
                             f"did not finish; it is not a result (delete it)")
        if urls.is_url(path):
            from .zarr_store import ZarrSource

            if kind_of_path(path) == "npy":
                raise InputError(f"{role}: {path!r}: .npy inputs must be local paths; store "
                                 f"it as Zarr to read it by URL")
            return ZarrSource(urls.open_array(path, role, storage_options), name=path,
                              path=urls.normal(path))
        if not os.path.exists(path):
            raise InputError(f"{role}: no such file or directory: {path!r}")
        if kind_of_path(path) == "npy":
            from .npy import open_npy

            return open_npy(path, role)
        from .zarr_store import ZarrSource, open_zarr_array

        return ZarrSource(open_zarr_array(path, role), name=path, path=os.path.abspath(path))
    module = _module(obj)
    if isinstance(obj, np.ndarray):
        name = "numpy memmap" if isinstance(obj, np.memmap) else "numpy array"
        mapped = isinstance(obj, np.memmap) and obj.filename
        path = os.path.abspath(obj.filename) if mapped else None
        return NumpySource(obj, name=f"{role} ({name})", on_disk=path is not None, path=path)
    if module == "zarr":
        from .zarr_store import ZarrSource

        if not hasattr(obj, "shape"):
            raise InputError(f"{role}: a {type(obj).__name__} is not an array (a Zarr group? "
                             f"pass one of its arrays)")

        root = getattr(getattr(obj, "store", None), "root", None)  # LocalStore: on disk
        path = os.path.abspath(os.path.join(os.fspath(root), obj.path)) if root else None
        return ZarrSource(obj, name=f"{role} (zarr array)", path=path,
                          incomplete_ok=incomplete_ok)
    if module == "cupy":
        return CupySource(obj, name=f"{role} (cupy array)")
    if module == "dask":
        stored = zarr_behind(obj)
        if stored is not None:  # da.from_zarr: read the store at its grain, not through dask
            return open_source(stored, f"{role} (dask array from Zarr)", storage_options,
                               incomplete_ok=incomplete_ok)
        return DaskSource(obj, name=f"{role} (dask array)")
    if module == "xarray":
        if not hasattr(obj, "dims") or not hasattr(obj, "variable"):
            raise InputError(f"{role}: an xarray {type(obj).__name__} is not an array (pass "
                             f"one of its DataArrays)")
        return open_source(obj.data, f"{role} (xarray DataArray)", storage_options,
                           incomplete_ok=incomplete_ok)
    raise InputError(f"{role}: expected a path (.zarr or .npy) or an array (numpy, zarr, cupy, "
                     f"dask, xarray), got {type(obj).__name__}")


def zarr_behind(x):
    """The zarr.Array a dask array is, when it is ``da.from_zarr(...)`` untouched (its graph:
    the array, and one getter per chunk); None otherwise."""
    layers = getattr(getattr(x, "dask", None), "layers", None)
    if not layers or len(layers) != 2 or f"original-{x.name}" not in layers:
        return None
    values = list(layers[f"original-{x.name}"].values())
    stored = values[0] if len(values) == 1 else None
    if (_module(stored) != "zarr" or tuple(getattr(stored, "shape", ())) != tuple(x.shape)
            or np.dtype(stored.dtype) != np.dtype(x.dtype)):
        return None
    return stored


def open_sink(out, *, shape, dtype, options=None, overwrite=False, in_place=False,
              attributes=None, storage_options=None, temporary=None) -> MatrixSink:
    """Where C goes: a new file under a temporary name, or a given array written in place.

    ``options`` is the layout of a new Zarr output (``zarr.create_array`` keywords, checked).
    ``in_place``: the output path is also C (beta != 0, c=None) and is replaced on commit.
    ``temporary``: the temporary output of an interrupted run of the same product, continued.
    """
    if out is None:
        return NumpySink(np.empty(shape, dtype=dtype), name="result array")
    if is_path(out) and urls.is_url(urls.local(os.fspath(out))):
        from .zarr_store import ZarrSink

        url = os.fspath(out)
        urls.check_sink(url, storage_options)
        if urls.exists(url, storage_options) and not (overwrite or in_place):
            raise OutputError(f"out: {url!r} exists; pass overwrite=True (--overwrite) to "
                              f"replace it")
        return ZarrSink(shape=shape, dtype=dtype, name=url, path=url, options=options,
                        attributes=attributes, storage_options=storage_options)
    if is_path(out):
        path = urls.local(os.fspath(out))
        if os.path.exists(path) and not (overwrite or in_place):
            raise OutputError(f"out: {path!r} exists; pass overwrite=True (--overwrite) to "
                              f"replace it")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise OutputError(f"out: the directory {parent!r} does not exist")
        if kind_of_path(path) == "npy":
            from .npy import NpySink

            return NpySink(path, shape, dtype, replace=overwrite or in_place,
                           temporary=temporary)
        from .zarr_store import ZarrSink

        return ZarrSink(shape=shape, dtype=dtype, name=path, path=path, options=options,
                        attributes=attributes, replace=overwrite or in_place,
                        temporary=temporary)
    module = _module(out)
    if isinstance(out, np.ndarray):
        return NumpySink(out, name="out (numpy array)")
    if module == "zarr":
        from .zarr_store import ZarrSink

        if getattr(out, "read_only", False):
            raise OutputError("out: the zarr array is open read-only")
        return ZarrSink(shape=out.shape, dtype=out.dtype, name="out (zarr array)", array=out)
    if module == "cupy":
        return CupySink(out)
    raise OutputError(f"out: expected None, a path (.zarr or .npy) or a writable array, got "
                      f"{type(out).__name__}")

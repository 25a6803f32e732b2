"""Storage adapters: turn what the user passed (a path, an array) into sources and sinks."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import numpy as np

from ..errors import InputError, OutputError
from . import urls
from .base import MatrixSink, MatrixSource, library_of
from .dask_arrays import DaskSource
from .files import PARTIAL
from .memory import CupySink, CupySource, NumpySink, NumpySource

__all__ = ["SINKS", "SOURCES", "SUFFIXES", "MatrixSink", "MatrixSource", "exists", "is_path",
           "kind_of_path", "open_sink", "open_source", "register_sink", "register_source"]


def is_path(obj) -> bool:
    return isinstance(obj, (str, os.PathLike))


#: Path suffixes and the kind of adapter that reads and writes them ('zip': a Zarr array in a
#: zip file, read only).
SUFFIXES: dict[str, str] = {".npy": "npy", ".zarr": "zarr", ".zip": "zip"}


def kind_of_path(path: str) -> str:
    """'npy', 'zarr', 'zip' or a registered kind, from the name's suffix (and, for other existing
    paths, what is there: a directory is Zarr, a file .npy)."""
    lower = path.lower().rstrip("/\\")
    for suffix, kind in SUFFIXES.items():
        if lower.endswith(suffix):
            return kind
    if os.path.isdir(path):
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
    """A readable matrix from a path (.zarr directory, .npy file, a Zarr array in a .zip
    file), a URL of a Zarr array
    (``storage_options`` for its file system), a zarr/numpy/cupy/dask array or an xarray
    DataArray: the adapter registered for its kind (:data:`SOURCES`). ``incomplete_ok``
    accepts a Zarr array flagged incomplete (the product being checked before its commit);
    anything else an interrupted run left is refused.

    Raises
    ------
    InputError
        Missing path, unreadable or corrupt file, unsupported object.
    """
    if isinstance(obj, MatrixSource):  # opened already (a region, in a dask task)
        return obj
    kind, obj = _kind(obj)
    if is_path(obj) and PARTIAL in os.path.basename(obj.rstrip("/\\")):
        raise InputError(f"{role}: {obj!r} is the temporary output of an oocgemm run that did "
                         f"not finish; it is not a result (delete it)")
    if is_path(obj) and kind != "url" and not os.path.exists(obj):
        raise InputError(f"{role}: no such file or directory: {obj!r}")
    return _adapter(SOURCES, kind, InputError(
        f"{role}: expected a path (.zarr, .npy or a Zarr .zip) or an array (numpy, zarr, cupy, "
        f"dask, xarray), got {type(obj).__name__}"))(obj, role, storage_options, incomplete_ok)


def _url_source(url, role, storage_options, incomplete_ok):
    from .zarr_store import ZarrSource

    if kind_of_path(url) == "npy":
        raise InputError(f"{role}: {url!r}: .npy inputs must be local paths; store it as Zarr "
                         f"to read it by URL")
    return ZarrSource(urls.open_array(url, role, storage_options), name=url,
                      path=urls.normal(url))


def _npy_source(path, role, storage_options, incomplete_ok):
    from .npy import open_npy

    return open_npy(path, role)


def _zarr_source(path, role, storage_options, incomplete_ok):
    from .zarr_store import ZarrSource, open_zarr_array

    return ZarrSource(open_zarr_array(path, role), name=path, path=os.path.abspath(path))


def _zip_source(path, role, storage_options, incomplete_ok):
    from .zarr_store import ZarrSource, open_zip_array

    return ZarrSource(open_zip_array(path, role), name=path, path=os.path.abspath(path),
                      owns_store=True)


def _numpy_source(obj, role, storage_options, incomplete_ok):
    name = "numpy memmap" if isinstance(obj, np.memmap) else "numpy array"
    mapped = isinstance(obj, np.memmap) and obj.filename
    path = os.path.abspath(obj.filename) if mapped else None
    return NumpySource(obj, name=_described(role, name), on_disk=path is not None, path=path)


def _described(role: str, kind: str) -> str:
    """A source's name: its role and what it is ('a (numpy array)'), or the role alone where
    it says that already (an array inside a dask or xarray one: 'a (xarray DataArray)')."""
    return role if role.endswith(")") else f"{role} ({kind})"


def _zarr_array_source(obj, role, storage_options, incomplete_ok):
    from .zarr_store import ZarrSource, open_zarr_array

    if not hasattr(obj, "shape"):
        raise InputError(f"{role}: a {type(obj).__name__} is not an array (a Zarr group? "
                         f"pass one of its arrays)")
    root = getattr(getattr(obj, "store", None), "root", None)  # LocalStore: on disk
    path = os.path.abspath(os.path.join(os.fspath(root), obj.path)) if root else None
    folder = None if path else _local_fsspec_folder(obj)
    if folder is not None:  # opened as a LocalStore: read at its grain, file by file
        obj = open_zarr_array(folder, role)
        path = folder
    return ZarrSource(obj, name=_described(role, "zarr array"), path=path,
                      incomplete_ok=incomplete_ok)


def _local_fsspec_folder(array) -> str | None:
    """The folder of a zarr array in a local file system reached through fsspec (what
    ``da.from_zarr(path)`` opens), or None. Through fsspec its chunks go through zarr's
    async file wrapper, neither decoded straight into the run's buffers nor handed to a GPU
    as frames; opened again as a local store, it is read as ``multiply("a.zarr", ...)``
    reads it."""
    from .identity import LOCAL_PROTOCOLS, protocol_name

    store = getattr(getattr(array, "store_path", None), "store", None)
    fs, base = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is None or not isinstance(base, str) or \
            protocol_name(getattr(fs, "protocol", "?")) not in LOCAL_PROTOCOLS:
        return None
    folder = os.path.abspath(os.path.join(base, array.store_path.path))
    return folder if os.path.isdir(folder) else None


def _cupy_source(obj, role, storage_options, incomplete_ok):
    return CupySource(obj, name=_described(role, "cupy array"))


def _dask_source(obj, role, storage_options, incomplete_ok):
    stored = zarr_behind(obj)
    if stored is not None:  # da.from_zarr: read the store at its grain, not through dask
        return open_source(stored, f"{role} (dask array from Zarr)", storage_options,
                           incomplete_ok=incomplete_ok)
    return DaskSource(obj, name=_described(role, "dask array"))


def _xarray_source(obj, role, storage_options, incomplete_ok):
    if not hasattr(obj, "dims") or not hasattr(obj, "variable"):
        raise InputError(f"{role}: an xarray {type(obj).__name__} is not an array (pass one "
                         f"of its DataArrays)")
    return open_source(obj.data, f"{role} (xarray DataArray)", storage_options,
                       incomplete_ok=incomplete_ok)


#: The source adapters by kind: a local path's ('npy', 'zarr': :func:`kind_of_path`), a URL's
#: ('url'), an array's ('numpy', or its top-level module and ' array': 'zarr array', 'cupy
#: array', 'dask array', 'xarray array'). Each is ``opener(obj, role, storage_options,
#: incomplete_ok) -> MatrixSource``, or a 'module:function' name imported when first used.
#: :func:`register_source` adds one.
SOURCES: dict[str, Callable | str] = {
    "url": _url_source, "npy": _npy_source, "zarr": _zarr_source, "zip": _zip_source,
    "numpy": _numpy_source, "zarr array": _zarr_array_source, "cupy array": _cupy_source,
    "dask array": _dask_source, "xarray array": _xarray_source,
}


def register_source(kind: str, opener: Callable | str, *, suffix: str | None = None) -> None:
    """Read paths with ``suffix`` (e.g. '.h5'), or arrays of the top-level module ``m``
    (``kind='m array'``), with ``opener``: a callable or a 'module:function' name."""
    _register(SOURCES, kind, opener, suffix)


def _register(table: dict, kind: str, opener: Callable | str, suffix: str | None) -> None:
    table[kind] = opener
    if suffix is not None:
        SUFFIXES[suffix.lower()] = kind


def _kind(target) -> tuple[str, object]:
    """The adapter kind of ``target`` ('url', a local path's kind, 'numpy', or an array's
    top-level module and ' array'), and ``target`` as its adapter takes it (a path as a str,
    ``file://`` URLs made local paths)."""
    if not is_path(target):
        kind = "numpy" if isinstance(target, np.ndarray) else library_of(target) + " array"
        return kind, target
    path = urls.local(os.fspath(target))
    return ("url", os.fspath(target)) if urls.is_url(path) else (kind_of_path(path), path)


def _adapter(table: dict, kind: str, unknown: Exception | None = None) -> Callable:
    """The adapter registered as ``kind`` (imported on first use where it is a name); raises
    ``unknown`` where there is none."""
    if kind not in table and unknown is not None:
        raise unknown
    entry = table[kind]
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = table[kind] = getattr(importlib.import_module(module), name)
    return entry


def zarr_behind(x):
    """The zarr.Array a dask array is, when it is ``da.from_zarr(...)`` untouched (its graph:
    the array, and one getter per chunk); None otherwise."""
    layers = getattr(getattr(x, "dask", None), "layers", None)
    if not layers or len(layers) != 2 or f"original-{x.name}" not in layers:
        return None
    values = list(layers[f"original-{x.name}"].values())
    stored = values[0] if len(values) == 1 else None
    if (library_of(stored) != "zarr" or tuple(getattr(stored, "shape", ())) != tuple(x.shape)
            or np.dtype(stored.dtype) != np.dtype(x.dtype)):
        return None
    return stored


def open_sink(out, *, shape, dtype, options=None, overwrite=False, in_place=False,
              attributes=None, storage_options=None, temporary=None) -> MatrixSink:
    """Where C goes: a new file under a temporary name, or a given array written in place; the
    adapter registered for its kind (:data:`SINKS`).

    ``options`` is the layout of a new Zarr output (``zarr.create_array`` keywords, checked).
    ``in_place``: the output path is also C (beta != 0, c=None) and is replaced on commit.
    ``temporary``: the temporary output of an interrupted run of the same product, continued.
    """
    if out is None:
        return NumpySink(np.empty(shape, dtype=dtype), name="result array")
    kind, out = _kind(out)
    if is_path(out) and kind != "url":
        if os.path.exists(out) and not (overwrite or in_place):
            raise OutputError(f"out: {out!r} exists; pass overwrite=True (--overwrite) to "
                              f"replace it")
        parent = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(parent):
            raise OutputError(f"out: the directory {parent!r} does not exist")
    make = _adapter(SINKS, kind, OutputError(
        f"out: expected None, a path (.zarr or .npy) or a writable array, got "
        f"{type(out).__name__}"))
    try:
        return make(out, shape=shape, dtype=dtype, options=options, overwrite=overwrite,
                    in_place=in_place, attributes=attributes, storage_options=storage_options,
                    temporary=temporary)
    except OSError as exc:  # a folder that says it is writable and is not (/proc, /sys...)
        raise OutputError(f"out {os.fspath(out)!r}: cannot create it there "
                          f"({exc.strerror or exc})") from exc


def _url_sink(url, *, shape, dtype, options, overwrite, in_place, attributes, storage_options,
              temporary):
    from .zarr_store import ZarrSink

    urls.check_sink(url, storage_options)
    if urls.exists(url, storage_options, OutputError) and not (overwrite or in_place):
        raise OutputError(f"out: {url!r} exists; pass overwrite=True (--overwrite) to replace "
                          f"it")
    return ZarrSink(shape=shape, dtype=dtype, name=url, path=url, options=options,
                    attributes=attributes, storage_options=storage_options)


def _npy_sink(path, *, shape, dtype, overwrite, in_place, temporary, **_):
    from .npy import NpySink

    return NpySink(path, shape, dtype, replace=overwrite or in_place, temporary=temporary)


def _zarr_sink(path, *, shape, dtype, options, overwrite, in_place, attributes, temporary,
               **_):
    from .zarr_store import ZarrSink

    return ZarrSink(shape=shape, dtype=dtype, name=path, path=path, options=options,
                    attributes=attributes, replace=overwrite or in_place, temporary=temporary)


def _numpy_sink(out, **_):
    return NumpySink(out, name="out (numpy array)")


def _zarr_array_sink(out, **_):
    from .zarr_store import ZarrSink

    if getattr(out, "read_only", False):
        raise OutputError("out: the zarr array is open read-only")
    return ZarrSink(shape=out.shape, dtype=out.dtype, name="out (zarr array)", array=out)


def _cupy_sink(out, **_):
    return CupySink(out)


#: The sink adapters by kind, as :data:`SOURCES`: ``opener(out, *, shape, dtype, options,
#: overwrite, in_place, attributes, storage_options, temporary) -> MatrixSink`` (a path
#: checked already: not there, or to be replaced; its directory exists).
SINKS: dict[str, Callable | str] = {
    "url": _url_sink, "npy": _npy_sink, "zarr": _zarr_sink, "numpy": _numpy_sink,
    "zarr array": _zarr_array_sink, "cupy array": _cupy_sink,
    "oocgemm array": "oocgemm.storage.regions:open_region",
}


def register_sink(kind: str, opener: Callable | str, *, suffix: str | None = None) -> None:
    """Write paths with ``suffix``, or arrays of the top-level module ``m`` (``kind='m
    array'``), with ``opener``: a callable or a 'module:function' name."""
    _register(SINKS, kind, opener, suffix)

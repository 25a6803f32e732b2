"""What storage is behind an operand, by identity, never by name, and without reading data.

Two questions of :func:`oocgemm.multiply` need it:

- *one operand, one read*: ``multiply(x, x, trans_a=True)`` may get the same matrix on both
  sides in many spellings (a path and a symlink to it, a ``file://`` URL, two ``zarr.Array``
  objects opened on one array, two memmaps of one file, a ``da.from_zarr`` of it), and then
  reads it once for both roles (:func:`same_matrix`);
- *aliasing*: an output that shares bytes with an input would overwrite what is still to be
  read (:func:`overlaps`).

What is compared is what the operating system or the process says a thing is: a local file or
folder by ``(st_dev, st_ino)`` after links are resolved (so a symlink, a hard link, a relative
path and a ``file://`` URL of one file agree), memory by address, a Zarr store that is not on
the local disk by its in-process object or by its protocol and normalised path, a dask array by
its graph's name. Names are compared only where nothing else identifies the thing (an object
store reached by URL, a local path that does not exist yet).

Nothing here reads array data: ``os.stat`` of a path and its folders, and, for a ``.npy`` file
named by path, its header (a few hundred bytes: where the matrix starts and how it lies).
"""

from __future__ import annotations

import mmap
import os
import posixpath
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..errors import OutputError, operand_name
from . import urls
from .base import MatrixSink, MatrixSource, library_of
from .regions import ZarrRegion

__all__ = ["KINDS", "Identity", "Layout", "check_output", "identity", "one_matrix", "overlaps",
           "remembered", "same_matrix"]

#: The kinds of :class:`Identity`, as :attr:`Identity.kind` spells them.
KINDS = ("file", "memory", "store", "dask", "unknown")

#: The key of in-process memory: one address space for host memory and, under CUDA's unified
#: addressing (every 64-bit Linux build), device memory as well.
ADDRESS_SPACE = ("address space", os.getpid())

#: fsspec protocols that are the local file system: their paths are identified by inode.
LOCAL_PROTOCOLS = ("file", "local")


@dataclass(frozen=True)
class Layout:
    """How a matrix lies in the bytes of what holds it: enough to tell the same matrix from
    another one over the same bytes (a transpose, a strided view, another dtype)."""

    shape: tuple[int, ...]
    """Elements along each axis (-1 where dask does not know a size)."""
    dtype: str
    """The element type with its byte order, as ``numpy.dtype.str`` spells it (``'<f8'``)."""
    strides: tuple[int, ...] | None = None
    """Bytes from one element to the next along each axis, 0 along an axis of one element
    (where no step is ever taken); all 0 for an empty matrix. None where the storage has no
    strides (a dask array)."""
    offset: int | None = None
    """Where element ``[0, 0]`` lies, bytes: from the start of the file (a memmap, a ``.npy``
    file named by path) or its address (memory). None where the storage has no strides."""


@dataclass(frozen=True)
class Identity:
    """What storage an operand is, as :func:`identity` finds it. Compare two with
    :func:`same_matrix` and :func:`overlaps`, not ``==``: a ``.npy`` file named by path is the
    whole file where a memmap of it is its data bytes, and a hard link in another folder has
    other folders above it, yet each pair is one matrix."""

    kind: str
    """'file': a local file or folder (a ``.npy`` file, a memmap's file, a Zarr array's
    folder); 'memory': a buffer of this process (numpy, CuPy); 'store': a Zarr array in a store
    that is not a local folder (an in-memory store, a URL of an object store); 'dask': a dask
    array that is not one stored array untouched; 'unknown': anything else."""
    key: Hashable
    """Which thing of its kind. 'file': ``(st_dev, st_ino)`` of the resolved path, or the
    resolved path (a str) where nothing is there yet; 'memory': :data:`ADDRESS_SPACE`;
    'store': ``(space, path)``, ``space`` the store (``('memory store', id)`` of a zarr
    ``MemoryStore``'s dictionary, an fsspec protocol such as ``'memory'`` or ``'s3'``,
    ``('zip', st_dev, st_ino)``, ``('store object', id)``) and ``path`` the array's normalised
    path in it; 'dask': the graph's name; 'unknown': ``('object', id(obj))``. In-process ids and
    addresses hold while the operands are alive (for the duration of one call)."""
    span: tuple[int, int] | None = None
    """The byte range ``[start, stop)`` within the thing that the matrix occupies: a memmap's
    range of its file, an in-memory array's address range (from its lowest to its highest
    byte, gaps of a strided view included). None: the whole thing (a file or folder named by
    path, a Zarr array, a dask array)."""
    layout: Layout | None = None
    """How the matrix lies in :attr:`span`. None: as the thing describes itself (a Zarr
    array's metadata; a ``.npy`` file whose header could not be read)."""
    part: tuple | None = None
    """``((r0, r1), (c0, c1))``: the part of the matrix that an opened source reads (a dask
    task's region, one executor's range of K); the same bytes as the whole, but another
    matrix. None: the whole."""
    within: frozenset[tuple[str, Hashable]] = frozenset()
    """``(kind, key)`` of what holds the thing and so shares its bytes: the folders above a
    file or a Zarr array's folder, the groups and prefixes above an array in a store, the zip
    file of a zip store."""
    reads: tuple[Identity, ...] = ()
    """For a dask array: the storage its graph holds (Zarr arrays, numpy arrays and memmaps
    among the values of its layers), one identity per thing and contiguous range; () for
    everything else."""


def identity(obj, source: MatrixSource | MatrixSink | None = None) -> Identity:
    """The storage behind ``obj``, without reading its data.

    Parameters
    ----------
    obj
        What the user passed as an operand or an output: a path (str or ``os.PathLike``; a
        ``.npy`` file, a Zarr array's folder), a URL (``file://`` URLs are local paths), a
        ``zarr.Array``, a numpy array or memmap (or a view of one), a CuPy array (or anything
        with ``__cuda_array_interface__``; CuPy itself is never imported here), a dask array,
        an xarray DataArray, or an opened :class:`~oocgemm.storage.base.MatrixSource` or
        sink.
    source
        The source or sink opened for ``obj``, if any. Where ``obj`` alone says nothing (an
        object of a registered adapter) the array it reads or its path says what it is; for a
        ``.npy`` path it gives the layout without another look at the file's header.

    Returns
    -------
    Identity
        Of kind 'unknown' (its key the object's id) where nothing is known about ``obj``.

    Raises
    ------
    InputError
        A ``file://`` URL that names another host.

    Notes
    -----
    Cost: O(1) per operand (an ``os.stat`` of a path and of each folder above it, and the
    header of a ``.npy`` file named by path), but for a dask array, whose graph's layers are
    looked at value by value (``O(layers + values of materialised layers)``; nothing is
    computed, and layers that are not materialised yet are not materialised: their literal
    arguments are looked at instead).
    """
    if isinstance(obj, MatrixSource | MatrixSink):
        return _opened(obj)
    if isinstance(obj, str | os.PathLike):
        path = urls.local(os.fspath(obj))
        found = _path(path)
        if found.kind != "file" or not os.path.isfile(path):
            return found
        layout = None
        if source is not None:  # a .npy file opened as a memmap: its layout is the header's
            opened = _opened(source)
            if (opened.kind, opened.key) == (found.kind, found.key):
                layout = opened.layout
        return replace(found, layout=layout or _npy_layout(path))
    found = _object(obj)
    if found.kind == "unknown" and source is not None:
        opened = _opened(source)
        if opened.kind != "unknown":
            return opened
    return found


def same_matrix(x: Identity, y: Identity) -> bool:
    """Whether ``x`` and ``y`` are one matrix: the same bytes, laid out alike (shape, strides,
    dtype), so that one read serves both roles.

    False where it cannot be told (an 'unknown' identity is the same matrix only as the same
    object); a false answer costs a second read, never a wrong product. Two empty matrices
    of one shape and dtype at one place are the same matrix, yet share no byte.
    """
    if (x.kind, x.key, x.layout, x.part) != (y.kind, y.key, y.layout, y.part):
        return False
    # With a layout the span follows from it, but for a .npy path, which is the whole file:
    # its layout (from its header) is what a memmap of its data has.
    return x.layout is not None or x.span == y.span


def one_matrix(a, source_a: MatrixSource, b, source_b: MatrixSource, *,
               identify=identity) -> bool:
    """Whether operands ``a`` and ``b`` (as the user passed them, with the sources opened for
    them) are one stored matrix, so that one read serves both roles (:func:`same_matrix`).
    ``identify``: :func:`identity`, or :func:`remembered`'s."""
    return same_matrix(identify(a, source_a), identify(b, source_b))


def seen_through(a, trans_a: bool, b, trans_b: bool) -> tuple[Any, bool, Any, bool]:
    """``multiply(x.T, x)`` as ``multiply(x, x, trans_a=True)`` where one side is the other
    transposed: a numpy array (or memmap, or an xarray DataArray of one) viewing the other's
    bytes transposed, or a dask array whose graph is the other's transpose (by name). The
    same matrix read transposed, so that the product is found to be ``X^T X`` (X read once,
    C exactly symmetric): the one entry point of ``multiply`` and ``oocgemm.dask``."""
    if library_of(a) == "dask" and library_of(b) == "dask" and a.ndim == b.ndim == 2:
        if a.name == b.T.name:
            return b, not trans_a, b, trans_b
        if b.name == a.T.name:
            return a, trans_a, a, not trans_b
        return a, trans_a, b, trans_b
    x, y = (v.data if library_of(v) == "xarray" and hasattr(v, "variable") else v
            for v in (a, b))
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)) or x.ndim != 2 \
            or y.ndim != 2 or x is y:
        return a, trans_a, b, trans_b
    if same_matrix(identity(x), identity(y.T)):
        return b, not trans_a, b, trans_b
    return a, trans_a, b, trans_b


def remembered() -> Callable[..., Identity]:
    """:func:`identity`, each answer kept by the objects asked about: the checks of one call
    (one matrix in both roles, the output against each input) ask about each operand twice.
    For the span of one call, while the objects it holds live (the key is their ``id``)."""
    known: dict[tuple[int, int], Identity] = {}

    def identify(obj, source=None) -> Identity:
        key = (id(obj), id(source))
        found = known.get(key)
        if found is None:
            found = known[key] = identity(obj, source)
        return found
    return identify


def overlaps(x: Identity, y: Identity) -> bool:
    """Whether ``x`` and ``y`` may share bytes: an output that overlaps an input would
    overwrite what is still to be read.

    Conservative where it can be: in-memory arrays are compared by their address ranges (two
    interleaved strided views of one buffer overlap here, as for ``numpy.may_share_memory``);
    a folder overlaps everything in it; a dask array overlaps whatever its graph holds. False
    where it truly cannot be told: 'unknown' identities (but for the same object), two stores
    reached in ways that name them differently (an object store under two endpoints or
    credentials, a zarr ``ObjectStore`` and a URL of the same bucket), a dask graph that reads
    storage only inside its tasks (a ``da.from_delayed``, a ``map_blocks`` that opens files).
    """
    if (x.kind, x.key) == (y.kind, y.key):
        return _intersect(x.span, y.span)
    if (x.kind, x.key) in y.within or (y.kind, y.key) in x.within:
        return True
    return any(overlaps(r, y) for r in x.reads) or any(overlaps(x, r) for r in y.reads)


def check_output(out, inputs, c=None, *, identify=identity) -> bool:
    """Refuse an output that shares storage with an input, by what is behind both: an
    :class:`~oocgemm.errors.OutputError` that names them, before any work. ``inputs``:
    ``(role, obj, source)`` of each input that is read (``obj`` as the user passed it, and
    the source opened for it, or None);
    ``c``: the same of C where it is read (beta != 0), which may be ``out`` itself.

    Returns True where ``c`` is ``out`` (the same matrix under any spelling: an update in
    place, each block of C read right before it is written); C that overlaps ``out``
    otherwise is refused like any input. Nothing is read but what :func:`identity` reads
    (``identify``: it, or :func:`remembered`'s)."""
    target = identify(out)
    in_place = False
    if c is not None:
        if same_matrix(identify(c[1], c[2]), target):
            in_place = True
        else:
            inputs = [*inputs, c]
    for role, obj, source in inputs:
        found = identify(obj, source)
        if overlaps(found, target):
            what = "is the same matrix as" if same_matrix(found, target) else "shares storage with"
            hint = " (pass it as c=out to update it in place)" if role == "c" else ""
            named = source.name if source is not None else _name(obj).strip("'")
            raise OutputError(
                f"out {_name(out)} {what} {operand_name(role, named)}: writing C would overwrite "
                f"{role} while it is still being read; write C elsewhere{hint}")
    return in_place


def _name(out) -> str:
    """How messages name an output: its path, or what array it is."""
    if isinstance(out, str | os.PathLike):
        return repr(os.fspath(out))
    filename = getattr(out, "filename", None)
    if filename is not None:
        return f"(a memmap of {os.fspath(filename)})"
    store_path = getattr(out, "store_path", None)
    if store_path is not None:
        return f"(the Zarr array {store_path})"
    return f"(a {library_of(out)} array)"


# ------------------------------------------------------------------------------------------
def _intersect(x: tuple[int, int] | None, y: tuple[int, int] | None) -> bool:
    """Whether two byte ranges share a byte (None: the whole thing; an empty range shares
    none)."""
    if (x is not None and x[0] >= x[1]) or (y is not None and y[0] >= y[1]):
        return False
    if x is None or y is None:
        return True
    return max(x[0], y[0]) < min(x[1], y[1])


def _unknown(obj) -> Identity:
    return Identity("unknown", ("object", id(obj)))


def _opened(opened: MatrixSource | MatrixSink) -> Identity:
    """An opened source or sink: the array it reads or writes, else its path; a source that
    reads a part of it (``region``) is that part: the same bytes as the whole, another
    matrix."""
    found = _unknown(opened)
    array = opened.array()
    if array is not None and _object(array).kind != "unknown":
        found = _object(array)
    elif opened.path is not None:
        found = _path(opened.path)
    region = getattr(opened, "region", None)
    if region is not None and found.kind != "unknown":
        found = replace(found, part=region)
    return found


def _object(obj) -> Identity:
    """An object that is not a path."""
    if isinstance(obj, np.ndarray):
        return _numpy(obj)
    if isinstance(obj, ZarrRegion):  # the array's bytes; a part of its matrix
        return replace(_object(obj.array), part=obj.region)
    module = library_of(obj)
    if module == "zarr" and (hasattr(obj, "store_path") or hasattr(obj, "store")):
        return _zarr(obj)
    if module == "dask" and hasattr(obj, "dask") and hasattr(obj, "name"):
        return _dask(obj)
    if module == "xarray" and hasattr(obj, "variable"):
        return _object(obj.data)
    # CuPy arrays (and numba's, torch's): never import cupy to ask
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is None:
        interface = getattr(obj, "__array_interface__", None)
    if isinstance(interface, dict):
        return _interface(obj, interface)
    return _unknown(obj)


# --- local files and URLs -------------------------------------------------------------------
def _stat_key(path: str) -> Hashable:
    """``(st_dev, st_ino)`` of ``path`` (links followed), or the path where nothing is there:
    a name is all that an output not written yet has."""
    try:
        st = os.stat(path)
    except OSError:
        return path
    return (st.st_dev, st.st_ino)


def _folders(real: str) -> Iterator[str]:
    """The folders above a resolved path, nearest first, the root included."""
    parent = os.path.dirname(real)
    while parent != real:
        yield parent
        real, parent = parent, os.path.dirname(parent)


def _file(path: str) -> Identity:
    """A local file or folder, by inode, within the folders above it."""
    real = os.path.realpath(path)
    within = frozenset(("file", _stat_key(folder)) for folder in _folders(real))
    return Identity("file", _stat_key(real), within=within)


def _path(path: str) -> Identity:
    """A path or URL as the user wrote it (without the layout of a file: :func:`identity`
    adds it)."""
    path = urls.local(path)
    return _url(path) if urls.is_url(path) else _file(path)


def _npy_layout(path: str) -> Layout | None:
    """The layout that the header of a ``.npy`` file gives (its size is not read: the header
    says where the data starts and how it lies); None for anything that is not one."""
    try:
        with open(path, "rb") as f:
            if npy_format.read_magic(f) == (1, 0):
                shape, fortran, dtype = npy_format.read_array_header_1_0(f)
            else:  # 3.0 differs from 2.0 only in the header's encoding (utf-8 field names)
                shape, fortran, dtype = npy_format.read_array_header_2_0(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError, SyntaxError):
        return None
    dtype = np.dtype(dtype)
    return _layout(tuple(shape), dtype, _contiguous_strides(shape, dtype.itemsize, fortran),
                   offset)


def _contiguous_strides(shape: Iterable[int], itemsize: int, fortran: bool
                        ) -> tuple[int, ...]:
    shape = tuple(shape)
    strides = []
    step = itemsize
    for n in (reversed(shape) if not fortran else shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides)) if not fortran else tuple(strides)


def _url(url: str) -> Identity:
    """A URL that is not ``file://``: a local one by inode (``local://``), others by protocol
    and normalised path, as the store that zarr opens for it names itself."""
    protocol, path = _split_url(url)
    if protocol in LOCAL_PROTOCOLS:
        return _file(path)
    if protocol is None:  # chained (simplecache::s3://...) or a protocol fsspec lacks
        return _in_store(("url",), urls.normal(url))
    return _in_store(protocol, path)


def _split_url(url: str) -> tuple[str | None, str]:
    """(canonical protocol, path as its fsspec file system names it), or (None, url) where
    fsspec cannot say (not installed, a protocol without its package, a chained URL)."""
    if "::" in url:
        return None, url
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(url.split("://", 1)[0].lower())
        # _strip_protocol is what fsspec's url_to_fs uses, without making a file system
        # (which for an object store may look for credentials)
        return protocol_name(cls.protocol), cls._strip_protocol(url)
    except Exception:  # ImportError, ValueError: unknown protocol; anything its class raises
        return None, url


def protocol_name(protocol) -> str:
    """The first of a file system's protocols (``('s3', 's3a')``: 's3'), as the name of its
    namespace."""
    return protocol if isinstance(protocol, str) else protocol[0]


def _in_store(space: Hashable, path: str) -> Identity:
    """An array at ``path`` of the store ``space``, within its prefixes (its groups)."""
    path = _normal(path)
    within = frozenset(("store", (space, prefix)) for prefix in _prefixes(path))
    return Identity("store", (space, path), within=within)


def _normal(path: str) -> str:
    path = path.rstrip("/")
    return posixpath.normpath(path) if path else ""


def _prefixes(path: str) -> Iterator[str]:
    """The prefixes of a store path, nearest first, down to the root ('' or '/')."""
    parent = posixpath.dirname(path)
    while parent != path:
        yield parent
        path, parent = parent, posixpath.dirname(parent)


# --- zarr ----------------------------------------------------------------------------------
def _zarr(array) -> Identity:
    """A zarr array (or group): its folder in a local store, else its path in its store."""
    store_path = getattr(array, "store_path", None)
    store = getattr(store_path, "store", None) or getattr(array, "store", None)
    inner = getattr(store_path, "path", None)
    if inner is None:
        inner = getattr(array, "path", "")
    return _store_item(store, str(inner).strip("/"), array)


def _store_item(store, inner: str, array) -> Identity:
    """The thing at ``inner`` of a zarr store."""
    root = getattr(store, "root", None)  # LocalStore
    if root is not None:
        return _file(os.path.join(os.fspath(root), inner))
    fs, base = getattr(store, "fs", None), getattr(store, "path", None)
    if fs is not None and isinstance(base, str):  # FsspecStore
        protocol = protocol_name(getattr(fs, "protocol", "?"))
        full = posixpath.join(base, inner) if inner else base
        return _file(full) if protocol in LOCAL_PROTOCOLS else _in_store(protocol, full)
    store_dict = getattr(store, "_store_dict", None)
    if store_dict is not None or type(store).__name__.endswith("MemoryStore"):
        # the dictionary, not the store: zarr opens a read-only MemoryStore anew over the
        # same one (with_read_only)
        return _in_store(("memory store", id(store if store_dict is None else store_dict)),
                         inner)
    if type(store).__name__ == "ZipStore" and isinstance(base, str | os.PathLike):
        archive = _file(os.fspath(base))
        found = _in_store(("zip", archive.key), inner)
        return replace(found, within=found.within | {(archive.kind, archive.key)}
                       | archive.within)
    wrapped = getattr(store, "_store", None)  # WrapperStore, LoggingStore
    if wrapped is not None and wrapped is not store:
        return _store_item(wrapped, inner, array)
    if store is None:
        return _unknown(array)
    return _in_store(("store object", id(store)), inner)  # ObjectStore and other kinds


# --- in-process memory ---------------------------------------------------------------------
def _layout(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...], offset: int
            ) -> Layout:
    """A layout with strides that do not matter set to 0 (an axis of one element is never
    stepped along; an empty matrix has no elements), so that equal matrices compare equal."""
    if 0 in shape:
        strides = (0,) * len(shape)
    else:
        strides = tuple([0 if n == 1 else s for n, s in zip(shape, strides)])
    return Layout(tuple(map(int, shape)), np.dtype(dtype).str, strides, int(offset))


def _extent(start: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int
            ) -> tuple[int, int]:
    """``[lowest, highest + 1)`` byte of an array whose element 0 is at ``start``."""
    if 0 in shape:
        return (start, start)
    low, high = start, start + itemsize
    for n, s in zip(shape, strides):
        if s < 0:
            low += s * (n - 1)
        else:
            high += s * (n - 1)
    return (low, high)


def _numpy(array: np.ndarray) -> Identity:
    """A numpy array: its file range where it views a memmap, else its address range."""
    address = array.__array_interface__["data"][0]
    layout = _layout(array.shape, array.dtype, array.strides, address)
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    # np.memmap keeps its file offset on the array that owns the mapping; its views copy the
    # attribute unchanged, so the offset of a view is found from its address in the mapping
    filename = getattr(root, "filename", None) if isinstance(root, np.memmap) else None
    offset = getattr(root, "offset", None)
    if filename is not None and isinstance(offset, int) and isinstance(root.base, mmap.mmap):
        found = _file(os.fspath(filename))
        position = offset + address - root.__array_interface__["data"][0]
        layout = replace(layout, offset=position)
        span = _extent(position, array.shape, array.strides, array.itemsize)
        return replace(found, span=span, layout=layout)
    span = _extent(address, array.shape, array.strides, array.itemsize)
    return Identity("memory", ADDRESS_SPACE, span=span, layout=layout)


def _interface(obj, interface: dict) -> Identity:
    """An array that says where it lies by ``__cuda_array_interface__`` (CuPy) or
    ``__array_interface__``."""
    try:
        address = int(interface["data"][0])
        shape = tuple(int(n) for n in interface["shape"])
        dtype = np.dtype(interface["typestr"])
        strides = interface.get("strides")
        strides = (_contiguous_strides(shape, dtype.itemsize, False) if strides is None
                   else tuple(int(s) for s in strides))
    except (KeyError, TypeError, ValueError, IndexError):
        return _unknown(obj)
    return Identity("memory", ADDRESS_SPACE, span=_extent(address, shape, strides,
                                                          dtype.itemsize),
                    layout=_layout(shape, dtype, strides, address))


# --- dask ----------------------------------------------------------------------------------
def _dask(array) -> Identity:
    """A dask array: the stored array it is, untouched (``da.from_zarr``, ``da.from_array`` of
    a zarr array), else its graph's name and the storage its graph holds."""
    stored = _stored_behind(array)
    if stored is not None:
        found = _object(stored)
        # Not memory: dask copies a numpy array (a memmap too) that it is made from, and two
        # arrays made alike, each with its own copy, are still one matrix by their name.
        if found.kind in ("file", "store"):
            return found
    shape = tuple(int(n) if n == n else -1 for n in array.shape)  # NaN: a size not known
    layout = Layout(shape, np.dtype(array.dtype).str)
    return Identity("dask", array.name, layout=layout, reads=_merged(_graph_reads(array)))


def _stored_behind(array):
    """The array that a dask array is, when its graph is that array and one getter per chunk
    (``da.from_zarr``, ``da.from_array`` of anything but a plain numpy array, which dask cuts
    into chunks up front); None otherwise. As :func:`oocgemm.storage.zarr_behind`, for any
    array."""
    layers = getattr(getattr(array, "dask", None), "layers", None)
    name = getattr(array, "name", None)
    if not layers or len(layers) != 2 or f"original-{name}" not in layers:
        return None
    values = list(layers[f"original-{name}"].values())
    stored = values[0] if len(values) == 1 else None
    try:
        same = (tuple(stored.shape) == tuple(array.shape)
                and np.dtype(stored.dtype) == np.dtype(array.dtype))
    except (AttributeError, TypeError):
        return None
    return stored if same else None


def _graph_reads(array) -> Iterator[Identity]:
    """The storage among the values of a dask array's layers: the values of materialised
    layers (``from_array``'s chunks, ``from_zarr``'s array) and the literal arguments of
    blockwise ones (``from_zarr(..., inline_array=True)``). A value inside a task is not looked
    for: that would take materialising and walking every task."""
    layers = getattr(getattr(array, "dask", None), "layers", None)
    for layer in (layers or {}).values():
        mapping = getattr(layer, "mapping", None)
        if isinstance(mapping, dict):
            values: Iterable = mapping.values()
        elif isinstance(getattr(layer, "indices", None), tuple | list):
            values = (value for value, index in layer.indices if index is None)
        else:
            continue
        for value in values:
            if library_of(value) == "dask" and hasattr(value, "value"):  # a DataNode
                value = value.value
            if isinstance(value, np.ndarray) or (library_of(value) == "zarr"
                                                 and hasattr(value, "store_path")):
                found = _object(value)
                if found.kind != "unknown":
                    yield found


def _merged(found: Iterable[Identity]) -> tuple[Identity, ...]:
    """Identities of the same thing with touching or overlapping spans made one (a memmap's
    chunks: one range of its file), without a layout: what a graph reads, for
    :func:`overlaps`. Spans far apart stay apart, so that unrelated arrays of one address
    space do not merge into one range that covers everything between them."""
    spans: dict[tuple[str, Hashable], list[tuple[int, int] | None]] = {}
    within: dict[tuple[str, Hashable], frozenset] = {}
    for item in found:
        spans.setdefault((item.kind, item.key), []).append(item.span)
        within[(item.kind, item.key)] = item.within
    merged = []
    for (kind, key), ranges in spans.items():
        if any(r is None for r in ranges):
            merged.append(Identity(kind, key, within=within[(kind, key)]))
            continue
        runs: list[list[int]] = []
        for start, stop in sorted(r for r in ranges if r is not None):
            if runs and start <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], stop)
            else:
                runs.append([start, stop])
        merged.extend(Identity(kind, key, span=(start, stop), within=within[(kind, key)])
                      for start, stop in runs)
    return tuple(merged)

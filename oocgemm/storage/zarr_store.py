"""Zarr arrays (format 2 or 3) on disk or given as ``zarr.Array`` objects."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import mmap
import numbers
import os
import threading
import time
import warnings
import zipfile
from typing import Any, NamedTuple, cast

import numpy as np
import zarr
from zarr.core.buffer import cpu as zarr_cpu

from .. import machine
from ..arguments import parse_compressor
from ..errors import InputError, OptionError, OutputError
from ..headstart import will_need
from ..planning.chunks import chunk_region, chunks_of, on_chunk_edges
from . import files, frames, urls
from .base import MatrixSink, MatrixSource


def open_zarr_array(path: str, role: str):
    """Open an existing Zarr array read-only, with a clear error for everything else."""
    try:
        node = zarr.open(store=path, mode="r")
    except FileNotFoundError as exc:
        raise InputError(f"{role}: no Zarr array at {path!r} ({exc})") from None
    except Exception as exc:  # zarr raises several kinds for broken metadata
        raise InputError(f"{role}: {path!r} is not a readable Zarr array "
                         f"(corrupt or missing metadata: {type(exc).__name__}: {exc})") from None
    if not isinstance(node, zarr.Array):
        raise InputError(f"{role}: {path!r} is a Zarr group, not an array")
    return node


def open_zip_array(path: str, role: str):
    """Open a Zarr array stored in a zip file read-only (zarr's ``ZipStore``), with a clear
    error for everything else; the store is closed with the source
    (:meth:`ZarrSource.close`)."""
    store = zarr.storage.ZipStore(path, mode="r")  # opens the file when first read
    try:
        node = zarr.open(store=store, mode="r")
    except Exception as exc:
        _close_quietly(store)
        if isinstance(exc, zipfile.BadZipFile):
            raise InputError(f"{role}: {path!r} is not a readable zip file ({exc})") from None
        raise InputError(f"{role}: {path!r} is a zip file that holds no readable Zarr array "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(node, zarr.Array):
        _close_quietly(store)
        raise InputError(f"{role}: the zip file {path!r} holds a Zarr group, not an array; "
                         f"open it with zarr.open_array(zarr.storage.ZipStore({path!r}), "
                         f"path=...) and pass that array")
    return node


def _close_quietly(store) -> None:
    """Close a store that failed to open (a ZipStore whose file never opened has nothing to
    close, and says so by raising)."""
    with contextlib.suppress(Exception):
        store.close()


def pipeline_config(threads: int) -> dict:
    """zarr settings under which oocgemm opens the arrays it reads and those it creates,
    chosen by measurement (docs/performance.md, "Which decoder" and "Zarr writes, n =
    32768"): zarr's fused codec pipeline where zarr has one (3.4+; the quickest to decode
    whole zstd chunks, and to store uncompressed ones, several times quicker than zarr's
    defaults), else the ``zarrs`` pipeline where it is installed (the next quickest), else
    zarr's own with more concurrency (quicker than its defaults)."""
    from zarr.core import codec_pipeline

    config: dict[str, object] = {"async.concurrency": 4 * threads,
                                 "threading.max_workers": threads}
    if hasattr(codec_pipeline, "FusedCodecPipeline"):
        config.update({"codec_pipeline.path": "zarr.core.codec_pipeline.FusedCodecPipeline",
                       "codec_pipeline.max_workers": threads})
    elif importlib.util.find_spec("zarrs") is not None:
        config.update({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline",
                       "codec_pipeline.strict": False})  # zarr's pipeline for codecs it lacks
    return config


def fast_reader(array: zarr.Array, threads: int = 0) -> zarr.Array:
    """``array`` opened again, read-only, under :func:`pipeline_config` (the codec pipeline is
    fixed when an array is opened); the array itself where that fails."""
    threads = threads or machine.cores()
    try:
        with zarr.config.set(pipeline_config(threads)):
            return zarr.open_array(store=array.store_path, mode="r")
    except Exception:
        return array


class Frame(NamedTuple):
    """One compressed unit of a stored object (a chunk file, or an inner chunk of a shard):
    its bytes in the object, and the rows and columns of the object's region it decodes into
    (clipped at the array's edges; its decoded shape is the reader's ``frame_shape``)."""

    offset: int
    nbytes: int
    """0: never written, the fill value."""
    rows: tuple[int, int]
    cols: tuple[int, int]
    pieces: tuple = ()
    """Its zstd frames, where it was read for a GPU to decode (:meth:`ZarrSource.read_object`):
    (offset in the object, bytes, where its content starts in the decoded frame, its
    decoded bytes), checked to end where the frame does."""


class _Direct:
    """Whole chunks of a local, unsharded Zarr array whose chunks are plain C-order bytes,
    compressed or not, decoded straight into the caller's buffer: the chunk file read, its
    codec (numcodecs) run on it; and written the other way (:meth:`write`). Decoding zstd
    chunks this way is several times quicker than through zarr's fused codec pipeline
    (docs/performance.md, "Gram products"). :func:`direct` says which arrays qualify; every
    other layout goes through zarr."""

    def __init__(self, array: zarr.Array, codec):
        self.array = array
        self.codec = codec
        """A numcodecs codec, or None for uncompressed chunks."""
        self.chunks = tuple(array.chunks)
        self.dtype = np.dtype(array.dtype)
        self.fill = array.metadata.fill_value

    @property
    def sliceable(self) -> bool:
        """Raw chunk files: a read may take part of a chunk from its file's pages."""
        return self.codec is None

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """The decoded shape of one frame: a chunk."""
        return self.chunks

    def frames(self, data, size: int, shape) -> list[Frame]:
        """The frames of an object of ``size`` bytes (``data``) whose region is ``shape``."""
        return [Frame(0, size, (0, shape[0]), (0, shape[1]))]

    def decode_frames(self, data, frames: list[Frame], out: np.ndarray) -> None:
        """Each of ``frames`` (in ``data``, the object's bytes) decoded into its place in
        ``out`` (the object's region); frames never written take the fill value."""
        shape = self.frame_shape
        frame_bytes = math.prod(shape) * self.dtype.itemsize
        scratch = np.empty(shape, dtype=self.dtype) if self.codec is not None else None
        for frame in frames:
            target = out[frame.rows[0]:frame.rows[1], frame.cols[0]:frame.cols[1]]
            if frame.nbytes == 0:  # never written: the fill value
                target[...] = self.fill
                continue
            end = frame.offset + frame.nbytes
            if end > len(data):
                raise ValueError(f"a frame at {frame.offset} runs past the object's end")
            rows, cols = target.shape
            if scratch is None:
                if frame.nbytes != frame_bytes:
                    raise ValueError(f"a raw frame of {frame.nbytes} bytes, expected "
                                     f"{frame_bytes}")
                chunk = np.frombuffer(data, dtype=self.dtype, count=math.prod(shape),
                                      offset=frame.offset).reshape(shape)
                np.copyto(target, chunk[:rows, :cols], casting="same_kind")
                del chunk  # a mapping closes only once no array uses it
            else:
                with memoryview(data) as view:
                    self.codec.decode(view[frame.offset:end], out=scratch)
                np.copyto(target, scratch[:rows, :cols], casting="same_kind")

    def path(self, index) -> str:
        root = self.array.store_path.store.root  # type: ignore[attr-defined]  # LocalStore
        key = self.array.metadata.encode_chunk_key(tuple(index))
        return os.path.join(os.fspath(root), self.array.store_path.path, key)

    def read(self, index, out: np.ndarray, files=None) -> None:
        """Chunk ``index`` into ``out`` (its region, clipped at the array's edges); its file
        read by ``files`` where given (:data:`~oocgemm.storage.base.FileReads`)."""
        whole = out.shape == self.chunks and out.flags.c_contiguous and out.dtype == self.dtype
        target = out if whole else np.empty(self.chunks, dtype=self.dtype)
        try:
            if files is not None:
                self._read_file(index, target, files)
            else:
                self._read_pages(index, target)
        except FileNotFoundError:  # never written: the fill value
            out[...] = self.fill
            return
        if not whole:
            np.copyto(out, target[:out.shape[0], :out.shape[1]], casting="same_kind")

    def _read_file(self, index, target: np.ndarray, files) -> None:
        """A whole chunk into ``target``, its file read by ``files`` (then decoded)."""
        if self.codec is None:
            got = files(self.path(index), target.data.cast("B"))
            if got.nbytes != target.nbytes:
                raise ValueError(f"{got.nbytes} bytes, expected {target.nbytes}")
            return
        data = files(self.path(index))
        if data.nbytes == 0:
            raise ValueError("an empty chunk file")
        self.codec.decode(data, out=target)

    def _read_pages(self, index, target: np.ndarray) -> None:
        """A whole chunk into ``target``, decoded from its file's pages."""
        with open(self.path(index), "rb") as f:
            if self.codec is None:
                got = f.readinto(target.data.cast("B"))
                if got != target.nbytes or f.read(1):
                    raise ValueError(f"{got} bytes or more, expected {target.nbytes}")
                return
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ValueError("an empty chunk file")
            # decoded from the page cache's pages, not from a copy of them
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                self.codec.decode(data, out=target)

    def write(self, index, data: np.ndarray) -> None:
        """Chunk ``index`` from ``data`` (its region, clipped at the array's edges): padded
        to the whole chunk with the fill value (as zarr stores edge chunks), encoded by the
        codec, and stored as the chunk's file. For the arrays oocgemm creates only (a new
        output under its temporary name): nothing else reads the file while it is written."""
        rows = (self.codec is None and data.shape == self.chunks and data.dtype == self.dtype
                and data.strides[1] == data.itemsize and not data.flags.c_contiguous)
        if not rows and (data.shape != self.chunks or data.dtype != self.dtype
                         or not data.flags.c_contiguous):
            whole = np.full(self.chunks, self.fill or 0, dtype=self.dtype)
            whole[:data.shape[0], :data.shape[1]] = data
            data = whole
        path = self.path(index)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            if rows:  # a whole chunk's rows inside a wider block: written as they lie
                write_all(f.fileno(), [memoryview(row) for row in data])
            else:
                f.write(data.data if self.codec is None else self.codec.encode(data))

    def write_frames(self, index, frames: list) -> None:
        """Chunk ``index`` stored as ``frames`` back to back (:mod:`.frames`): already
        encoded, the whole chunk (padding included)."""
        path = self.path(index)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.writelines(frames)

    def read_part(self, index, rows, cols, out: np.ndarray) -> None:
        """Rows ``rows`` and columns ``cols`` (within chunk ``index``) of an uncompressed
        chunk into ``out``, from the pages of its file that hold them: nothing else of the
        chunk is read or decoded."""
        assert self.codec is None, "a compressed chunk is decoded whole"
        try:
            with open(self.path(index), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                want = math.prod(self.chunks) * self.dtype.itemsize
                if size != want:
                    raise ValueError(f"{size} bytes, expected {want}")
                with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                    chunk = np.ndarray(self.chunks, dtype=self.dtype, buffer=data)
                    np.copyto(out, chunk[rows[0]:rows[1], cols[0]:cols[1]], casting="same_kind")
                    del chunk  # the mmap closes only once no array uses it
        except FileNotFoundError:  # never written: the fill value
            out[...] = self.fill


#: Buffers one ``os.writev`` takes at most (POSIX's IOV_MAX on Linux).
IOV_MAX = 1024


def write_all(fd: int, buffers: list) -> None:
    """``buffers`` written to ``fd`` back to back, with as few system calls as the kernel
    takes (``os.writev``, which lets the other threads run; copying an uncompressed chunk's
    rows into a fresh whole chunk first cost an encoder thread far more, faulting its pages
    in: docs/performance.md, "C compressed on the GPU by default"); a short write goes on
    where it stopped."""
    views = [b.cast("B") if b.format != "B" else b for b in buffers]
    start = 0
    while start < len(views):
        batch = views[start:start + IOV_MAX]
        done = os.writev(fd, batch)
        for view in batch:
            if done < view.nbytes:
                views[start] = view[done:]
                break
            done -= view.nbytes
            start += 1


class _DirectSharded(_Direct):
    """Whole shards of a local sharded Zarr v3 array whose inner chunks are plain C-order
    bytes, raw or compressed by one numcodecs codec: the shard's file mapped once, its index
    read (at its start or end, its crc32c checked where it has one), and each inner chunk
    decoded and copied into its place in the caller's buffer; inner chunks never written
    take the fill value. zarr's pipeline took far more of the host's CPU for a product's
    reads of such stores (shards of small zstd chunks) than for chunk files of the same data
    (docs/performance.md, "Shards read straight from their files")."""

    def __init__(self, array: zarr.Array, codec, sharding):
        super().__init__(array, codec)
        self.chunks = tuple(cast(tuple, array.shards))  # the unit read: a shard
        self.inner = tuple(sharding.chunk_shape)
        self.grid = tuple(s // c for s, c in zip(self.chunks, self.inner))
        self.index_at_end = _setting(sharding.index_location, "end") == "end"
        names = [type(c).__name__ for c in sharding.index_codecs]
        self.index_crc = "Crc32cCodec" in names
        self.index_bytes = 16 * math.prod(self.grid) + (4 if self.index_crc else 0)

    @property
    def sliceable(self) -> bool:
        return False  # a shard is decoded whole, raw or not

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return self.inner

    def read(self, index, out: np.ndarray, files=None) -> None:
        """Shard ``index`` into ``out`` (its region, clipped at the array's edges); its file
        read by ``files`` where given (:data:`~oocgemm.storage.base.FileReads`), else decoded
        from its pages."""
        try:
            if files is not None:
                data = files(self.path(index))
                self.decode_frames(data, self.frames(data, data.nbytes, out.shape), out)
                return
            with open(self.path(index), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                    self.decode_frames(data, self.frames(data, size, out.shape), out)
        except FileNotFoundError:  # never written: the fill value
            out[...] = self.fill

    def frames(self, data, size: int, shape) -> list[Frame]:
        """The inner chunks of a shard of ``size`` bytes whose region is ``shape``, from its
        index (at its start or end; its crc32c checked where it has one)."""
        if size < self.index_bytes:
            raise ValueError(f"{size} bytes, shorter than the shard's index")
        at = size - self.index_bytes if self.index_at_end else 0
        raw = bytes(data[at:at + self.index_bytes])
        if self.index_crc:
            import google_crc32c

            if google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
                raise ValueError("the shard's index fails its crc32c check")
        table = np.frombuffer(raw, dtype="<u8", count=2 * math.prod(self.grid)).reshape(
            self.grid + (2,))
        found = []
        (ir, ic) = self.inner
        for gi, gj in np.ndindex(*self.grid):
            r0, c0 = gi * ir, gj * ic
            rows, cols = min(ir, shape[0] - r0), min(ic, shape[1] - c0)
            if rows <= 0 or cols <= 0:
                continue  # past the array's edge
            offset, nbytes = (int(v) for v in table[gi, gj])
            if offset == nbytes == _MISSING:
                offset = nbytes = 0  # never written
            elif offset + nbytes > size:
                raise ValueError(f"inner chunk {(gi, gj)} runs past the shard's end")
            found.append(Frame(offset, nbytes, (r0, r0 + rows), (c0, c0 + cols)))
        return found


_MISSING = (1 << 64) - 1
"""A shard index's offset and size of an inner chunk never written."""


def _setting(value, default: str) -> str:
    """A codec's setting as its name: zarr before 3.4 holds enums ('little' as
    ``Endian.little``), 3.4 the names themselves; ``default`` where it is unset."""
    if value is None:
        return default
    return str(getattr(value, "value", value))


def _plain_codec(array: zarr.Array) -> tuple[bool, Any]:
    """(True, the numcodecs codec or None for raw bytes) where ``array``'s chunks (inner
    chunks, when sharded) are the C-order bytes of its native little-endian dtype, raw or
    compressed by one codec numcodecs has (Zarr v2's compressor, or v3's zstd, gzip or
    blosc), with no filter; (False, None) otherwise."""
    import numcodecs

    dtype = np.dtype(array.dtype)
    if (tuple(array.filters) or array.ndim != 2 or dtype.byteorder == ">"
            or dtype.hasobject or len(array.compressors) > 1):
        return False, None
    (compressor,) = array.compressors or (None,)
    if array.metadata.zarr_format == 2:
        return array.metadata.order == "C", compressor  # a numcodecs codec already
    serializer = array.serializer
    endian = _setting(getattr(serializer, "endian", None), "little")
    if type(serializer).__name__ != "BytesCodec" or endian != "little":
        return False, None
    if compressor is None:
        return True, None
    name, level = type(compressor).__name__, getattr(compressor, "level", 0)
    if name == "ZstdCodec":
        return True, numcodecs.Zstd(level=level,
                                    checksum=bool(getattr(compressor, "checksum", False)))
    if name == "GzipCodec":
        return True, numcodecs.GZip(level=level)
    if name == "BloscCodec":  # (a decode reads how it was shuffled from the frame)
        blosc = cast(Any, compressor)
        shuffle = _setting(getattr(blosc, "shuffle", None), "shuffle")
        cname = _setting(blosc.cname, blosc.cname)
        return True, numcodecs.Blosc(
            cname=cname, clevel=blosc.clevel, blocksize=blosc.blocksize,
            shuffle={"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[shuffle])
    return False, None


def direct(array: zarr.Array) -> _Direct | None:
    """A :class:`_Direct` reader and writer for ``array`` where its chunks are one local file
    each holding plain bytes (:func:`_plain_codec`); None otherwise (sharded, transposed,
    filtered, big-endian, in another store...)."""
    try:
        if (getattr(array.store_path.store, "root", None) is None
                or getattr(array, "shards", None)):
            return None
        plain, codec = _plain_codec(array)
        return _Direct(array, codec) if plain else None
    except Exception:  # a layout this does not know: zarr reads it
        return None


def direct_reader(array: zarr.Array) -> _Direct | None:
    """What reads ``array``'s chunks straight from their files: :func:`direct`, or for a
    local sharded array whose inner chunks are plain bytes and whose index is plain (with or
    without its crc32c) a :class:`_DirectSharded`; None where zarr reads it."""
    found = direct(array)
    if found is not None or not getattr(array, "shards", None):
        return found
    try:
        if getattr(array.store_path.store, "root", None) is None:
            return None
        (sharding,) = cast(Any, array.metadata).codecs
        index = [type(c).__name__ for c in sharding.index_codecs]
        endian = _setting(getattr(sharding.index_codecs[0], "endian", None), "little")
        if index not in (["BytesCodec"], ["BytesCodec", "Crc32cCodec"]) or endian != "little":
            return None
        plain, codec = _plain_codec(array)
        return _DirectSharded(array, codec, cast(Any, sharding)) if plain else None
    except Exception:  # a layout this does not know: zarr reads it
        return None


#: The least share of its decoded bytes a stored input is taken to move (a sample of chunks
#: never written, or of zeros, stores next to nothing; each object still costs a request).
LEAST_STORED = 0.01

#: Bytes of one stored object asked of the OS ahead of its decode at most (its first ones):
#: half the disk queue's window (``oocgemm.storage.chunked.COLD_WINDOW``), so that a few
#: shards of gigabytes ahead do not fill the page cache with what is decoded much later;
#: the rest of such an object is read as it is decoded.
AHEAD_OF_DECODE = 256 << 20


class ZarrSource(MatrixSource):
    def __init__(self, array: zarr.Array, name: str, path: str | None = None,
                 incomplete_ok: bool = False, owns_store: bool = False):
        mark = array.attrs.get("oocgemm")
        if isinstance(mark, dict) and mark.get("complete") is False and not incomplete_ok:
            raise InputError(f"{name}: an incomplete oocgemm output (its run was interrupted "
                             f"or failed); run the product again, or resume it")
        self._given = array
        self._owns_store = owns_store
        """The store was opened for this source (a zip file): closed with it."""
        self._array = fast_reader(array)
        self._direct = direct_reader(self._array)
        self._hinted: set[str] = set()
        # Of any rank until arguments.check_matrix refuses all but 2 (as for every source).
        self.shape = cast(tuple[int, int], tuple(array.shape))
        self.dtype = np.dtype(array.dtype)
        # The unit decoded at once: the shard of a sharded array. zarr's pipelines decode a
        # whole shard quicker than its inner chunks one call each (docs/performance.md,
        # "Which decoder").
        chunks = getattr(array, "shards", None) or array.chunks
        self.chunks = tuple(chunks) if len(chunks) == 2 else None
        self.on_disk = True
        self.name = name
        self.path = path
        self.sliced = self._direct is not None and self._direct.sliceable
        """Uncompressed chunks, one plain file each: a read takes the rows and columns it
        needs from the chunk files' pages (the OS page cache is their cache, as for .npy),
        never a whole chunk for part of it."""
        self.decodes_into = self._direct is not None and not self._direct.sliceable

    lock: threading.Lock | None = None
    """A lock every read takes: the sink's, when the run writes this very array in place
    (a read must not meet a rewrite of the chunk it decodes)."""

    def read(self, rows, cols, out):
        with self.lock or contextlib.nullcontext():
            self._read(rows, cols, out)

    def _read(self, rows, cols, out):
        if self.sliced:
            self._read_parts(rows, cols, out)
            return
        selection = (slice(*rows), slice(*cols))
        try:
            if out.dtype == self.dtype and out.flags.c_contiguous:
                self._array.get_basic_selection(
                    selection, out=zarr_cpu.NDBuffer.from_numpy_array(out))
            else:
                np.copyto(out, self._array.get_basic_selection(selection), casting="same_kind")
        except Exception as exc:
            raise InputError(f"{self.name}: cannot read rows {rows[0]}:{rows[1]}, columns "
                             f"{cols[0]}:{cols[1]} (corrupt or truncated chunk? "
                             f"{type(exc).__name__}: {exc})") from exc

    def _read_parts(self, rows, cols, out) -> None:
        """A region of uncompressed chunks, each chunk's part copied from its file's pages."""
        assert self._direct is not None and self.chunks is not None
        for index in chunks_of((tuple(rows), tuple(cols)), self.chunks):
            (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
            lo_r, hi_r = max(r0, rows[0]), min(r1, rows[1])
            lo_c, hi_c = max(c0, cols[0]), min(c1, cols[1])
            try:
                self._direct.read_part(
                    index, (lo_r - r0, hi_r - r0), (lo_c - c0, hi_c - c0),
                    out[lo_r - rows[0]:hi_r - rows[0], lo_c - cols[0]:hi_c - cols[0]])
            except Exception as exc:
                raise InputError(f"{self.name}: cannot read rows {lo_r}:{hi_r}, columns "
                                 f"{lo_c}:{hi_c}, chunk {tuple(index)} (corrupt or truncated "
                                 f"chunk? {type(exc).__name__}: {exc})") from exc
        self.count(out.size * self.dtype.itemsize)

    def prefetch_chunk(self, index) -> None:
        """Ask the OS to start reading the object that holds chunk ``index`` (its shard when
        sharded) into the page cache, so that a cold disk works ahead of the decoders
        (``posix_fadvise(WILLNEED)``; local stores only, a hint that may do nothing)."""
        path = self.object_path(index)
        if path is None or path in self._hinted or not hasattr(os, "posix_fadvise"):
            return
        self._hinted.add(path)
        will_need(path, most=AHEAD_OF_DECODE)

    def cached_fraction(self, most: int = 64) -> float | None:
        """The share of the stored objects' bytes that the OS page cache holds, from ``most``
        objects spread over the array (:func:`~oocgemm.storage.files.cached_fraction`: none
        of them read); None where it cannot tell (not a local folder)."""
        paths = self._sample(most)
        return None if paths is None else files.cached_fraction(paths)

    def stored_fraction(self, most: int = 64) -> float:
        """Bytes stored per byte decoded, from the sizes of ``most`` objects spread over the
        array (none read): their stored bytes (0 for one never written, which costs no read)
        over their whole decoded bytes (an edge chunk is stored whole, padded); at least
        :data:`LEAST_STORED`, and 1 where it cannot tell (not a local folder, or none of them
        written)."""
        paths = self._sample(most)
        if not paths or self.chunks is None:
            return 1.0
        stored = written = 0
        for path in paths:
            try:
                stored += os.stat(path).st_size
                written += 1
            except OSError:  # never written (the fill value), or gone: nothing to read
                continue
        if not written:  # (an array of metadata alone, as a plan's test makes: as if full)
            return 1.0
        decoded = len(paths) * math.prod(self.chunks) * self.dtype.itemsize
        return max(stored / decoded, LEAST_STORED)

    def _sample(self, most: int) -> list[str] | None:
        """The files of up to ``most`` of its objects spread over the array; None where they
        are not local files."""
        if self.chunks is None:
            return None
        rows, cols = (-(-n // c) for n, c in zip(self.shape, self.chunks))
        step = max(1, rows * cols // most)
        found = [self.object_path(divmod(i, cols)) for i in range(0, rows * cols, step)]
        if not found or any(path is None for path in found):
            return None
        return cast(list[str], found)

    def object_path(self, index) -> str | None:
        """The file that holds chunk ``index`` (its shard's, when sharded); None where the
        store is not a local folder."""
        store = self._array.store_path.store
        root = getattr(store, "root", None)
        if root is None:
            return None
        chunks = self.chunks
        assert chunks is not None, "asked for a chunk of an array that is not a matrix"
        outer = getattr(self._array, "shards", None) or chunks
        coords = tuple(i * c // o for i, c, o in zip(index, chunks, outer))
        key = self._array.metadata.encode_chunk_key(coords)
        return os.path.join(os.fspath(root), self._array.store_path.path, key)

    def read_chunk(self, index, out, *, files=None):
        """Decode one chunk (a whole shard of a sharded array) into ``out``: straight from its
        file where the layout allows (:func:`direct`; the file read by ``files`` where
        given, else decoded from its pages), else through zarr."""
        (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
        if self._direct is None:
            self.read((r0, r1), (c0, c1), out)
        else:
            with self.lock or contextlib.nullcontext():
                self._read_direct(index, out, (r0, r1), (c0, c1), files)
        stored = self.stored_size(index)
        self.count(out.nbytes if stored is None else stored, out.nbytes)

    def stored_size(self, index) -> int | None:
        """Bytes of the object that holds chunk ``index`` (its shard's, decoded whole), 0 for
        one never written; None where the store is not a local folder (unknown)."""
        path = self.object_path(index)
        if path is None:
            return None
        try:
            return os.stat(path).st_size
        except OSError:  # never written: the fill value
            return 0

    # -- objects as stored, for a GPU to decode (Plan.io.gpu_decode) --------------------------
    @property
    def fill_value(self):
        """What chunks never written hold."""
        return self._array.metadata.fill_value

    @property
    def zstd_frames(self) -> tuple[int, int] | None:
        """The decoded shape of one frame (a chunk, or an inner chunk of a shard) where every
        stored object is a local file of zstd frames of plain bytes (what nvCOMP decodes);
        None otherwise."""
        d = self._direct
        if d is None or type(d.codec).__name__ != "Zstd" or self.chunks is None:
            return None
        return cast(tuple[int, int], tuple(d.frame_shape))

    def read_object(self, index, into: np.ndarray) -> tuple[int, list[Frame]]:
        """The stored bytes of the object (chunk file, or shard) at ``index`` (in units of
        :attr:`chunks`) into ``into`` (bytes), and its frames; ``(0, [a frame of the fill
        value])`` for an object never written. InputError for one that does not fit
        ``into`` or whose index is damaged."""
        assert self._direct is not None and self.chunks is not None
        (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
        where = f"{self.name}: rows {r0}:{r1}, columns {c0}:{c1}, chunk {tuple(index)}"
        try:
            with self.lock or contextlib.nullcontext(), open(self._direct.path(index), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > into.nbytes:
                    raise InputError(
                        f"{where}: its file holds {size} bytes, more than the {into.nbytes} "
                        f"a zstd frame of its size takes at most (written by another "
                        f"encoder?); decode it on the host (gpu_decode=False, "
                        f"--gpu-decode off)")
                got = f.readinto(into[:size].data)
            if got != size:
                raise ValueError(f"read {got} of {size} bytes")
            found = [self._pieces(into, frame)
                     for frame in self._direct.frames(into, size, (r1 - r0, c1 - c0))]
        except FileNotFoundError:  # never written: the fill value
            return 0, [Frame(0, 0, (0, r1 - r0), (0, c1 - c0))]
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"{where} (corrupt or truncated chunk? {type(exc).__name__}: "
                             f"{exc})") from exc
        self.count(size, (r1 - r0) * (c1 - c0) * self.dtype.itemsize, objects=1)
        return size, found

    def _pieces(self, data, frame: Frame) -> Frame:
        """``frame`` with its zstd frames (:func:`~oocgemm.storage.frames.zstd_pieces`): each
        where its decoded bytes go, which must add up to the whole frame's."""
        assert self._direct is not None
        if frame.nbytes == 0:
            return frame
        whole = math.prod(self._direct.frame_shape) * self.dtype.itemsize
        found = frames.zstd_pieces(data, frame.offset, frame.nbytes)
        if len(found) == 1 and found[0][2] is None:
            return frame._replace(pieces=((found[0][0], found[0][1], 0, whole),))
        sizes = [content for _, _, content in found if content is not None]
        if len(sizes) != len(found) or sum(sizes) != whole:
            raise ValueError(f"zstd frames of {[c for _, _, c in found]} bytes, not the "
                             f"{whole} of a chunk")
        pieces, at = [], 0
        for (offset, nbytes, _), content in zip(found, sizes):
            pieces.append((offset, nbytes, at, content))
            at += content
        return frame._replace(pieces=tuple(pieces))

    def decode_object(self, index, data, frames: list[Frame], out: np.ndarray) -> None:
        """An object's frames (:meth:`read_object`) decoded on the host into ``out`` (its
        region): what a GPU's DECODE does, for the CPU's replay and for frames a GPU
        refused (which fail here with the codec's message)."""
        assert self._direct is not None and self.chunks is not None
        try:
            self._direct.decode_frames(data, frames, out)
        except Exception as exc:
            (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
            raise InputError(f"{self.name}: cannot read rows {r0}:{r1}, columns {c0}:{c1}, "
                             f"chunk {tuple(index)} (corrupt or truncated chunk? "
                             f"{type(exc).__name__}: {exc})") from exc

    def _read_direct(self, index, out, rows, cols, files=None) -> None:
        (r0, r1), (c0, c1) = rows, cols
        assert self._direct is not None
        try:
            self._direct.read(index, out, files)
        except Exception as exc:
            raise InputError(f"{self.name}: cannot read rows {r0}:{r1}, columns {c0}:{c1}, "
                             f"chunk {tuple(index)} (corrupt or truncated chunk? "
                             f"{type(exc).__name__}: {exc})") from exc

    def array(self):
        return self._given

    def close(self) -> None:
        if self._owns_store:
            self._given.store_path.store.close()


#: Keywords of ``zarr.create_array`` that ``out_options`` may set.
OUT_OPTIONS = ("chunks", "shards", "compressors", "filters", "serializer", "zarr_format",
               "dimension_names", "chunk_key_encoding")
#: Largest default output chunk, bytes: readers of C downstream want chunks, not one file.
MAX_OUT_CHUNK = 64 << 20
#: Smallest default output chunk where the blocks hold one, bytes: a store's cost per chunk
#: (a file, an encoder's call) stays small beside its bytes.
MIN_OUT_CHUNK = 4 << 20


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def output_chunks(block: tuple[int, int], itemsize: int, stripe_rows: int | None = None,
                  limit: int = MAX_OUT_CHUNK) -> tuple[int, int]:
    """Default chunks of a new Zarr output: they tile the C blocks (``block``: w x h) and the
    row stripes C is written in (``stripe_rows``, staged plans), so that every write covers
    whole chunks, and hold at most ``limit`` bytes; square-ish, as large as that allows.

    Stripes whose rows share few factors with the block's (2047 of 2048) would make chunks
    of a row or so, and the store's cost per chunk the run's bound (a 16 KiB chunk each:
    docs/performance.md, "Small blocks"): where the stripes' chunks would hold less than
    :data:`MIN_OUT_CHUNK` and an eighth of a block, chunks tile the blocks only, and the
    writer gathers the stripes that cut them (:class:`~oocgemm.storage.chunked.ChunkWriter`).
    """
    w, h = max(block[0], 1), max(block[1], 1)
    unit = w
    if stripe_rows:
        aligned = math.gcd(w, stripe_rows)
        if aligned * h * itemsize >= min(MIN_OUT_CHUNK, w * h * itemsize // 8):
            unit = aligned
    fits = [d for d in _divisors(unit) if d * d * itemsize <= limit] or [1]
    rows = fits[-1]
    cols = [d for d in _divisors(h) if rows * d * itemsize <= limit] or [1]
    return rows, cols[-1]


def layout_of(array: zarr.Array) -> dict:
    """The ``zarr.create_array`` keywords that make an array laid out and coded like
    ``array`` (chunks, shards, codecs, fill value, dimension names, chunk keys, format), and
    its attributes: what an in-place update keeps."""
    meta = array.metadata
    options = {"chunks": array.chunks, "compressors": array.compressors,
               "filters": array.filters, "fill_value": array.fill_value,
               "zarr_format": meta.zarr_format,
               "attributes": {k: v for k, v in array.attrs.items() if k != "oocgemm"}}
    if meta.zarr_format == 3:
        options.update(shards=array.shards, serializer=array.serializer,
                       dimension_names=meta.dimension_names,
                       chunk_key_encoding=meta.chunk_key_encoding)
    else:
        options.update(order=meta.order, chunk_key_encoding={
            "name": "v2", "separator": meta.dimension_separator})
    return options


def is_zarr_array(path: str) -> bool:
    """True when ``path`` is a directory holding a Zarr array's metadata (format 2 or 3)."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, ".zarray")):
        return True
    try:
        with open(os.path.join(path, "zarr.json")) as f:
            return json.load(f).get("node_type") == "array"
    except (OSError, ValueError, AttributeError):
        return False


def parent_group(path: str):
    """The Zarr group that holds ``path`` (``g.zarr/C``), or None."""
    parent = os.path.dirname(os.path.abspath(path))
    if not any(os.path.exists(os.path.join(parent, name)) for name in ("zarr.json", ".zgroup")):
        return None
    try:
        node = zarr.open(store=parent, mode="r")
    except Exception:
        return None
    return node if isinstance(node, zarr.Group) else None


def check_zarr_options(options, shape, dtype, path: str | None) -> dict:
    """``out_options`` checked before any work: known keywords that ``zarr.create_array``
    accepts for this shape and dtype (tried on an in-memory store). Fills in the Zarr format of
    the group the output goes into (a v2 group gets a v2 array it can see)."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise OptionError(f"out_options must be a dict of zarr.create_array keywords, got "
                          f"{type(options).__name__}")
    unknown = sorted(set(options) - set(OUT_OPTIONS))
    if unknown:
        raise OptionError(f"out_options: unknown keyword(s) {', '.join(unknown)}; accepted: "
                          f"{', '.join(OUT_OPTIONS)}")
    options = dict(options)
    group = parent_group(path) if path is not None else None
    if "zarr_format" not in options and group is not None:
        options["zarr_format"] = group.metadata.zarr_format
    for name in ("chunks", "shards"):
        if options.get(name) is not None:
            value = options[name]
            ok = (isinstance(value, (tuple, list)) and len(value) == 2
                  and all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                          and int(x) >= 1 for x in value))
            if not ok:
                raise OptionError(f"out_options[{name!r}] must be two positive integers, got "
                                  f"{value!r}")
            options[name] = tuple(int(x) for x in value)
    fmt = options.get("zarr_format", 3)
    if fmt not in (2, 3):
        raise OptionError(f"out_options['zarr_format'] must be 2 or 3, got {fmt!r}")
    if isinstance(options.get("compressors"), str):
        options["compressors"] = compressor(options["compressors"], fmt)
    if set(options) <= {"zarr_format"}:  # nothing of the user's to try
        return options
    trial = dict(options)
    if trial.get("chunks") is None:  # default chunks come later, inside the shards
        trial["chunks"] = tuple(max(1, min(x, 64)) for x in shape)
        if trial.get("shards") is not None:
            trial["chunks"] = tuple(min(c, s) for c, s in zip(trial["chunks"],
                                                              trial["shards"]))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tried = zarr.create_array(store=zarr.storage.MemoryStore(), shape=shape,
                                      dtype=dtype, **trial)
            # One chunk stored (not of the fill value, which zarr would not store): a
            # codec's settings that only its encoder checks (blosc's clevel) fail here
            # rather than at the run's first write.
            if all(shape):
                tried[(0,) * len(shape)] = 1
    except Exception as exc:
        raise OptionError(f"out_options {options!r} are not a valid Zarr array layout: "
                          f"{type(exc).__name__}: {exc}") from None
    return options


def compressor(spec: str, zarr_format: int = 3):
    """A compressor from ``NAME[:LEVEL]``: none, zstd, gzip, blosc (lz4), lz4 (blosc)."""
    name, level = parse_compressor(spec)
    if name == "none":
        return None
    if zarr_format == 2:
        import numcodecs

        made = {"zstd": lambda: numcodecs.Zstd(level=1 if level is None else level),
                "gzip": lambda: numcodecs.GZip(level=6 if level is None else level),
                "blosc": lambda: numcodecs.Blosc("lz4", 5 if level is None else level),
                "lz4": lambda: numcodecs.Blosc("lz4", 5 if level is None else level)}
    else:
        from zarr import codecs

        made = {"zstd": lambda: codecs.ZstdCodec(level=0 if level is None else level),
                "gzip": lambda: codecs.GzipCodec(level=6 if level is None else level),
                "blosc": lambda: codecs.BloscCodec(cname="lz4",
                                                   clevel=5 if level is None else level),
                "lz4": lambda: codecs.BloscCodec(cname="lz4",
                                                 clevel=5 if level is None else level)}
    try:
        return made[name]()
    except (ValueError, TypeError) as exc:  # a level out of the codec's range
        raise OptionError(f"compressor {spec!r}: {exc}") from None


def _reopen(path: str, tries: int = 50):
    """The committed output, opened again. Another writer with ``overwrite=True`` may move it
    aside for an instant while it publishes its own: try again rather than fail."""
    for attempt in range(tries):
        try:
            return zarr.open_array(path, mode="r+")
        except Exception:  # FileNotFoundError, zarr's ArrayNotFoundError
            if attempt == tries - 1:
                raise OutputError(f"out {path!r} was replaced by another writer as this run "
                                  f"finished") from None
            time.sleep(0.01)


class ZarrSink(MatrixSink):
    """Writes into a new Zarr array under a temporary name, renamed on commit; or into a
    given ``zarr.Array`` in place, flagged incomplete in its attributes until commit.

    ``options`` are the checked ``out_options`` (:func:`check_zarr_options`) with ``chunks``
    filled in; a new array is uncompressed unless they say otherwise. An output inside a Zarr
    group (``g.zarr/C``) is of the group's format, and a group with consolidated metadata is
    consolidated again on commit, so that the group lists it.

    ``path`` may be a URL (:mod:`oocgemm.storage.urls`, with ``storage_options``): a new one
    is written where it goes, flagged incomplete until commit and removed on abort; an
    existing one is replaced on commit from a temporary sibling."""

    chunks: tuple[int, int]

    def __init__(self, *, shape, dtype, name: str, path: str | None = None,
                 options: dict | None = None, array: zarr.Array | None = None,
                 attributes: dict | None = None, storage_options: dict | None = None,
                 replace: bool = False, temporary: str | None = None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.name = name
        self.on_disk = True
        self._final = path
        self._temporary = None
        self._attributes = attributes or {}
        self._replace = replace
        self._lock = threading.Lock()
        self._storage_options = storage_options
        self._url = path is not None and urls.is_url(path)
        self._direct = False  # a new URL output, written where it goes
        if temporary is not None:  # an interrupted run's output, continued (resume)
            assert path is not None, "a resumed output has a path"
            self.path = os.path.abspath(path)
            self._temporary = temporary
            with zarr.config.set(pipeline_config(machine.cores())):
                self._array = zarr.open_array(temporary, mode="r+")
            if tuple(self._array.shape) != self.shape or self._array.dtype != self.dtype:
                raise OutputError(f"{temporary!r} is not the output this run writes")
        elif array is None:
            assert path is not None, "a new output needs a path (or an array to write in)"
            if self._url:
                self.path = urls.normal(path)
                self._direct = not urls.exists(path, storage_options, OutputError)
                self._temporary = (path if self._direct else
                                   self.path + files.temporary_suffix())
            else:
                self.path = os.path.abspath(path)
                self._temporary = files.temporary_sibling(path)
            options = dict(options or {})
            options.setdefault("chunks", self.shape)
            options.setdefault("compressors", None)
            options.setdefault("zarr_format", 3)
            options.setdefault("fill_value", 0)
            kept = options.pop("attributes", None) or {}  # an update in place: the user's
            extra: dict[str, Any] = {"storage_options": storage_options} if self._url else {}
            try:
                with zarr.config.set(pipeline_config(machine.cores())):
                    self._array = zarr.create_array(
                        store=self._temporary, shape=self.shape, dtype=self.dtype,
                        attributes={**kept, "oocgemm": {"complete": False}}, **options,
                        **extra)
            except BaseException:  # an interrupt too: what was begun goes
                self.abort()
                raise
        else:
            self._array = array
            self.path = None
            array.attrs["oocgemm"] = {"complete": False}
        # The unit a write rewrites: the shard of a sharded array (its inner chunks share one
        # object), else the chunk. Blocks aligned to inner chunks only would race on a shard.
        self.chunks = tuple(getattr(self._array, "shards", None) or self._array.chunks)
        # Whole chunks of an output this run creates on a local disk are encoded by the
        # calling thread and stored as files, not through zarr's codec pipeline (whose
        # event loop serialises what the writer threads hand it).
        self._writer = (direct(self._array)
                        if self._temporary is not None and not self._url else None)
        w = self._writer  # one Framing, whose padding frames are encoded once
        self._framing = (frames.Framing(self.chunks, self.shape, self.dtype.itemsize,
                                        codec=w.codec)
                         if w is not None and frames.storable(w.codec, w.fill, self.dtype)
                         else None)

    def _aligned(self, rows, cols) -> bool:
        """The region (not empty) covers whole chunks only."""
        return on_chunk_edges((rows, cols), self.chunks, self.shape)

    def guard(self, source: ZarrSource) -> None:
        """``source`` reads the array this sink updates in place: its reads and the writes
        that rewrite chunks other blocks share take one lock. (A write of whole chunks only
        touches chunks that no other block reads.)"""
        source.lock = self._lock

    def write(self, rows, cols, block):
        selection = (slice(*rows), slice(*cols))
        if self._writer is not None and self._aligned(rows, cols):
            for index in chunks_of((tuple(rows), tuple(cols)), self.chunks):
                (r0, r1), (c0, c1) = chunk_region(index, self.chunks, self.shape)
                self._writer.write(index, block[r0 - rows[0]:r1 - rows[0],
                                                c0 - cols[0]:c1 - cols[0]])
            return
        if self._aligned(rows, cols):
            self._array[selection] = block
        else:  # blocks that share a chunk would lose each other's updates
            with self._lock:
                self._array[selection] = block

    def framing(self):
        """C's chunks may come as zstd frames where this run creates the array on a local
        disk, unsharded, its chunks zstd without a checksum (:func:`.frames.storable`)."""
        return self._framing

    def store_frames(self, index, rows, cols, parts) -> None:
        assert self._writer is not None
        self._writer.write_frames(index, parts)

    @property
    def temporary_path(self) -> str | None:
        """Where the output is written until its commit (None: written in place)."""
        return self._temporary

    def close_partial(self) -> None:
        """Leave the temporary output where it is, for a later resume."""
        self._temporary = None

    def commit(self):
        self._array.attrs["oocgemm"] = {"complete": True, **self._attributes}
        if self._temporary is None:
            return self._array
        if self._url:
            if not self._direct:
                urls.replace(self._temporary, self._final, self._storage_options)
            self._temporary = None
            return zarr.open_array(self._final, mode="r+",
                                   storage_options=self._storage_options)
        files.publish(self._temporary, self._final, replace=self._replace)
        self._temporary = None
        group = parent_group(self._final)
        if group is not None and group.metadata.consolidated_metadata is not None:
            with warnings.catch_warnings():  # zarr: consolidated v3 metadata is not spec
                warnings.simplefilter("ignore")
                zarr.consolidate_metadata(os.path.dirname(os.path.abspath(self._final)))
        return _reopen(self._final)

    def abort(self):
        if self._temporary is not None:
            if self._url:
                urls.remove(self._temporary, self._storage_options)
            else:
                files.remove(self._temporary)
            self._temporary = None

    def array(self):
        return self._array

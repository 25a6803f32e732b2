"""Zarr storage floors and chunk decode rates: how fast can a store's chunks reach host memory?

Three subcommands (``python -m benchmarks.zarr_io SUBCOMMAND --help`` for the options)::

    python -m benchmarks.zarr_io make --n 8192 --chunk 4096 --layout v3|v3-sharded|v2 DIR
    python -m benchmarks.zarr_io floor DIR... [--threads 16] [--drop-caches]
    python -m benchmarks.zarr_io decode DIR... [--threads 16] [--decoders
    zarr,zarrs,tensorstore,numcodecs]

``make`` writes a test store the way a user with zarr-python's defaults would (random float64,
zstd, chunk-aligned parallel writes; the shards of ``v3-sharded`` hold 512² chunks); the data of
each stored object is ``default_rng([seed, *index])``, the seed recorded in the attributes, so
``decode`` can check every decoder against regenerated data.

``floor`` measures the disk under the stores: parallel os-level reads of every chunk file, cold
(after dropping the page cache) and warm, and parallel writes with fsync of as many files as
threads, the largest store's bytes in all, beside the first store (C's storage floor).

``decode`` reads each whole store into a preallocated array, every stored chunk decoded once, with
each decoder that imports here: zarr-python's own pipeline (under several concurrency settings),
zarr-python's fused pipeline where it has one, the ``zarrs`` codec pipeline, tensorstore, and a
direct reader (chunk files + numcodecs) that shows what is left when the library overheads go.
Each case runs in a fresh interpreter so that zarr's event loop and thread pools, and the zarrs and
tensorstore pools, start from that case's own settings.

Variants of ``decode`` (each fills one preallocated row-major array, timed from the first read):
``whole`` one call for the whole array into it; ``chunks`` N threads share the stored objects
(chunks, or shards), each read into its place; ``bands`` N threads share row bands of whole
stored objects (C-contiguous places); ``inner`` N threads share the inner chunks of a sharded
array (a partial read of a shard each); ``direct`` (numcodecs) decodes each chunk straight into
a chunk-major destination, no copy.

Rates are GB/s, 1e9 bytes per second. ``decode`` divides the decoded bytes (the dtype's bytes, the
array in memory) by the median time of ``--repeat`` reads, and shows the stored bytes beside them.
``floor`` needs only numpy; ``make`` needs zarr; each decoder is imported only in its own cases.
``decode`` reads only stores that ``make`` wrote: the check needs their seed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata as _metadata
from importlib import util as _importlib_util
from pathlib import Path

import numpy as np

from benchmarks.common import write_json

GB = 1e9
"""Bytes in the GB of every rate printed (GB/s)."""

ATTR = "benchmarks.zarr_io"
"""Attribute under which ``make`` records how the data was generated."""

METADATA_FILES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})
"""Files of a store that are metadata, not chunks."""

_UINT64_MASK = (1 << 64) - 1

LAYOUTS = ("v3", "v3-sharded", "v2")
INNER = 512
"""Side of the inner chunks of a ``v3-sharded`` store (elements)."""
CASE_TIMEOUT = 600
"""Seconds one decode case may take in its own interpreter."""
DECODERS = ("zarr", "zarr-fused", "zarrs", "tensorstore", "numcodecs")
VARIANTS = ("whole", "chunks", "bands", "inner", "direct")
_VARIANTS_OF = {
    "zarr": ("whole", "chunks", "bands", "inner"),
    "zarr-fused": ("whole", "chunks", "bands", "inner"),
    "zarrs": ("whole", "chunks", "bands", "inner"),
    "tensorstore": ("whole", "chunks", "bands", "inner"),
    "numcodecs": ("chunks", "inner", "direct"),
}
_INSTALL_HINT = {
    "zarr": "pip install zarr",
    "zarr-fused": "needs zarr-python with zarr.core.codec_pipeline.FusedCodecPipeline (3.4 has it)",
    "zarrs": "pip install zarrs",
    "tensorstore": "pip install tensorstore",
    "numcodecs": "pip install numcodecs",
}


class BenchError(ValueError):
    """A store, option or decoder that this benchmark cannot handle; the message says which."""


# ----------------------------------------------------------------------------------------------
# Stores
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreInfo:
    """What the benchmark needs to know about one Zarr array on local disk, read from its JSON."""

    path: str
    """The array's folder, absolute."""
    zarr_format: int
    """2 or 3."""
    shape: tuple[int, ...]
    """Array shape (elements)."""
    dtype: str
    """numpy dtype string of the array in memory, e.g. ``<f8``."""
    unit: tuple[int, ...]
    """Shape of one stored object, the file a key names: the shard when sharded, else the chunk."""
    inner: tuple[int, ...]
    """Shape of the innermost chunk, the unit of compression; equal to ``unit`` unless sharded."""
    sharded: bool
    """Whether the array's array->bytes codec is ``sharding_indexed``."""
    codecs: tuple[str, ...]
    """Codec names outermost first, for the table (``zstd``, ``sharding_indexed[zstd]``, ...)."""
    files: tuple[str, ...] = field(repr=False)
    """Every chunk file under the store (metadata files left out)."""
    stored_bytes: int = 0
    """Total size of ``files`` (bytes on disk, as the file sizes say)."""
    seed: int | None = None
    """The seed ``make`` generated the data from; None for a store ``make`` did not write."""
    meta: dict = field(default_factory=dict, repr=False, compare=False)
    """The array's metadata as stored (zarr.json, or .zarray for version 2)."""

    @property
    def decoded_bytes(self) -> int:
        """Bytes of the array in memory."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def grid(self) -> tuple[int, ...]:
        """Number of stored objects along each axis."""
        return tuple(-(-s // u) for s, u in zip(self.shape, self.unit))

    @property
    def label(self) -> str:
        """A short description of the layout, e.g. ``v3 zstd 4096x4096 shards of 512x512``."""
        codec = "+".join(self.codecs) or "raw"
        unit = "x".join(map(str, self.unit))
        if self.sharded:
            return f"v{self.zarr_format} {codec} {unit} shards of {'x'.join(map(str, self.inner))}"
        return f"v{self.zarr_format} {codec} {unit} chunks"

    def key(self, index: Sequence[int]) -> str:
        """Path of the stored object at grid ``index``, under zarr's default chunk key encoding
        (``make`` writes no other)."""
        if self.zarr_format == 2:
            return os.path.join(self.path, ".".join(map(str, index)))
        return os.path.join(self.path, "c", *map(str, index))

    def units(self) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
        """Every stored object as (grid index, its region of the array), in C order."""
        return [(idx, self.region(idx, self.unit)) for idx in np.ndindex(*self.grid)]

    def region(self, index: Sequence[int], step: Sequence[int]) -> tuple[slice, ...]:
        """The array region of block ``index`` in a grid of ``step``-sized blocks, clipped."""
        return tuple(slice(i * s, min((i + 1) * s, n)) for i, s, n in zip(index, step, self.shape))

    def inner_chunks(self) -> list[tuple[slice, ...]]:
        """Regions of every innermost chunk, C order (stored objects' order for unsharded
        arrays)."""
        grid = tuple(-(-s // c) for s, c in zip(self.shape, self.inner))
        return [self.region(idx, self.inner) for idx in np.ndindex(*grid)]

    def bands(self) -> list[tuple[slice, ...]]:
        """Row bands of whole stored objects: each is C-contiguous in a row-major array."""
        rows = self.unit[0]
        rest = tuple(slice(0, n) for n in self.shape[1:])
        return [
            (slice(r, min(r + rows, self.shape[0])), *rest) for r in range(0, self.shape[0], rows)
        ]


def _codec_label(codecs: Iterable[dict]) -> list[str]:
    names = []
    for c in codecs:
        name = c["name"] if isinstance(c, dict) else str(c)
        if name == "bytes":
            continue
        if name == "sharding_indexed":
            inner = _codec_label(c.get("configuration", {}).get("codecs", []))
            names.append(f"sharding[{'+'.join(inner) or 'raw'}]")
        else:
            names.append(name)
    return names


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _chunk_files(path: str) -> tuple[list[str], int]:
    files, total = [], 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            if name in METADATA_FILES:
                continue
            p = os.path.join(root, name)
            files.append(p)
            total += os.path.getsize(p)
    files.sort()
    return files, total


def describe_store(path: str) -> StoreInfo:
    """Read a Zarr array's metadata (version 2 or 3, local folder) into a `StoreInfo`.

    Raises
    ------
    BenchError
        If ``path`` holds no Zarr array, or one of a kind this benchmark does not handle.
    """
    path = os.path.abspath(path)
    attrs: dict = {}
    if os.path.exists(os.path.join(path, "zarr.json")):
        meta = _read_json(os.path.join(path, "zarr.json"))
        if meta.get("node_type") != "array":
            raise BenchError(f"{path} is a Zarr {meta.get('node_type')}, expected an array")
        shape = tuple(meta["shape"])
        dtype = np.dtype(meta["data_type"]).newbyteorder("=").str
        unit = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
        codecs = meta["codecs"]
        sharded = any(c["name"] == "sharding_indexed" for c in codecs)
        inner = unit
        if sharded:
            inner = tuple(
                next(c for c in codecs if c["name"] == "sharding_indexed")["configuration"][
                    "chunk_shape"
                ]
            )
        labels = _codec_label(codecs)
        zarr_format = 3
        attrs = meta.get("attributes") or {}
    elif os.path.exists(os.path.join(path, ".zarray")):
        meta = _read_json(os.path.join(path, ".zarray"))
        shape = tuple(meta["shape"])
        dtype = np.dtype(meta["dtype"]).newbyteorder("=").str
        unit = inner = tuple(meta["chunks"])
        sharded = False
        comp = meta.get("compressor")
        labels = [f["id"] for f in meta.get("filters") or []] + ([comp["id"]] if comp else [])
        zarr_format = 2
        if os.path.exists(os.path.join(path, ".zattrs")):
            attrs = _read_json(os.path.join(path, ".zattrs"))
    else:
        raise BenchError(f"{path} is not a Zarr array: it has neither zarr.json nor .zarray")
    files, total = _chunk_files(path)
    gen = attrs.get(ATTR) or {}
    seed = gen.get("seed") if tuple(gen.get("unit", ())) == unit else None
    return StoreInfo(
        path=path,
        zarr_format=zarr_format,
        shape=shape,
        dtype=dtype,
        unit=unit,
        inner=inner,
        sharded=sharded,
        codecs=tuple(labels),
        files=tuple(files),
        stored_bytes=total,
        seed=seed,
        meta=meta,
    )


# ----------------------------------------------------------------------------------------------
# Generated data and checksums
# ----------------------------------------------------------------------------------------------


def unit_data(seed: int, index: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """The float64 data ``make`` writes into the stored object at grid ``index`` (clipped
    ``shape``): a stream of its own per object, so that any object can be regenerated alone."""
    return np.random.default_rng([seed, *map(int, index)]).random(tuple(shape))


def checksum(a: np.ndarray) -> int:
    """Sum of the array's elements read as unsigned integers, modulo 2**64.

    Independent of the order of the elements, so an array decoded into a blocked layout sums the
    same as the row-major one; an unwritten (poisoned) element changes it.
    """
    a = np.ascontiguousarray(a)
    size = a.dtype.itemsize
    view = a.reshape(-1).view(
        f"u{size}" if size in (1, 2, 4, 8) else ("u8" if size % 8 == 0 else "u1")
    )
    return int(np.add.reduce(view, dtype=np.uint64)) & _UINT64_MASK


def expected_checksum(info: StoreInfo, threads: int) -> int:
    """Checksum of the data ``make`` wrote, regenerated (needs ``info.seed``)."""

    def one(item):
        idx, sl = item
        return checksum(unit_data(info.seed, idx, [s.stop - s.start for s in sl]))

    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(one, info.units())) & _UINT64_MASK


def _parallel(fn: Callable, items: Sequence, threads: int) -> None:
    """Run ``fn`` over ``items`` on ``threads`` threads; the first exception is raised."""
    if threads <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(min(threads, len(items))) as ex:
        for _ in ex.map(fn, items):
            pass


# ----------------------------------------------------------------------------------------------
# Page cache and raw file I/O
# ----------------------------------------------------------------------------------------------


def drop_caches(files: Iterable[str]) -> str:
    """Evict ``files`` from the page cache before a cold measurement.

    Returns how: ``drop_caches`` (``sync; echo 3 > /proc/sys/vm/drop_caches``, needs root),
    ``fadvise`` (``POSIX_FADV_DONTNEED`` on each file, where the former is not permitted), or ``""``
    when neither worked and the measurement is not cold.
    """
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        for p in files:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"
    except (OSError, AttributeError):
        return ""


def _read_whole_file(path: str, local: threading.local) -> memoryview:
    """The file's bytes in this thread's reusable buffer (valid until its next call): a buffer
    faulted in once per thread, not a fresh allocation per file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        buf = getattr(local, "buf", None)
        if buf is None or len(buf) < size:
            buf = local.buf = bytearray(max(size, 1))
        mv = memoryview(buf)
        got = 0
        while got < size:
            n = os.readv(fd, [mv[got:size]])
            if n == 0:
                break
            got += n
        return mv[:got]
    finally:
        os.close(fd)


def read_files(files: Sequence[str], threads: int, block: int = 16 << 20) -> tuple[int, float]:
    """Read every file once on ``threads`` threads: os-level reads of ``block`` bytes into one
    buffer per thread, allocated and faulted in before the clock starts.

    Returns
    -------
    (bytes read, seconds)
    """
    order = sorted(files, key=os.path.getsize, reverse=True)
    threads = max(1, min(threads, len(order)))
    buffers = [np.ones(block, dtype=np.uint8) for _ in range(threads)]
    counts = [0] * threads
    lock = threading.Lock()
    todo = iter(order)

    def work(t: int) -> None:
        mv = memoryview(buffers[t])
        while True:
            with lock:
                p = next(todo, None)
            if p is None:
                return
            fd = os.open(p, os.O_RDONLY)
            try:
                while n := os.readv(fd, [mv]):
                    counts[t] += n
            finally:
                os.close(fd)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts), time.perf_counter() - t0


def write_files(folder: str, total: int, threads: int) -> tuple[int, float]:
    """Write ``total`` bytes as ``threads`` files of equal size into ``folder``, each fsynced.

    The files are removed afterwards. Returns (bytes written, seconds to the last fsync).
    """
    os.makedirs(folder, exist_ok=True)
    per = max(1, -(-total // threads))
    block = np.random.default_rng(0).integers(0, 256, size=min(per, 16 << 20), dtype=np.uint8)
    paths = [
        os.path.join(folder, f".zarr_io_write_floor_{os.getpid()}_{i}") for i in range(threads)
    ]

    def one(p: str) -> None:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = per
            while left:
                left -= os.write(fd, block[: min(left, len(block))])
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        t0 = time.perf_counter()
        _parallel(one, paths, threads)
        seconds = time.perf_counter() - t0
    finally:
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
    return per * threads, seconds


# ----------------------------------------------------------------------------------------------
# make
# ----------------------------------------------------------------------------------------------


def make_store(path: str, *, n: int, chunk: int, layout: str, seed: int = 0,
               threads: int = 1) -> dict:
    """Write an n x n float64 array of random data the way a zarr-python user with its defaults
    would (zstd, ``zarr.create_array``), one stored object per write, on ``threads`` threads.

    ``chunk`` is the side of a chunk (``v3``, ``v2``) or of a shard of `INNER`-sided chunks
    (``v3-sharded``); ``path`` is replaced if it exists. Returns what was written, with the
    seconds it took and the stored bytes.
    """
    import zarr

    if layout not in LAYOUTS:
        raise BenchError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    sharded = layout == "v3-sharded"
    if sharded and chunk % INNER:
        raise BenchError(f"the shard side {chunk} is not a multiple of the inner chunk side "
                         f"{INNER}")
    shape = {"chunks": (INNER, INNER), "shards": (chunk, chunk)} if sharded else {
        "chunks": (chunk, chunk)}
    arr = zarr.create_array(store=path, shape=(n, n), dtype="float64",
                            zarr_format=2 if layout == "v2" else 3, overwrite=True,
                            attributes={ATTR: {"seed": seed, "unit": [chunk, chunk]}}, **shape)
    units = [(idx, tuple(slice(i * chunk, min((i + 1) * chunk, n)) for i in idx))
             for idx in np.ndindex(-(-n // chunk), -(-n // chunk))]

    def one(item) -> None:
        idx, sl = item
        arr[sl] = unit_data(seed, idx, [s.stop - s.start for s in sl])

    t0 = time.perf_counter()
    _parallel(one, units, threads)
    seconds = time.perf_counter() - t0
    info = describe_store(path)
    return {"path": info.path, "label": info.label, "n": n, "threads": threads,
            "seconds": seconds, "decoded_bytes": info.decoded_bytes,
            "stored_bytes": info.stored_bytes, "files": len(info.files)}


# ----------------------------------------------------------------------------------------------
# Decoders. Each reads the whole store into a preallocated array, each stored chunk once.
# ----------------------------------------------------------------------------------------------


def alloc_out(shape: Sequence[int], dtype: str) -> np.ndarray:
    """The destination array (pageable numpy today; the place to put pinned host memory)."""
    return np.empty(tuple(shape), dtype=dtype)


class Reader:
    """One decoder in one variant, filling ``out`` (a row-major array of the store's shape)."""

    note = ""

    def __init__(self, info: StoreInfo, variant: str, threads: int) -> None:
        self.info = info
        self.variant = variant
        self.threads = threads
        self.out = alloc_out(info.shape, info.dtype)

    def poison(self) -> None:
        """Fill the destination with 0xFF bytes (NaN for floats), which also faults its pages in."""
        self.out.reshape(-1).view(np.uint8).fill(0xFF)

    def run(self) -> None:
        """Read and decode the whole store into the destination (the timed part)."""
        raise NotImplementedError

    def region(self, sl: tuple[slice, ...]) -> np.ndarray:
        """The decoded values of region ``sl`` (for the correctness check)."""
        return self.out[sl]

    def checksum(self) -> int:
        return checksum(self.out)

    def pieces(self) -> list[tuple[slice, ...]]:
        """The regions that the threads share out, one read each."""
        if self.variant == "chunks":
            return [sl for _, sl in self.info.units()]
        if self.variant == "inner":
            return self.info.inner_chunks()
        if self.variant == "bands":
            return self.info.bands()
        raise BenchError(f"variant {self.variant!r} has no pieces")


class ZarrReader(Reader):
    """zarr-python's own API: ``get_basic_selection(region, out=NDBuffer)``, under a codec pipeline.

    ``whole`` reads the array in one call into ``out``; ``chunks``/``inner``/``bands`` share
    stored objects / innermost chunks / row bands of whole stored objects out to ``threads``
    Python threads, each reading into its place of ``out``. The ``zarrs`` pipeline decodes only
    into C-contiguous arrays: its ``chunks`` and ``inner`` read into a per-thread scratch array
    and copy into place.
    """

    def __init__(
        self, info: StoreInfo, variant: str, threads: int, config: dict, expect_pipeline: str = ""
    ) -> None:
        super().__init__(info, variant, threads)
        import zarr
        from zarr.core.buffer.cpu import NDBuffer

        zarr.config.set(config)
        self._ndbuffer = NDBuffer
        self.array = zarr.open_array(info.path, mode="r")
        pipeline = type(self.array._async_array.codec_pipeline).__name__
        if expect_pipeline and pipeline != expect_pipeline:
            raise BenchError(
                f"the array opened with codec pipeline {pipeline}, expected {expect_pipeline}"
            )
        self.contiguous_only = pipeline == "ZarrsCodecPipeline"
        self._local = threading.local()
        if self.contiguous_only and variant in ("chunks", "inner"):
            self.note = "scratch+copy"

    def _into(self, sl: tuple[slice, ...]) -> None:
        dest = self.out[sl]
        if self.contiguous_only and not dest.flags.c_contiguous:
            scratch = _scratch(self._local, dest.shape, dest.dtype)
            self.array.get_basic_selection(sl, out=self._ndbuffer.from_numpy_array(scratch))
            dest[...] = scratch
        else:
            self.array.get_basic_selection(sl, out=self._ndbuffer.from_numpy_array(dest))

    def run(self) -> None:
        if self.variant == "whole":
            self.array.get_basic_selection(Ellipsis, out=self._ndbuffer.from_numpy_array(self.out))
        else:
            _parallel(self._into, self.pieces(), self.threads)


class TensorstoreReader(Reader):
    """tensorstore's ``zarr3``/``zarr`` drivers on a ``file`` kvstore, no cache, ``threads`` as its
    data-copy and file-I/O concurrency. ``whole``: ``ts.array(out).write(source)``; the piecewise
    variants write each region of the source into the same region of ``ts.array(out)``, one Python
    thread waiting per region."""

    def __init__(self, info: StoreInfo, variant: str, threads: int) -> None:
        super().__init__(info, variant, threads)
        import tensorstore as ts

        self._ts = ts
        ctx = ts.Context(
            {
                "data_copy_concurrency": {"limit": threads},
                "file_io_concurrency": {"limit": threads},
                "cache_pool": {"total_bytes_limit": 0},
            }
        )
        driver = "zarr3" if info.zarr_format == 3 else "zarr"
        spec = {"driver": driver, "kvstore": {"driver": "file", "path": info.path}}
        self.source = ts.open(spec, context=ctx, read=True).result()

    def run(self) -> None:
        dest = self._ts.array(self.out, copy=False, write=True)
        if self.variant == "whole":
            dest.write(self.source).result()
        else:
            _parallel(
                lambda sl: dest[sl].write(self.source[sl]).result(), self.pieces(), self.threads
            )


def _scratch(local: threading.local, shape: tuple[int, ...], dtype) -> np.ndarray:
    cache = getattr(local, "scratch", None)
    if cache is None:
        cache = local.scratch = {}
    key = (shape, np.dtype(dtype).str)
    if key not in cache:
        cache[key] = np.empty(shape, dtype=dtype)
    return cache[key]


def _zstd(info: StoreInfo):
    """The numcodecs codec of the store's innermost chunks: zstd, as ``make`` writes them
    (little-endian ``bytes``, no filters); anything else is refused."""
    import numcodecs

    if info.codecs not in (("zstd",), ("sharding[zstd]",)):
        raise BenchError(f"{info.path}: chunks coded {'+'.join(info.codecs) or 'raw'}; the "
                         f"direct reader decodes zstd, as make writes it")
    return numcodecs.Zstd()


class NumcodecsReader(Reader):
    """The floor of decoding: chunk files read with os-level reads, decoded by numcodecs.

    ``chunks``: ``threads`` threads share the stored objects; each reads the whole file and decodes
    it (every inner chunk of a shard, through the shard index) into a per-thread scratch chunk,
    then copies it into its place. ``inner`` (sharded only): each inner chunk on its own, reading
    the shard index and then the chunk's byte range, as a reader of tiles smaller than a shard
    would. ``direct``: the destination is laid out chunk by chunk (a blocked array), so each chunk
    is decoded straight into its block, no copy.
    """

    def __init__(self, info: StoreInfo, variant: str, threads: int) -> None:
        super().__init__(info, variant, threads)
        self.codec = _zstd(info)
        self.cps = tuple(u // c for u, c in zip(info.unit, info.inner))
        """Inner chunks per shard along each axis (ones when unsharded)."""
        self.index_size = 16 * math.prod(self.cps) + 4
        """Bytes of a shard's index at its end: an offset and a size per chunk, and a crc32c."""
        self._local = threading.local()
        self.blocks = None
        if variant == "direct":
            if any(s % c for s, c in zip(info.shape, info.inner)):
                raise BenchError(
                    f"direct needs the shape {info.shape} to be a multiple of the chunk "
                    f"{info.inner}"
                )
            grid = tuple(s // c for s, c in zip(info.shape, info.inner))
            self.out = None
            self.blocks = alloc_out(grid + info.inner, info.dtype)

    def poison(self) -> None:
        target = self.blocks if self.blocks is not None else self.out
        target.reshape(-1).view(np.uint8).fill(0xFF)

    def checksum(self) -> int:
        return checksum(self.blocks if self.blocks is not None else self.out)

    def region(self, sl: tuple[slice, ...]) -> np.ndarray:
        if self.blocks is None:
            return self.out[sl]
        c = self.info.inner
        d = len(c)
        sub = self.blocks[tuple(slice(s.start // k, -(-s.stop // k)) for s, k in zip(sl, c))]
        axes = [a for pair in zip(range(d), range(d, 2 * d)) for a in pair]
        full = sub.transpose(axes).reshape([sub.shape[i] * c[i] for i in range(d)])
        return full[tuple(slice(0, s.stop - s.start) for s in sl)]

    def _place(self, data, grid_index: tuple[int, ...]) -> None:
        """Decode one innermost chunk at innermost-grid ``grid_index``: into its block
        (``direct``), else into a scratch chunk copied into its region, clipped at the edge."""
        if self.blocks is not None:
            self.codec.decode(data, out=self.blocks[grid_index].reshape(-1).view(np.uint8))
            return
        info = self.info
        sl = info.region(grid_index, info.inner)
        scratch = _scratch(self._local, info.inner, info.dtype)
        self.codec.decode(data, out=scratch.reshape(-1).view(np.uint8))
        self.out[sl] = scratch[tuple(slice(0, s.stop - s.start) for s in sl)]

    def _index(self, index_bytes) -> np.ndarray:
        return np.frombuffer(index_bytes, dtype="<u8", count=2 * math.prod(self.cps)).reshape(
            self.cps + (2,)
        )

    def _unit(self, idx: tuple[int, ...]) -> None:
        """One stored object read whole: a chunk, or every inner chunk of a shard."""
        info = self.info
        data = _read_whole_file(info.key(idx), self._local)
        if not info.sharded:
            self._place(data, idx)
            return
        index = self._index(data[-self.index_size :])
        base = tuple(i * k for i, k in zip(idx, self.cps))
        for j in np.ndindex(*self.cps):
            gi = tuple(b + k for b, k in zip(base, j))
            if any(g * c >= s for g, c, s in zip(gi, info.inner, info.shape)):
                continue  # entirely past the array's edge: not stored
            off, nb = (int(v) for v in index[j])
            self._place(data[off : off + nb], gi)

    def _inner(self, gi: tuple[int, ...]) -> None:
        """One inner chunk of a shard read on its own: the index, then the chunk's bytes."""
        idx = tuple(g // k for g, k in zip(gi, self.cps))
        j = tuple(g % k for g, k in zip(gi, self.cps))
        fd = os.open(self.info.key(idx), os.O_RDONLY)
        try:
            at = os.fstat(fd).st_size - self.index_size
            off, nb = (int(v) for v in self._index(os.pread(fd, self.index_size, at))[j])
            data = os.pread(fd, nb, off)
        finally:
            os.close(fd)
        self._place(data, gi)

    def run(self) -> None:
        info = self.info
        if self.variant == "inner":
            grid = tuple(-(-s // c) for s, c in zip(info.shape, info.inner))
            _parallel(self._inner, list(np.ndindex(*grid)), self.threads)
        else:
            _parallel(self._unit, list(np.ndindex(*info.grid)), self.threads)


def make_reader(info: StoreInfo, decoder: str, variant: str, threads: int, config: dict) -> Reader:
    """The reader for one case (imports its decoder)."""
    if variant not in _VARIANTS_OF.get(decoder, ()):
        raise BenchError(
            f"decoder {decoder!r} has no variant {variant!r}: it has "
            f"{', '.join(_VARIANTS_OF.get(decoder, ()))}"
        )
    if variant == "inner" and not info.sharded:
        raise BenchError("inner is for sharded arrays; for others it is 'chunks'")
    if decoder == "zarr":
        return ZarrReader(info, variant, threads, config, "BatchedCodecPipeline")
    if decoder == "zarr-fused":
        return ZarrReader(info, variant, threads, config, "FusedCodecPipeline")
    if decoder == "zarrs":
        return ZarrReader(info, variant, threads, config, "ZarrsCodecPipeline")
    if decoder == "tensorstore":
        return TensorstoreReader(info, variant, threads)
    if decoder == "numcodecs":
        return NumcodecsReader(info, variant, threads)
    raise BenchError(f"unknown decoder {decoder!r}: expected one of {', '.join(DECODERS)}")


# ----------------------------------------------------------------------------------------------
# decode: cases, each in its own interpreter
# ----------------------------------------------------------------------------------------------


def zarr_configs(spec: str, threads: int) -> list[tuple[str, dict]]:
    """Parse ``--zarr-configs``: ``default`` (zarr's own settings) and ``tuned``
    (async.concurrency = 4 x threads, threading.max_workers = threads), as a label and the
    settings of each."""
    known = {"default": ("default", {}),
             "tuned": (f"c={4 * threads} w={threads}",
                       {"async.concurrency": 4 * threads, "threading.max_workers": threads})}
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise BenchError(f"zarr config {name!r}: expected default or tuned")
    return [known[name] for name in names]


def _available(decoder: str) -> str:
    """Empty when ``decoder`` can run here, else why not with the install hint."""
    need = {
        "zarr": "zarr",
        "zarr-fused": "zarr",
        "zarrs": "zarrs",
        "tensorstore": "tensorstore",
        "numcodecs": "numcodecs",
    }[decoder]
    if _importlib_util.find_spec(need) is None:
        return f"not installed ({_INSTALL_HINT[decoder]})"
    if decoder == "zarr-fused":
        import zarr.core.codec_pipeline as cp

        if not hasattr(cp, "FusedCodecPipeline"):
            return f"zarr {_version('zarr')} has no FusedCodecPipeline"
    return ""


#: zarr settings that select each non-default codec pipeline, for ``threads`` threads.
_PIPELINES = {
    "zarr-fused": lambda threads: {
        "codec_pipeline.path": "zarr.core.codec_pipeline.FusedCodecPipeline",
        "codec_pipeline.max_workers": threads},
    "zarrs": lambda threads: {
        "codec_pipeline.path": "zarrs.ZarrsCodecPipeline", "codec_pipeline.strict": True},
}


def build_cases(
    info: StoreInfo,
    decoders: Sequence[str],
    threads: int,
    variants: Sequence[str],
    configs: str,
    repeat: int,
    cold: bool,
) -> list[dict]:
    """Every (decoder, variant, config) case to run on one store at one thread count."""
    cases = []
    for dec in decoders:
        for var in variants:
            if var not in _VARIANTS_OF[dec] or (var == "inner" and not info.sharded):
                continue
            if var == "direct" and any(s % c for s, c in zip(info.shape, info.inner)):
                continue  # a blocked destination needs whole chunks
            if dec == "zarr":
                settings = zarr_configs(configs, threads)
            elif dec in _PIPELINES:
                settings = [(f"w={threads}", {**_PIPELINES[dec](threads),
                                              "threading.max_workers": threads,
                                              "async.concurrency": 4 * threads})]
            elif dec == "tensorstore":
                settings = [(f"io={threads}", {})]
            else:
                settings = [("", {})]
            for label, conf in settings:
                cases.append(
                    {
                        "path": info.path,
                        "decoder": dec,
                        "variant": var,
                        "threads": threads,
                        "config": conf,
                        "config_label": label,
                        "repeat": repeat,
                        "cold": cold,
                    }
                )
    return cases


def _sample_units(info: StoreInfo) -> list[tuple[slice, ...]]:
    units = info.units()
    picks = {0, len(units) // 2, len(units) - 1}
    return [units[i][1] for i in sorted(picks)]


def _expected_region(info: StoreInfo, sl: tuple[slice, ...]) -> np.ndarray:
    """The data ``make`` wrote into the stored object whose region is ``sl``, regenerated."""
    idx = tuple(s.start // u for s, u in zip(sl, info.unit))
    return unit_data(info.seed, idx, [s.stop - s.start for s in sl])


def run_case(case: dict) -> dict:
    """Run one case here (in this interpreter): time ``repeat`` reads, then check the result."""
    info = describe_store(case["path"])
    result = {k: case[k] for k in ("decoder", "variant", "threads", "config_label", "repeat")}
    result["config"] = {k: v for k, v in case["config"].items()}
    reader = make_reader(info, case["decoder"], case["variant"], case["threads"], case["config"])
    times, evicted = [], []
    for _ in range(case["repeat"]):
        reader.poison()
        if case["cold"]:
            evicted.append(drop_caches(info.files))
        t0 = time.perf_counter()
        reader.run()
        times.append(time.perf_counter() - t0)
    result["seconds"] = times
    result["cache"] = (
        ("cold (" + evicted[0] + ")" if evicted and all(evicted) else "warm")
        if case["cold"]
        else "warm"
    )
    result["note"] = reader.note
    result["checksum"] = reader.checksum()
    result["samples_bad"] = [[[s.start, s.stop] for s in sl] for sl in _sample_units(info)
                             if not np.array_equal(reader.region(sl), _expected_region(info, sl))]
    return result


def _run_case_subprocess(case: dict, timeout: float = CASE_TIMEOUT) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "benchmarks.zarr_io", "_case", json.dumps(case)]
    base = {k: case[k] for k in ("decoder", "variant", "threads", "config_label", "repeat")}
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=root, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        return {**base, "error": tail.removeprefix("error: ")[-300:]}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------------------
# Tables and the command line
# ----------------------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        return _metadata.version(name)
    except _metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Where and with what the figures were taken."""
    return {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": {
            n: _version(n) for n in ("numpy", "zarr", "numcodecs", "zarrs", "tensorstore")
        },
    }


def _table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    def fmt(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join(
        [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        + [fmt(r) for r in cells[1:]]
    )


def _rate(nbytes: float, seconds: float | None) -> str:
    return "-" if not seconds else f"{nbytes / seconds / GB:.2f}"


def cmd_make(args) -> None:
    rec = make_store(args.dir, n=args.n, chunk=args.chunk, layout=args.layout,
                     threads=os.cpu_count() or 1)
    print(f"{rec['path']}: {rec['label']}, {rec['n']}x{rec['n']} float64, {rec['files']} files, "
          f"{rec['stored_bytes'] / GB:.3f} GB stored of {rec['decoded_bytes'] / GB:.3f} GB, "
          f"written in {rec['seconds']:.2f} s on {rec['threads']} threads "
          f"({_rate(rec['decoded_bytes'], rec['seconds'])} GB/s)")


def cmd_floor(args) -> None:
    infos = [describe_store(d) for d in args.dirs]
    records = []
    for threads in _threads_list(args.threads):
        for info in infos:
            rec = {"path": info.path, "label": info.label, "files": len(info.files),
                   "stored_bytes": info.stored_bytes, "threads": threads}
            if args.drop_caches:
                how = drop_caches(info.files)
                if how:
                    n, s = read_files(info.files, threads)
                    rec.update(cold_bytes=n, cold_seconds=s, cold_how=how)
            else:
                read_files(info.files, threads)  # bring the files into the cache
            n, s = read_files(info.files, threads)
            rec.update(warm_bytes=n, warm_seconds=s)
            records.append(rec)
    rows = [[Path(r["path"]).name, r["label"], r["files"], f"{r['stored_bytes'] / GB:.3f}",
             r["threads"],
             _rate(r.get("cold_bytes", 0), r.get("cold_seconds"))
             + (f" ({r['cold_how']})" if r.get("cold_how") else ""),
             _rate(r["warm_bytes"], r["warm_seconds"])] for r in records]
    print(_table(rows, ["store", "layout", "files", "stored GB", "threads", "cold read GB/s",
                        "warm read GB/s"]))
    total = max(i.stored_bytes for i in infos)
    folder = os.path.dirname(infos[0].path)
    writes = []
    for threads in _threads_list(args.threads):
        n, s = write_files(folder, total, threads)
        writes.append([folder, f"{n / GB:.3f}", threads, f"{s:.2f}", _rate(n, s)])
    print()
    print(_table(writes, ["write folder", "GB", "files = threads", "s (to last fsync)",
                          "write GB/s"]))
    if args.drop_caches and not any("cold_how" in r for r in records):
        print("note: page cache could not be dropped (not root, no fadvise): no cold figures")


def cmd_decode(args) -> None:
    infos = [describe_store(d) for d in args.dirs]
    for info in infos:
        if info.seed is None:
            raise BenchError(f"{info.path} was not written by make: decode checks every decoder "
                             f"against make's regenerated data")
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    for d in decoders:
        if d not in DECODERS:
            raise BenchError(f"unknown decoder {d!r}: expected one of {', '.join(DECODERS)}")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise BenchError(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS)}")
    skipped = {d: why for d in decoders if (why := _available(d))}
    for d, why in skipped.items():
        print(f"skipping {d}: {why}", flush=True)
    run_decoders = [d for d in decoders if d not in skipped]
    thread_counts = _threads_list(args.threads)
    records = []
    for info in infos:
        expected = expected_checksum(info, max(thread_counts))
        print(f"{info.path}: {info.label}, {'x'.join(map(str, info.shape))} {info.dtype}, "
              f"{len(info.files)} files, {info.stored_bytes / GB:.3f} GB stored of "
              f"{info.decoded_bytes / GB:.3f} GB; checked against regenerated data", flush=True)
        if not args.drop_caches:
            read_files(info.files, max(thread_counts))  # warm: the files start in the page cache
        if "direct" in variants and any(n % c for n, c in zip(info.shape, info.inner)):
            print(f"  direct skipped: the shape is not a multiple of the chunk {info.inner}")
        for threads in thread_counts:
            for case in build_cases(info, run_decoders, threads, variants, args.zarr_configs,
                                    args.repeat, args.drop_caches):
                res = _run_case_subprocess(case)
                res.update(path=info.path, label=info.label, decoded_bytes=info.decoded_bytes,
                           stored_bytes=info.stored_bytes)
                if "error" not in res:
                    res["ok"] = not res["samples_bad"] and res["checksum"] == expected
                    res["median_seconds"] = statistics.median(res["seconds"])
                    res["best_seconds"] = min(res["seconds"])
                records.append(res)
                _print_progress(res)
    print()
    print(decode_table(records))
    if args.drop_caches and any(r.get("cache") == "warm" for r in records):
        print("note: page cache could not be dropped: figures marked warm")
    write_json(args.json, {"environment": environment(), "decode": records, "skipped": skipped})
    if args.json:
        print(f"wrote {args.json}")


def _print_progress(r: dict) -> None:
    name = (f"{Path(r['path']).name} {r['decoder']} {r['variant']} t={r['threads']} "
            f"{r.get('config_label', '')}")
    if "error" in r:
        print(f"  {name}: error: {r['error']}", flush=True)
    else:
        print(
            f"  {name}: {_rate(r['decoded_bytes'], r['median_seconds'])} GB/s, "
            f"{'ok' if r['ok'] else 'WRONG'}",
            flush=True,
        )


def decode_table(records: list[dict]) -> str:
    """The decode results as a Markdown table (median of the repeats)."""
    rows = []
    for r in records:
        store = Path(r["path"]).name
        if "error" in r:
            rows.append(
                [
                    store,
                    r["decoder"],
                    r["variant"],
                    r["threads"],
                    r.get("config_label", ""),
                    "-",
                    "-",
                    "-",
                    "-",
                    "error: " + r["error"][:80],
                ]
            )
            continue
        rows.append(
            [
                store,
                r["decoder"],
                r["variant"] + (f" ({r['note']})" if r.get("note") else ""),
                r["threads"],
                r["config_label"],
                r["cache"],
                f"{r['median_seconds']:.3f}",
                _rate(r["decoded_bytes"], r["median_seconds"]),
                _rate(r["stored_bytes"], r["median_seconds"]),
                "ok" if r["ok"] else "WRONG",
            ]
        )
    return _table(
        rows,
        [
            "store",
            "decoder",
            "variant",
            "threads",
            "config",
            "cache",
            "median s",
            "decoded GB/s",
            "stored GB/s",
            "check",
        ],
    )


def _threads_list(spec: str) -> list[int]:
    """``--threads``: a number or a comma list like 1,4,16."""
    try:
        vals = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise BenchError(
            f"--threads {spec!r}: expected a number or a comma list like 1,4,16"
        ) from None
    if not vals or min(vals) < 1:
        raise BenchError(f"--threads {spec!r}: expected numbers of at least 1")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.zarr_io",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    cpus = os.cpu_count() or 1

    m = sub.add_parser("make", help="write a test store of random float64 with zarr-python's "
                                    "defaults, on every core")
    m.add_argument("dir")
    m.add_argument("--n", type=int, default=8192, help="rows and columns (default 8192)")
    m.add_argument("--chunk", type=int, default=4096,
                   help=f"chunk side; the shard side for v3-sharded, whose chunks are {INNER}² "
                        f"(default 4096)")
    m.add_argument("--layout", choices=LAYOUTS, default="v3")

    f = sub.add_parser("floor", help="raw parallel read rate of the stores' chunk files, and a "
                                     "write rate")
    f.add_argument("dirs", nargs="+", metavar="DIR")
    f.add_argument("--threads", default=str(cpus),
                   help=f"a number or a comma list like 1,4,16 (default {cpus})")
    f.add_argument("--drop-caches", action="store_true",
                   help="also a cold read, after dropping the page cache")

    d = sub.add_parser("decode", help="whole-store parallel read + decode into memory, per "
                                      "decoder (stores make wrote)")
    d.add_argument("dirs", nargs="+", metavar="DIR")
    d.add_argument("--threads", default=str(cpus),
                   help=f"a number or a comma list (default {cpus})")
    d.add_argument("--decoders", default=",".join(DECODERS),
                   help=f"comma list of {', '.join(DECODERS)} (default all; those not installed "
                        f"are skipped)")
    d.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma list of {', '.join(VARIANTS)} (default all)")
    d.add_argument("--zarr-configs", default="default,tuned",
                   help="zarr-python settings to try: default, tuned (async.concurrency 4 x "
                        "threads, threading.max_workers threads) (default default,tuned)")
    d.add_argument("--repeat", type=int, default=3,
                   help="timed reads per case; the table shows the median (default 3)")
    d.add_argument("--drop-caches", action="store_true",
                   help="drop the page cache before every timed read (cold)")
    d.add_argument("--json", metavar="FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_case"]:  # internal: one decode case in a fresh interpreter
        print(json.dumps(run_case(json.loads(argv[1]))))
        return 0
    args = build_parser().parse_args(argv)
    try:
        {"make": cmd_make, "floor": cmd_floor, "decode": cmd_decode}[args.command](args)
        return 0
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

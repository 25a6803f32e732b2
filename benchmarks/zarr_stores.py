"""The test stores of the Zarr benchmarks: what a zarr-python user with its defaults writes, in
each layout, with data that any stored object can be regenerated from.

``make_store`` writes an n x n float64 array (zstd, zarr's default) as ``v3`` (chunks),
``v3-sharded`` (shards of 512² chunks) or ``v2``; the data of each stored object is
``default_rng([seed, *index])``, the seed recorded in the array's attributes, so that a reader
can be checked against regenerated data (`unit_data`, `checksum`, `expected_checksum`).
``describe_store`` reads what the benchmarks need to know about a store (its layout, codecs,
chunk files) from its metadata. ``python -m benchmarks.zarr_io make`` is the command line of
``make_store``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from benchmarks.common import BenchError, run_parallel

ATTR = "benchmarks.zarr_io"
"""Attribute under which ``make`` records how the data was generated (the name of the module that
first wrote it, kept so that stores written before still check)."""

METADATA_FILES = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})
"""Files of a store that are metadata, not chunks."""

LAYOUTS = ("v3", "v3-sharded", "v2")
INNER = 512
"""Side of the inner chunks of a ``v3-sharded`` store (elements)."""


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


def store_files(*paths: str) -> list[str]:
    """Every chunk file of the stores at ``paths``: what a warm-up reads, or a cold run evicts."""
    return [f for p in paths for f in describe_store(p).files]


def unit_data(seed: int, index: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """The float64 data ``make`` writes into the stored object at grid ``index`` (clipped
    ``shape``): a stream of its own per object, so that any object can be regenerated alone."""
    return np.random.default_rng([seed, *map(int, index)]).random(tuple(shape))


def checksum(a: np.ndarray) -> int:
    """Sum of the float64 array's elements read as unsigned integers, modulo 2**64.

    Independent of the order of the elements, so an array decoded into a blocked layout sums the
    same as the row-major one; an unwritten (poisoned) element changes it.
    """
    view = np.ascontiguousarray(a, dtype=np.float64).reshape(-1).view(np.uint64)
    return int(np.add.reduce(view, dtype=np.uint64))


def expected_checksum(info: StoreInfo, threads: int) -> int:
    """Checksum of the data ``make`` wrote, regenerated (needs ``info.seed``)."""

    def one(item):
        idx, sl = item
        return checksum(unit_data(info.seed, idx, [s.stop - s.start for s in sl]))

    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(one, info.units())) % (1 << 64)


def product_stores(folder: str, n: int, chunk: int, threads: int) -> tuple[str, str, str]:
    """A product's inputs made in ``folder`` (created where missing): ``a.zarr`` and
    ``b.zarr``, n x n in ``chunk``-sided chunks as zarr's defaults store them (seeds 1 and 2);
    returns their paths and the output's, ``c.zarr`` (not made)."""
    work = os.path.abspath(folder)
    os.makedirs(work, exist_ok=True)
    a, b, c = (os.path.join(work, name) for name in ("a.zarr", "b.zarr", "c.zarr"))
    for seed, path in ((1, a), (2, b)):
        make_store(path, n=n, chunk=chunk, layout="v3", seed=seed, threads=threads)
    return a, b, c


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
    grid = {"chunks": (INNER, INNER), "shards": (chunk, chunk)} if sharded else {
        "chunks": (chunk, chunk)}
    arr = zarr.create_array(store=path, shape=(n, n), dtype="float64",
                            zarr_format=2 if layout == "v2" else 3, overwrite=True,
                            attributes={ATTR: {"seed": seed, "unit": [chunk, chunk]}}, **grid)
    units = [(idx, tuple(slice(i * chunk, min((i + 1) * chunk, n)) for i in idx))
             for idx in np.ndindex(-(-n // chunk), -(-n // chunk))]

    def one(item) -> None:
        idx, sl = item
        arr[sl] = unit_data(seed, idx, [s.stop - s.start for s in sl])

    t0 = time.perf_counter()
    run_parallel(one, units, threads)
    seconds = time.perf_counter() - t0
    info = describe_store(path)
    return {"path": info.path, "label": info.label, "n": n, "threads": threads,
            "seconds": seconds, "decoded_bytes": info.decoded_bytes,
            "stored_bytes": info.stored_bytes, "files": len(info.files)}

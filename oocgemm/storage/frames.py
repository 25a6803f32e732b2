"""The zstd frames inside a Zarr chunk file, for decoders that are not zarr's (nvCOMP on a GPU).

A Zarr array whose chunks are coded as plain zstd (zarr-python's default for formats 2 and 3)
stores each chunk as one zstd frame of the chunk's bytes in C order; a sharded array stores a
shard as the frames of its inner chunks, with an index of (offset, size) pairs at its end or
start. :func:`zstd_layout` says whether an array is of this kind, :func:`split_frames` cuts a
stored object's bytes into its frames, and :func:`assemble` puts the decoded frames back
together as the object's region of the array (with ``xp`` numpy or CuPy, so that the same code
runs on the host in the tests and on the GPU in a run).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

_MISSING = (1 << 64) - 1


@dataclass(frozen=True)
class FrameLayout:
    """How the stored objects of a zstd-coded array hold their frames."""

    shape: tuple[int, int]
    """The array's shape."""
    unit: tuple[int, int]
    """Shape of a stored object: the shard when sharded, else the chunk."""
    inner: tuple[int, int]
    """Shape of one frame's chunk (equal to ``unit`` unless sharded)."""
    dtype: np.dtype
    fill: object
    """The fill value, for objects and inner chunks never written."""
    index_size: int = 0
    """Bytes of a shard's index (0 unsharded)."""
    index_at_end: bool = True

    @property
    def sharded(self) -> bool:
        return self.index_size > 0

    @property
    def grid(self) -> tuple[int, int]:
        """Frames per stored object along each axis."""
        return (self.unit[0] // self.inner[0], self.unit[1] // self.inner[1])

    @property
    def frame_bytes(self) -> int:
        """Bytes of one decoded frame."""
        return self.inner[0] * self.inner[1] * self.dtype.itemsize

    def region(self, index: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """The array region of stored object ``index``, clipped to the array."""
        return tuple((i * u, min((i + 1) * u, n))
                     for i, u, n in zip(index, self.unit, self.shape))  # type: ignore[return-value]


def _native_little(dtype: np.dtype) -> bool:
    return dtype.byteorder in ("<", "|") or (dtype.byteorder == "=" and sys.byteorder == "little")


def _plain_zstd(codecs: list[dict]) -> bool:
    """``bytes`` (little-endian) then ``zstd``, nothing else."""
    return ([c.get("name") for c in codecs] == ["bytes", "zstd"]
            and (codecs[0].get("configuration") or {}).get("endian", "little") == "little")


def zstd_layout(array) -> FrameLayout | None:
    """The frame layout of a 2-d zarr array whose chunks are plain zstd frames of
    little-endian numbers in C order (shards of them allowed); None for any other coding."""
    if len(array.shape) != 2:
        return None
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "fiuc" or not _native_little(dtype) or sys.byteorder != "little":
        return None
    meta = array.metadata.to_dict()
    fill = getattr(array, "fill_value", None)
    fill = 0 if fill is None else fill
    shape = tuple(array.shape)
    if meta.get("zarr_format") == 2:
        compressor = meta.get("compressor") or {}
        if (compressor.get("id") != "zstd" or meta.get("filters")
                or meta.get("order", "C") != "C"):
            return None
        chunks = tuple(array.chunks)
        return FrameLayout(shape, chunks, chunks, dtype, fill)
    codecs = meta.get("codecs") or []
    if len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
        conf = codecs[0].get("configuration") or {}
        index_codecs = [c.get("name") for c in conf.get("index_codecs") or []]
        if not _plain_zstd(conf.get("codecs") or []) or index_codecs not in (
                ["bytes"], ["bytes", "crc32c"]):
            return None
        unit, inner = tuple(array.shards), tuple(conf["chunk_shape"])
        per = (unit[0] // inner[0]) * (unit[1] // inner[1])
        return FrameLayout(shape, unit, inner, dtype, fill,
                           index_size=16 * per + 4 * index_codecs.count("crc32c"),
                           index_at_end=conf.get("index_location", "end") == "end")
    if not _plain_zstd(codecs):
        return None
    chunks = tuple(array.chunks)
    return FrameLayout(shape, chunks, chunks, dtype, fill)


def split_frames(layout: FrameLayout, index: tuple[int, int], data) -> list:
    """The frames of stored object ``index`` from its bytes ``data`` (None: never written), in
    C order of its inner chunks; None for an inner chunk never written or wholly past the
    array's edge (zarr writes neither)."""
    rows, cols = layout.grid
    if data is None:
        return [None] * (rows * cols)
    if not layout.sharded:
        return [memoryview(data)]
    data = memoryview(data)
    if len(data) < layout.index_size:
        raise ValueError(f"shard {index}: {len(data)} bytes, shorter than its index")
    raw = data[-layout.index_size:] if layout.index_at_end else data[:layout.index_size]
    table = np.frombuffer(raw, dtype="<u8", count=2 * rows * cols).reshape(rows, cols, 2)
    (r0, _), (c0, _) = layout.region(index)
    frames = []
    for i in range(rows):
        for j in range(cols):
            offset, size = int(table[i, j, 0]), int(table[i, j, 1])
            past = (r0 + i * layout.inner[0] >= layout.shape[0]
                    or c0 + j * layout.inner[1] >= layout.shape[1])
            if offset == _MISSING or past:
                frames.append(None)
            elif offset + size > len(data):
                raise ValueError(f"shard {index}: inner chunk ({i}, {j}) runs past the shard's end")
            else:
                frames.append(data[offset:offset + size])
    return frames


def assemble(xp, layout: FrameLayout, index: tuple[int, int], decoded: list):
    """Stored object ``index`` as its (clipped) region of the array, from its decoded frames
    (flat byte arrays of ``layout.frame_bytes``, or None where :func:`split_frames` gave None),
    with array module ``xp`` (numpy or CuPy)."""
    cols = layout.grid[1]
    (r0, r1), (c0, c1) = layout.region(index)
    ir, ic = layout.inner
    if not layout.sharded:
        if decoded[0] is None:
            return xp.full((r1 - r0, c1 - c0), layout.fill, dtype=layout.dtype)
        return decoded[0].view(layout.dtype).reshape(ir, ic)[:r1 - r0, :c1 - c0]
    # Only the frames the region needs: whole inner rows and columns inside the array.
    need_r, need_c = math.ceil((r1 - r0) / ir), math.ceil((c1 - c0) / ic)
    out = xp.empty((need_r * ir, need_c * ic), dtype=layout.dtype)
    for i in range(need_r):
        for j in range(need_c):
            frame = decoded[i * cols + j]
            block = out[i * ir:(i + 1) * ir, j * ic:(j + 1) * ic]
            if frame is None:
                block[...] = layout.fill
            else:
                block[...] = frame.view(layout.dtype).reshape(ir, ic)
    return out[:r1 - r0, :c1 - c0]

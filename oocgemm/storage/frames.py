"""C's chunks stored from frames encoded elsewhere: the layout both encoders follow.

A chunk of zarr's zstd is one zstd stream, and a stream may be several frames back to back:
a decoder reads them as the concatenation of their contents. The chunk's bytes are its
elements in C order, so any run of its rows is a run of its bytes: the rows of a chunk that
one row stripe of C brings can be compressed on their own, as soon as the stripe is final,
and the chunk's file is its pieces' frames in row order. That lets the GPU compress C's
stripes before they go down (:mod:`oocgemm.cuda.nvcomp`), in the same stripes the schedule
moves anyway, and the host only write files.

:class:`Framing` cuts a stripe into its chunk pieces, each ``rows x chunk columns`` (an edge
chunk's columns past the array padded with zeros, as zarr stores edge chunks), and each
piece into frames of at most :attr:`Framing.frame_bytes`; rows past the array's last row are
one frame of zeros that the host encodes (:meth:`Framing.padding`). :func:`encode_stripe` is
the host's way of doing the same (the CPU executor's replay of a framed run), and
:func:`storable` says which outputs can be written this way.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Piece:
    """The rows of one chunk that one stripe brings."""

    index: tuple[int, int]
    """The chunk's index in the chunk grid."""
    rows: tuple[int, int]
    """Rows of the array (within the chunk's rows)."""
    cols: tuple[int, int]
    """Columns of the array that hold data (the chunk's, clipped at the array's edge)."""


@dataclass(frozen=True)
class Framing:
    """How C's chunks are cut into frames: ``chunks`` and ``shape`` of the output, bytes per
    element, and the most bytes a frame compresses."""

    chunks: tuple[int, int]
    shape: tuple[int, int]
    itemsize: int
    frame_bytes: int = 16 << 10
    """Small frames make a stripe's batch wide enough to fill the GPU: a stripe of 32 MiB
    compresses the slower the larger its frames, and the ratio barely moves
    (docs/performance.md, "C compressed on the GPU, in the engine")."""
    codec: Any = field(default=None, compare=False)
    """The output's numcodecs codec: it encodes the padding rows and, in a host replay, the
    frames themselves."""
    _padding: dict = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def pieces(self, rows: tuple[int, int], cols: tuple[int, int]) -> list[Piece]:
        """The chunk pieces of the stripe ``rows`` x ``cols`` (``cols`` start on a chunk's
        edge), chunk row by chunk row, left to right."""
        cr, cc = self.chunks
        out = []
        for b in range(rows[0] // cr, -(-rows[1] // cr)):
            lo, hi = max(rows[0], b * cr), min(rows[1], (b + 1) * cr)
            for jc in range(cols[0] // cc, -(-cols[1] // cc)):
                out.append(Piece((b, jc), (lo, hi), (jc * cc, min(cols[1], (jc + 1) * cc))))
        return out

    def piece_bytes(self, piece: Piece) -> int:
        """Bytes a piece's frames compress: its rows at the chunk's full width."""
        return (piece.rows[1] - piece.rows[0]) * self.chunks[1] * self.itemsize

    def cuts(self, nbytes: int, step: int | None = None) -> list[tuple[int, int]]:
        """The frames of ``nbytes``: byte ranges of at most ``step`` (default:
        :attr:`frame_bytes`)."""
        step = step or self.frame_bytes
        return [(lo, min(lo + step, nbytes)) for lo in range(0, nbytes, step)]

    def padding(self, index: tuple[int, int]) -> bytes:
        """The frame of zeros that ends chunk ``index`` where it reaches past the array's
        last row (zarr stores an edge chunk whole); empty elsewhere."""
        cr, cc = self.chunks
        rows = (index[0] + 1) * cr - self.shape[0]
        if rows <= 0:
            return b""
        with self._lock:
            frame = self._padding.get(rows)
            if frame is None:
                zeros = np.zeros(rows * cc * self.itemsize, dtype=np.uint8)
                frame = self._padding[rows] = bytes(self.codec.encode(zeros))
        return frame


def encode_piece(framing: Framing, data: np.ndarray, rows, cols, piece: Piece,
                 frame_bytes: int | None = None) -> bytes:
    """The frames of one piece of the stripe ``data`` (``rows`` x ``cols`` of C), encoded
    on the host in frames of ``frame_bytes`` (default: the framing's; the host's frames may
    be larger than a GPU's, the chunk's file is the same stream)."""
    (r0, r1), (c0, c1) = piece.rows, piece.cols
    padded = np.zeros((r1 - r0, framing.chunks[1]), dtype=data.dtype)
    padded[:, :c1 - c0] = data[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]]
    raw = padded.reshape(-1).view(np.uint8)
    return b"".join(bytes(framing.codec.encode(raw[lo:hi]))
                    for lo, hi in framing.cuts(raw.size, frame_bytes))


def encode_stripe(framing: Framing, data: np.ndarray, rows, cols) -> list[tuple[Piece, bytes]]:
    """The frames of the stripe ``data`` (``rows`` x ``cols`` of C) encoded on the host,
    piece by piece, as a GPU encodes them: what the CPU executor replays of a framed run."""
    return [(piece, encode_piece(framing, data, rows, cols, piece))
            for piece in framing.pieces(rows, cols)]


def storable(codec, fill, dtype: np.dtype) -> bool:
    """Whether chunks of ``codec`` (a numcodecs codec), fill value ``fill`` and ``dtype`` can
    be stored from frames that a GPU encodes: zstd without a content checksum (nvCOMP writes
    none), padding of zeros, a native dtype."""
    if type(codec).__name__ != "Zstd" or getattr(codec, "checksum", False):
        return False
    return bool(fill == 0 or fill is None) and np.dtype(dtype).isnative


#: The first four bytes of a zstd frame (little-endian), and of a skippable frame's (the
#: last four bits vary).
ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = 0x184D2A50


def zstd_pieces(data, offset: int, nbytes: int) -> list[tuple[int, int, int | None]]:
    """The zstd frames of the stream at ``data[offset:offset + nbytes]``, each ``(offset,
    nbytes, decoded bytes or None where its header does not say)``, from the frames' and
    blocks' headers alone (nothing decoded): ValueError where a frame is not one or does not
    end exactly where the stream does (cut short, or bytes after it). A GPU decoder given a
    frame cut short may read past it and report success; the host's decoder does not."""
    view = memoryview(data)
    end, pos = offset + nbytes, offset
    pieces = []
    while pos < end:
        if end - pos < 8:
            raise ValueError(f"{end - pos} bytes at {pos}: not a whole zstd frame")
        magic = int.from_bytes(view[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE:
            pos += 8 + int.from_bytes(view[pos + 4:pos + 8], "little")
            continue
        if magic != ZSTD_MAGIC:
            raise ValueError(f"no zstd frame at {pos} (magic {magic:#010x})")
        descriptor = view[pos + 4]
        if descriptor & 0x08:
            raise ValueError(f"the zstd frame at {pos} sets a reserved bit")
        single = descriptor >> 5 & 1
        size_bytes = (single, 2, 4, 8)[descriptor >> 6]
        header = 5 + (1 - single) + (0, 1, 2, 4)[descriptor & 3]
        content = None
        if size_bytes:
            content = int.from_bytes(view[pos + header:pos + header + size_bytes], "little")
            content += 256 if size_bytes == 2 else 0
        at = pos + header + size_bytes
        while True:
            if at + 3 > end:
                raise ValueError(f"the zstd frame at {pos} is cut short")
            block = int.from_bytes(view[at:at + 3], "little")
            kind = block >> 1 & 3
            if kind == 3:
                raise ValueError(f"the zstd frame at {pos} has a block of a reserved kind")
            at += 3 + (1 if kind == 1 else block >> 3)
            if block & 1:
                break
        at += 4 if descriptor & 0x04 else 0  # the content's checksum
        if at > end:
            raise ValueError(f"the zstd frame at {pos} is cut short")
        pieces.append((pos, at - pos, content))
        pos = at
    return pieces

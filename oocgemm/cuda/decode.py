"""Panels decoded on the GPU: the DECODE of a plan whose operands go up compressed
(:attr:`Plan.io.gpu_decode <oocgemm.planning.plan.IOChoices.gpu_decode>`).

A DECODE finds the stored objects of its panel in their cells of a Z slot (uploaded as read,
each with its frames: :meth:`ZarrSource.read_object
<oocgemm.storage.zarr_store.ZarrSource.read_object>`), decodes every zstd frame of them in one
nvCOMP batch into a scratch buffer, with those of the other operand's panel of the same K step
(:func:`~oocgemm.planning.schedule.decode_batches`: nvCOMP decodes a frame on one thread
block, so a batch of few frames leaves most of the GPU idle), and copies each decoded frame
into its place in the panel slot (clipped at the array's edges; frames never written take the
fill value). All of it is enqueued on the decode stream: nvCOMP's C API takes the batch's
tables in device memory (a few kilobytes, copied up from a pinned table on the same stream)
and writes each frame's status there; the statuses come down behind the batch and are looked
at when the table is used again and at the end of the run (:meth:`PanelDecoder.finish`), where
a frame nvCOMP refused is an InputError naming its chunk.

Measured before it was built (docs/performance.md, "GPU decoding of the inputs, as a
design"): the route takes a fraction of the host decoders' time, on shards of small chunks
most of all, and frees most of the host's CPU.
"""

from __future__ import annotations

import ctypes
import math
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..planning.schedule import object_cells
from . import nvcomp

_H2D, _D2H, _D2D = 1, 2, 3

#: Tables a decoder keeps in turn: a table is written again once the DECODE that used it
#: four DECODEs ago is done (its statuses looked at then).
TABLES = 4


class _Table:
    """One batch's tables: pinned (written on the host), on the device (nvCOMP reads them),
    the statuses and sizes nvCOMP writes, their pinned copies, and what they decode."""

    def __init__(self, frames: int):
        import cupy

        self.host = cupy.cuda.alloc_pinned_memory(4 * 8 * frames)
        self.entries = np.frombuffer(self.host, np.uint64, 4 * frames).reshape(4, frames)
        self.device = cupy.empty((4, frames), dtype=np.uint64)
        self.statuses = cupy.empty(frames, dtype=np.int32)
        self.sizes = cupy.empty(frames, dtype=np.uint64)
        self.back = cupy.cuda.alloc_pinned_memory(16 * frames)
        self.back_statuses = np.frombuffer(self.back, np.int32, frames)
        self.back_sizes = np.frombuffer(self.back, np.uint64, frames, offset=8 * frames)
        self.event = None
        self.what: list[tuple[str, tuple[int, int]]] = []  # (operand's name, chunk) a frame
        self.count = 0  # zstd frames of the batch
        self.capacity = frames


class Copy(NamedTuple):
    """A 2D copy into a panel slot (elements): ``height`` rows of ``width``, from ``src`` in
    the scratch buffer or in a buffer of the fill value (``source``), rows ``src_pitch``
    apart, to ``dst`` in panel slot ``slot``, rows ``dst_pitch`` apart."""

    slot: str
    dst: int
    dst_pitch: int
    source: str
    """'scratch' (a decoded frame) or 'fill' (a buffer of the fill value of the stored
    object's shape)."""
    src: int
    src_pitch: int
    width: int
    height: int


class Piece(NamedTuple):
    """A zstd frame of nvCOMP's batch: ``nbytes`` compressed at ``at`` bytes into Z slot
    ``z``, ``content`` bytes decoded at ``out`` bytes into the scratch buffer."""

    z: str
    at: int
    nbytes: int
    content: int
    out: int


def panel_batch(plan, ops, cells: dict):
    """What the DECODEs ``ops`` (a batch of :func:`~oocgemm.planning.schedule.decode_batches`)
    do, as data: ``(batch, copies, what)``. ``batch``: nvCOMP's frames (:class:`Piece`; a
    chunk stored as several zstd frames gives several, one after the other in its frame's
    place), decoded one after the other into the scratch buffer; ``copies``: the
    :class:`Copy` of each frame into its place in its panel (clipped at the array's edges;
    what was never written, a frame or a whole object, from the fill buffer); ``what``: the
    (operand, chunk) of each of ``batch``. ``cells``: (Z slot, offset) -> (chunk, size,
    frames) of the objects uploaded."""
    s = plan.problem.itemsize
    batch, copies, what = [], [], []
    used = 0  # bytes of the scratch buffer the batch's frames take so far
    for op in ops:
        x = plan.problem_operand(op.operand)
        shape = x.zstd_frames
        frame_bytes = math.prod(shape) * s
        (r0, _), (c0, c1) = op.region
        cols = c1 - c0
        z = op.src[0]
        for index, ((o0, _), (p0, _)), offset in object_cells(plan, op.operand, op.region):
            got, _, frames = cells[(z, offset)]
            assert got == index, (got, index)
            for frame in frames:
                at = (o0 - r0 + frame.rows[0]) * cols + p0 - c0 + frame.cols[0]
                width, height = frame.cols[1] - frame.cols[0], frame.rows[1] - frame.rows[0]
                if frame.nbytes == 0:  # never written: the fill value
                    copies.append(Copy(op.dst, at, cols, "fill", 0, x.chunks[1], width,
                                       height))
                    continue
                out, used = used, used + frame_bytes
                for at_piece, nbytes, start, content in frame.pieces:  # (checked on the host)
                    batch.append(Piece(z, offset * s + at_piece, nbytes, content, out + start))
                    what.append((op.operand, index))
                copies.append(Copy(op.dst, at, cols, "scratch", out // s, shape[1], width,
                                   height))
    return batch, copies, what


class PanelDecoder:
    """DECODEs of a plan's panels on the current GPU; its buffers live until :meth:`close`.
    ``names``: how messages name the operands ('A', 'B' -> a path)."""

    def __init__(self, plan, names: dict, fills: dict):
        import cupy

        self.lib = nvcomp.library()
        if self.lib is None:
            raise InputError("decoding on the GPU needs nvCOMP (pip install "
                             "nvidia-libnvcomp-cu12 or -cu13, matching CuPy's CUDA)")
        self.plan, self.names, self.fills = plan, names, fills
        self.itemsize = plan.problem.itemsize
        # a batch: a panel of each operand at most
        frames = max(1, sum(plan.panel_frames(name) for name in plan.io.gpu_decode))
        self.frames = frames
        self.frame_bytes = max(plan.frame_bytes(name) for name in plan.io.gpu_decode)
        self.scratch = cupy.empty(max(plan.decode_scratch, 1), dtype=np.uint8)
        self.temp = cupy.empty(max(self._temp_bytes(frames), 1), dtype=np.uint8)
        self.tables = [_Table(frames) for _ in range(TABLES)]
        self.turn = 0
        self._filled: dict = {}  # operand -> a device object of its fill value

    def decode(self, ops, pointer, cells: dict, stream) -> None:
        """Enqueue the DECODEs ``ops`` (a batch: :func:`panel_batch`) on ``stream``, as one
        nvCOMP batch and the copies of its frames into their panel slots. ``pointer``: a
        slot's device address; ``cells``: (Z slot, offset) -> (chunk, size, frames)."""
        from cupy.cuda import runtime

        table = self._table()
        batch, copies, what = panel_batch(self.plan, ops, cells)
        base = self.scratch.data.ptr
        pieces = [(pointer(p.z) + p.at, p.nbytes, p.content, base + p.out) for p in batch]
        n = len(pieces)
        table = self._fit(table, n, stream)
        table.what = what
        if n:
            table.entries[:, :n] = np.array(pieces, dtype=np.uint64).T
        ptr = stream.ptr
        if n:
            runtime.memcpyAsync(table.device.data.ptr, table.entries.ctypes.data,
                                table.entries.nbytes, _H2D, ptr)
            row = table.capacity * 8
            dev = table.device.data.ptr
            status = self.lib.nvcompBatchedZstdDecompressAsync(
                ctypes.c_void_p(dev), ctypes.c_void_p(dev + row), ctypes.c_void_p(dev + 2 * row),
                ctypes.c_void_p(table.sizes.data.ptr), ctypes.c_size_t(n),
                ctypes.c_void_p(self.temp.data.ptr), ctypes.c_size_t(self.temp.nbytes),
                ctypes.c_void_p(dev + 3 * row), nvcomp.DecodeOpts(),
                ctypes.c_void_p(table.statuses.data.ptr), ctypes.c_void_p(ptr))
            if status:
                raise RuntimeError(f"nvCOMP DecompressAsync failed (status {status})")
            runtime.memcpyAsync(table.back_statuses.ctypes.data, table.statuses.data.ptr,
                                4 * n, _D2H, ptr)
            runtime.memcpyAsync(table.back_sizes.ctypes.data, table.sizes.data.ptr, 8 * n,
                                _D2H, ptr)
        s = self.itemsize
        operands = {op.dst: op.operand for op in ops}
        for c in copies:
            src = (base if c.source == "scratch" else self._fill_frame(operands[c.slot], stream))
            src += c.src * s
            runtime.memcpy2DAsync(pointer(c.slot) + c.dst * s, c.dst_pitch * s, src,
                                  c.src_pitch * s, c.width * s, c.height, _D2D, ptr)
        table.count = n
        table.event = stream.record()

    def _fill_frame(self, operand: str, stream) -> int:
        """A device buffer of a stored object's shape (the largest region a frame of the
        fill value covers) holding ``operand``'s fill value, made on ``stream`` the first
        time."""
        import cupy

        if operand not in self._filled:
            with stream:
                self._filled[operand] = cupy.full(self.plan.problem_operand(operand).chunks,
                                                  self.fills[operand],
                                                  dtype=self.plan.problem.dtype)
        return self._filled[operand].data.ptr

    def _fit(self, table: _Table, n: int, stream) -> _Table:
        """``table``, or one made larger for a batch of ``n`` zstd frames (chunks stored as
        several frames each), with nvCOMP's scratch made larger to match (once what runs on
        ``stream`` is done with the old one)."""
        if n <= table.capacity:
            return table
        import cupy

        stream.synchronize()
        self.tables[self.tables.index(table)] = table = _Table(n)
        if n > self.frames:
            self.frames = n
            temp = self._temp_bytes(n)
            if temp > self.temp.nbytes:
                self.temp = cupy.empty(temp, dtype=np.uint8)
        return table

    def _temp_bytes(self, frames: int) -> int:
        """The scratch nvCOMP asks for to decode ``frames`` frames of the largest size."""
        temp = ctypes.c_size_t()
        status = self.lib.nvcompBatchedZstdDecompressGetTempSize(
            ctypes.c_size_t(frames), ctypes.c_size_t(self.frame_bytes), nvcomp.DecodeOpts(),
            ctypes.byref(temp), ctypes.c_size_t(frames * self.frame_bytes), ctypes.c_void_p(0))
        if status:
            raise RuntimeError(f"nvCOMP DecompressGetTempSize failed (status {status})")
        return temp.value

    def _table(self) -> _Table:
        """The next table, once the DECODE that used it is done and its statuses are good."""
        table = self.tables[self.turn]
        self.turn = (self.turn + 1) % len(self.tables)
        self._settle(table)
        return table

    def _settle(self, table: _Table) -> None:
        if table.event is None:
            return
        table.event.synchronize()
        table.event = None
        n = table.count
        bad = np.flatnonzero((table.back_statuses[:n] != 0)
                             | (table.back_sizes[:n] != table.entries[2, :n]))
        if bad.size:
            operand, index = table.what[int(bad[0])]
            raise InputError(f"{self.names.get(operand, operand)}: chunk {tuple(index)} "
                             f"(corrupt chunk? nvCOMP could not decode a zstd frame of it: "
                             f"status {int(table.back_statuses[bad[0]])}, "
                             f"{int(table.back_sizes[bad[0]])} bytes)")

    def finish(self) -> None:
        """Every DECODE done: their statuses looked at (InputError for a refused frame)."""
        for table in self.tables:
            self._settle(table)

    def close(self) -> None:
        self.tables = []
        self.scratch = self.temp = None
        self._filled.clear()

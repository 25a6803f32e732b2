"""Panels decoded on the GPU: the DECODE of a plan whose operands go up compressed
(:attr:`Plan.gpu_decode <oocgemm.planning.plan.Plan.gpu_decode>`).

A DECODE finds the stored objects of its panel in their cells of a Z slot (uploaded as read,
each with its frames: :meth:`ZarrSource.read_object
<oocgemm.storage.zarr_store.ZarrSource.read_object>`), decodes every zstd frame of them in one
nvCOMP batch into a scratch buffer, and copies each decoded frame into its place in the panel
slot (clipped at the array's edges; frames never written take the fill value). All of it is
enqueued on the decode stream: nvCOMP's C API takes the batch's tables in device memory (a
few kilobytes, copied up from a pinned table on the same stream) and writes each frame's
status there; the statuses come down behind the batch and are looked at when the table is
used again and at the end of the run (:meth:`PanelDecoder.finish`), where a frame nvCOMP
refused is an InputError naming its chunk.

Measured before it was built (docs/performance.md, GPU decoding as a design): the route is
0.23-0.34x the host decoders' time on shards of small chunks and 0.58x on 4096² chunks where
each is decoded once, and frees most of the host's CPU.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from ..errors import InputError
from ..planning.grid import chunk_region, chunks_of
from . import nvcomp

_H2D, _D2H, _D2D = 1, 2, 3

#: Tables a decoder keeps in turn: a table is written again once the DECODE that used it
#: four DECODEs ago is done (its statuses looked at then).
TABLES = 4


class _DecodeOpts(ctypes.Structure):  # nvcompBatchedZstdDecompressOpts_t
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


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
        self.count = 0  # frames of the batch
        self.frame_bytes = 0


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
        frames, frame_bytes = 1, 1
        for name in plan.gpu_decode:
            frames = max(frames, plan.panel_frames(name))
            x = plan.problem_operand(name)
            frame_bytes = max(frame_bytes, math.prod(x.zstd_frames) * self.itemsize)
        self.frames, self.frame_bytes = frames, frame_bytes
        self.scratch = cupy.empty(max(plan.decode_scratch, 1), dtype=np.uint8)
        temp = ctypes.c_size_t()
        status = self.lib.nvcompBatchedZstdDecompressGetTempSize(
            ctypes.c_size_t(frames), ctypes.c_size_t(frame_bytes), _DecodeOpts(),
            ctypes.byref(temp), ctypes.c_size_t(frames * frame_bytes), ctypes.c_void_p(0))
        if status:
            raise RuntimeError(f"nvCOMP DecompressGetTempSize failed (status {status})")
        self.temp = cupy.empty(max(temp.value, 1), dtype=np.uint8)
        self.tables = [_Table(frames) for _ in range(TABLES)]
        self.turn = 0
        self._filled: dict = {}  # (operand, frame shape) -> a device frame of the fill value

    def decode(self, op, z_ptr: int, slot_ptr: int, cells: dict, stream) -> None:
        """Enqueue DECODE ``op`` on ``stream``: the objects in their cells of the Z slot at
        ``z_ptr`` (``cells``: (Z slot, offset) -> (chunk, size, frames)), decoded into the
        panel slot at ``slot_ptr``."""
        from cupy.cuda import runtime

        plan, s = self.plan, self.itemsize
        x = plan.problem_operand(op.operand)
        shape = x.zstd_frames
        frame_bytes = math.prod(shape) * s
        cell = plan.object_cell(op.operand)
        (r0, _), (c0, c1) = op.region
        cols = c1 - c0
        table = self._table()
        placed, fills = [], []
        for k, index in enumerate(chunks_of(op.region, x.chunks)):
            got, _, frames = cells[(op.src[0], k * cell // s)]
            assert got == index, (got, index)
            (o0, _), (p0, _) = chunk_region(index, x.chunks, x.shape)
            for frame in frames:
                at = (o0 - r0 + frame.rows[0]) * cols + p0 - c0 + frame.cols[0]
                if frame.nbytes == 0:  # never written: the fill value
                    fills.append((at, frame))
                    continue
                j = len(placed)
                table.entries[:, j] = (z_ptr + k * cell + frame.offset, frame.nbytes,
                                       frame_bytes, self.scratch.data.ptr + j * frame_bytes)
                table.what.append((op.operand, index))
                placed.append((at, frame))
        n = len(placed)
        ptr = stream.ptr
        if n:
            runtime.memcpyAsync(table.device.data.ptr, table.entries.ctypes.data,
                                table.entries.nbytes, _H2D, ptr)
            row = self.frames * 8
            dev = table.device.data.ptr
            status = self.lib.nvcompBatchedZstdDecompressAsync(
                ctypes.c_void_p(dev), ctypes.c_void_p(dev + row), ctypes.c_void_p(dev + 2 * row),
                ctypes.c_void_p(table.sizes.data.ptr), ctypes.c_size_t(n),
                ctypes.c_void_p(self.temp.data.ptr), ctypes.c_size_t(self.temp.nbytes),
                ctypes.c_void_p(dev + 3 * row), _DecodeOpts(),
                ctypes.c_void_p(table.statuses.data.ptr), ctypes.c_void_p(ptr))
            if status:
                raise RuntimeError(f"nvCOMP DecompressAsync failed (status {status})")
            runtime.memcpyAsync(table.back_statuses.ctypes.data, table.statuses.data.ptr,
                                4 * n, _D2H, ptr)
            runtime.memcpyAsync(table.back_sizes.ctypes.data, table.sizes.data.ptr, 8 * n,
                                _D2H, ptr)
        for j, (at, frame) in enumerate(placed):
            self._place(slot_ptr, at, cols, self.scratch.data.ptr + j * frame_bytes, shape,
                        frame, ptr)
        for at, frame in fills:
            self._place(slot_ptr, at, cols, self._fill_frame(op.operand, shape, stream), shape,
                        frame, ptr)
        table.count, table.frame_bytes = n, frame_bytes
        table.event = stream.record()

    def _place(self, slot_ptr: int, at: int, cols: int, src: int, shape, frame, stream):
        """A decoded frame (``shape``, at ``src``) into the panel slot, clipped to ``frame``."""
        from cupy.cuda import runtime

        s = self.itemsize
        runtime.memcpy2DAsync(slot_ptr + at * s, cols * s, src, shape[1] * s,
                              (frame.cols[1] - frame.cols[0]) * s,
                              frame.rows[1] - frame.rows[0], _D2D, stream)

    def _fill_frame(self, operand: str, shape, stream) -> int:
        """A device frame of ``operand``'s fill value (made on ``stream`` the first time)."""
        import cupy

        key = (operand, tuple(shape))
        if key not in self._filled:
            with stream:
                self._filled[key] = cupy.full(shape, self.fills[operand],
                                              dtype=self.plan.problem.dtype)
        return self._filled[key].data.ptr

    def _table(self) -> _Table:
        """The next table, once the DECODE that used it is done and its statuses are good."""
        table = self.tables[self.turn]
        self.turn = (self.turn + 1) % len(self.tables)
        self._settle(table)
        table.what = []
        return table

    def _settle(self, table: _Table) -> None:
        if table.event is None:
            return
        table.event.synchronize()
        table.event = None
        n = table.count
        bad = np.flatnonzero((table.back_statuses[:n] != 0)
                             | (table.back_sizes[:n] != table.frame_bytes))
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

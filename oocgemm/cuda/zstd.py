"""Chunk decoding on the GPU: nvCOMP's batched zstd decoder in place of the host's.

Measured on the H100 machine (docs/performance.md): the 16 zstd frames of a 16384² float64
store with 4096² chunks decode at 12.3 GB/s in one nvCOMP batch, the 1024 frames of the same
data in 4096² shards of 512² chunks at 87 GB/s, against 2.9-3.3 GB/s for the best host decoder
on 16 cores. So where a staged plan's inputs are plain-zstd Zarr on local storage and nvCOMP is
installed, :class:`GpuZstdDecoder` does the decoding of a :class:`~oocgemm.storage.chunked.
ChunkReader`: its decoder threads read the chunk files (in parallel, so cold storage is kept
busy) and hand the bytes to one batching thread, which copies every frame waiting into pinned
memory, to the GPU, decodes them in one call, puts each stored object together on the GPU
(:func:`~oocgemm.storage.frames.assemble`) and copies it into the reader's host array. The
rest of the run is as before: the same schedule, the same pinned ring.

A batch that nvCOMP refuses is decoded again by the host's pipeline, so that a corrupt chunk
fails as it does without the GPU (an :class:`~oocgemm.errors.InputError` naming the chunk).
"""

from __future__ import annotations

import importlib.util
import threading
from collections import deque
from concurrent.futures import Future

import numpy as np

from ..storage.frames import FrameLayout, assemble, split_frames

#: Decoded bytes of one batch, at most (a single larger stored object goes alone).
BATCH_BYTES = 1 << 30
#: Decode rate the planner assumes, bytes/s: 16 frames of 128 MiB in one batch on the H100.
GPU_RATE = 12e9


def available() -> bool:
    """nvCOMP's Python package is installed (``pip install nvidia-nvcomp-cu12`` or ``-cu13``)."""
    try:
        return importlib.util.find_spec("nvidia.nvcomp") is not None
    except (ImportError, ValueError):
        return False


def scratch_bytes(layout: FrameLayout) -> tuple[int, int]:
    """(GPU, pinned host) bytes a decoder of this layout holds: the compressed and decoded
    frames of one batch and one stored object put together; the compressed frames."""
    batch = _batch_bytes(layout)
    compressed = _pinned_bytes(layout)
    return compressed + batch + _object_frames(layout) * layout.frame_bytes, compressed


def _batch_bytes(layout: FrameLayout) -> int:
    return max(BATCH_BYTES, _object_frames(layout) * layout.frame_bytes)


def _pinned_bytes(layout: FrameLayout) -> int:
    """Room for the compressed frames of a batch, each at zstd's bound, 16-byte aligned."""
    most = _batch_bytes(layout) // layout.frame_bytes
    return _zstd_bound(_batch_bytes(layout)) + most * (16 + 128) + 4096


def _object_frames(layout: FrameLayout) -> int:
    rows, cols = layout.grid
    return rows * cols


def _zstd_bound(n: int) -> int:
    """Largest zstd frame of ``n`` bytes (ZSTD_compressBound)."""
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


class _Request:
    __slots__ = ("done", "frames", "index", "out")

    def __init__(self, index, frames, out):
        self.index, self.frames, self.out = index, frames, out
        self.done: Future = Future()


class GpuZstdDecoder:
    """Decodes the stored objects of one zstd-coded Zarr source on GPU ``device``.

    Parameters
    ----------
    source
        A :class:`~oocgemm.storage.zarr_store.ZarrSource` on local storage.
    layout
        Its frame layout (:func:`~oocgemm.storage.frames.zstd_layout`).
    device
        CUDA device ordinal.
    """

    def __init__(self, source, layout: FrameLayout, device: int = 0):
        import cupy
        from nvidia import nvcomp

        self._cp, self._nvcomp = cupy, nvcomp
        self.source, self.layout, self.device = source, layout, device
        self.batch_bytes = _batch_bytes(layout)
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._closed = False
        self.batches = 0
        """nvCOMP calls made."""
        self.frames = 0
        """Frames decoded on the GPU."""
        self.fallbacks = 0
        """Stored objects decoded by the host's pipeline after nvCOMP refused their batch."""
        with cupy.cuda.Device(device):
            self._stream = cupy.cuda.Stream(non_blocking=True)
            compressed = _pinned_bytes(layout)
            self._pinned = cupy.cuda.alloc_pinned_memory(compressed)
            self._host = np.frombuffer(self._pinned, dtype=np.uint8, count=compressed)
            self._packed = cupy.empty(compressed, dtype=cupy.uint8)
            self._decoded = cupy.empty(self.batch_bytes, dtype=cupy.uint8)
            self._codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                       cuda_stream=self._stream.ptr, device_id=device)
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="oocgemm-gpu-decode")
        self._thread.start()

    # -- called by the ChunkReader's decoder threads ----------------------------------------------
    def decode(self, index: tuple[int, int], out: np.ndarray) -> None:
        """Decode stored object ``index`` into ``out`` (its region of the array, C order)."""
        path = self.source.object_path(index)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = None
        try:
            frames = split_frames(self.layout, index, data)
        except ValueError:  # a damaged shard index: the host pipeline says what is wrong
            self.source.read_chunk(index, out)
            return
        if all(frame is None for frame in frames):
            out[...] = self.layout.fill
            return
        request = _Request(index, frames, out)
        with self._cond:
            if self._closed:
                raise RuntimeError("the GPU decoder is closed")
            self._queue.append(request)
            self._cond.notify()
        request.done.result()

    # -- the batching thread -------------------------------------------------------------------
    def _serve(self) -> None:
        cp = self._cp
        with cp.cuda.Device(self.device):
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if self._closed and not self._queue:
                        return
                    batch, size = [], 0
                    per = _object_frames(self.layout) * self.layout.frame_bytes
                    while self._queue and (not batch or size + per <= self.batch_bytes):
                        batch.append(self._queue.popleft())
                        size += per
                try:
                    self._decode_batch(batch)
                except BaseException as exc:  # noqa: BLE001 - each waiter gets it
                    for request in batch:
                        if not request.done.done():
                            request.done.set_exception(exc)

    def _decode_batch(self, batch: list[_Request]) -> None:
        cp, nvcomp, layout = self._cp, self._nvcomp, self.layout
        offsets, sizes, packed = [], [], []
        at = 0
        for request in batch:
            need = sum(-(-len(f) // 16) * 16 for f in request.frames if f is not None)
            if at + need > len(self._host):  # frames larger than zstd makes: not zstd's
                self._host_decode(request)
                continue
            for frame in request.frames:
                if frame is not None:
                    self._host[at:at + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
                    offsets.append(at)
                    sizes.append(len(frame))
                    at += -(-len(frame) // 16) * 16
            packed.append(request)
        batch = packed
        if not batch:
            return
        count = len(offsets)
        self._packed[:at].set(self._host[:at], stream=self._stream)
        src = nvcomp.as_arrays(self._packed, offsets, sizes, self._stream.ptr)
        dst = nvcomp.as_arrays(self._decoded, [i * layout.frame_bytes for i in range(count)],
                               [layout.frame_bytes] * count, self._stream.ptr)
        try:
            self._codec.decode(src, out=dst)
            self._stream.synchronize()
            refused = None
        except Exception as exc:  # noqa: BLE001 - decided below, per stored object
            self._stream.synchronize()
            refused = exc
        finally:
            del src, dst
        if refused is not None:
            for request in batch:
                self._host_decode(request)
            return
        self.batches += 1
        self.frames += count
        flat = self._decoded[:count * layout.frame_bytes].reshape(count, layout.frame_bytes)
        at = 0
        with self._stream:
            for request in batch:
                slots = []
                for frame in request.frames:
                    slots.append(None if frame is None else flat[at])
                    at += frame is not None
                region = assemble(cp, layout, request.index, slots)
                cp.ascontiguousarray(region).get(stream=self._stream, out=request.out)
                self._stream.synchronize()
                request.done.set_result(None)

    def _host_decode(self, request: _Request) -> None:
        self.fallbacks += 1
        try:
            self.source.read_chunk(request.index, request.out)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting reader
            request.done.set_exception(exc)
        else:
            request.done.set_result(None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        with self._cp.cuda.Device(self.device):
            self._stream.synchronize()
            del self._codec
            self._packed = self._decoded = None


def decoder_for(source, device: int) -> GpuZstdDecoder | None:
    """A GPU decoder for ``source`` where it qualifies: a Zarr array of plain zstd chunks on
    local storage, with nvCOMP installed; None otherwise."""
    if getattr(source, "zstd_layout", None) is None or not available():
        return None
    if source.object_path((0, 0)) is None:  # not a local store
        return None
    return GpuZstdDecoder(source, source.zstd_layout, device)

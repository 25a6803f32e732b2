"""C's stripes compressed on the GPU before they go down: nvCOMP's batched zstd.

The library is the ``libnvcomp`` of the ``nvidia-libnvcomp-cu12`` or ``-cu13`` wheel (nvCOMP 5
or later), called through its C API: the compression of a batch is stream-ordered and writes
into buffers allocated once per run, so a stripe's compression, like its copy down, is a few
calls enqueued on the C stream and nothing waits on the host. (nvCOMP's Python package
allocates each batch's outputs and returns their sizes to the host, which waits for them.)

:class:`StripeEncoder` does a DOWNLOAD of a framed run (:mod:`oocgemm.storage.frames`): the
stripe's chunk pieces are gathered from the C slot into a scratch buffer at the chunk's
width (2D copies; an edge chunk's padding columns zeroed), compressed as one batch of
frames into fixed slots, packed back to back (``kernels/frames.cu``), and the frames' sizes,
statuses and packed bytes copied into the stripe's pinned ring buffer, whose WRITE takes each
chunk piece's frames as one span of it (:func:`read_stripe`).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

from ..settings import get as setting
from ..storage.frames import Framing, Piece

_D2H, _D2D = 2, 3
_ALIGN = 256


class _Opts(ctypes.Structure):  # nvcompBatchedZstdCompressOpts_t
    _fields_ = [("reserved", ctypes.c_char * 64)]


class DecodeOpts(ctypes.Structure):  # nvcompBatchedZstdDecompressOpts_t
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


class _Alignments(ctypes.Structure):  # nvcompAlignmentRequirements_t
    _fields_ = [("input", ctypes.c_size_t), ("output", ctypes.c_size_t),
                ("temp", ctypes.c_size_t)]


class _Properties(ctypes.Structure):  # nvcompProperties_t
    _fields_ = [("version", ctypes.c_uint32), ("cudart_version", ctypes.c_uint32)]


def _candidates() -> list[str]:
    first = setting("nvcomp")  # OOCGEMM_NVCOMP
    paths = [first] if first else []
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        paths += sorted(glob.glob(os.path.join(root, "lib*", "libnvcomp.so*")))
    return paths + ["libnvcomp.so"]


@functools.cache
def library() -> ctypes.CDLL | None:
    """libnvcomp (major version 5 or later), loaded once; None where there is none."""
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        props = _Properties()
        if lib.nvcompGetProperties(ctypes.byref(props)) != 0 or props.version // 1000 < 5:
            continue
        for name in ("nvcompBatchedZstdCompressGetTempSize",
                     "nvcompBatchedZstdCompressGetMaxOutputChunkSize",
                     "nvcompBatchedZstdCompressGetRequiredAlignments",
                     "nvcompBatchedZstdCompressAsync"):
            getattr(lib, name).restype = ctypes.c_int
        # The decompressor typed once, here, for every caller of this shared handle.
        lib.nvcompBatchedZstdDecompressGetTempSize.restype = ctypes.c_int
        lib.nvcompBatchedZstdDecompressGetTempSize.argtypes = [
            ctypes.c_size_t, ctypes.c_size_t, DecodeOpts, ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_size_t, ctypes.c_void_p]
        lib.nvcompBatchedZstdDecompressAsync.restype = ctypes.c_int
        lib.nvcompBatchedZstdDecompressAsync.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, DecodeOpts,
            ctypes.c_void_p, ctypes.c_void_p]
        return lib
    return None


def version() -> str | None:
    """nvCOMP's version ('6.0.0'), or None where it cannot be loaded."""
    lib = library()
    if lib is None:
        return None
    props = _Properties()
    lib.nvcompGetProperties(ctypes.byref(props))
    v = props.version
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"nvCOMP {what} failed (status {status})")


def _up(n: int, align: int = _ALIGN) -> int:
    return -(-n // align) * align


@functools.cache
def frame_capacity(frame_bytes: int) -> int:
    """Bytes nvCOMP may write for one frame of ``frame_bytes``, rounded to the slot's
    alignment."""
    lib = library()
    assert lib is not None
    out, align = ctypes.c_size_t(), _Alignments()
    _check(lib.nvcompBatchedZstdCompressGetMaxOutputChunkSize(
        ctypes.c_size_t(frame_bytes), _Opts(), ctypes.byref(out)), "GetMaxOutputChunkSize")
    _check(lib.nvcompBatchedZstdCompressGetRequiredAlignments(_Opts(), ctypes.byref(align)),
           "GetRequiredAlignments")
    return _up(out.value, max(align.output, 8))


def temp_bytes(frames: int, frame_bytes: int) -> int:
    lib = library()
    assert lib is not None
    out = ctypes.c_size_t()
    _check(lib.nvcompBatchedZstdCompressGetTempSize(
        ctypes.c_size_t(frames), ctypes.c_size_t(frame_bytes), _Opts(), ctypes.byref(out),
        ctypes.c_size_t(frames * frame_bytes), ctypes.c_void_p(0)), "GetTempSize")
    return out.value


def _shape(framing: Framing, rows, cols) -> tuple:
    """What a stripe's frames depend on: the rows of its pieces in each chunk row it
    crosses, and its columns (which start on a chunk's edge)."""
    cr = framing.chunks[0]
    heights = tuple(min(rows[1], (b + 1) * cr) - max(rows[0], b * cr)
                    for b in range(rows[0] // cr, -(-rows[1] // cr)))
    return heights, cols[1] - cols[0]


@functools.lru_cache(maxsize=64)
def _layout(framing: Framing, heights: tuple[int, ...], width: int):
    """Per piece of a stripe of this shape (chunk row by chunk row, left to right), its
    frames' (offset in the scratch, bytes); and the scratch's bytes."""
    cc = framing.chunks[1]
    frames, at = [], 0
    for height in heights:
        for _ in range(-(-width // cc)):
            size = height * cc * framing.itemsize
            frames.append([(at + lo, hi - lo) for lo, hi in framing.cuts(size)])
            at += size
    return frames, at


def _frames_of(framing: Framing, rows, cols):
    """The stripe's pieces, each piece's frames (offset in the scratch, bytes), and the
    scratch's bytes."""
    rows, cols = tuple(rows), tuple(cols)
    return (framing.pieces(rows, cols), *_layout(framing, *_shape(framing, rows, cols)))


def host_bytes(framing: Framing, rows, cols) -> int:
    """Pinned bytes a stripe's frames take in the ring: sizes, statuses, frame slots."""
    _, frames, _ = _frames_of(framing, tuple(rows), tuple(cols))
    n = sum(len(f) for f in frames)
    return _up(12 * n) + n * frame_capacity(framing.frame_bytes)


def device_bytes(framing: Framing, stripes) -> int:
    """Device bytes a :class:`StripeEncoder` for ``stripes`` ((rows, cols) of each DOWNLOAD)
    holds: scratch, frame slots, tables and nvCOMP's temporary buffer."""
    scratch, frames = _largest(framing, stripes)
    return (_up(scratch) + frames * (2 * frame_capacity(framing.frame_bytes) + 40)
            + _up(temp_bytes(frames, framing.frame_bytes)))


@dataclass(frozen=True)
class Sizes:
    """nvCOMP's buffers for C's stripes in ``framing``: what the planner's GPU encode pass
    weighs against the plan's budgets (:class:`~oocgemm.planning.planner.EncoderSizes`;
    the CUDA backend's :meth:`~oocgemm.backends.CudaBackend.encoder`)."""

    framing: Framing

    def host_bytes(self, rows, cols) -> int:
        return host_bytes(self.framing, rows, cols)

    def device_bytes(self, stripes) -> int:
        return device_bytes(self.framing, stripes)


def _largest(framing: Framing, stripes) -> tuple[int, int]:
    scratch = frames = 0
    for shape in {_shape(framing, rows, cols) for rows, cols in stripes}:
        f, size = _layout(framing, *shape)
        scratch, frames = max(scratch, size), max(frames, sum(len(x) for x in f))
    return scratch, frames


class StripeEncoder:
    """Compresses C's stripes on the GPU (current device) into pinned ring buffers; its
    buffers live until :meth:`close`. ``stripes``: (rows, cols) of every stripe it will
    encode (their frame tables are made once, here)."""

    def __init__(self, framing: Framing, stripes, itemsize: int):
        import cupy

        self.lib = library()
        assert self.lib is not None, "nvCOMP is not loadable"
        self.framing = framing
        self.itemsize = itemsize
        self.capacity = frame_capacity(framing.frame_bytes)
        scratch, frames = _largest(framing, stripes)
        self.scratch = cupy.empty(max(scratch, 1), dtype=np.uint8)
        self.slots = cupy.empty(max(frames, 1) * self.capacity, dtype=np.uint8)
        self.packed = cupy.empty(max(frames, 1) * self.capacity, dtype=np.uint8)
        self.pack = pack_kernel()
        self.sizes = cupy.empty(max(frames, 1), dtype=np.uint64)
        self.statuses = cupy.empty(max(frames, 1), dtype=np.int32)
        self.temp_size = temp_bytes(max(frames, 1), framing.frame_bytes)
        self.temp = cupy.empty(max(self.temp_size, 1), dtype=np.uint8)
        self.tables: dict = {}
        for rows, cols in stripes:
            key = _shape(framing, rows, cols)
            if key not in self.tables:
                self.tables[key] = self._table(key)
        cupy.cuda.Device().synchronize()  # the tables are up before any stream uses them

    def _table(self, shape):
        """Device arrays of a stripe shape's frames: input pointers and sizes, slots."""
        import cupy

        frames, _ = _layout(self.framing, *shape)
        flat = [f for piece in frames for f in piece]
        base, slots = self.scratch.data.ptr, self.slots.data.ptr
        ins = np.array([base + at for at, _ in flat], dtype=np.uint64)
        sizes = np.array([n for _, n in flat], dtype=np.uint64)
        outs = slots + np.arange(len(flat), dtype=np.uint64) * np.uint64(self.capacity)
        return len(flat), cupy.asarray(ins), cupy.asarray(sizes), cupy.asarray(outs)

    def encode(self, src_ptr: int, pitch: int, rows, cols, host_ptr: int, stream) -> None:
        """Enqueue on ``stream`` the stripe ``rows`` x ``cols`` of C, which starts at device
        address ``src_ptr`` with rows of ``pitch`` elements: gathered, compressed, and its
        frames copied to the pinned ``host_ptr`` (:func:`read_stripe`'s layout)."""
        import cupy
        from cupy.cuda import runtime

        rows, cols = tuple(rows), tuple(cols)
        pieces, frames, _ = _frames_of(self.framing, rows, cols)
        s, cc = self.itemsize, self.framing.chunks[1]
        base = self.scratch.data.ptr
        for piece, piece_frames in zip(pieces, frames):
            at = piece_frames[0][0]
            height = piece.rows[1] - piece.rows[0]
            width = (piece.cols[1] - piece.cols[0]) * s
            if width < cc * s:  # an edge chunk: its padding columns are zeros
                runtime.memsetAsync(base + at, 0, height * cc * s, stream)
            src = src_ptr + ((piece.rows[0] - rows[0]) * pitch + piece.cols[0] - cols[0]) * s
            runtime.memcpy2DAsync(base + at, cc * s, src, pitch * s, width, height, _D2D,
                                  stream)
        n, ins, sizes, outs = self.tables[_shape(self.framing, rows, cols)]
        _check(self.lib.nvcompBatchedZstdCompressAsync(
            ctypes.c_void_p(ins.data.ptr), ctypes.c_void_p(sizes.data.ptr),
            ctypes.c_size_t(self.framing.frame_bytes), ctypes.c_size_t(n),
            ctypes.c_void_p(self.temp.data.ptr), ctypes.c_size_t(self.temp_size),
            ctypes.c_void_p(outs.data.ptr), ctypes.c_void_p(self.sizes.data.ptr), _Opts(),
            ctypes.c_void_p(self.statuses.data.ptr), ctypes.c_void_p(stream)), "compression")
        with cupy.cuda.ExternalStream(stream):
            self.pack((n,), (PACK_THREADS,), (self.slots, np.uint64(self.capacity), self.sizes,
                                              self.packed))
        runtime.memcpyAsync(host_ptr, self.sizes.data.ptr, 8 * n, _D2H, stream)
        runtime.memcpyAsync(host_ptr + 8 * n, self.statuses.data.ptr, 4 * n, _D2H, stream)
        runtime.memcpyAsync(host_ptr + _up(12 * n), self.packed.data.ptr, n * self.capacity,
                            _D2H, stream)

    def close(self) -> None:
        self.tables.clear()
        self.scratch = self.slots = self.packed = self.sizes = self.statuses = None
        self.temp = None


def read_stripe(framing: Framing, host: np.ndarray, rows, cols
                ) -> list[tuple[Piece, np.ndarray]]:
    """The pieces of a stripe that :meth:`StripeEncoder.encode` copied into ``host`` (the
    pinned ring buffer, as bytes), each with its frames joined: one copy of its span of the
    packed frames (numpy's, which lets the other threads run)."""
    pieces, frames, _ = _frames_of(framing, tuple(rows), tuple(cols))
    n = sum(len(f) for f in frames)
    sizes = host[:8 * n].view(np.uint64)
    statuses = host[8 * n:12 * n].view(np.int32)
    if statuses.any():
        bad = int(np.flatnonzero(statuses)[0])
        raise RuntimeError(f"nvCOMP could not compress frame {bad} of a stripe "
                           f"(status {int(statuses[bad])})")
    ends = np.cumsum(sizes)
    base, g, at, out = _up(12 * n), 0, 0, []
    for piece, piece_frames in zip(pieces, frames):
        g += len(piece_frames)
        end = int(ends[g - 1])
        out.append((piece, host[base + at:base + end].copy()))
        at = end
    return out


#: Threads of a block of ``kernels/frames.cu``'s pack_frames (its reduction's width).
PACK_THREADS = 256
_PACK: dict = {}  # device -> the compiled pack_frames


def pack_kernel():
    """``kernels/frames.cu``'s pack_frames, compiled for the current GPU once a process."""
    import cupy

    from ..errors import KernelError
    from ..kernel_catalog import kernels_dir

    device = cupy.cuda.runtime.getDevice()
    if device not in _PACK:
        path = kernels_dir() / "frames.cu"
        try:
            module = cupy.RawModule(code=path.read_text())
        except OSError as exc:
            raise KernelError(f"cannot read {path} ({exc}); set OOCGEMM_KERNELS to the folder "
                              f"holding the .cu files") from exc
        _PACK[device] = module.get_function("pack_frames")
    return _PACK[device]

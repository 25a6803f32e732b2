"""The direct decoder: chunk files read with os-level reads and decoded by numcodecs, no Zarr
library in between. What is left of a decode rate when the libraries' overheads go: a floor for
the decoders of ``zarr_decoders``, measured by ``decode_rates`` beside them.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np

from benchmarks.common import BenchError, run_parallel
from benchmarks.zarr_decoders import Reader, alloc_out, scratch_array
from benchmarks.zarr_stores import StoreInfo, checksum


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
        scratch = scratch_array(self._local, info.inner, info.dtype)
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
            run_parallel(self._inner, list(np.ndindex(*grid)), self.threads)
        else:
            run_parallel(self._unit, list(np.ndindex(*info.grid)), self.threads)

"""The Zarr decoders under test: each reads a whole store into a preallocated array, every stored
chunk once, through a library's own API: zarr-python (under its own, fused or ``zarrs`` codec
pipeline) and tensorstore. `Reader` is what every decoder of ``decode_rates`` provides,
``direct_decode`` included.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from benchmarks.common import BenchError, run_parallel
from benchmarks.zarr_stores import StoreInfo, checksum


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
        """The destination's `checksum`, for the check against ``make``'s data."""
        return checksum(self.out)

    def pieces(self) -> list[tuple[slice, ...]]:
        """The regions that the threads share out, one read each (``chunks``, ``inner`` or
        ``bands``)."""
        if self.variant == "chunks":
            return [sl for _, sl in self.info.units()]
        if self.variant == "inner":
            return self.info.inner_chunks()
        return self.info.bands()


class ZarrReader(Reader):
    """zarr-python's own API: ``get_basic_selection(region, out=NDBuffer)``, under a codec pipeline.

    ``whole`` reads the array in one call into ``out``; ``chunks``/``inner``/``bands`` share
    stored objects / innermost chunks / row bands of whole stored objects out to ``threads``
    Python threads, each reading into its place of ``out``. The ``zarrs`` pipeline decodes only
    into C-contiguous arrays: its ``chunks`` and ``inner`` read into a per-thread scratch array
    and copy into place.
    """

    def __init__(self, info: StoreInfo, variant: str, threads: int, config: dict,
                 expect_pipeline: str) -> None:
        super().__init__(info, variant, threads)
        import zarr
        from zarr.core.buffer.cpu import NDBuffer

        zarr.config.set(config)
        self._ndbuffer = NDBuffer
        self.array = zarr.open_array(info.path, mode="r")
        pipeline = type(self.array._async_array.codec_pipeline).__name__
        if pipeline != expect_pipeline:
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
            scratch = scratch_array(self._local, dest.shape, dest.dtype)
            self.array.get_basic_selection(sl, out=self._ndbuffer.from_numpy_array(scratch))
            dest[...] = scratch
        else:
            self.array.get_basic_selection(sl, out=self._ndbuffer.from_numpy_array(dest))

    def run(self) -> None:
        if self.variant == "whole":
            self.array.get_basic_selection(Ellipsis, out=self._ndbuffer.from_numpy_array(self.out))
        else:
            run_parallel(self._into, self.pieces(), self.threads)


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
            run_parallel(
                lambda sl: dest[sl].write(self.source[sl]).result(), self.pieces(), self.threads
            )


def scratch_array(local: threading.local, shape: tuple[int, ...], dtype) -> np.ndarray:
    """This thread's reusable array of ``shape``: a decoder that cannot write into its place
    decodes here and copies, without allocating per chunk."""
    cache = getattr(local, "scratch", None)
    if cache is None:
        cache = local.scratch = {}
    key = (shape, np.dtype(dtype).str)
    if key not in cache:
        cache[key] = np.empty(shape, dtype=dtype)
    return cache[key]

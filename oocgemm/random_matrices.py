"""Random matrices for tests, examples and benchmarks, and the writer behind ``oocgemm random``.

* :class:`NormalStream` and :func:`write_random` -- standard-normal matrices of any size,
  written band by band to ``.zarr`` or ``.npy``, identical for one seed whatever the chunking;
* :func:`random_matrix` -- a standard-normal matrix in memory, filled by several threads;
* :func:`tolerance` -- the relative error a product of random matrices may show against a
  reference computed in another order.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import sys
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from . import arguments, machine
from .errors import OptionError, OutputError
from .storage import files
from .units import format_size

#: Default chunk edge of ``random`` .zarr outputs (chunks are min(shape, 2048x2048)).
DEFAULT_CHUNK = 2048

#: Bytes of matrix that ``write_random`` generates at a time (its memory use is a few times this).
RANDOM_BLOCK_BYTES = 64 << 20


def check_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """``dtype`` as a numpy dtype; :class:`~oocgemm.DTypeError` unless oocgemm multiplies it
    (:func:`oocgemm.arguments.check_dtype`, the check of operands' dtypes too)."""
    return arguments.check_dtype(None, dtype)



def tolerance(dtype: npt.DTypeLike, k: int) -> float:
    """Largest acceptable ``max|C - C_numpy| / max|C_numpy|`` for a product of depth ``k``:
    both results sum the same k products in different orders."""
    return 100 * float(np.finfo(np.dtype(dtype)).eps) * math.sqrt(max(k, 1))



def random_matrix(shape: tuple[int, int], dtype: npt.DTypeLike = "float64", seed: int = 0,
                  threads: int | None = None) -> np.ndarray:
    """A standard-normal matrix filled by several threads (one generator per row band): the
    GPU benchmark's operands are tens of GB, too many for one thread."""
    from concurrent.futures import ThreadPoolExecutor

    out = np.empty(shape, dtype=dtype)
    threads = threads or machine.cores()
    bands = np.array_split(np.arange(shape[0]), max(1, min(threads * 4, shape[0])))
    seeds = np.random.SeedSequence(seed).spawn(len(bands))

    def fill(band, seq):
        if len(band):
            rng = np.random.default_rng(seq)
            rows = out[band[0]:band[-1] + 1]
            if rows.dtype == np.float64:
                rng.standard_normal(out=rows)
            else:
                rows[...] = rng.standard_normal(rows.shape)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, bands, seeds))
    return out



class NormalStream:
    """An endless, seekable stream of standard-normal float64 values for one seed.

    Value ``i`` of the stream depends only on the seed and ``i``: it is computed from the
    uniforms ``2*(i//2)`` and ``2*(i//2)+1`` of a PCG64 generator seeded with
    ``SeedSequence(seed)`` (Box-Muller: ``sqrt(-2 log(1 - u0)) * cos/sin(2 pi u1)``), and the
    generator jumps straight to any position (``PCG64.advance``). A matrix element (i, j) of an
    M x N real matrix is value ``i*N + j``; of a complex one, values ``2*(i*N + j)`` (real) and
    ``+1`` (imaginary). So the data are the same for one seed whatever the chunks, the bands
    written at a time or the file format, and an m-row matrix is the first m rows of a taller
    one with the same seed and columns. float32/complex64 are the float64 values rounded.

    ``seed=None`` draws fresh entropy; ``stream.seed`` is then the number to pass to get the
    same data again.
    """

    def __init__(self, seed: int | None = None):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise OptionError(f"seed must be a non-negative integer, got {seed!r}")
        sequence = np.random.SeedSequence(seed)
        entropy = sequence.entropy
        assert isinstance(entropy, int)  # a given seed, or the one SeedSequence drew
        self.seed = entropy
        self._base = np.random.PCG64(sequence)

    def values(self, start: int, count: int) -> np.ndarray:
        """Stream values ``start .. start+count-1`` (float64)."""
        if count <= 0:
            return np.empty(0)
        p0, p1 = start // 2, (start + count + 1) // 2
        bits = copy.copy(self._base)
        bits.advance(2 * p0)
        u = np.random.Generator(bits).random(2 * (p1 - p0)).reshape(-1, 2)
        radius = np.subtract(1.0, u[:, 0])  # exact, in (0, 1]: the log is finite
        np.log(radius, out=radius)
        radius *= -2.0
        np.sqrt(radius, out=radius)
        angle = u[:, 1] * (2 * np.pi)
        z = np.empty((p1 - p0, 2))
        np.multiply(radius, np.cos(angle), out=z[:, 0])
        np.multiply(radius, np.sin(angle), out=z[:, 1])
        offset = start - 2 * p0
        return z.reshape(-1)[offset:offset + count]

    def block(self, n_cols: int, rows: tuple[int, int], cols: tuple[int, int],
              dtype: npt.DTypeLike) -> np.ndarray:
        """Rows ``rows[0]:rows[1]``, columns ``cols[0]:cols[1]`` of the matrix with ``n_cols``
        columns, as ``dtype``."""
        dt = np.dtype(dtype)
        per = 2 if dt.kind == "c" else 1  # stream values per element
        (r0, r1), (c0, c1) = rows, cols
        width = (c1 - c0) * per
        if c0 == 0 and c1 == n_cols:
            flat = self.values(r0 * n_cols * per, (r1 - r0) * width).reshape(r1 - r0, width)
        else:
            flat = np.empty((r1 - r0, width))
            for i in range(r0, r1):
                flat[i - r0] = self.values((i * n_cols + c0) * per, width)
        if per == 2:
            flat = np.ascontiguousarray(flat).view(np.complex128)
        return flat.astype(dt, copy=False)


def random_kind(path: str | os.PathLike[str]) -> str:
    """'zarr' or 'npy' from the name; anything else is an error."""
    lower = os.fspath(path).lower().rstrip("/\\")
    if lower.endswith(".zarr"):
        return "zarr"
    if lower.endswith(".npy"):
        return "npy"
    raise OptionError(f"{path!r}: the output name must end in .zarr (a Zarr v3 directory) or "
                      f".npy")


def _write_blocks(m: int, n: int, itemsize: int, align: tuple[int, int], target: int):
    """Blocks (rows, cols) in row-major order: whole rows when a band of ``align[0]`` rows fits
    in ``target`` bytes, else ``align[0]`` rows by a multiple of ``align[1]`` columns. Block
    edges fall on multiples of ``align`` (the Zarr chunks): no chunk is written twice."""
    cr, cc = align
    rows = (target // max(n * itemsize, 1)) // cr * cr
    if rows >= cr:
        cols = n
    else:
        rows = cr
        cols = min(n, max(cc, (target // max(cr * itemsize, 1)) // cc * cc))
    rows = min(rows, m)
    for r0 in range(0, m, rows):
        for c0 in range(0, n, cols):
            yield (r0, min(r0 + rows, m)), (c0, min(c0 + cols, n))


def write_random(path: str | os.PathLike[str], shape: tuple[int, int] | str,
                 dtype: npt.DTypeLike = "float64", *,
                 chunks: tuple[int, int] | str | None = None, seed: int | None = None,
                 overwrite: bool = False, progress: bool | None = None,
                 block_bytes: int = RANDOM_BLOCK_BYTES) -> dict:
    """Write a standard-normal matrix (see :class:`NormalStream`) to a ``.zarr`` or ``.npy``.

    Generated block by block (bands of whole chunk rows, at most about ``block_bytes`` each),
    so it works for matrices larger than memory. Written under a temporary name beside
    ``path`` and renamed at the end; nothing is left behind on failure or interruption.

    Parameters
    ----------
    path
        Ends in ``.zarr`` (Zarr v3, uncompressed, chunks ``chunks``) or ``.npy``.
    shape
        (rows, cols), positive.
    dtype
        float32, float64, complex64 or complex128.
    chunks
        Zarr chunk shape; default ``min(shape, (2048, 2048))``. Not allowed for ``.npy``.
    seed
        Non-negative integer; None draws one (returned as ``"seed"``).
    overwrite
        Replace an existing ``path``.
    progress
        True/False for a progress bar on stderr; None for one only when stderr is a terminal.

    Returns
    -------
    dict
        path, format, shape, dtype, chunks, seed, bytes, seconds.
    """
    path = os.fspath(path)
    kind = random_kind(path)
    shape = _positive_pair(shape, "shape")
    dt = check_dtype(dtype)
    if chunks is not None and kind == "npy":
        raise OptionError("chunks apply to .zarr outputs only (a .npy file has no chunks)")
    # the blocks written: whole Zarr chunks; any for a .npy
    grid = (_positive_pair(chunks, "chunks") if chunks is not None
            else (min(shape[0], DEFAULT_CHUNK), min(shape[1], DEFAULT_CHUNK)))
    if kind == "npy":
        grid = (1, 1)
    stream = NormalStream(seed)
    if os.path.lexists(path) and not overwrite:
        raise OutputError(f"{path!r} exists; pass --overwrite (overwrite=True) to replace it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"the directory {parent!r} does not exist")
    m, n = shape
    nbytes = m * n * dt.itemsize
    free = shutil.disk_usage(parent).free
    if nbytes > free:
        raise OutputError(f"{path!r}: the matrix needs {format_size(nbytes)}; only "
                          f"{format_size(free)} is free on that file system")

    temporary = files.temporary_sibling(path)
    start = time.perf_counter()
    bar = None
    try:
        if kind == "zarr":
            import zarr

            array: Any = zarr.create_array(
                store=temporary, shape=shape, dtype=dt, chunks=grid, compressors=None,
                fill_value=0, zarr_format=3,
                attributes={"random": {"distribution": "standard_normal", "seed": stream.seed,
                                       "generator": "oocgemm.random_matrices.NormalStream"}})
        else:
            from numpy.lib import format as npy_format

            array = npy_format.open_memmap(temporary, mode="w+", dtype=dt, shape=shape)
        if progress is None or progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=nbytes, unit="B", unit_scale=True, unit_divisor=1024,
                       desc=os.path.basename(path.rstrip("/\\")), leave=False,
                       disable=None if progress is None else False, file=sys.stderr)
        for rows, cols in _write_blocks(m, n, dt.itemsize, grid, block_bytes):
            block = stream.block(n, rows, cols, dt)
            array[rows[0]:rows[1], cols[0]:cols[1]] = block
            if bar is not None:
                bar.update(block.nbytes)
        if kind == "npy":
            array.flush()
        del array
        files.replace(temporary, path)
    except BaseException:
        files.remove(temporary)
        raise
    finally:
        if bar is not None:
            bar.close()
    return {"path": path, "format": kind, "shape": list(shape), "dtype": dt.name,
            "chunks": list(grid) if kind == "zarr" else None, "seed": stream.seed,
            "bytes": nbytes,
            "seconds": time.perf_counter() - start}


def _positive_pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, (str, bytes)):
        raise OptionError(f"{name} must be two positive integers, got {value!r}")
    try:
        pair = tuple(int(v) for v in value)
        ok = len(pair) == 2 and all(int(v) == v for v in value) and min(pair) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionError(f"{name} must be two positive integers, got {value!r}")
    return pair[0], pair[1]

"""A product's operands on both sides of the graph. Where the graph is built, an :class:`Operand`
is a stored matrix (each task reads its part from storage) or a dask array (each task gets its
part's chunks as dependencies), and writes what a task needs of it as a spec; in the task,
:func:`resolve` opens the spec as a source (a :class:`Region` of a stored matrix). Only
metadata is read where the graph is built; the chunks a Region decodes are shared through
:mod:`.sharing`, which knows nothing of sources."""

from __future__ import annotations

import os

import numpy as np

from ..errors import ShapeError
from ..storage.base import MatrixSource
from .partition import covering
from .sharing import SharedChunks


class Operand:
    """One input of the graph: stored (each task reads its part from storage), or a dask
    array (each task gets its part's chunks as dependencies)."""

    def __init__(self, shape, dtype, transposed, *, stored=None, array=None, grain=None):
        self.shape, self.dtype, self.transposed = shape, np.dtype(dtype), transposed
        self.stored, self.array = stored, array
        #: The chunk sizes of op(operand) where it has a chunk grid, (rows, cols).
        self.grain = (grain[1], grain[0]) if transposed and grain else (grain or (None, None))

    @classmethod
    def of(cls, obj, role: str, transposed: bool) -> Operand:
        import dask.array as da

        from ..storage import is_path, open_source, urls, zarr_behind
        from ..storage.base import library_of

        stored = grain = None
        if is_path(obj):  # absolute: workers may run elsewhere (a shared file system)
            path = urls.local(os.fspath(obj))
            stored = path if urls.is_url(path) else os.path.abspath(path)
        elif library_of(obj) == "zarr":
            stored = obj
        elif library_of(obj) == "dask":
            stored = zarr_behind(obj)
        if stored is not None:
            src = open_source(stored, role)  # checked here: missing, corrupt, not a matrix
            shape, dtype, array = tuple(src.shape), src.dtype, None
            grain = getattr(src, "chunks", None)
            src.close()
        else:
            if library_of(obj) == "xarray":
                obj = obj.data
            if library_of(obj) == "dask":
                array = obj
                grain = tuple(sizes[0] if sizes else None for sizes in obj.chunks)
            else:
                array = da.from_array(np.asarray(obj))
            if array.ndim != 2:
                raise ShapeError(f"{role} must be 2-d, got shape {tuple(array.shape)}")
            src = open_source(array, role)  # unknown chunk sizes, dtypes: refused here
            shape, dtype = tuple(array.shape), src.dtype
        return cls((shape[1], shape[0]) if transposed else shape, dtype, transposed,
                   stored=stored, array=array, grain=grain)

    @property
    def token(self):
        if self.array is not None:
            return self.array.name
        return repr(self.stored) if not hasattr(self.stored, "store_path") else (
            str(self.stored.store_path), self.stored.shape)

    def for_plan(self):
        """What ``oocgemm.plan`` takes for this operand (it reads no data)."""
        return self.stored if self.stored is not None else self.array

    def part(self, rows, cols):
        """What a task needs of op(operand): rows ``rows`` (all columns) or columns ``cols``
        (all rows), or both; as a spec the task resolves."""
        m, n = self.shape
        r = rows or (0, m)
        q = cols or (0, n)
        stored_r, stored_q = (q, r) if self.transposed else (r, q)
        # Lists, not tuples: dask looks for the keys of dependencies inside lists.
        if self.stored is not None:
            return ["stored", self.stored, list(stored_r), list(stored_q), self.transposed]
        x = self.array
        row_bounds = np.cumsum((0,) + x.chunks[0])
        col_bounds = np.cumsum((0,) + x.chunks[1])
        i0, i1 = covering(row_bounds, stored_r)
        j0, j1 = covering(col_bounds, stored_q)
        keys = [[(x.name, i, j) for j in range(j0, j1)] for i in range(i0, i1)]
        offset = [int(row_bounds[i0]), int(col_bounds[j0])]
        return ["blocks", keys, offset, list(stored_r), list(stored_q), self.transposed]


def resolve(spec, shared: SharedChunks | None = None, role: str = "") -> MatrixSource:
    """A task's part of an operand, in its stored layout."""
    kind = spec[0]
    if kind == "blocks":
        _, blocks, (r0, c0), (lo_r, hi_r), (lo_c, hi_c), _ = spec
        from ..storage.dask_arrays import host_array
        from ..storage.memory import NumpySource

        band = np.block([[np.asarray(host_array(b)) for b in row] for row in blocks])

        return NumpySource(band[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0], name="dask chunks")
    _, stored, rows, cols, _ = spec
    from ..storage import open_source

    source = open_source(stored, "stored input")
    if shared is None and tuple(rows) == (0, source.shape[0]) and \
            tuple(cols) == (0, source.shape[1]):
        return source  # the whole operand, for a run of its own: read as multiply reads it
    return Region(source, rows, cols, shared=shared, role=role)


class Region(MatrixSource):
    """Rows ``rows`` and columns ``cols`` of a source, itself a source: chunked where the
    region starts on the source's chunk grid, so that reads stay at the storage's grain."""

    def __init__(self, inner: MatrixSource, rows, cols, *, shared: SharedChunks | None = None,
                 role: str = ""):
        self.inner = inner
        self._shared, self._role = shared, role
        self.rows, self.cols = tuple(rows), tuple(cols)
        self.region = (self.rows, self.cols)
        self.shape = (rows[1] - rows[0], cols[1] - cols[0])
        self.dtype = inner.dtype
        self.on_disk = inner.on_disk
        self.name = f"{inner.name}[{rows[0]}:{rows[1]}, {cols[0]}:{cols[1]}]"
        self.path = inner.path
        grid = getattr(inner, "chunks", None)
        aligned = grid is not None and rows[0] % grid[0] == 0 and cols[0] % grid[1] == 0
        self.chunks: tuple[int, int] | None = (
            (int(grid[0]), int(grid[1])) if grid is not None and aligned and
            hasattr(inner, "read_chunk") else None)

    def read(self, rows, cols, out):
        self.inner.read((self.rows[0] + rows[0], self.rows[0] + rows[1]),
                        (self.cols[0] + cols[0], self.cols[0] + cols[1]), out)

    def read_chunk(self, index, out, *, files=None):
        """Chunk ``index`` of the region, read as a region (``files`` unused)."""
        assert self.chunks is not None  # only regions on the chunk grid are read by chunks
        r0 = index[0] * self.chunks[0]
        c0 = index[1] * self.chunks[1]
        self.read((r0, r0 + out.shape[0]), (c0, c0 + out.shape[1]), out)

    def stored_chunk(self, index) -> tuple[int, int]:
        """Region chunk ``index`` as the stored array's chunk index."""
        assert self.chunks is not None  # only regions on the chunk grid are read by chunks
        return (self.rows[0] // self.chunks[0] + index[0],
                self.cols[0] // self.chunks[1] + index[1])

    @property
    def shared_chunk(self):
        """Chunks decoded once for every task of the graph in this process (None where the
        region is not on the chunk grid, or nothing is shared)."""
        if self._shared is None or self.chunks is None:
            return None
        return self._shared_chunk

    def _shared_chunk(self, index) -> tuple[np.ndarray, bool]:
        """Region chunk ``index``: its stored chunk, decoded once per process, clipped to the
        region; and whether this call decoded it (else another task of the graph had)."""
        assert self.chunks is not None and self._shared is not None  # see shared_chunk
        (ch, cw), (rows, cols) = self.chunks, self.inner.shape
        at = self.stored_chunk(index)
        r0, c0 = at[0] * ch, at[1] * cw
        r1, c1 = min(r0 + ch, rows), min(c0 + cw, cols)

        decoded = []

        def decode():  # the stored chunk whole, as the source decodes it (and counts it)
            whole = np.empty((r1 - r0, c1 - c0), dtype=self.inner.dtype)
            self.inner.read_chunk(at, whole)
            decoded.append(True)
            return whole

        whole = self._shared.get((self._role, at), decode)
        return whole[:min(r1, self.rows[1]) - r0, :min(c1, self.cols[1]) - c0], bool(decoded)

    # what the inner source took from storage and decoded, for the run's figures
    @property
    def bytes_read(self) -> int:  # type: ignore[override]
        return self.inner.bytes_read

    @property
    def decoded_bytes(self) -> int:  # type: ignore[override]
        return self.inner.decoded_bytes

    def array(self):
        return self.inner.array()

    def close(self):
        self.inner.close()

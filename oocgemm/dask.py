"""oocgemm inside dask graphs: a lazy matmul with one task per C block.

    >>> import dask.array as da, oocgemm.dask
    >>> c = oocgemm.dask.matmul(da.from_zarr("a.zarr"), da.from_zarr("b.zarr"))  # doctest: +SKIP
    >>> c.to_zarr("c.zarr")                                                     # doctest: +SKIP

dask's own ``x @ y`` makes a partial product for every (i, k, j) triple of chunks and sums them
in a tree. :func:`matmul` makes one task per C block of the plan instead. Each task runs the
engine for its block on the worker's device (a GPU where the worker has one), streaming the A
rows and B columns it needs:

- inputs that are stored (a ``.zarr`` or ``.npy`` path, a ``zarr.Array``, an untouched
  ``da.from_zarr``) are read by each task straight from storage, at its chunks;
- any other dask array feeds its chunks to the tasks as graph dependencies, so each chunk is
  computed once per graph run.

The result is a ``dask.array.Array`` whose chunks are the C blocks, and it composes with the rest
of a graph (``to_zarr``, reductions, ``persist``). Under a ``dask.distributed`` Client the tasks run
on its workers. With one GPU per worker (dask-cuda's ``LocalCUDACluster``, or workers started
with their own ``CUDA_VISIBLE_DEVICES``), pass ``resources={"GPU": 1}`` to hold each worker to
one engine run at a time. Within one process the engine runs one block at a time per device.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DeviceError, OptionError, ShapeError
from .storage.base import MatrixSource

if TYPE_CHECKING:
    import dask.array

    from .api import MatrixLike, Scalar

#: One engine run at a time per device in a process (a GPU's memory is planned for one run).
_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def matmul(x: MatrixLike, y: MatrixLike, *, c: MatrixLike | None = None, alpha: Scalar = 1.0,
           beta: Scalar = 0.0, trans_a: bool = False, trans_b: bool = False,
           chunks: tuple[int | Sequence[int], int | Sequence[int]] | None = None,
           resources: Mapping[str, float] | None = None, **options: Any) -> dask.array.Array:
    """``alpha * op(x) @ op(y) + beta * c`` as a lazy dask array, one task per C block.

    Parameters
    ----------
    x, y, c
        Dask arrays, numpy arrays, ``zarr.Array`` objects, or ``.zarr`` / ``.npy`` paths
        (``c`` with ``beta != 0`` only).
    chunks
        The C blocks, as ``(rows, cols)`` of the output chunks; default: the plan's C blocks
        for the device (``oocgemm.plan`` on the inputs, with ``options``).
    resources
        dask resource annotations of the tasks, e.g. ``{"GPU": 1}`` for workers started with
        ``--resources GPU=1``.
    options
        Keywords of :func:`oocgemm.multiply` for each task's run: ``device``,
        ``memory_limit``, ``host_memory_limit``, ``tile``, ``kernel``; and ``trace_dir``, a
        folder every worker can write, where each task leaves its events for
        :func:`timeline` to merge.
    """
    import dask.array as da
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

    from .api import _scalar
    from .api import plan as plan_product

    unknown = set(options) - {"device", "memory_limit", "host_memory_limit", "tile", "kernel",
                              "trace_dir"}
    if unknown:
        raise OptionError(f"oocgemm.dask.matmul: unknown options {sorted(unknown)}")
    alpha, beta = _scalar("alpha", alpha), _scalar("beta", beta)
    ops = {"A": _Operand.of(x, "x", trans_a), "B": _Operand.of(y, "y", trans_b)}
    (m, k), (k2, n) = ops["A"].shape, ops["B"].shape
    if k != k2:
        raise ShapeError(f"op(x) is {m}x{k} and op(y) is {k2}x{n}: inner dimensions differ")
    if beta != 0:
        if c is None:
            raise OptionError("beta != 0 needs c")
        ops["C"] = _Operand.of(c, "c", False)
        if ops["C"].shape != (m, n):
            raise ShapeError(f"c has shape {ops['C'].shape}, expected {(m, n)}")
    dtype = np.result_type(*(op.dtype for op in ops.values()),
                           *([np.complex64] if isinstance(alpha, complex) or
                             isinstance(beta, complex) else []))
    if chunks is None:
        chunks = _plan_chunks(plan_product, ops, alpha, beta, options)
    rows, cols = (_splits(sizes, extent, name) for sizes, extent, name in
                  ((chunks[0], m, "rows"), (chunks[1], n, "cols")))
    name = "oocgemm-matmul-" + tokenize(*(op.token for op in ops.values()), alpha, beta, rows,
                                        cols, sorted(options.items()))
    layer = {}
    for i in range(len(rows) - 1):
        for j in range(len(cols) - 1):
            r, q = (rows[i], rows[i + 1]), (cols[j], cols[j + 1])
            layer[(name, i, j)] = (
                _block, ops["A"].part(r, None), ops["B"].part(None, q),
                ops["C"].part(r, q) if "C" in ops else None,
                alpha, beta, str(np.dtype(dtype)), dict(options), name)
    deps = [op.array for op in ops.values() if op.array is not None]
    annotations = {"resources": dict(resources)} if resources else None
    graph = HighLevelGraph.from_collections(
        name, MaterializedLayer(layer, annotations=annotations), dependencies=deps)
    return da.Array(graph, name, (tuple(np.diff(rows)), tuple(np.diff(cols))), dtype=dtype)


def _splits(sizes, extent: int, what: str) -> list[int]:
    if isinstance(sizes, (int, np.integer)):
        sizes = [int(sizes)] * max(1, math.ceil(extent / max(int(sizes), 1)))
        sizes[-1] = extent - sum(sizes[:-1])
    sizes = [int(s) for s in sizes]
    if sum(sizes) != extent or any(s < 0 for s in sizes):
        raise OptionError(f"chunks: {what} {sizes} do not add up to {extent}")
    return [0, *np.cumsum(sizes).tolist()] if sizes else [0, 0]


def _plan_chunks(plan_product, ops, alpha, beta, options):
    """The plan's C blocks for these inputs (planned here, where the graph is built)."""
    args = {name: op.for_plan() for name, op in ops.items()}
    kw = dict(alpha=alpha, beta=beta, c=args.get("C"), trans_a=ops["A"].transposed,
              trans_b=ops["B"].transposed,
              **{k: v for k, v in options.items() if k != "trace_dir"})
    try:
        p = plan_product(args["A"], args["B"], **kw)
    except DeviceError:  # no GPU where the graph is built: the blocks of a CPU plan
        p = plan_product(args["A"], args["B"], **{**kw, "device": "cpu"})
    return (tuple(np.diff(p.row_splits)), tuple(np.diff(p.col_splits)))


class _Operand:
    """One input of the graph: stored (each task reads its part from storage), or a dask
    array (each task gets its part's chunks as dependencies)."""

    def __init__(self, shape, dtype, transposed, *, stored=None, array=None):
        self.shape, self.dtype, self.transposed = shape, np.dtype(dtype), transposed
        self.stored, self.array = stored, array

    @classmethod
    def of(cls, obj, role: str, transposed: bool) -> _Operand:
        import dask.array as da

        from .storage import _module, is_path, open_source, urls, zarr_behind

        stored = None
        if is_path(obj):  # absolute: workers may run elsewhere (a shared file system)
            path = urls.local(os.fspath(obj))
            stored = path if urls.is_url(path) else os.path.abspath(path)
        elif _module(obj) == "zarr":
            stored = obj
        elif _module(obj) == "dask":
            stored = zarr_behind(obj)
        if stored is not None:
            src = open_source(stored, role)  # checked here: missing, corrupt, not a matrix
            shape, dtype, array = tuple(src.shape), src.dtype, None
            src.close()
        else:
            if _module(obj) == "xarray":
                obj = obj.data
            array = obj if _module(obj) == "dask" else da.from_array(np.asarray(obj))
            if array.ndim != 2:
                raise ShapeError(f"{role} must be 2-d, got shape {tuple(array.shape)}")
            src = open_source(array, role)  # unknown chunk sizes, dtypes: refused here
            shape, dtype = tuple(array.shape), src.dtype
        return cls((shape[1], shape[0]) if transposed else shape, dtype, transposed,
                   stored=stored, array=array)

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
        i0, i1 = _covering(row_bounds, stored_r)
        j0, j1 = _covering(col_bounds, stored_q)
        keys = [[(x.name, i, j) for j in range(j0, j1)] for i in range(i0, i1)]
        offset = [int(row_bounds[i0]), int(col_bounds[j0])]
        return ["blocks", keys, offset, list(stored_r), list(stored_q), self.transposed]


def _covering(bounds, span) -> tuple[int, int]:
    """The chunk indices whose union covers ``span`` (a nonempty range of chunks for empty
    spans, so that a block of a 0-size dimension still has its shape)."""
    lo, hi = span
    i0 = max(0, int(np.searchsorted(bounds, lo, side="right")) - 1)
    i1 = max(i0 + 1, int(np.searchsorted(bounds, hi, side="left")))
    return min(i0, len(bounds) - 2), min(i1, len(bounds) - 1)


def _block(a, b, c, alpha, beta, dtype, options, graph: str = ""):
    """One task: its C block, computed by the engine on this worker."""
    from .api import multiply

    trans_a, trans_b = a[-1], b[-1]  # each spec ends with its operand's transposition
    options = dict(options)
    trace_dir = options.pop("trace_dir", None)
    with _shared_chunks(graph) as shared:
        a_src, b_src = _resolve(a, shared, "A"), _resolve(b, shared, "B")
        c_src = _resolve(c, shared, "C") if c is not None else None
        out = np.empty((a_src.shape[1] if trans_a else a_src.shape[0],
                        b_src.shape[0] if trans_b else b_src.shape[1]), dtype=dtype)
        if 0 in out.shape:
            return out
        with _device_lock(str(options.get("device", "auto"))):
            result = multiply(a_src, b_src, out, c=c_src, alpha=alpha, beta=beta,
                              trans_a=trans_a, trans_b=trans_b, progress=False,
                              events=trace_dir is not None, **options)
    if trace_dir is not None:
        _leave_events(trace_dir, result)
    return out


def _leave_events(trace_dir: str, result) -> None:
    """The task's events, in a file of its own in ``trace_dir`` (for :func:`timeline`)."""
    import json
    import socket
    import uuid

    worker = f"{socket.gethostname()}:{os.getpid()}"
    doc = {"worker": worker, "device": result.plan.device, "started_at": result.started_at,
           "flops": result.flops, "seconds": result.seconds,
           "events": [[e.index, e.kind, e.operand, list(e.key), e.q, e.lane, e.start, e.end,
                       e.nbytes, e.flops] for e in result.events]}
    path = os.path.join(trace_dir, f"task-{uuid.uuid4().hex}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def timeline(trace_dir: str):
    """The tasks' events that :func:`matmul` left in ``trace_dir`` (``trace_dir=`` option),
    merged onto one clock: a :class:`~oocgemm.diagnostics.Timeline` with a lane group per
    worker and device ('host:pid/cuda:0/compute'), and its ``devices`` line for the share of
    each and the balance."""
    import glob
    import json

    from .diagnostics.events import Event
    from .diagnostics.timeline import Timeline
    from .errors import InputError

    docs = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "task-*.json"))):
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    if not docs:
        raise InputError(f"{trace_dir}: no task events (pass trace_dir= to matmul, and run it)")
    zero = min(d["started_at"] for d in docs)
    events = []
    for d in docs:
        shift = d["started_at"] - zero
        for index, kind, operand, key, q, lane, start, end, nbytes, flops in d["events"]:
            events.append(Event(index=index, kind=kind, operand=operand, key=tuple(key), q=q,
                                lane=f"{d['worker']}/{d['device']}/{lane}",
                                start=start + shift, end=end + shift, nbytes=nbytes,
                                flops=flops))
    return Timeline.from_events(events, meta={"tasks": len(docs)})


def _device_lock(device: str) -> threading.Lock:
    """This process's lock of ``device``."""
    with _LOCKS_LOCK:
        return _DEVICE_LOCKS.setdefault(device, threading.Lock())


class SharedChunks:
    """The decoded chunks of a graph's stored inputs, shared by its tasks in one process, so
    that each chunk is decoded once per process however many blocks need it. Held while
    some task of the graph runs (or waits for its device) here, and ``GRACE`` seconds after;
    at most ``budget`` bytes (chunks beyond it are decoded by each task for itself)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.bytes = 0
        self.decodes = 0
        self._chunks: dict = {}
        self._lock = threading.Lock()
        self.active = 0
        self.timer: threading.Timer | None = None

    def get(self, key, decode) -> np.ndarray:
        """The chunk ``key``, decoded by ``decode()`` by the first task that asks."""
        with self._lock:
            entry = self._chunks.get(key)
            mine = entry is None
            if mine:
                entry = self._chunks[key] = _Pending()
        if not mine:
            return entry.wait()
        try:
            array = decode()
        except BaseException as exc:
            with self._lock:
                del self._chunks[key]
            entry.fail(exc)
            raise
        with self._lock:
            self.decodes += 1
            if self.bytes + array.nbytes > self.budget:
                del self._chunks[key]  # over budget: not kept, the next task decodes again
            else:
                self.bytes += array.nbytes
        entry.done(array)
        return array


class _Pending:
    def __init__(self):
        self._event = threading.Event()
        self._value = self._error = None

    def done(self, value):
        self._value = value
        self._event.set()

    def fail(self, error):
        self._error = error
        self._event.set()

    def wait(self):
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


#: Seconds a graph's shared chunks outlive its last task running in a process. 0: they go
#: as soon as no task of the graph runs here, so that a graph computed again after its stored
#: inputs changed never meets chunks decoded before.
GRACE = 0.0
_SHARED: dict[str, SharedChunks] = {}


@contextlib.contextmanager
def _shared_chunks(graph: str):
    """This process's shared chunks of ``graph``, held for the duration of one task."""
    from . import hostinfo

    with _LOCKS_LOCK:
        shared = _SHARED.get(graph)
        if shared is None:
            shared = _SHARED[graph] = SharedChunks(hostinfo.total_memory() // 4)
        if shared.timer is not None:
            shared.timer.cancel()
            shared.timer = None
        shared.active += 1
    try:
        yield shared
    finally:
        with _LOCKS_LOCK:
            shared.active -= 1
            if shared.active == 0 and GRACE <= 0:
                del _SHARED[graph]
            elif shared.active == 0:
                shared.timer = threading.Timer(GRACE, _drop, args=(graph, shared))
                shared.timer.daemon = True
                shared.timer.start()


def _drop(graph: str, shared: SharedChunks) -> None:
    with _LOCKS_LOCK:
        if _SHARED.get(graph) is shared and shared.active == 0:
            del _SHARED[graph]


def _resolve(spec, shared: SharedChunks | None = None, role: str = "") -> MatrixSource:
    """A task's part of an operand, in its stored layout."""
    kind = spec[0]
    if kind == "blocks":
        _, blocks, (r0, c0), (lo_r, hi_r), (lo_c, hi_c), _ = spec
        from .storage.memory import NumpySource, host_array

        band = np.block([[np.asarray(host_array(b)) for b in row] for row in blocks])

        return NumpySource(band[lo_r - r0:hi_r - r0, lo_c - c0:hi_c - c0], name="dask chunks")
    _, stored, rows, cols, _ = spec
    from .storage import open_source

    return Region(open_source(stored, "stored input"), rows, cols, shared=shared, role=role)


class Region(MatrixSource):
    """Rows ``rows`` and columns ``cols`` of a source, itself a source: chunked where the
    region starts on the source's chunk grid, so that reads stay at the storage's grain."""

    def __init__(self, inner: MatrixSource, rows, cols, *, shared: SharedChunks | None = None,
                 role: str = ""):
        self.inner = inner
        self._shared, self._role = shared, role
        self.rows, self.cols = tuple(rows), tuple(cols)
        self.shape = (rows[1] - rows[0], cols[1] - cols[0])
        self.dtype = inner.dtype
        self.on_disk = inner.on_disk
        self.name = f"{inner.name}[{rows[0]}:{rows[1]}, {cols[0]}:{cols[1]}]"
        self.path = inner.path
        grid = getattr(inner, "chunks", None)
        aligned = grid is not None and rows[0] % grid[0] == 0 and cols[0] % grid[1] == 0
        self.chunks = tuple(grid) if aligned and hasattr(inner, "read_chunk") else None

    def read(self, rows, cols, out):
        self.inner.read((self.rows[0] + rows[0], self.rows[0] + rows[1]),
                        (self.cols[0] + cols[0], self.cols[0] + cols[1]), out)

    def read_chunk(self, index, out):
        r0 = index[0] * self.chunks[0]
        c0 = index[1] * self.chunks[1]
        self.read((r0, r0 + out.shape[0]), (c0, c0 + out.shape[1]), out)

    @property
    def shared_chunk(self):
        """Chunks decoded once for every task of the graph in this process (None where the
        region is not on the chunk grid, or nothing is shared)."""
        if self._shared is None or self.chunks is None:
            return None
        return self._shared_chunk

    def _shared_chunk(self, index) -> np.ndarray:
        """Region chunk ``index``: its stored chunk, decoded once per process, clipped to the
        region."""
        (ch, cw), (rows, cols) = self.chunks, self.inner.shape
        at = (self.rows[0] // ch + index[0], self.cols[0] // cw + index[1])
        r0, c0 = at[0] * ch, at[1] * cw
        r1, c1 = min(r0 + ch, rows), min(c0 + cw, cols)

        def decode():
            whole = np.empty((r1 - r0, c1 - c0), dtype=self.inner.dtype)
            self.inner.read((r0, r1), (c0, c1), whole)
            return whole

        whole = self._shared.get((self._role, at), decode)
        return whole[:min(r1, self.rows[1]) - r0, :min(c1, self.cols[1]) - c0]

    def array(self):
        return self.inner.array()

    def close(self):
        self.inner.close()

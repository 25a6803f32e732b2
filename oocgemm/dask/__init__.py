"""oocgemm inside dask graphs: a lazy matmul with one group task per group of C blocks.

    >>> import dask.array as da, oocgemm.dask
    >>> c = oocgemm.dask.matmul(da.from_zarr("a.zarr"), da.from_zarr("b.zarr"))  # doctest: +SKIP
    >>> c.to_zarr("c.zarr")                                                     # doctest: +SKIP

dask's own ``x @ y`` makes a partial product for every (i, k, j) triple of chunks and sums them
in a tree. :func:`matmul` makes one group task per group of C blocks instead (by default a
band of whole block rows, as large as memory allows), and a light task per chunk of the result.
A group task starts oocgemm's run of its group (a product of its own, as ``multiply``'s) on
the worker's device (a GPU where the worker has one) and returns a handle once the run has the
device; each chunk task takes its chunk from the handle as soon as the run has written the
blocks under it, so that the rest of the graph works on the first chunks while the run
computes the next. Stored into a Zarr array (``to_zarr``), the result has its groups' runs
write their parts of the array themselves, as ``multiply`` writes a Zarr output
(:mod:`.stored`): no chunk tasks, each chunk encoded once, on the GPU where the run has one.

- Inputs that are stored (a ``.zarr`` or ``.npy`` path, a ``zarr.Array``, an untouched
  ``da.from_zarr``) are read by each run straight from storage, at its chunks, each chunk
  decoded once per process for all the runs of a graph there;
- any other dask array feeds its chunks to the group tasks as graph dependencies, so each
  chunk is computed once per graph run.

Under a ``dask.distributed`` Client the group tasks run on its workers (at least two groups
per worker by default, so that they balance). With one GPU per worker (dask-cuda's
``LocalCUDACluster``, or workers started with their own ``CUDA_VISIBLE_DEVICES`` and
``--resources GPU=1``), pass ``resources={"GPU": 1}``. Within one process oocgemm runs one
group at a time per device.

The package, in the order a graph is built and run: :mod:`.graph` checks the arguments and
lays out the tasks, cutting C where :mod:`.partition` says and computing half of ``X^T X`` as
:mod:`.gram` says; :mod:`.operands` writes what each task needs of an input and opens it in the
task; :mod:`.runner` is the tasks' side in a worker process, the groups' runs and the handles
their chunks are taken from; :mod:`.stored` stores the result by its groups' runs;
:mod:`.sharing` lets the tasks of one process decode each chunk
once; :mod:`.traces` leaves each run's events and merges them (:func:`timeline`);
:mod:`.plugin` warms each worker when it starts (:class:`WarmUp`). The
constants are read in their modules: set ``GROUP_MEMORY``, ``MIN_CHUNK_SIDE`` and
``MAX_CHUNKS_PER_SIDE`` on :mod:`.partition` and ``GRACE`` on :mod:`.sharing` (setting the
copies here changes nothing).
"""

from .graph import matmul
from .operands import Region
from .partition import GROUP_MEMORY, MAX_CHUNKS_PER_SIDE, MIN_CHUNK_SIDE
from .sharing import GRACE, SharedChunks
from .traces import timeline

__all__ = ["GRACE", "GROUP_MEMORY", "MAX_CHUNKS_PER_SIDE", "MIN_CHUNK_SIDE", "Region",
           "SharedChunks", "WarmUp", "matmul", "timeline"]


def __getattr__(name: str):
    if name == "WarmUp":  # a distributed WorkerPlugin: distributed imported when asked for
        from .plugin import WarmUp

        return WarmUp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

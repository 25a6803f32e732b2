"""oocgemm.dask.matmul when a worker is lost, or a group's handle moves (issue 50): every chunk has
the bits of its group's run, wherever the group ran and wherever its chunk is taken. A chunk
computed as a product of its own is planned for its own shape (other K panels, another order
of sums) and differs from its group's in the last bit."""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from _helpers import leftovers, rand

import oocgemm
import oocgemm.dask as odask
from oocgemm import cuda
from oocgemm.dask.operands import Region
from oocgemm.dask.runner import Handle
from oocgemm.storage import open_source

distributed = pytest.importorskip("distributed")


def _stored(rng, m: int, k: int, n: int):
    """A (m x k) and B (k x n) as Zarr arrays with zarr-python's default chunks."""
    for name, shape in (("a.zarr", (m, k)), ("b.zarr", (k, n))):
        zarr.create_array(name, shape=shape, dtype="f8")[...] = rand(rng, shape)
    return "a.zarr", "b.zarr"


def _groups(z) -> dict:
    return dict(z.dask.layers[z.name + "-groups"])


def test_a_moved_handle_takes_its_chunk_from_the_groups_run(rng, workdir):
    a, b = _stored(rng, 256, 4096, 2048)
    # a chunk by itself is another product, planned for its shape: other K panels, other bits
    group, chunk = (oocgemm.plan(Region(open_source(a, "A"), (0, 256), (0, 4096)),
                                 Region(open_source(b, "B"), (0, 4096), (0, n)), device="cpu")
                    for n in (2048, 1024))
    assert group.k_splits != chunk.k_splits
    z = odask.matmul(a, b, groups=(256, 2048), chunks=(256, 1024), device="cpu")
    graph = dict(z.__dask_graph__())
    handle = dask.get(graph, next(iter(_groups(z))))  # the group's handle, as its worker has it
    mine = [handle.chunk(0, 256, c0, c0 + 1024).copy() for c0 in (0, 1024)]
    moved = pickle.loads(pickle.dumps(handle))  # as another worker gets it: no run with it
    assert moved.run is None
    assert np.array_equal(moved.chunk(0, 256, 1024, 2048), mine[1])  # the blocks written, copied
    # moved before its blocks were written: the group's run made again, once in a process
    early, earlier = Handle(None, handle.spec), Handle(None, handle.spec)
    assert np.array_equal(early.chunk(0, 256, 0, 1024), mine[0])
    assert np.array_equal(earlier.chunk(0, 256, 1024, 2048), mine[1])
    assert early.rerun() is earlier.rerun()


def _compute(z, path: str) -> np.ndarray:
    z.to_zarr(path)
    return zarr.open_array(path)[...]


def _chunks_stored(path: str) -> int:
    """The chunks stored in the Zarr array at ``path`` (not zarr's own '.partial' files of a
    chunk being written: a worker killed while it writes one leaves it)."""
    return sum(not f.endswith(".partial") for _, _, files in os.walk(os.path.join(path, "c"))
               for f in files)


def _plain(z):
    """The same graph as a plain dask array: stored chunk by chunk (chunk tasks, then
    dask's own store), not by its groups' runs (:mod:`oocgemm.dask.stored`)."""
    return da.Array(z.dask, z.name, z.chunks, dtype=z.dtype)


ON_THE_GPU = pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")])


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", ON_THE_GPU])
@pytest.mark.parametrize("stored_by", ["groups", "chunks"])
def test_a_worker_killed_mid_run_changes_no_bit_of_the_result(rng, workdir, stored_by, device):
    m = 1024 if device == "cpu" else 4096  # a GPU's groups are many, to be killed among
    a, b = _stored(rng, m, 2048, 2048)  # a group's chunk by itself: other K panels
    every = m // 256 * 2
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        def matmul():
            z = odask.matmul(a, b, groups=(256, 2048), chunks=(256, 1024), device=device)
            return z if stored_by == "groups" else _plain(z)

        want = _compute(matmul(), "undisturbed.zarr")
        victim = next(iter(client.run(os.getpid).values()))
        done, written = threading.Event(), []

        def kill_once_a_chunk_is_written():  # some of the groups done, others running
            while not done.is_set():
                chunks = _chunks_stored("c.zarr")
                if chunks:
                    os.kill(victim, signal.SIGKILL)
                    written.append(chunks)
                    return
                time.sleep(0.002)

        killer = threading.Thread(target=kill_once_a_chunk_is_written, daemon=True)
        killer.start()
        try:
            got = _compute(matmul(), "c.zarr")
        finally:
            done.set()
            killer.join()
    assert written and written[0] < every  # killed mid-run: some chunks stored, not all
    assert _chunks_stored("c.zarr") == _chunks_stored("undisturbed.zarr") == every
    assert got.shape == want.shape == (m, 2048) and not np.isnan(got).any()
    assert np.array_equal(got, want)
    # the graph stored from this process (no group moved, no chunk taken elsewhere)
    with dask.config.set(scheduler="sync"):
        assert np.array_equal(_compute(matmul(), "here.zarr"), want)
    assert dict(zarr.open_array("c.zarr").attrs).get("oocgemm", {}).get("complete") is (
        True if stored_by == "groups" else None)
    # nothing of oocgemm's own temporary output left, at any depth
    assert [d for d, _, _ in os.walk(workdir) if leftovers(d)] == []


@pytest.mark.slow
def test_a_groups_bits_do_not_depend_on_where_it_ran(rng, workdir):
    a, b = _stored(rng, 1024, 2048, 2048)  # a group's chunk by itself: other K panels
    tile = (256, 256, 512)

    def matmul(**kw):
        return odask.matmul(a, b, groups=(256, 2048), chunks=(256, 1024), device="cpu", **kw)

    here = matmul().compute(scheduler="sync")  # one process, one thread: no handle moves
    runs = []
    for workers, threads in ((1, 2), (2, 1)):
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=threads,
                                      processes=True, dashboard_address=None) as cluster, \
                distributed.Client(cluster):
            runs.append((matmul().compute(), matmul(tile=tile).compute()))
    assert all(np.array_equal(run, here) for run, _ in runs)
    # where the plans are the same, multiply's bits: a group's rows by themselves, with the
    # group's tile (not the whole product's plan: its walk sums a block's K panels forward or
    # backward by the block's place in it), and the whole product as one group
    rows = zarr.open_array(a)
    alone = np.concatenate([oocgemm.multiply(rows[r:r + 256], b, device="cpu", tile=tile).out
                            for r in range(0, 1024, 256)])
    assert all(np.array_equal(run, alone) for _, run in runs)
    whole = odask.matmul(a, b, groups=(1024, 2048), device="cpu").compute(scheduler="sync")
    assert np.array_equal(whole, oocgemm.multiply(a, b, device="cpu").out)

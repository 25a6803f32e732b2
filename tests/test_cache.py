"""Operands on disk that the schedule reads more than once are kept in host memory as read,
within host_memory_limit: storage is read once."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import oocgemm
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage.cache import CachedSource
from oocgemm.storage.memory import NumpySink, NumpySource
from _helpers import assert_gemm, poisoned, rand


class Counting(NumpySource):
    """Counts the reads of each region that reach 'storage'."""

    def __init__(self, array):
        super().__init__(array, on_disk=True)
        self.regions: dict = {}

    def read(self, rows, cols, out):
        key = (tuple(rows), tuple(cols))
        self.regions[key] = self.regions.get(key, 0) + 1
        super().read(rows, cols, out)


def test_cached_source_serves_repeats_from_memory(rng):
    a = rand(rng, (30, 20))
    inner = Counting(a)
    cached = CachedSource(inner, budget=a.nbytes)
    for _ in range(3):
        out = np.empty((10, 20))
        cached.read((5, 15), (0, 20), out)
        np.testing.assert_array_equal(out, a[5:15])
    assert inner.regions == {((5, 15), (0, 20)): 1}
    assert (cached.hits, cached.misses) == (2, 1)


def test_cached_source_keeps_nothing_past_its_budget(rng):
    a = rand(rng, (30, 20))
    inner = Counting(a)
    cached = CachedSource(inner, budget=10 * 20 * 8)  # one 10-row region
    out = np.empty((10, 20))
    for rows in ((0, 10), (10, 20), (0, 10), (10, 20)):
        cached.read(rows, (0, 20), out)
        np.testing.assert_array_equal(out, a[rows[0]:rows[1]])
    assert cached.cached_bytes <= 10 * 20 * 8
    assert inner.regions[((10, 20), (0, 20))] == 2  # not kept: read through each time


@pytest.mark.parametrize("staged", [False, True])
def test_replay_reads_each_region_from_storage_once(rng, staged, workdir):
    a, b = rand(rng, (48, 40)), rand(rng, (40, 36))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(16, 8))[:] = a
    zarr.create_array("b.zarr", shape=b.shape, dtype=b.dtype, chunks=(8, 12))[:] = b
    plan = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 12, 8))
    assert plan.grid == (3, 3, 5) and set(plan.cache) == {"A", "B"}
    if staged:
        import dataclasses

        plan = dataclasses.replace(plan, staged=True, stripe=24, n_stage=3, n_out=2)
    counting = {"A": Counting(a), "B": Counting(b)}
    sources = {name: CachedSource(src, budget=10**6) for name, src in counting.items()}
    out = poisoned((48, 36))
    CpuExecutor(plan, sources, NumpySink(out)).run()
    assert_gemm(out, a, b)
    reads = sum(1 for op in plan.schedule.ops if op.kind.value == "read" and op.operand == "B")
    assert reads > len(counting["B"].regions)  # the schedule reloads B panels...
    for src in counting.values():  # ...which come from storage once each
        assert set(src.regions.values()) == {1}


def test_plan_caches_within_host_memory_limit(rng, workdir):
    a, b = rand(rng, (64, 64)), rand(rng, (64, 64))
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype=x.dtype, chunks=(16, 16))[:] = x
    roomy = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16))
    assert set(roomy.cache) == {"A", "B"}
    assert roomy.host_bytes >= 2 * a.nbytes and "kept in memory" in str(roomy)
    tight = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16),
                         host_memory_limit=a.nbytes + 2 * 16 * 16 * 8 * 4 + 100)
    assert len(tight.cache) == 1 and tight.host_bytes <= tight.host_memory_limit
    none = oocgemm.plan("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16),
                        host_memory_limit=10_000)
    assert none.cache == ()
    in_memory = oocgemm.plan(a, b, device="cpu", tile=(16, 16, 16))
    assert in_memory.cache == ()  # nothing to save: the data is in memory already
    np.save("a.npy", a)
    np.save("b.npy", b)
    memmaps = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(16, 16, 16))
    assert memmaps.cache == ()  # the OS page cache is already their cache
    for plan_ in (roomy, tight, none):
        r = oocgemm.multiply("a.zarr", "b.zarr", device="cpu", tile=(16, 16, 16),
                             host_memory_limit=plan_.host_memory_limit)
        assert r.plan.cache == plan_.cache
        assert_gemm(r.out, a, b)


def test_cache_cuts_predicted_storage_time(workdir):
    import zarr as z

    z.create_array("a.zarr", shape=(4000, 3000), dtype="f8", chunks=(500, 500))
    z.create_array("b.zarr", shape=(3000, 5000), dtype="f8", chunks=(500, 500))
    kw = dict(device="cpu", tile=(1000, 1000, 1000), memory_limit="1GB")
    cached = oocgemm.plan("a.zarr", "b.zarr", **kw)
    uncached = oocgemm.plan("a.zarr", "b.zarr", host_memory_limit="64MB", **kw)
    assert cached.cache and not uncached.cache
    assert cached.prediction.storage_read < uncached.prediction.storage_read / 2

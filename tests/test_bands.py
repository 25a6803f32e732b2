"""runtime.base.Bands: an in-core product's large copies of memory shared among
the free threads of a pool, never waiting for a task that has not started (so never a
deadlock, whoever holds the pool's threads); bands started ahead of their join (the copies of
two operands at once), and stopped where a run fails before it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from oocgemm.runtime.base import BAND_BYTES, Bands


def _copy_in_bands(src, dst, pool, threads, seen=None):
    def work(lo, hi):
        if seen is not None:
            seen.append((lo, hi, threading.get_ident()))
        np.copyto(dst[lo:hi], src[lo:hi])

    Bands(work, src.shape[0], src[0].nbytes, pool, threads).join()


@pytest.mark.parametrize("rows", [1, 7, 255, 1001])
def test_every_row_once(rng, rows):
    src = rng.standard_normal((rows, 1024))  # 8 KiB rows: 128 to a band of BAND_BYTES
    dst = np.full_like(src, np.nan)
    seen: list = []
    with ThreadPoolExecutor(4) as pool:
        _copy_in_bands(src, dst, pool, 4, seen)
    assert np.array_equal(dst, src)
    covered = sorted((lo, hi) for lo, hi, _ in seen)
    assert covered[0][0] == 0 and covered[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # no gap, no overlap
    per_band = -(-rows // len(covered))
    assert len(covered) <= 4 and (len(covered) == 1 or per_band * 8192 >= BAND_BYTES)


def test_large_copies_use_several_threads(rng):
    src = rng.standard_normal((4096, 1024))  # 32 MiB
    dst = np.empty_like(src)
    seen: list = []
    with ThreadPoolExecutor(3) as pool:
        for _ in range(20):  # a helper may start after the caller took every band
            _copy_in_bands(src, dst, pool, 4, seen)
    assert np.array_equal(dst, src)
    assert len({tid for *_, tid in seen}) > 1


def test_a_busy_pool_leaves_the_caller_alone(rng):
    """Every thread of the pool blocked: the caller copies every band itself and cancels the
    helpers it queued, rather than waiting for them."""
    src = rng.standard_normal((2048, 1024))
    dst = np.empty_like(src)
    release = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        blockers = [pool.submit(release.wait) for _ in range(2)]
        seen: list = []
        _copy_in_bands(src, dst, pool, 4, seen)
        assert {tid for *_, tid in seen} == {threading.get_ident()}
        release.set()
        for b in blockers:
            b.result()
    assert np.array_equal(dst, src)


def test_callers_on_the_pool_itself_do_not_deadlock(rng):
    """Tasks of a pool that each split their copy on that same pool (as a run's readers do)."""
    src = rng.standard_normal((8, 2048, 1024))
    dst = np.empty_like(src)
    with ThreadPoolExecutor(2) as pool:
        tasks = [pool.submit(_copy_in_bands, src[i], dst[i], pool, 4) for i in range(8)]
        for t in tasks:
            t.result(timeout=60)
    assert np.array_equal(dst, src)


def test_an_error_raises_after_the_started_bands_end(rng):
    src = rng.standard_normal((4096, 1024))
    running = []
    lock = threading.Lock()

    def work(lo, hi):
        with lock:
            running.append(1)
        try:
            if lo > 0:
                raise ValueError(f"band {lo}")
            threading.Event().wait(0.05)
        finally:
            with lock:
                running.pop()

    with ThreadPoolExecutor(4) as pool:
        with pytest.raises(ValueError, match="band"):
            Bands(work, src.shape[0], src[0].nbytes, pool, 4).join()
        assert not running  # nothing of the call runs on once it has raised


def test_bands_started_ahead_overlap_the_callers_own_and_join_complete(rng):
    """The second copy's bands start on the pool (no caller share) while the caller copies
    the first; its join then takes what is left: both complete, the second's bands on the
    pool's threads while the first ran."""
    a, b = rng.standard_normal((2048, 1024)), rng.standard_normal((2048, 1024))
    out_a, out_b = np.full_like(a, np.nan), np.full_like(b, np.nan)
    seen: list = []

    def copy(src, dst, name):
        def work(lo, hi):
            seen.append((name, threading.get_ident()))
            np.copyto(dst[lo:hi], src[lo:hi])
        return work

    with ThreadPoolExecutor(8) as pool:
        for _ in range(10):
            early = Bands(copy(b, out_b, "b"), 2048, b[0].nbytes, pool, 4, caller=False)
            Bands(copy(a, out_a, "a"), 2048, a[0].nbytes, pool, 4).join()
            early.join()
    assert np.array_equal(out_a, a) and np.array_equal(out_b, b)
    assert {tid for name, tid in seen if name == "b"} - {threading.get_ident()}


def test_stopped_bands_leave_the_rest_and_nothing_runs_after(rng):
    """stop(): the bands not started are left, the started ones end before it returns, and
    their errors are dropped (the run that stops them is failing already)."""
    running, done = [], []
    lock = threading.Lock()
    gate = threading.Event()

    def work(lo, hi):
        with lock:
            running.append(lo)
        try:
            gate.wait(5)
            if lo == 0:
                raise OSError("the first band fails")
        finally:
            with lock:
                running.remove(lo)
                done.append(lo)

    with ThreadPoolExecutor(2) as pool:
        bands = Bands(work, 64, BAND_BYTES // 8, pool, 8, caller=False)  # 8 bands, 2 threads
        while len(running) < 2:
            threading.Event().wait(0.001)
        threading.Timer(0.05, gate.set).start()
        bands.stop()
        assert not running  # the two started ended inside stop()
    assert len(done) == 2  # only the started bands ran, each once


def test_an_error_of_bands_started_ahead_raises_at_their_join(rng):
    def work(lo, hi):
        raise ValueError(f"band {lo}")

    with ThreadPoolExecutor(4) as pool:
        bands = Bands(work, 4096, 8192, pool, 4, caller=False)
        with pytest.raises(ValueError, match="band"):
            bands.join()

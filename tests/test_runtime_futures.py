"""The executors' futures (no GPU needed). The CUDA executor's, made on first use: every
thread asking for one operation gets the same future, and a stopped run cancels those made so
far and every one made later, so that no lane can wait forever on a future nobody will settle.
The CPU executor's: a lane waiting on the compute thread's future is not left asleep by an
interrupt that lands inside its ``set_result``."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures._base import FINISHED

import pytest

import oocgemm
from oocgemm.planning.schedule import OpKind
from oocgemm.runtime import cpu
from oocgemm.runtime.cuda_executor import _Futures


def test_one_future_per_operation_across_threads():
    futures = _Futures()
    seen: list = []
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        seen.extend(futures[i] for i in range(200))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(futures) == 200
    assert {id(f) for f in seen} == {id(futures[i]) for i in range(200)}


def test_cancel_all_reaches_futures_made_later():
    futures = _Futures()
    settled, pending = futures[0], futures[1]
    settled.set_result("done")
    futures.cancel_all()
    assert settled.result() == "done"          # a settled future keeps its result
    assert pending.cancelled()
    assert futures[2].cancelled()              # made after the stop: cancelled at birth
    assert not futures[0].cancelled()


def test_a_cpu_run_interrupted_inside_set_result_ends(rng, monkeypatch):
    """Ctrl-C and SIGTERM raise in the compute thread (the caller's) wherever it is, also
    inside the ``set_result`` of a GEMM's future, after CPython's Future is marked done and
    before the lanes waiting on it are woken: the run still ends (it once waited forever in
    ``shutdown(wait=True)`` for a lane asleep on a done future: the rare hang of
    test_resume's SIGTERM cases under load)."""
    a, b = rng.standard_normal((128, 64)), rng.standard_normal((64, 128))
    ops = oocgemm.plan(a, b, tile=(64, 64, 64), device="cpu").schedule.ops
    # The compute thread's futures (of what no pool runs) are made in schedule order; the one
    # interrupted is the GEMM that the first WRITE waits for (on an idle writer: at once).
    pooled = (OpKind.READ, OpKind.UPLOAD, OpKind.DOWNLOAD, OpKind.WRITE)
    computed = [op.index for op in ops if op.kind not in pooled]
    target = computed.index(min(d for op in ops if op.kind is OpKind.WRITE for d in op.deps))
    made: list[Future] = []

    class Interrupted(Future):
        def __init__(self):
            super().__init__()
            made.append(self)

        def set_result(self, result):
            if self is not made[target]:
                super().set_result(result)
                return
            deadline = time.monotonic() + 10
            while not self._condition._waiters and time.monotonic() < deadline:
                time.sleep(0.001)
            assert self._condition._waiters, "no lane waited on the GEMM"
            with self._condition:  # done, and nobody woken: the interrupt lands here
                self._result, self._state = result, FINISHED
            raise KeyboardInterrupt

    rescued = threading.Event()

    def rescue():  # a run that waits on: its lanes woken, so that the test fails, not hangs
        rescued.set()
        with made[target]._condition:
            made[target]._condition.notify_all()

    monkeypatch.setattr(cpu, "Future", Interrupted)
    timer = threading.Timer(20, rescue)
    timer.daemon = True
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            oocgemm.multiply(a, b, tile=(64, 64, 64), device="cpu", progress=False)
    finally:
        timer.cancel()
    assert len(made) == len(computed) and made[target].done()
    assert not rescued.is_set(), "the run waited for a lane asleep on a done future"

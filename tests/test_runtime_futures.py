"""The CUDA executor's futures, made on first use (no GPU needed): every thread asking for one
operation gets the same future, and a stopped run cancels those made so far and every one
made later, so that no lane can wait forever on a future nobody will settle."""

from __future__ import annotations

import threading

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

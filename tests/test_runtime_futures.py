"""The executors' futures (no GPU needed). The CUDA executor's, made on first use: every
thread asking for one operation gets the same future, and a stopped run cancels those made so
far and every one made later, so that no lane can wait forever on a future nobody will settle.
The CPU executor's (no futures: a flag per operation): a lane waiting on the compute
thread's GEMM is not left asleep by an interrupt that lands inside its finish."""

from __future__ import annotations

import threading
import time

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


def test_a_cpu_run_interrupted_inside_a_finish_ends(rng, monkeypatch, workdir):
    """Ctrl-C and SIGTERM raise in the compute thread (the caller's) wherever it is, also
    inside the finish of a GEMM, after its flag is set and before the lanes waiting on it
    are woken: the run still ends, raising the interrupt (with futures, it once waited
    forever in ``shutdown(wait=True)`` for a lane asleep on a done future: the rare hang of
    test_resume's SIGTERM cases under load). The lane asleep looks again every
    ``LOOK_AGAIN`` seconds, and the run wakes every lane as it stops."""
    a, b = rng.standard_normal((128, 64)), rng.standard_normal((64, 128))
    # out to a .npy file: C is not computed in place, so its WRITEs run on the writer lane
    plan = oocgemm.plan(a, b, "c.npy", tile=(64, 64, 64), device="cpu")
    ops = plan.schedule.ops
    assert "C" not in plan.in_place
    target = min(d for op in ops if op.kind is OpKind.WRITE for d in op.deps)
    assert ops[target].kind is OpKind.GEMM
    finish, slept = cpu._Board.finish, []

    def interrupted(self, index):
        if index != target:
            return finish(self, index)
        self.done[index] = 1  # done, and nobody woken: the interrupt lands here
        deadline = time.monotonic() + 10
        while not self._sleepers and time.monotonic() < deadline:
            time.sleep(0.001)
        slept.append(self._sleepers)
        raise KeyboardInterrupt

    monkeypatch.setattr(cpu._Board, "finish", interrupted)
    done = threading.Event()
    errors: list[BaseException] = []

    def run():
        try:
            oocgemm.multiply(a, b, "c.npy", tile=(64, 64, 64), device="cpu", progress=False)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(20), "the run waited for a lane asleep on a finished GEMM"
    assert slept == [1], "no lane waited on the GEMM"
    assert len(errors) == 1 and isinstance(errors[0], KeyboardInterrupt)

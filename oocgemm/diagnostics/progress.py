"""The progress bar of a run: work done with its ETA and rate, C blocks stored, and what the
storage moves (read and write GB/s), fed by the executors' finished events."""

from __future__ import annotations

import collections
import threading
import time

from ..planning.schedule import OpKind

#: Seconds between two refreshes of the figures beside the bar.
REFRESH = 0.5


class ProgressBar:
    """An ``on_event`` callback that draws a tqdm bar on stderr: flops (or C blocks when no
    product is computed) with ETA and rate; beside it the C blocks stored and the storage's
    read and write rates so far. Thread-safe (readers, writers and streams report)."""

    def __init__(self, plan, *, file=None):
        from tqdm.auto import tqdm

        self._flops = plan.flops
        self._writes = collections.Counter(op.key for op in plan.schedule.ops
                                           if op.kind is OpKind.WRITE)
        self._blocks = len(self._writes)  # a symmetric plan writes the blocks across too
        self._stored = 0
        self._read = self._written = 0
        self._lock = threading.Lock()
        self._start = time.perf_counter()
        self._shown = 0.0
        if self._flops:
            self.bar = tqdm(total=self._flops, unit="flop", unit_scale=True, desc="oocgemm",
                            leave=False, dynamic_ncols=True, file=file)
        else:  # integer counts: float GFLOP steps add up past the total by rounding
            self.bar = tqdm(total=self._blocks, unit="block", desc="oocgemm", leave=False,
                            dynamic_ncols=True, file=file)

    def __call__(self, event) -> None:
        with self._lock:
            if event.kind == "gemm" and self._flops:
                self.bar.update(event.flops)
            elif event.kind == "read":
                self._read += event.nbytes
            elif event.kind == "write":
                self._written += event.nbytes
                self._writes[event.key] -= 1
                if self._writes[event.key] == 0:
                    self._stored += 1
                    if not self._flops:
                        self.bar.update(1)
            now = time.perf_counter()
            if now - self._shown >= REFRESH or self._stored == self._blocks:
                self._shown = now
                self.bar.set_postfix_str(self.figures(now - self._start), refresh=False)

    def figures(self, seconds: float) -> str:
        """'blocks 3/16, read 1.2 GB/s, write 0.4 GB/s' (the storage rates so far)."""
        seconds = max(seconds, 1e-9)
        parts = [f"blocks {self._stored}/{self._blocks}"]
        if self._read:
            parts.append(f"read {self._read / seconds / 1e9:.3g} GB/s")
        if self._written:
            parts.append(f"write {self._written / seconds / 1e9:.3g} GB/s")
        return ", ".join(parts)

    def close(self) -> None:
        self.bar.close()

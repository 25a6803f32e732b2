"""The progress bar of a run: work done with its ETA and rate, C blocks stored, and what the
storage moves (read and write GB/s), fed by the executors' finished events."""

from __future__ import annotations

import collections
import threading
import time

from ..planning.schedule import OpKind

#: Seconds between two refreshes of the figures beside the bar.
REFRESH = 0.5
#: Columns the bar itself keeps at the least: on a narrow terminal the figures beside it give
#: way first, the least important first (:meth:`ProgressBar.figures`).
MIN_BAR = 20
#: The line: the share done, the bar, the time left and the rate (tqdm's), then the figures
#: (no elapsed time and no counts before them: at 80 columns tqdm's own line left the bar one
#: column and cut the figures off).
FORMAT = "{desc} {percentage:3.0f}%|{bar}| {remaining} left, {rate_fmt}{postfix}"


class ProgressBar:
    """An ``on_event`` callback that draws a tqdm bar on stderr: flops (or C blocks when no
    product is computed) with ETA and rate; beside it the C blocks stored, the storage's
    read and write rates so far and the flops done, as many as fit beside a bar of
    :data:`MIN_BAR` columns. Thread-safe (readers, writers and streams report)."""

    def __init__(self, plan, *, file=None, ncols: int | None = None):
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
        # ncols: that many columns; None: the terminal's, followed as it is resized
        shape = dict(desc="oocgemm", leave=False, file=file, bar_format=FORMAT, ncols=ncols,
                     dynamic_ncols=ncols is None)
        if self._flops:
            self.bar = tqdm(total=self._flops, unit="flop", unit_scale=True, **shape)
        else:  # integer counts: float GFLOP steps add up past the total by rounding
            self.bar = tqdm(total=self._blocks, unit="block", **shape)

    def __call__(self, event) -> None:
        with self._lock:
            if event.kind == "gemm" and self._flops:
                self.bar.update(event.flops)
            elif event.kind in ("read", "fetch"):  # what the storage gave, as stored or not
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
                self.bar.set_postfix_str(self.figures(now - self._start, self._room()),
                                         refresh=False)

    def _room(self) -> int | None:
        """Columns left for the figures beside a bar of :data:`MIN_BAR` columns on the
        bar's line; None where the line has no width (not a terminal)."""
        shape = self.bar.format_dict
        columns = shape["ncols"]
        if not columns:
            return None
        # the line without figures, with tqdm's bar of 10 columns where no width is given
        line = self.bar.format_meter(**{**shape, "postfix": None, "ncols": None})
        return columns - (len(line) - 10) - MIN_BAR

    def figures(self, seconds: float, room: int | None = None) -> str:
        """'blocks 3/16, read 1.2 GB/s, write 0.4 GB/s, 1.2T/4.1T flop' (the storage rates
        so far); within ``room`` columns (with the ', ' before them) where given, the least
        important dropped first: the flop counts, then the write rate, then the read rate,
        then the blocks."""
        from tqdm import tqdm

        seconds = max(seconds, 1e-9)
        done = self.bar.n if self._flops else 0
        parts = {  # shown in this order
            "blocks": f"blocks {self._stored}/{self._blocks}",
            "read": f"read {self._read / seconds / 1e9:.3g} GB/s" if self._read else "",
            "write": f"write {self._written / seconds / 1e9:.3g} GB/s" if self._written else "",
            "flop": (f"{tqdm.format_sizeof(done)}/{tqdm.format_sizeof(self._flops)} flop"
                     if self._flops else ""),
        }
        if room is not None:
            left = room
            for name in ("blocks", "read", "write", "flop"):
                if parts[name] and len(parts[name]) + 2 <= left:
                    left -= len(parts[name]) + 2
                else:
                    parts[name] = ""
        return ", ".join(part for part in parts.values() if part)

    def close(self) -> None:
        self.bar.close()

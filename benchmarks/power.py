"""SM clock and board power of a GPU while work runs on it, sampled with ``nvidia-smi``.

Under its board power limit a GPU lowers its clock until it draws no more than the limit; a
kernel that reaches the limit then runs at a rate set by its energy per flop, whatever its
instruction schedule. ``python -m benchmarks power`` uses these samples to show where the
kernels stop. No CuPy here: the parsing is tested on machines without a GPU.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime

from oocgemm.errors import OptionError

#: The fields queried, in order.
QUERY = ("timestamp", "clocks.sm", "power.draw", "power.limit", "clocks_event_reasons.active")
#: Bit of ``clocks_event_reasons.active``: the clock is held down by the software power cap.
SW_POWER_CAP = 0x4


@dataclass(frozen=True)
class Sample:
    """One line of ``nvidia-smi``: when, SM clock (MHz), board power and its limit (W), and
    the active clock event reasons (bit mask; None where the driver does not report it)."""

    time: datetime
    clock_mhz: float
    power_w: float
    limit_w: float | None
    reasons: int | None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_line(line: str) -> Sample | None:
    """A :class:`Sample` from one ``--format=csv,noheader,nounits`` line of the :data:`QUERY`
    fields; None for a line that is not one (a header, an error message, a cut-off line)."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != len(QUERY):
        return None
    try:
        when = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f")
    except ValueError:
        return None
    clock, power, limit = (_number(f) for f in fields[1:4])
    if clock is None or power is None:
        return None
    try:
        reasons = int(fields[4], 16)
    except ValueError:
        reasons = None
    return Sample(when, clock, power, limit, reasons)


def summarize(samples: list[Sample]) -> dict:
    """Medians of the samples' clock and power, their power limit, and the fraction of them
    taken while the power cap held the clock down."""
    if not samples:
        return {"samples": 0}
    limits = [s.limit_w for s in samples if s.limit_w is not None]
    reasons = [s.reasons for s in samples if s.reasons is not None]
    return {
        "samples": len(samples),
        "clock_mhz": statistics.median(s.clock_mhz for s in samples),
        "power_w": statistics.median(s.power_w for s in samples),
        "limit_w": statistics.median(limits) if limits else None,
        "power_capped": (sum(bool(r & SW_POWER_CAP) for r in reasons) / len(reasons)
                         if reasons else None),
    }


class PowerSampler:
    """Runs ``nvidia-smi`` in the background for the life of a ``with`` block, one sample every
    ``interval_ms``; :meth:`window` summarises the samples taken between two times.

    ``gpu``: what ``nvidia-smi --id`` accepts; a PCI bus id names the same GPU as CUDA does
    whatever CUDA_VISIBLE_DEVICES says.
    """

    def __init__(self, gpu: str | int = 0, interval_ms: int = 50):
        self.gpu = str(gpu)
        self.interval_ms = int(interval_ms)
        self.samples: list[Sample] = []
        self._proc = None
        self._log = None

    def __enter__(self) -> PowerSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            raise OptionError("measuring power needs nvidia-smi on the PATH (it comes with "
                              "the NVIDIA driver)")
        fd, path = tempfile.mkstemp(prefix="oocgemm-power-", suffix=".csv")
        self._log = (os.fdopen(fd, "w"), path)
        self._proc = subprocess.Popen(
            [exe, f"--id={self.gpu}", "--query-gpu=" + ",".join(QUERY),
             "--format=csv,noheader,nounits", f"--loop-ms={self.interval_ms}"],
            stdout=self._log[0], stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 5.0
        while not self._read() and time.monotonic() < deadline:  # the first sample is in
            if self._proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.samples:
            self.__exit__(None, None, None)
            raise OptionError(f"nvidia-smi --id={self.gpu} gave no clock and power samples")
        return self

    def _read(self) -> list[Sample]:
        self._log[0].flush()
        with open(self._log[1]) as f:
            parsed = [parse_line(line) for line in f]
        self.samples = [s for s in parsed if s is not None]
        return self.samples

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._read()
            self._log[0].close()
            os.unlink(self._log[1])
            self._log = None

    @staticmethod
    def now() -> datetime:
        """A time comparable with the samples' (nvidia-smi stamps them in local time)."""
        return datetime.now()

    def window(self, start: datetime, end: datetime) -> dict:
        """:func:`summarize` of the samples taken from ``start`` to ``end``."""
        if self._log is not None:
            self._read()
        return summarize([s for s in self.samples if start <= s.time < end])

"""Clock and power samples of `python -m benchmarks power` (benchmarks/power.py): parsing the
lines nvidia-smi prints, summarising a window, and a clear error where nvidia-smi is absent.
The sampling itself runs in the GPU tests (tests/test_gpu_benchmarks.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from benchmarks import power
from oocgemm.errors import OptionError

T0 = datetime(2026, 11, 22, 10, 31, 22, 123000)


def _line(when: datetime, clock="1875", draw="696.78", limit="700.00",
          reasons="0x0000000000000004"):
    return f"{when:%Y/%m/%d %H:%M:%S.%f}"[:-3] + f", {clock}, {draw}, {limit}, {reasons}"


def test_parse_line_reads_every_field():
    s = power.parse_line(_line(T0))
    assert s == power.Sample(T0, 1875.0, 696.78, 700.0, 0x4)


@pytest.mark.parametrize("line", [
    "timestamp, clocks.current.sm [MHz], power.draw [W], power.limit [W], "
    "clocks_event_reasons.active",
    "Failed to initialize NVML: Driver/library version mismatch",
    "",
    _line(T0)[:30],                        # cut off
    _line(T0, clock="[N/A]"),              # no clock: nothing to summarise
])
def test_parse_line_skips_what_is_not_a_sample(line):
    assert power.parse_line(line) is None


def test_parse_line_keeps_a_sample_without_limit_or_reasons():
    s = power.parse_line(_line(T0, limit="[N/A]", reasons="[Not Supported]"))
    assert (s.clock_mhz, s.power_w, s.limit_w, s.reasons) == (1875.0, 696.78, None, None)


def test_summarize_takes_medians_and_the_capped_share():
    samples = [power.parse_line(_line(T0 + timedelta(milliseconds=50 * i), clock=str(c),
                                      draw=str(w), reasons=r))
               for i, (c, w, r) in enumerate([(1980, 400.0, "0x0"), (1890, 690.0, "0x4"),
                                              (1875, 700.0, "0x4"), (1860, 701.0, "0x5")])]
    got = power.summarize(samples)
    assert got == {"samples": 4, "clock_mhz": 1882.5, "power_w": 695.0, "limit_w": 700.0,
                   "power_capped": 0.75}
    assert power.summarize([]) == {"samples": 0}


def test_window_keeps_the_samples_between_two_times():
    sampler = power.PowerSampler()
    sampler.samples = [power.parse_line(_line(T0 + timedelta(seconds=i), clock=str(1000 + i)))
                       for i in range(10)]
    got = sampler.window(T0 + timedelta(seconds=3), T0 + timedelta(seconds=6))
    assert got["samples"] == 3 and got["clock_mhz"] == 1004.0


def test_without_nvidia_smi_the_error_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi on it
    with pytest.raises(OptionError, match="nvidia-smi"), power.PowerSampler():
        pass

"""oocgemm.diagnostics.nvtx without a GPU: the choice of backend, the no-tool path that costs
nothing, and the ranges reaching an NVTX tool, here a fake one (tests/fake_nvtx_tool.c)
injected the way Nsight Systems and CUPTI are (NVTX_INJECTION64_PATH). tests/test_gpu_nvtx.py
does the same with CUPTI around a real GPU product."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from _nvtx_ranges import Mark, check, pair, summary

from oocgemm.diagnostics import nvtx as onvtx
from oocgemm.planning.schedule import OpKind

ROOT = Path(__file__).resolve().parent.parent


def _op(kind: str, operand: str = "C", key=(0, 1), q: int = -1):
    return SimpleNamespace(kind=OpKind(kind), operand=operand, key=key, q=q)


@pytest.fixture
def env(monkeypatch):
    """No tool attached and no NVTX switches, whatever the environment of the test run."""
    for var in ("NVTX_INJECTION64_PATH", "NVTX_DISABLE", onvtx.ENV):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# -- naming -------------------------------------------------------------------------------------
def test_range_names_and_colors():
    assert onvtx.range_name(_op("gemm", key=(1, 2), q=3)) == "gemm C(1,2) q=3"
    assert onvtx.range_name(_op("upload", "A", (1, 0))) == "H2D A(1,0)"
    assert onvtx.range_name(_op("download", "C", (0, 0))) == "D2H C(0,0)"
    assert onvtx.range_name(_op("read", "B", (0, 1))) == "read B(0,1)"
    assert onvtx.range_name(_op("write", "C", (2, 1))) == "write C(2,1)"
    assert onvtx.COLORS["gemm"] == 0xFF2CA02C and set(onvtx.COLORS) >= {k.value for k in OpKind}


# -- backend choice -----------------------------------------------------------------------------
def test_no_tool_no_ranges(env):
    r = onvtx.Ranges()
    assert r.backend is None and r.push is onvtx._noop and r.pop is onvtx._noop
    assert "no NVTX tool attached" in r.reason
    r.push(_op("gemm", q=0))
    r.pop()


def test_no_tool_imports_nothing(env):
    """Without a tool, making the ranges imports neither the nvtx package nor CuPy's NVTX nor
    loads an NVTX library: nothing to pay for."""
    code = ("import sys; from oocgemm.diagnostics.nvtx import Ranges; r = Ranges(); "
            "print(r.backend, [m for m in ('nvtx', 'cupy', 'cupy.cuda.nvtx') if m in sys.modules],"
            " [l for l in open('/proc/self/maps') if 'nvtx3interop' in l or 'nvToolsExt' in l])")
    env_ = {k: v for k, v in os.environ.items()
            if k not in ("NVTX_INJECTION64_PATH", "NVTX_DISABLE", onvtx.ENV)}
    env_["PYTHONPATH"] = os.pathsep.join([str(ROOT), env_.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", code], env=env_, capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["None", "[]", "[]"], out


@pytest.mark.parametrize("var,value", [("NVTX_DISABLE", "1"), (onvtx.ENV, "off")])
def test_switched_off(env, var, value):
    env.setenv("NVTX_INJECTION64_PATH", "/nonexistent/libtool.so")
    env.setenv(var, value)
    r = onvtx.Ranges()
    assert r.backend is None and var in r.reason


def test_unknown_backend_is_ignored(env):
    env.setenv(onvtx.ENV, "nsys")
    r = onvtx.Ranges()
    assert r.backend is None and "'nsys' is not one of" in r.reason


def test_a_failing_backend_is_skipped(env):
    def broken():
        raise OSError("no libnvtx3interop here")

    env.setattr(onvtx, "_library_domain", broken)
    env.setenv(onvtx.ENV, "lib")
    r = onvtx.Ranges()
    assert r.backend is None and "lib: OSError: no libnvtx3interop here" in r.reason


def test_setting_up_never_raises(env):
    def broken(self):
        raise RuntimeError("boom")

    env.setattr(onvtx.Ranges, "_choose", broken)
    r = onvtx.Ranges()
    assert r.backend is None and "boom" in r.reason
    r.push(_op("read", "A"))
    r.pop()


# -- pairing what a tool recorded ---------------------------------------------------------------
def _marks(*specs):
    """(what, thread, domain, name, id, time) tuples -> Marks in delivery order."""
    return [Mark(w, t, i, domain=d, name=n, id=k, time=tm)
            for i, (w, t, d, n, k, tm) in enumerate(specs)]


def test_pair_nested_and_per_thread():
    marks = _marks(("start", 1, "oocgemm", "gemm C(0,0) q=0", 1, 10),
                   ("start", 2, "oocgemm", "read A(0,0)", 2, 11),
                   ("start", 1, "oocgemm", "inner", 3, 12),
                   ("end", 1, None, None, 3, 13),  # CUPTI's ends carry no domain: by id
                   ("end", 2, None, None, 2, 14),
                   ("end", 1, None, None, 1, 15),
                   ("start", 1, None, "other domain", 4, 16),
                   ("end", 1, None, None, 4, 17))
    ranges, problems = pair(marks)
    assert problems == []
    assert sorted((r.thread, r.name, r.depth) for r in ranges) == [
        (1, "gemm C(0,0) q=0", 0), (1, "inner", 1), (2, "read A(0,0)", 0)]
    assert "3 ranges in 2 threads, deepest nesting 2" in summary(ranges)
    assert len(pair(marks, domain=None)[0]) == 4


def test_pair_finds_overlap_and_open_ranges():
    overlap = _marks(("start", 1, "oocgemm", "a", 1, 1), ("start", 1, "oocgemm", "b", 2, 2),
                     ("end", 1, None, None, 1, 3), ("end", 1, None, None, 2, 4))
    assert any("overlap" in p for p in pair(overlap)[1])
    unended = _marks(("start", 1, "oocgemm", "a", 1, 1))
    assert pair(unended)[1] == ["thread 1: 'a' (id 1) never ended"]
    stray = _marks(("end", 1, "oocgemm", None, None, None))
    assert "with no open range" in pair(stray)[1][0]


def test_check_against_events():
    events = [SimpleNamespace(kind="gemm", operand="C", key=(0, 0), q=0),
              SimpleNamespace(kind="read", operand="A", key=(0, 0), q=-1)]
    good = [Mark("start", 1, 0, "oocgemm", "gemm C(0,0) q=0", color=onvtx.COLORS["gemm"]),
            Mark("end", 1, 1, "oocgemm"),
            Mark("start", 2, 2, "oocgemm", "read A(0,0)", color=onvtx.COLORS["read"]),
            Mark("end", 2, 3, "oocgemm")]
    ranges, problems = pair(good)
    assert problems == [] and check(ranges, events, colors=True) == []
    assert "1 ranges in the 'oocgemm' domain for 2" in check(ranges[:1], events)[0]
    renamed = [Mark("start", 1, 0, "oocgemm", "gemm C(0,1) q=0"), Mark("end", 1, 1, "oocgemm"),
               Mark("start", 2, 2, "oocgemm", "read A(0,0)"), Mark("end", 2, 3, "oocgemm")]
    assert "names differ" in check(pair(renamed)[0], events)[0]


# -- the ranges reach a tool ------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_tool(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("no C compiler (or not Linux) for the fake NVTX tool")
    lib = tmp_path_factory.mktemp("nvtxtool") / "libfakenvtx.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib),
                    str(Path(__file__).with_name("fake_nvtx_tool.c")), "-lpthread"], check=True)
    return lib


# One product on the CPU for its events; then each event's operation is pushed and popped the
# way the CUDA executor does it: host copies (read, write) on a pool of threads, the rest on
# the calling thread.
_DRIVE = r"""
import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

import oocgemm
from oocgemm.diagnostics.nvtx import Ranges
from oocgemm.planning.schedule import OpKind

r = oocgemm.multiply(np.ones((64, 48)), np.ones((48, 40)), device="cpu", tile=(16, 16, 16))
ranges = Ranges()
ops = [SimpleNamespace(kind=OpKind(e.kind), operand=e.operand, key=e.key, q=e.q)
       for e in r.events]


def run(op):
    ranges.push(op)
    ranges.pop()


with ThreadPoolExecutor(2) as pool:
    futures = [pool.submit(run, op) for op in ops if op.kind.value in ("read", "write")]
    for op in ops:
        if op.kind.value not in ("read", "write"):
            run(op)
    for f in futures:
        f.result()
print(json.dumps({"backend": ranges.backend, "reason": ranges.reason,
                  "events": [[e.kind, e.operand, list(e.key), e.q] for e in r.events]}))
"""


def _read_log(path: Path) -> list[Mark]:
    marks = []
    for seq, line in enumerate(path.read_text().splitlines()):
        parts = line.split(" ", 4)
        domain = None if parts[2] == "-" else parts[2]
        if parts[0] == "push":
            marks.append(Mark("start", int(parts[1]), seq, domain, parts[4] if len(parts) > 4
                              else "", color=int(parts[3], 16)))
        else:
            marks.append(Mark("end", int(parts[1]), seq, domain))
    return marks


@pytest.mark.parametrize("backend,reject", [("", False), ("nvtx", False), ("lib", False),
                                            ("cupy", False), ("", True)])
def test_ranges_reach_an_nvtx_tool(fake_tool, tmp_path, backend, reject):
    """One range per block operation, in the oocgemm domain (CuPy's: the default domain),
    named and coloured by kind, nested per thread: as the tool saw them.

    reject: the tool fails NVTX's extension initialisation, so the nvtx package sees the
    domain disabled and hands out a dummy one; the ranges still reach the tool (the ``lib``
    backend), as they do under CUPTI and nsys whatever their extension support."""
    if backend == "nvtx" and importlib.util.find_spec("nvtx") is None:
        pytest.skip("the nvtx package is not installed")
    if backend == "cupy" and importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed")
    if backend == "lib" or reject:
        try:
            onvtx._nvtx_library()
        except OSError as exc:
            pytest.skip(f"no NVTX C library: {exc}")
    log = tmp_path / "nvtx.log"
    env_ = {k: v for k, v in os.environ.items()
            if k not in ("NVTX_DISABLE", onvtx.ENV, "FAKE_NVTX_REJECT_EXTENSIONS")}
    if reject:
        env_["FAKE_NVTX_REJECT_EXTENSIONS"] = "1"
    env_.update(NVTX_INJECTION64_PATH=str(fake_tool), FAKE_NVTX_LOG=str(log),
                PYTHONPATH=os.pathsep.join([str(ROOT), env_.get("PYTHONPATH", "")]))
    if backend:
        env_[onvtx.ENV] = backend
    proc = subprocess.run([sys.executable, "-c", _DRIVE], env=env_, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    events = [SimpleNamespace(kind=k, operand=o, key=tuple(key), q=q)
              for k, o, key, q in result["events"]]
    assert backend == "" or result["backend"] == backend, result["reason"]
    assert result["backend"] is not None, result["reason"]
    if reject and importlib.util.find_spec("nvtx") is not None:
        assert result["backend"] == "lib" and "dummy domain" in result["reason"], result
    marks = _read_log(log) if log.exists() else []
    if result["backend"] == "cupy":  # CuPy has no domains: the ranges are the default domain's
        assert pair(marks)[0] == []
        ranges, problems = pair([m for m in marks if m.domain is None], domain=None)
    else:
        ranges, problems = pair(marks)
    assert problems == [], problems
    assert check(ranges, events, colors=True) == [], summary(ranges)
    assert len({r.thread for r in ranges}) > 1  # the pool's threads and the calling one


# -- the CUPTI probe's analysis (tests/nvtx_cupti_probe.py), on records made up here ------------
def _cupti_data(events, same=True, drop_end=False):
    """What the probe's run step writes, as CUPTI would record the ranges of ``events``:
    host copies on thread 2, the rest on thread 1; an end's id is its start's, with no name."""
    records, time = [], 1000
    for i, (kind, operand, key, q) in enumerate(events):
        thread = 2 if kind in ("read", "write") else 1
        name = onvtx.range_name(_op(kind, operand, tuple(key), q))
        records.append({"kind": "marker", "flags": 2, "id": i + 1, "time": time,
                        "thread": thread, "object_kind": 2, "domain": "oocgemm", "name": name})
        records.append({"kind": "marker_data", "id": i + 1, "flags": 2,
                        "color": onvtx.COLORS[kind]})
        if not (drop_end and i == 3):
            records.append({"kind": "marker", "flags": 4, "id": i + 1, "time": time + 5,
                            "thread": thread, "object_kind": 2, "domain": None, "name": None})
        time += 10
    return {"injected": "/x/libcupti.so.13", "loaded_cupti": ["/x/libcupti.so.13"],
            "same_cupti": same, "backend": "nvtx", "reason": "nvtx: the nvtx package",
            "correct": True, "plan": {"ops": len(events)}, "failures": [],
            "events": [[k, o, list(key), q, "lane"] for k, o, key, q in events],
            "records": records, "counts": {"CONCURRENT_KERNEL": 3}, "versions": {}}


def test_probe_analysis():
    from nvtx_cupti_probe import analyse

    events = [("read", "A", (0, 0), -1), ("upload", "A", (0, 0), -1), ("gemm", "C", (0, 0), 0),
              ("download", "C", (0, 0), -1), ("write", "C", (0, 0), -1)]
    problems, notes, text = analyse(_cupti_data(events))
    assert problems == [] and notes == [], text
    assert "range starts by domain: {'oocgemm': 5}" in text
    problems = analyse(_cupti_data(events, same=False, drop_end=True))[0]
    assert "is not the libcupti that cupti-python loaded" in problems[0]
    assert any("'D2H C(0,0)' (id 4) never ended" in p for p in problems)
    assert any("4 ranges in the 'oocgemm' domain for 5" in p for p in problems)


@pytest.mark.skipif(importlib.util.find_spec("cupti") is not None, reason="cupti-python is here")
def test_probe_without_cupti_says_missing():
    from nvtx_cupti_probe import probe

    result = probe(size=64, tile=32)
    assert result["status"] == "missing" and "cupti-python" in result["problems"][0]


def test_pair_ends_without_ids_or_domains():
    """Ends that name neither their start's id nor a domain close the innermost open range of
    their thread."""
    marks = _marks(("start", 1, "oocgemm", "a", 1, 1), ("start", 1, None, "x", 2, 2),
                   ("end", 1, None, None, 90, 3), ("end", 1, None, None, 91, 4),
                   ("start", 2, "oocgemm", "b", 3, 5), ("end", 2, None, None, None, 6))
    ranges, problems = pair(marks)
    assert problems == [] and sorted(r.name for r in ranges) == ["a", "b"]
    assert [r.name for r in pair(marks, domain=None)[0] if r.domain is None] == ["x"]

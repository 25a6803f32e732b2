"""Do oocgemm's NVTX ranges reach a profiler? CUPTI, injected as the NVTX handler the way
Nsight Systems is, collects the NVTX marker records of one small GPU product.

    python tests/nvtx_cupti_probe.py [--out FILE] [--json FILE] [--size N] [--tile T]
                                     [--backend default|nvtx|lib|cupy ...]

Needs a CUDA GPU, CuPy and cupti-python (``from cupti import cupti``; it loads the libcupti of
the ``nvidia-cuda-cupti`` wheel). Three steps, each in a process of its own, since NVTX reads
``NVTX_INJECTION64_PATH`` once per process (at its first call), and the libcupti that NVTX
loads must be the very one cupti-python collects from (another copy of CUPTI would take the
markers and nobody would read them):

1. ``--find-cupti FILE``: load CUPTI through cupti-python, write the path of that libcupti;
2. ``--run FILE``: with ``NVTX_INJECTION64_PATH`` naming it from the process's start, enable
   the MARKER and MARKER_DATA activity (and CONCURRENT_KERNEL and MEMCPY, to count), run
   ``oocgemm.multiply(a, b, device='cuda', tile=(T, T, T), events=True)`` on N x N float64
   numpy operands, flush CUPTI's buffers, write every marker record and ``result.events``;
3. by default: steps 1 and 2 for each backend asked for (``default``: the one oocgemm picks;
   ``OOCGEMM_NVTX`` names the others), then the checks of tests/_nvtx_ranges.py: one range per
   block operation in the ``oocgemm`` domain, named by kind, start/end pairs nested per thread,
   as many as ``result.events``. Prints a summary (and writes it to --out), the raw records to
   --json. Exit status 0: all good; 1: a check failed; 2: no CUPTI to be had.

tests/test_gpu_nvtx.py runs :func:`probe` under pytest. ``OOCGEMM_CUPTI_LIB`` overrides the
libcupti to inject (it must still be the one cupti-python loads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARKER_INSTANTANEOUS, MARKER_START, MARKER_END = 1, 2, 4  # CUpti_ActivityFlag
OBJECT_THREAD = 2  # CUpti_ActivityObjectKind


def _loaded_cupti() -> list[str]:
    """Paths of the libcupti mapped into this process."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and "libcupti" in os.path.basename(parts[5].strip()):
                paths.add(parts[5].strip())
    return sorted(paths)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _write(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f)


# -- step 1 -------------------------------------------------------------------------------------
def find_cupti_main(path: str) -> None:
    out: dict = {"ok": False, "missing": True, "cupti_python": _version("cupti-python")}
    try:
        from cupti import cupti
    except Exception as exc:  # not installed, or its CUDA bindings are missing
        out["error"] = f"cupti-python: {type(exc).__name__}: {exc}"
        return _write(path, out)
    errors = []
    for step in ("get_timestamp", "activity_enable"):
        try:
            if step == "get_timestamp":
                cupti.get_timestamp()
            else:
                cupti.activity_register_callbacks(lambda: (1 << 20, 0), lambda records: None)
                cupti.activity_enable(cupti.ActivityKind.MARKER)
                cupti.activity_disable(cupti.ActivityKind.MARKER)
        except Exception as exc:
            errors.append(f"{step}: {type(exc).__name__}: {exc}")
        if _loaded_cupti():
            break
    paths = _loaded_cupti()
    out.update(ok=bool(paths), missing=not paths, paths=paths, errors=errors)
    _write(path, out)


# -- step 2 -------------------------------------------------------------------------------------
def run_main(path: str, size: int, tile: int, device: str = "cuda") -> None:
    from cupti import cupti

    injected = os.environ.get("NVTX_INJECTION64_PATH", "")
    kinds = {"MARKER": cupti.ActivityKind.MARKER, "MARKER_DATA": cupti.ActivityKind.MARKER_DATA,
             "CONCURRENT_KERNEL": cupti.ActivityKind.CONCURRENT_KERNEL,
             "MEMCPY": cupti.ActivityKind.MEMCPY}
    marker, marker_data = int(kinds["MARKER"]), int(kinds["MARKER_DATA"])
    records: list[dict] = []
    counts: Counter = Counter()
    lock = threading.Lock()
    failures: list[str] = []

    def text(a, name: str) -> str | None:
        try:  # a NULL string (an end's name, the default domain) may read as None, '' or fail
            value = getattr(a, name)
        except Exception:
            return None
        return None if value is None or value == "" else str(value)

    def flags_of(a) -> int:
        return int(getattr(a, "flags_", getattr(a, "flags", 0)))

    def requested():
        return 8 << 20, 0

    def completed(activities):
        # The records live in CUPTI's buffer: copy what is needed before returning.
        for a in activities:
            try:
                kind = int(a.kind)
                if kind == marker:
                    thread = (int(a.object_id.pt.thread_id)
                              if int(a.object_kind) == OBJECT_THREAD else -1)
                    rec = {"kind": "marker", "flags": flags_of(a), "id": int(a.id),
                           "time": int(a.timestamp), "thread": thread,
                           "object_kind": int(a.object_kind), "domain": text(a, "domain"),
                           "name": text(a, "name")}
                elif kind == marker_data:
                    rec = {"kind": "marker_data", "id": int(a.id), "flags": flags_of(a),
                           "color": int(a.color)}
                else:
                    with lock:
                        counts[cupti.ActivityKind(kind).name] += 1
                    continue
            except Exception as exc:
                with lock:
                    failures.append(f"reading a record: {type(exc).__name__}: {exc}")
                continue
            with lock:
                records.append(rec)

    cupti.activity_register_callbacks(requested, completed)
    for name, kind in kinds.items():
        try:
            cupti.activity_enable(kind)
        except Exception as exc:
            failures.append(f"activity_enable({name}): {type(exc).__name__}: {exc}")

    import numpy as np

    import oocgemm
    from oocgemm.diagnostics.nvtx import Ranges

    ranges = Ranges()  # what the executor will pick, and why
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((size, size)), rng.standard_normal((size, size))
    result = oocgemm.multiply(a, b, device=device, tile=(tile, tile, tile), events=True)
    correct = bool(np.allclose(result.out[:8], a[:8] @ b, rtol=1e-10, atol=1e-8))
    try:  # deliver every record (forced: also those of buffers not yet full)
        cupti.activity_flush_all(1)
    except Exception as exc:
        failures.append(f"activity_flush_all: {type(exc).__name__}: {exc}")
    for kind in kinds.values():
        with contextlib.suppress(Exception):
            cupti.activity_disable(kind)
    with contextlib.suppress(Exception):
        cupti.activity_flush_all(1)
    loaded = _loaded_cupti()
    same = bool(injected) and any(os.path.exists(p) and os.path.samefile(p, injected)
                                  for p in loaded)
    _write(path, {
        "injected": injected, "loaded_cupti": loaded, "same_cupti": same,
        "backend": ranges.backend, "reason": ranges.reason, "correct": correct,
        "plan": {"device": str(result.plan.device), "staged": result.plan.staged,
                 "ops": len(result.plan.schedule.ops)},
        "events": [[e.kind, e.operand, list(e.key), e.q, e.lane] for e in result.events],
        "records": records, "counts": dict(counts), "failures": failures,
        "versions": {d: _version(d) for d in ("cupti-python", "nvtx", "nvidia-cuda-cupti",
                                               "nvidia-cuda-cupti-cu12", "cuda-bindings",
                                               "cupy-cuda13x", "cupy-cuda12x")},
    })


# -- step 3 -------------------------------------------------------------------------------------
def _python(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(HERE),
                                                    env.get("PYTHONPATH", "")) if p)
    try:
        return subprocess.run([sys.executable, str(Path(__file__)), *args], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # killed; what it wrote before is still read
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return subprocess.CompletedProcess(exc.cmd, -9, "", f"timed out after {timeout} s\n"
                                           + err)


def find_cupti(timeout: float = 300) -> dict:
    """Step 1 in a subprocess: {'ok', 'missing', 'paths', 'errors', ...}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "find.json")
        env = {k: v for k, v in os.environ.items() if k != "NVTX_INJECTION64_PATH"}
        proc = _python(["--find-cupti", out], env, timeout)
        if not os.path.exists(out):
            return {"ok": False, "missing": False,
                    "error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"}
        with open(out) as f:
            return json.load(f)


def analyse(data: dict) -> tuple[list[str], list[str], str]:
    """(problems, notes, summary) of a step 2's records."""
    from types import SimpleNamespace

    from _nvtx_ranges import Mark, check, pair, summary

    problems, notes = [], []
    if not data["same_cupti"]:
        problems.append(f"NVTX_INJECTION64_PATH={data['injected']!r} is not the libcupti that "
                        f"cupti-python loaded ({data['loaded_cupti']}): its markers went to "
                        f"another CUPTI")
    problems += data["failures"]
    if not data["correct"]:
        problems.append("the product is wrong")
    colors = {r["id"]: r["color"] for r in data["records"] if r["kind"] == "marker_data"}
    marks = []
    for seq, r in enumerate(data["records"]):
        if r["kind"] != "marker" or r["flags"] & MARKER_INSTANTANEOUS:
            continue
        what = "start" if r["flags"] & MARKER_START else "end" if r["flags"] & MARKER_END \
            else f"flags {r['flags']}"
        marks.append(Mark(what, r["thread"], seq, r["domain"], r["name"], r["id"], r["time"],
                          colors.get(r["id"])))
    domains = Counter(m.domain for m in marks if m.what == "start")
    events = [SimpleNamespace(kind=k, operand=o, key=tuple(key), q=q, lane=lane)
              for k, o, key, q, lane in data["events"]]
    ranges, nesting = pair(marks)
    if not ranges:
        problems.append(f"no range in the 'oocgemm' domain (range starts by domain: "
                        f"{dict(domains)}; oocgemm's NVTX backend: {data['backend']}: "
                        f"{data['reason']})")
    problems += nesting
    problems += check(ranges, events) if ranges else []
    notes += [f"colour: {p}" for p in check(ranges, events, colors=True)
              if "colour" in p] if colors else ["no MARKER_DATA records (colours)"]
    if any(m.thread == -1 for m in marks):
        notes.append("markers not tied to a thread (object kind is not THREAD)")
    lines = [
        f"NVTX_INJECTION64_PATH: {data['injected']}",
        f"libcupti loaded by cupti-python: {', '.join(data['loaded_cupti'])} "
        f"({'the same' if data['same_cupti'] else 'NOT the same'})",
        f"versions: {', '.join(f'{k} {v}' for k, v in data['versions'].items() if v)}",
        f"oocgemm's NVTX backend: {data['backend']} ({data['reason']})",
        f"plan: {data['plan']}; product correct: {data['correct']}",
        f"CUPTI records: {sum(1 for r in data['records'] if r['kind'] == 'marker')} markers, "
        f"{len(colors)} marker data, other kinds {data['counts']}",
        f"range starts by domain: {dict(domains)}",
        f"result.events: {len(events)} ({dict(Counter(e.kind for e in events))})",
        summary(ranges),
    ]
    if ranges:
        first = sorted(ranges, key=lambda r: r.start or 0)[:6]
        lines.append("  first ranges: " + "; ".join(f"{r.name} [thread {r.thread}]"
                                                    for r in first))
    lines += [f"PROBLEM: {p}" for p in problems] + [f"note: {n}" for n in notes]
    return problems, notes, "\n".join(lines)


def probe(size: int = 2048, tile: int = 1024, backend: str = "", timeout: float = 600) -> dict:
    """Steps 1 and 2 for one backend ('' for oocgemm's own choice), and the analysis:
    {'status': 'ok' | 'fail' | 'missing', 'problems', 'notes', 'summary', 'data'}."""
    found = find_cupti(timeout)
    if not found.get("ok"):
        status = "missing" if found.get("missing") else "fail"
        return {"status": status, "problems": [json.dumps(found)], "notes": [],
                "summary": f"no CUPTI: {json.dumps(found)}", "data": found}
    lib = os.environ.get("OOCGEMM_CUPTI_LIB") or found["paths"][0]
    env = {k: v for k, v in os.environ.items() if k not in ("OOCGEMM_NVTX", "NVTX_DISABLE")}
    env["NVTX_INJECTION64_PATH"] = lib
    if backend:
        env["OOCGEMM_NVTX"] = backend
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        proc = _python(["--run", out, "--size", str(size), "--tile", str(tile)], env, timeout)
        if not os.path.exists(out):
            msg = f"the run failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}"
            return {"status": "fail", "problems": [msg], "notes": [], "summary": msg,
                    "data": {"find": found}}
        with open(out) as f:
            data = json.load(f)
    data["find"] = found
    problems, notes, text = analyse(data)
    status = "fail" if problems else "ok"
    if backend and data["backend"] is None:  # that backend cannot be had here
        status = "unavailable"
    return {"status": status, "problems": problems, "notes": notes, "summary": text,
            "data": data}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--find-cupti", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--run", metavar="FILE", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # a smoke test on a CPU
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--tile", type=int, default=1024)
    p.add_argument("--backend", action="append", choices=["default", "nvtx", "lib", "cupy"],
                   help="oocgemm's NVTX backend to try (repeatable; default: default and lib)")
    p.add_argument("--out", help="write the summary here too")
    p.add_argument("--json", help="write the raw records here")
    args = p.parse_args(argv)
    if args.find_cupti:
        find_cupti_main(args.find_cupti)
        return 0
    if args.run:
        run_main(args.run, args.size, args.tile, args.device)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # its records are written: leave CUPTI's exit-time flush out of it
    results = {}
    for backend in args.backend or ["default", "lib"]:
        results[backend] = probe(args.size, args.tile, "" if backend == "default" else backend)
    text = "\n\n".join(f"== backend {b}: {r['status'].upper()}\n{r['summary']}"
                       for b, r in results.items())
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    statuses = {r["status"] for r in results.values()}
    return 2 if statuses == {"missing"} else 1 if "fail" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())

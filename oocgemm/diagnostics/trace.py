"""Chrome trace event JSON of a timeline: what Perfetto (https://ui.perfetto.dev) and
chrome://tracing open.

The file is the JSON object format: ``traceEvents`` holds one complete event (``ph: "X"``) per
block operation, ``ts`` and ``dur`` in microseconds (whole nanoseconds written as µs, so
``round(ts * 1000)`` gives them back exactly), on one track (``tid``) per lane: a CUDA stream
or a thread. Metadata events (``ph: "M"``) name the process and every track and fix their
order. Events on one track never overlap; where a lane's events do (it never happens with one
event per thread or per stream, but a hand-made or foreign event list may), they are spread
over numbered sub-tracks ('read-0', 'read-0 #2'), first fit in start order. Each event's
``args`` holds its block, bytes and flops, and its exact start and end in seconds;
``otherData.oocgemm`` holds the run's wall time, the plan's prediction and the product, so
that :func:`read_chrome_trace` gives back the inputs of the same timeline.
"""

from __future__ import annotations

import json
import os

from ..errors import InputError, OutputError
from .events import Event, op_name
from .lanes import ns, tracks

FORMAT = 1
"""Version of what ``otherData.oocgemm`` and the events' ``args`` hold."""

_PID = 1


def chrome_trace(timeline) -> dict:
    """The trace of a :class:`~oocgemm.diagnostics.timeline.Timeline` as a JSON-able dict."""
    from ..version import __version__

    meta = timeline.meta
    process = "oocgemm"
    if meta.get("shape"):
        m, n, k = meta["shape"]
        process += f" C[{m}x{n}] {meta.get('dtype', '')} K={k} on {meta.get('device', '?')}"
    trace = []
    pids: dict[str, int] = {}  # a track group per device of a run on several
    for tid, (name, evs) in enumerate(tracks(timeline.events), start=1):
        device = name.rpartition("/")[0]
        if device not in pids:
            pid = pids[device] = _PID + len(pids)
            trace.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                          "args": {"name": process + (f" / {device}" if device else "")}})
        pid = pids[device]
        trace.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                      "args": {"name": name}})
        trace.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                      "args": {"sort_index": tid}})
        for e in evs:
            start = ns(e.start)
            trace.append({
                "ph": "X", "pid": pid, "tid": tid, "name": op_name(e.kind, e.operand),
                "cat": e.kind, "ts": start / 1000, "dur": (max(ns(e.end), start) - start) / 1000,
                "args": {"block": list(e.key), "q": e.q, "operand": e.operand,
                         "bytes": e.nbytes, "planned": e.planned, "flops": e.flops,
                         "index": e.index,
                         "lane": e.lane, "start_s": e.start, "end_s": e.end},
            })
    return {
        "traceEvents": trace,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": f"oocgemm {__version__}",
            "oocgemm": {"format": FORMAT, "run_seconds": timeline.run_seconds,
                        "predicted": dict(timeline.predicted), "meta": dict(timeline.meta)},
        },
    }


def write_chrome_trace(timeline, path) -> str:
    """Write :func:`chrome_trace` to ``path``; return the path.

    Raises
    ------
    OutputError
        The file cannot be written.
    """
    path = os.fspath(path)
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(timeline), f, separators=(",", ":"))
    except OSError as exc:
        raise OutputError(f"cannot write the timeline to {path!r}: {exc.strerror or exc}") from None
    return path


def read_chrome_trace(path) -> dict:
    """The inputs of :meth:`Timeline.from_events <oocgemm.diagnostics.timeline.Timeline.
    from_events>` from a trace that :func:`write_chrome_trace` wrote: ``events``,
    ``run_seconds``, ``predicted``, ``meta``.

    Raises
    ------
    InputError
        The file is missing or unreadable, not JSON, or not a trace that oocgemm wrote.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise InputError(f"timeline {path!r} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"timeline {path!r} is a directory, expected a .json trace") from None
    except OSError as exc:
        raise InputError(f"cannot read timeline {path!r}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path!r} is not a JSON trace: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{path!r} is not a Chrome trace in the JSON object format "
                         f"(no traceEvents list)")
    other = data.get("otherData")
    info = other.get("oocgemm") if isinstance(other, dict) else None
    if not isinstance(info, dict):
        raise InputError(f"{path!r} is a trace that oocgemm did not write (no "
                         f"otherData.oocgemm); save one with --timeline or Timeline.save")
    if info.get("format") != FORMAT:
        raise InputError(f"{path!r} holds oocgemm trace format {info.get('format')!r}; this "
                         f"version reads format {FORMAT}")
    events = []
    for item in data["traceEvents"]:
        if not isinstance(item, dict) or item.get("ph") != "X":
            continue
        args = item.get("args") or {}
        try:
            key = args["block"]
            events.append(Event(
                index=int(args["index"]), kind=str(item["cat"]), operand=str(args["operand"]),
                key=(int(key[0]), int(key[1])), q=int(args["q"]), lane=str(args["lane"]),
                start=float(args["start_s"]), end=float(args["end_s"]),
                nbytes=int(args["bytes"]), flops=int(args["flops"]),
                planned=int(args.get("planned", 0))))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise InputError(f"{path!r}: event {item.get('name')!r} at ts={item.get('ts')} "
                             f"lacks what oocgemm writes in its args ({exc!r})") from None
    run_seconds = info.get("run_seconds")
    return {"events": events,
            "run_seconds": float(run_seconds) if run_seconds is not None else None,
            "predicted": dict(info.get("predicted") or {}), "meta": dict(info.get("meta") or {})}

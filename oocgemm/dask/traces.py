"""The events of a graph's runs (one per group): each task leaves its run's events in a file of
its own under ``trace_dir``, and :func:`timeline` merges the files onto one clock. It reads and
writes those files only; the runs record their events themselves (``events=True``)."""

from __future__ import annotations

import os


def leave_events(trace_dir: str, result) -> None:
    """The task's events, in a file of its own in ``trace_dir`` (for :func:`timeline`)."""
    import json
    import socket
    import uuid

    worker = f"{socket.gethostname()}:{os.getpid()}"
    doc = {"worker": worker, "device": str(result.plan.device), "started_at": result.started_at,
           "flops": result.flops, "seconds": result.seconds,
           "tile": list(result.plan.tile), "cache": list(result.plan.io.cache),
           "chunks": result.chunks,
           "bytes": {key: result.bytes.get(key, 0) for key in ("storage_read", "decoded")},
           "events": [[e.index, e.kind, e.operand, list(e.key), e.q, e.lane, e.start, e.end,
                       e.nbytes, e.flops] for e in result.events]}
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, f"task-{uuid.uuid4().hex}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def timeline(trace_dir: str):
    """The tasks' events that :func:`matmul` left in ``trace_dir`` (``trace_dir=`` option),
    merged onto one clock: a :class:`~oocgemm.diagnostics.Timeline` with a lane group per
    worker and device ('host:pid/cuda:0/compute'), and its ``devices`` line for the share of
    each and the balance."""
    import glob
    import json

    from ..diagnostics.events import Event
    from ..diagnostics.timeline import Timeline
    from ..errors import InputError

    docs = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "task-*.json"))):
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))
    if not docs:
        raise InputError(f"{trace_dir}: no task events (pass trace_dir= to matmul, and run it)")
    zero = min(d["started_at"] for d in docs)
    events = []
    workers: dict[str, dict] = {}
    for d in docs:
        _tally(workers.setdefault(d["worker"], dict.fromkeys(WORKER_FIGURES, 0)), d)
        shift = d["started_at"] - zero
        for index, kind, operand, key, q, lane, start, end, nbytes, flops in d["events"]:
            events.append(Event(index=index, kind=kind, operand=operand, key=tuple(key), q=q,
                                lane=f"{d['worker']}/{d['device']}/{lane}",
                                start=start + shift, end=end + shift, nbytes=nbytes,
                                flops=flops))
    storage = {key: sum(w[key] for w in workers.values()) for key in ("storage_read",
                                                                       "decoded")}
    return Timeline.from_events(events, meta={"tasks": len(docs), "storage": storage,
                                              "workers": workers,
                                              "decoders": _decoders(docs)})


def _decoders(docs: list[dict]) -> dict[str, dict]:
    """Per input (the runs' 'A', 'B', 'C'): how many stored chunks were decoded, and by how
    many workers at most and on average (each chunk's decodes, by the worker that made
    them)."""
    by: dict[str, dict[tuple, set]] = {}
    for d in docs:
        for role, report in (d.get("chunks") or {}).items():
            for at in report.get("decoded_at", ()):
                by.setdefault(role, {}).setdefault(tuple(at), set()).add(d["worker"])
    return {role: {"chunks": len(chunks), "most_workers": max(map(len, chunks.values())),
                   "mean_workers": sum(map(len, chunks.values())) / len(chunks)}
            for role, chunks in by.items() if chunks}


#: What :func:`timeline` sums per worker (its ``meta['workers']``): group runs, their flops
#: and seconds, the stored bytes they read, and the chunks (or stored objects, where a GPU
#: decoded them) decoded and their decoded bytes.
WORKER_FIGURES = ("tasks", "flops", "seconds", "storage_read", "decodes", "decoded")


def _tally(worker: dict, doc: dict) -> None:
    """Add one task's figures to its worker's."""
    worker["tasks"] += 1
    worker["flops"] += doc["flops"]
    worker["seconds"] += doc["seconds"]
    chunks = (doc.get("chunks") or {}).values()  # per operand, as Result.chunks
    worker["storage_read"] += doc.get("bytes", {}).get("storage_read", 0)
    worker["decoded"] += sum(x.get("decoded_bytes", 0) for x in chunks)
    worker["decodes"] += sum(x.get("decodes", 0) for x in chunks)

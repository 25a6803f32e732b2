"""Lanes: where a run's operations ran (a CUDA stream, a thread of a pool, a device's), their
display order, and the tracks they are drawn on (the timeline's summary, its trace and its
plot all use them)."""

from __future__ import annotations

import re

#: Display order of lane families (anything else comes last, by name).
_LANE_ORDER = {"compute": 0, "h2d": 1, "decode": 2, "c": 3, "d2h": 4, "copy": 5, "read": 6,
               "write": 7, "encode": 8}


def lane_family(lane: str) -> str:
    """'read' for 'read-3': the pool a thread lane belongs to (a stream is its own)."""
    return re.sub(r"-\d+$", "", lane)


def lane_order(lane: str):
    """Sort key of lanes: by device on a run on several ('cuda:1/compute'), then compute,
    the streams, the copy thread, readers, writers."""
    device, _, own = lane.rpartition("/")
    family = lane_family(own)
    number = own[len(family) + 1:]
    return (device, _LANE_ORDER.get(family, len(_LANE_ORDER)), family,
            int(number) if number.isdigit() else -1, lane)


def ns(seconds: float) -> int:
    """Seconds as whole nanoseconds (what a trace holds)."""
    return round(seconds * 1e9)


def tracks(events) -> list[tuple[str, list]]:
    """``(track name, events)`` per track, in display order: one per lane, with numbered
    sub-tracks where a lane's events overlap (first fit in start order, on whole
    nanoseconds: what the trace holds)."""
    by_lane: dict[str, list] = {}
    for e in sorted(events, key=lambda e: (e.start, e.end, e.index)):
        by_lane.setdefault(e.lane, []).append(e)
    result = []
    for lane in sorted(by_lane, key=lane_order):
        subs: list[tuple[int, list]] = []  # (end of the last event in ns, events)
        for e in by_lane[lane]:
            start, end = ns(e.start), max(ns(e.end), ns(e.start))
            for i, (last, evs) in enumerate(subs):
                if last <= start:
                    evs.append(e)
                    subs[i] = (end, evs)
                    break
            else:
                subs.append((end, [e]))
        for i, (_, evs) in enumerate(subs):
            result.append((lane if i == 0 else f"{lane} #{i + 1}", evs))
    return result

"""What a profiler recorded of oocgemm's NVTX ranges, checked against a product's events.

A tool sees each range as two marks on one thread, a start (with its domain, name and colour)
and an end. CUPTI's MARKER activity records give both an id (the end's is its start's) and a
timestamp; the fake tool of tests/fake_nvtx_tool.c gives neither, only the order of the calls
and the domain of each. :func:`pair` matches them, :func:`check` compares the ranges of the
``oocgemm`` domain with ``result.events``. Used by tests/test_nvtx.py (fake tool, CPU) and by
tests/test_gpu_nvtx.py and tests/nvtx_cupti_probe.py (CUPTI, GPU).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from oocgemm.diagnostics.events import op_label
from oocgemm.diagnostics.nvtx import COLORS, DOMAIN


@dataclass
class Mark:
    """One push ('start') or pop ('end') as the tool recorded it."""

    what: str
    thread: int
    seq: int
    """Order in which the tool delivered it."""
    domain: str | None = None
    name: str | None = None
    id: int | None = None
    time: int | None = None
    color: int | None = None


@dataclass
class Range:
    thread: int
    domain: str | None
    name: str | None
    start: int | None
    end: int | None
    depth: int
    """Ranges of the same domain open around it on its thread when it started."""
    color: int | None = None


def _order(m: Mark):
    return (m.time if m.time is not None else 0, m.seq)


def pair(marks: list[Mark], domain: str | None = DOMAIN) -> tuple[list[Range], list[str]]:
    """The ranges of ``domain`` (all domains where None) and what is wrong with their nesting.

    An end belongs to the domain of the start of its id where the tool gives matching ids,
    else to its own domain if it has one, else to the innermost range still open on its
    thread. On each thread, in time order, every end must close the innermost range still open
    of its domain (NVTX keeps one stack per domain and thread), and every range must end."""
    starts = {m.id: m for m in marks if m.what == "start" and m.id is not None}
    open_: dict[int, list[Mark]] = defaultdict(list)  # starts still open, by thread
    stacks: dict[tuple[int, str | None], list[Mark]] = defaultdict(list)
    ranges: list[Range] = []
    problems: list[str] = []
    for m in sorted(marks, key=lambda m: (m.thread, *_order(m))):
        if m.what == "start":
            open_[m.thread].append(m)
            d = m.domain
        elif m.what == "end":
            by_id = starts.get(m.id) if m.id is not None else None
            if by_id is not None:
                d = by_id.domain
            elif m.domain is not None or not open_[m.thread]:
                d = m.domain
            else:
                d = open_[m.thread][-1].domain
            closed = by_id if by_id in open_[m.thread] else next(
                (s for s in reversed(open_[m.thread]) if s.domain == d), None)
            if closed is not None:
                open_[m.thread].remove(closed)
        else:
            problems.append(f"thread {m.thread}: a mark of kind {m.what!r}")
            continue
        if domain is not None and d != domain:
            continue
        stack = stacks[(m.thread, d)]
        if m.what == "start":
            stack.append(m)
            continue
        if not stack:
            problems.append(f"thread {m.thread}: an end (#{m.seq}, id {m.id}) with no open range")
            continue
        s = stack.pop()
        if m.id in starts and m.id != s.id:
            problems.append(f"thread {m.thread}: the end of id {m.id} closes {s.name!r} (id "
                            f"{s.id}): ranges overlap instead of nesting")
        if m.time is not None and s.time is not None and m.time < s.time:
            problems.append(f"thread {m.thread}: {s.name!r} ends before it starts")
        ranges.append(Range(m.thread, d, s.name, s.time, m.time, len(stack), s.color))
    for (thread, _), stack in stacks.items():
        problems += [f"thread {thread}: {s.name!r} (id {s.id}) never ended" for s in stack]
    return ranges, problems


def expected_names(events) -> Counter:
    """The range names that ``events`` (``result.events``) call for, with their counts."""
    return Counter(op_label(e.kind, e.operand, e.key, e.q) for e in events)


def check(ranges: list[Range], events, colors: bool = False) -> list[str]:
    """What is wrong with ``ranges`` (of the ``oocgemm`` domain) as one per block operation."""
    problems = []
    if len(ranges) != len(events):
        problems.append(f"{len(ranges)} ranges in the {DOMAIN!r} domain for {len(events)} "
                        f"block operations (result.events)")
    names = Counter(r.name for r in ranges)
    want = expected_names(events)
    if names != want:
        missing, extra = want - names, names - want
        problems.append(f"names differ: missing {dict(list(missing.items())[:8])} "
                        f"({sum(missing.values())} in all), unexpected "
                        f"{dict(list(extra.items())[:8])} ({sum(extra.values())} in all)")
    if colors:
        kinds = {op_label(e.kind, e.operand, e.key, e.q): e.kind for e in events}
        wrong = [(r.name, r.color) for r in ranges
                 if r.name in kinds and r.color != COLORS.get(kinds[r.name])]
        if wrong:
            problems.append(f"{len(wrong)} ranges of the wrong colour, e.g. {wrong[:4]}")
    return problems


def summary(ranges: list[Range]) -> str:
    """Ranges per kind and per thread, one line each."""
    kinds = Counter((r.name or "?").split(" ")[0].split("(")[0] for r in ranges)
    threads = Counter(r.thread for r in ranges)
    lines = [f"{len(ranges)} ranges in {len(threads)} threads, deepest nesting "
             f"{max((r.depth for r in ranges), default=0) + (1 if ranges else 0)}"]
    lines += [f"  {k:10s} {n}" for k, n in sorted(kinds.items())]
    for t, n in sorted(threads.items()):
        first = Counter((r.name or "?").split("(")[0] for r in ranges if r.thread == t)
        kinds_here = ", ".join(f"{k} x{v}" for k, v in first.items())
        lines.append(f"  thread {t}: {n} ranges ({kinds_here})")
    timed = [r.end - r.start for r in ranges if r.start is not None and r.end is not None]
    if timed:
        lines.append(f"  range length: median {sorted(timed)[len(timed) // 2] / 1e3:.1f} us, "
                     f"max {max(timed) / 1e3:.1f} us")
    return "\n".join(lines)

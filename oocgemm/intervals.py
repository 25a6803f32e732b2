"""Unions of half-open intervals: the checker's element ranges (``planning/check.py``) and the
timeline's busy times (``diagnostics/timeline.py``) measure the same way."""

from __future__ import annotations


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the given ``(start, end)`` pairs."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def measure(intervals: list[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in intervals)


def intersection(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """Length of the intersection of two sorted lists of disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total

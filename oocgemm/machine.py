"""The machine the process runs on: its memory and the cores it may use (the defaults of
the budgets and thread counts), without optional dependencies."""

from __future__ import annotations

import os


def total_memory() -> int:
    """Physical memory in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def available_memory() -> int:
    """Memory available without swapping, in bytes (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return total_memory() // 2


def cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is
    unknown): the one count of cores behind thread pools, the CPU model and ``oocgemm info``.
    ``os.cpu_count()`` itself is the machine's logical CPUs, which the process may not own."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

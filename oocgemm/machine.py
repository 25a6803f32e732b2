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


def _meminfo() -> dict[str, int]:
    """Linux's /proc/meminfo, in bytes by name ({} where there is none)."""
    found = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return found


def available_memory() -> int:
    """Memory available without swapping, in bytes (MemAvailable on Linux)."""
    return _meminfo().get("MemAvailable") or total_memory() // 2


def cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is
    unknown): the one count of cores behind thread pools, the CPU model and ``oocgemm info``.
    ``os.cpu_count()`` itself is the machine's logical CPUs, which the process may not own."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def write_back_room() -> int:
    """Bytes that writes may add to the OS page cache now before the OS holds the writers
    to the disk's rate (Linux: from the midpoint of its background and dirty thresholds,
    ``vm.dirty_*`` of the memory available, less what is dirty already); 0 where unknown."""
    def number(name: str) -> int:
        with open(f"/proc/sys/vm/{name}") as fh:
            return int(fh.read().split()[0])

    meminfo = _meminfo()
    try:
        dirtyable = meminfo["MemAvailable"]
        limits = []
        for absolute, ratio in (("dirty_background_bytes", "dirty_background_ratio"),
                                ("dirty_bytes", "dirty_ratio")):
            limits.append(number(absolute) or dirtyable * number(ratio) // 100)
        dirty = meminfo.get("Dirty", 0) + meminfo.get("Writeback", 0)
    except (OSError, ValueError, KeyError, IndexError):
        return 0
    return max(0, (limits[0] + limits[1]) // 2 - dirty)

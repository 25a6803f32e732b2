"""What the benchmarks share: option checks, error measures, rates in words, tables, threads
(sizes in words are :func:`oocgemm.units.format_size`'s)."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

import numpy as np

from oocgemm import cuda
from oocgemm.errors import OptionError
from oocgemm.random_matrices import check_dtype, tolerance
from oocgemm.units import format_size

__all__ = ["GB", "BenchError", "check_dtype", "check_room", "gbps", "markdown_table",
           "max_relative_error", "package_version", "run_parallel", "tolerance", "write_json"]

GB = 1e9
"""Bytes in the GB of every rate printed (GB/s)."""


class BenchError(ValueError):
    """A store, option or decoder that a benchmark cannot handle; the message says which."""


def max_relative_error(result, reference) -> float:
    """``max|result - reference| / max|reference|`` (0 when the reference is all zeros)."""
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    diff = float(np.max(np.abs(np.asarray(result) - reference))) if reference.size else 0.0
    return diff / scale if scale else diff


def check_room(nbytes: int, what: str) -> None:
    """OptionError unless the current GPU has ``nbytes`` free for ``what``."""
    import cupy

    free, _ = cuda.memory_info(cupy.cuda.Device().id)
    if nbytes > free:
        raise OptionError(f"{what} needs {format_size(nbytes)} of GPU memory; "
                          f"{format_size(free)} is free (choose a smaller --size)")


def write_json(path: str | None, doc: dict) -> None:
    """``doc`` as JSON at ``path`` (nothing when None); values JSON lacks as their ``str``."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, default=str)


def zarr_product_parser(doc: str, *, n: int, chunk: int, device: str,
                        memory_limit: str | None) -> argparse.ArgumentParser:
    """The command line of a benchmark of one Zarr product made for it: where, its size and
    chunks, the device and budget, and where its JSON goes."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--zarr", required=True, help="a folder for the inputs and outputs")
    parser.add_argument("--n", type=int, default=n)
    parser.add_argument("--chunk", type=int, default=chunk)
    parser.add_argument("--device", default=device)
    parser.add_argument("--memory-limit", default=memory_limit)
    parser.add_argument("--json", default=None)
    return parser


def report(doc: dict, path: str | None) -> None:
    """``doc`` printed as JSON, and written to ``path`` (nothing where None)."""
    print(json.dumps(doc, indent=1, default=str))
    write_json(path, doc)


def remove_all(*paths: str) -> None:
    """The folders a benchmark made, gone."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def gbps(nbytes: float, seconds: float | None) -> str:
    """``nbytes / seconds`` in GB/s with two decimals; ``-`` where nothing was timed."""
    return "-" if not seconds else f"{nbytes / seconds / GB:.2f}"


def markdown_table(rows: list[list], header: list[str]) -> str:
    """``rows`` under ``header`` as a Markdown table, columns padded to line up in a terminal
    too."""
    cells = [header] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join(
        [fmt(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        + [fmt(r) for r in cells[1:]]
    )


def run_parallel(fn: Callable, items: Sequence, threads: int) -> None:
    """Run ``fn`` over ``items`` on ``threads`` threads; the first exception is raised."""
    if threads <= 1 or len(items) <= 1:
        for it in items:
            fn(it)
        return
    with ThreadPoolExecutor(min(threads, len(items))) as ex:
        for _ in ex.map(fn, items):
            pass


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``; None where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

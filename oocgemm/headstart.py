"""A product's first reads begun as its command starts (``oocgemm multiply``, ``oocgemm
gram``): before numpy, zarr and CuPy are imported and a GPU starts (1-2 s of a fresh
process), the OS is asked to read (``posix_fadvise(WILLNEED)``, on a thread of its own) the
chunk files of each local Zarr input that the first C block needs, in the order it needs
them, a bounded amount; the run's reads find them in the page cache. Files the page cache
holds already cost the OS nothing to hint.

The standard library only (and :mod:`oocgemm.machine`, which is too): it runs before anything
else is imported. A hint, never an
error: a command line it cannot read, or an input it does not know, is left to the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading

from .machine import available_memory

#: Stored bytes hinted per input at most (and at most an eighth of the memory available):
#: about what a disk reads while a cold fresh process starts, for two inputs (docs/performance.md).
#: What the disk has not read when the run begins are the files it reads next anyway.
HEAD_START = 2 << 30

#: Bytes asked of the OS a call: Linux reads at most the device's readahead or its largest
#: request a call (128 KiB at the least), whatever length it is given, so that one call for a
#: whole chunk file of 128 MiB read 8 MiB of it (docs/lab-notes.md).
HINT_STEP = 128 << 10

#: The commands that multiply stored inputs.
COMMANDS = ("multiply", "gram")

#: The commands' options that take a value (the next word, unless given as ``--name=value``).
VALUE_OPTIONS = frozenset({
    "-o", "--out", "--alpha", "--beta", "-c", "--c", "--device", "--memory-limit",
    "--host-memory-limit", "--tile", "--kernel", "--gpu-decode", "--gpu-encode",
    "--out-chunks", "--out-shards", "--out-compressor", "--zarr-format", "--timeline",
    "--plot"})


#: Stored objects of a panel looked at at most (each a stat): the first block's panels of an
#: array of millions of tiny chunks are not walked whole.
MOST_OBJECTS = 4096


def begin(argv: list[str]) -> threading.Thread | None:
    """Hint the first chunk files of the inputs that the command line ``argv`` (without the
    program's name) multiplies, all of it (the inputs' metadata read too) on a daemon thread,
    returned; None for a command that multiplies nothing."""
    if not argv or argv[0] not in COMMANDS or not hasattr(os, "posix_fadvise"):
        return None
    thread = threading.Thread(target=_quietly, args=(argv,), name="oocgemm-headstart",
                              daemon=True)
    thread.start()
    return thread


def _quietly(argv: list[str]) -> None:
    with contextlib.suppress(Exception):  # a hint: the command reports what is wrong itself
        hint(first_files(argv))


def hint(files: list[str]) -> None:
    """Ask the OS to read ``files`` into its page cache, in order (:func:`will_need`)."""
    for path in files:
        will_need(path)


def will_need(path: str, step: int = HINT_STEP, most: int | None = None) -> None:
    """Ask the OS to read the file at ``path`` into its page cache (``posix_fadvise
    (WILLNEED)``, which lets go of the interpreter's lock), ``step`` bytes a call, its first
    ``most`` bytes where given; a hint that may do nothing, never an error."""
    try:  # (never waiting on a file that is not a plain one: a FIFO's writer, say)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # a chunk never written (the fill value), say
        return
    try:
        size = os.fstat(fd).st_size
        if most is not None:
            size = min(size, most)
        for offset in range(0, size, step):
            os.posix_fadvise(fd, offset, step, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def first_files(argv: list[str]) -> list[str]:
    """The chunk files that the first C block of the product ``argv`` names needs, in the
    order its K panels need them (A's and B's of each panel in turn), at most
    :data:`HEAD_START` stored bytes (and an eighth of the memory available) of each input;
    [] for another command, help, or inputs that are not local Zarr arrays."""
    if not argv or argv[0] not in COMMANDS or "-h" in argv or "--help" in argv:
        return []
    words, flags = _positional(argv[1:])
    if argv[0] == "gram":
        if not words:
            return []
        outer = "--outer" in flags
        operands = [(words[0], not outer), (words[0], outer)]  # X^T X, or X X^T
    else:
        if len(words) < 2:
            return []
        operands = [(words[0], "--trans-a" in flags), (words[1], "--trans-b" in flags)]
    budget = min(HEAD_START, available_memory() // 8)
    panels = []
    for role, (path, transposed) in zip("AB", operands):
        layout = _layout(path)
        if layout is None:
            return []  # (not a local Zarr array: the run reads it as it does)
        # A's first row panel (a column panel of the stored matrix where it is transposed);
        # B's first column panel (a row panel where transposed)
        along_rows = (role == "A") == transposed
        panels.append(_bounded(layout.panel(along_rows), budget))
    order: list[str] = []
    seen: set[str] = set()
    for pair in _interleaved(panels):
        for path in pair:
            if path not in seen:
                seen.add(path)
                order.append(path)
    return order


def _positional(words: list[str]) -> tuple[list[str], set[str]]:
    """(the positional words, the flags) of a command's words after its name: an option
    that takes a value takes the next word (``-qo OUT`` too: short options run together,
    the last taking it), and every word after ``--`` is positional."""
    positional, flags, skip, ended = [], set(), False, False
    for word in words:
        if skip:
            skip = False
        elif ended or not word.startswith("-") or word == "-":
            positional.append(word)
        elif word == "--":
            ended = True
        elif word in VALUE_OPTIONS:
            skip = True
        elif not word.startswith("--") and "=" not in word and len(word) > 2:
            skip = f"-{word[-1]}" in VALUE_OPTIONS  # short flags run together
        else:
            flags.add(word.partition("=")[0])
    return positional, flags


class _Layout:
    """A local 2-D Zarr array's chunk grid (its stored objects': shards where sharded) and
    the names of their files."""

    def __init__(self, path: str, shape, grid, key):
        self.path, self.shape, self.grid, self.key = path, shape, grid, key

    def panel(self, along_rows: bool) -> list[str]:
        """The files of its first column of objects (``along_rows``: down the rows), or of
        its first row of them, in order."""
        count = -(-self.shape[0 if along_rows else 1] // self.grid[0 if along_rows else 1])
        return [os.path.join(self.path, self.key((q, 0) if along_rows else (0, q)))
                for q in range(min(count, MOST_OBJECTS))]


def _layout(path: str) -> _Layout | None:
    """The layout of the Zarr array at ``path`` (format 2 or 3, 2-D), None where it is not
    one (or not local)."""
    if "://" in path or not os.path.isdir(path):
        return None
    v3 = os.path.join(path, "zarr.json")
    if os.path.isfile(v3):
        with open(v3) as f:
            meta = json.load(f)
        if meta.get("node_type") != "array" or len(meta.get("shape", ())) != 2:
            return None
        grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
        encoding = meta.get("chunk_key_encoding", {"name": "default"})
        config = encoding.get("configuration", {})
        if encoding.get("name") == "v2":
            sep = config.get("separator", ".")
            return _Layout(path, meta["shape"], grid, lambda ij: f"{ij[0]}{sep}{ij[1]}")
        sep = config.get("separator", "/")
        return _Layout(path, meta["shape"], grid, lambda ij: sep.join(("c", *map(str, ij))))
    v2 = os.path.join(path, ".zarray")
    if os.path.isfile(v2):
        with open(v2) as f:
            meta = json.load(f)
        if len(meta.get("shape", ())) != 2:
            return None
        sep = meta.get("dimension_separator") or "."
        return _Layout(path, meta["shape"], meta["chunks"], lambda ij: f"{ij[0]}{sep}{ij[1]}")
    return None


def _bounded(files: list[str], budget: int) -> list[str]:
    """The first of ``files`` (those that exist as plain files: a chunk never written is not
    stored) whose sizes add up to ``budget`` at most (one at least)."""
    kept, total = [], 0
    for path in files:
        try:
            found = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(found.st_mode):
            continue  # (what the run makes of it is the run's to say)
        size = found.st_size
        if kept and total + size > budget:
            break
        kept.append(path)
        total += size
    return kept


def _interleaved(panels: list[list[str]]):
    """The panels' files side by side, the longer's rest after."""
    longest = max((len(p) for p in panels), default=0)
    for q in range(longest):
        yield [p[q] for p in panels if q < len(p)]

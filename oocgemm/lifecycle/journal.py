"""Resume after a crash: a journal of the C blocks an output already holds.

A run that writes an output path (a ``.zarr`` array or a ``.npy`` file, under a temporary name
until its commit) keeps a journal beside what it writes: a header with the run's fingerprint
(what it computes, from which inputs, with which tile and schedule), then one line per C
block whose every element was written, with a CRC-32 of each piece written. An interrupted run
(Ctrl-C, SIGTERM) leaves its temporary output and journal in place when some blocks are done,
and so does a killed one. ``multiply(..., resume=True)`` finds them, refuses when the inputs or
the options changed, checks each journaled block against its checksums, and computes only the
blocks that are missing, with the same tile and schedule, so that the result is bitwise what
an uninterrupted run gives.

The journal holds an exclusive ``flock`` for as long as its run lives: a second process never
resumes (or disturbs) an output that another is still writing.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import threading
import zlib
from typing import TextIO

import numpy as np

from ..errors import OutputError
from ..storage import files
from ..storage.base import MatrixSink, MatrixSource, PartialSink
from ..storage.files import PARTIAL

#: The journal's name inside a temporary Zarr output; beside a temporary .npy, its name + this.
NAME = "oocgemm-journal.jsonl"
FORMAT = 1


def journal_path(temporary: str) -> str:
    """Where the journal of the temporary output ``temporary`` lives."""
    if os.path.isdir(temporary):
        return os.path.join(temporary, NAME)
    return temporary + "." + NAME


def signature(path: str) -> str:
    """What identifies a stored input's content cheaply, without reading it: for a file, its
    device, inode, size, and modification and change times; for a directory (Zarr), those of
    every file in it. The change time (ctime) is what the kernel sets on every write, and also
    when the modification time is set back (``touch -d``, ``os.utime``), so a file rewritten
    with its size and mtime restored is seen as changed; so is one renamed or chmod'ed,
    which refuses a resume that would have been right rather than mixing two inputs."""
    digest = hashlib.sha256()
    path = os.path.realpath(path)
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name == NAME or PARTIAL in name:
                    continue
                st = os.stat(os.path.join(root, name))
                rel = os.path.relpath(os.path.join(root, name), path)
                digest.update(f"{rel}\0{_stamp(st)}\n".encode())
    else:
        digest.update(_stamp(os.stat(path)).encode())
    return f"{path}:{digest.hexdigest()[:32]}"


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"


def candidates(final: str) -> list[str]:
    """Temporary outputs of earlier runs for the output path ``final`` that have a journal,
    the newest first."""
    found = [p for p in _partials(final)
             if not p.endswith(NAME) and os.path.exists(journal_path(p))]
    return sorted(found, key=os.path.getmtime, reverse=True)


_held: set[str] = set()
"""The temporary outputs whose journal this process holds open."""


def _partials(final: str) -> list[str]:
    """Every temporary output (and journal beside one) an oocgemm run of ``final`` made."""
    head, tail = os.path.split(os.path.abspath(final))
    return glob.glob(os.path.join(glob.escape(head), glob.escape(tail) + PARTIAL + "*"))


def writer_alive(temporary: str) -> bool:
    """Whether the process that made ``temporary`` still runs on this machine (its name
    carries the process id; a process of another user counts as alive). Only words hang
    on this; whether a run may take a journal over is decided by its lock."""
    pid = os.path.basename(temporary).rpartition(PARTIAL)[2].partition("-")[0]
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():  # this process: alive while its journal is open
        return os.path.abspath(temporary) in _held
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: a process of someone else
        return True
    return True


def left_behind(final: str) -> list[str]:
    """Temporary outputs of ``final`` that earlier runs left (interrupted, killed, or kept
    when a resume started afresh), whose process is gone: after a run of ``final`` was
    committed, nothing needs them. They are the user's to remove; oocgemm names them."""
    going = files.discarding()  # a replaced output this process is removing
    return sorted(p for p in _partials(final)
                  if not p.endswith(NAME) and not writer_alive(p) and p not in going)


class Journal:
    """The journal file of one temporary output, locked for this process.

    Raises
    ------
    BlockingIOError
        When another process holds it (its run is alive).
    """

    def __init__(self, temporary: str, header: dict | None = None):
        self.temporary = temporary
        self.path = journal_path(temporary)
        self._lock = threading.Lock()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        _held.add(os.path.abspath(temporary))
        # None once closed; bytes that are not UTF-8 (a damaged line) make a line not parsed
        self._file: TextIO | None = os.fdopen(fd, "r+", encoding="utf-8", errors="replace")
        self.header: dict
        self.blocks: dict[tuple[int, int], list[tuple]]
        """C block -> its pieces: (r0, r1, c0, c1, crc32) of what was written."""
        if header is not None:  # a new journal
            self._file.truncate(0)
            self._append({"oocgemm_journal": FORMAT, **header})
            self.header, self.blocks = header, {}
        else:
            self.header, self.blocks = self._read()
        self.recorded = 0
        """Blocks recorded by this run."""

    def _read(self) -> tuple[dict, dict]:
        assert self._file is not None
        lines = self._file.read().splitlines()
        try:
            header = json.loads(lines[0])
            if header.pop("oocgemm_journal") != FORMAT:
                raise ValueError("another journal format")
        except (IndexError, ValueError, KeyError, AttributeError):
            raise OutputError(f"{self.path}: not a journal this version of oocgemm reads; "
                              f"remove {self.temporary!r} and run again") from None
        blocks: dict[tuple[int, int], list[tuple]] = {}
        for line in lines[1:]:
            try:  # a line cut short by a crash is a block not recorded
                entry = json.loads(line)
                blocks[tuple(entry["block"])] = [tuple(piece) for piece in entry["pieces"]]
            except (ValueError, KeyError, TypeError):
                continue
        return header, blocks

    def _append(self, entry: dict) -> None:
        assert self._file is not None, f"{self.path}: written after close"
        self._file.seek(0, os.SEEK_END)
        self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._file.flush()

    def record(self, block: tuple[int, int], pieces: list[tuple]) -> None:
        """Block ``block`` is whole: ``pieces`` are (r0, r1, c0, c1, crc32) of what was written."""
        with self._lock:
            self._append({"block": list(block), "pieces": [list(p) for p in pieces]})
            self.blocks[block] = pieces
            self.recorded += 1

    def close(self, remove: bool = False) -> None:
        """Release the lock; ``remove`` the journal too (its output committed or discarded)."""
        if self._file is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
        self._file.close()  # closing the descriptor releases the flock
        self._file = None
        _held.discard(os.path.abspath(self.temporary))


def crc(data: np.ndarray) -> int:
    """CRC-32 of an array's bytes in C order (zlib releases the GIL on large buffers)."""
    return zlib.crc32(np.ascontiguousarray(data).data.cast("B"))


def verified(journal: Journal) -> set[tuple[int, int]]:
    """The journaled blocks whose every piece, read back from the temporary output, still
    has its checksum."""
    temporary = journal.temporary
    source: MatrixSource
    if os.path.isdir(temporary):
        import zarr

        from ..storage.zarr_store import ZarrSource

        source = ZarrSource(zarr.open_array(temporary, mode="r"), name=temporary,
                            incomplete_ok=True)
    else:
        from ..storage.memory import NumpySource

        source = NumpySource(np.load(temporary, mmap_mode="r"), name=temporary, on_disk=True)
    try:
        return _verified(journal, source)
    finally:
        source.close()


def _verified(journal: Journal, source) -> set[tuple[int, int]]:
    good = set()
    for block, pieces in journal.blocks.items():
        for r0, r1, c0, c1, want in pieces:
            buf = np.empty((r1 - r0, c1 - c0), dtype=source.dtype)
            try:
                source.read((r0, r1), (c0, c1), buf)
            except Exception:  # a damaged chunk (truncated, garbled): computed again
                break
            if want is not None and crc(buf) != want:  # None: stored from frames (whole
                break                                  # chunks that decode are the check)
        else:
            good.add(block)
    return good


class JournaledSink(MatrixSink):
    """Wraps an output's sink: every write goes through, and when the writes have covered a
    whole C block (of ``rows`` x ``cols`` splits), the block goes into the journal."""

    def __init__(self, inner: MatrixSink, journal: Journal, rows, cols):
        self.inner = inner
        self.journal = journal
        self.shape, self.dtype, self.name = inner.shape, inner.dtype, inner.name
        self.on_disk = inner.on_disk
        self.chunks = getattr(inner, "chunks", None)
        self._rows, self._cols = tuple(rows), tuple(cols)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], list] = {}
        self._covered: dict[tuple[int, int], int] = {}

    def _block(self, rows, cols) -> tuple[int, int]:
        return (bisect.bisect_right(self._rows, rows[0]) - 1,
                bisect.bisect_right(self._cols, cols[0]) - 1)

    def write(self, rows, cols, block):
        self.inner.write(rows, cols, block)
        self._covers(rows, cols, crc(block))

    def _covers(self, rows, cols, check: int | None) -> None:
        """The region is written: the block goes into the journal once it is all written."""
        key = self._block(rows, cols)
        i, j = key
        area = (self._rows[i + 1] - self._rows[i]) * (self._cols[j + 1] - self._cols[j])
        with self._lock:
            self._pending.setdefault(key, []).append((*rows, *cols, check))
            covered = self._covered[key] = (self._covered.get(key, 0)
                                            + (rows[1] - rows[0]) * (cols[1] - cols[0]))
            pieces = self._pending.pop(key) if covered >= area else None
        if pieces is not None:
            self.journal.record(key, sorted(pieces))

    def framing(self):
        return self.inner.framing()

    def store_frames(self, index, rows, cols, frames) -> None:
        """A chunk stored from frames encoded on the GPU: its data never reaches the host,
        so it is journaled without a checksum (a resume checks that the chunk decodes)."""
        self.inner.store_frames(index, rows, cols, frames)
        self._covers(rows, cols, None)

    def regrid(self, rows, cols, header: dict) -> JournaledSink:
        """The same output journaled afresh for other C blocks (a plan made again): what
        the old blocks wrote is computed again, so the journal starts over."""
        self.journal.close()
        return JournaledSink(self.inner, Journal(self.journal.temporary, header), rows, cols)

    def array(self):
        return self.inner.array()

    def commit(self):
        self.journal.close(remove=True)
        return self.inner.commit()

    def abort(self):
        self.journal.close(remove=True)
        self.inner.abort()

    def keep(self) -> bool:
        """After an interrupt: leave the temporary output and its journal for a later
        ``resume=True`` when some block is done (True), else abort."""
        if not self.journal.blocks:
            self.abort()
            return False
        inner = self.inner
        assert isinstance(inner, PartialSink), "only a file output is journaled"
        inner.close_partial()
        self.journal.close()
        return True

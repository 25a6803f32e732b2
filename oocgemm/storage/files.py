"""Temporary names and the final rename, shared by the file-backed sinks; how much of some
files the page cache holds."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import numpy as np

from ..errors import OutputError

PARTIAL = ".oocgemm-partial-"


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while an output is created or committed: zarr writes its
    metadata from its own event loop thread, so an interrupt raised in the caller meanwhile
    could remove the temporary output while that thread writes into it again. The signal
    arrives (and stops the run as usual) right after the block.

    The hold is a Python handler that notes the signal, not a signal mask: a mask holds the
    signal back from the calling thread only, and the OS hands a process's signal to any
    thread that does not block it (zarr's, for one), whose arrival Python then raises in the
    main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    held: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)  # the handler gets an int
    previous = {signum: signal.signal(signum, lambda signum, frame: arrived.append(signum))
                for signum in held}
    try:
        yield
    finally:
        # SIGTERM's handler first: a Ctrl-C between the two swaps is then still noted (and
        # delivered below), where SIGINT's first would raise it with SIGTERM's noting handler
        # left in place for good. (A SIGTERM between them meets its own handler, as it would.)
        for signum, handler in reversed(previous.items()):
            signal.signal(signum, handler)
        if arrived:
            _deliver(arrived[0], previous[arrived[0]])


def _deliver(signum: int, handler) -> None:
    """What a held signal would have done: its handler runs (Ctrl-C raises KeyboardInterrupt),
    or the default action ends the process."""
    if callable(handler):
        handler(signum, None)
    elif handler != signal.SIG_IGN:
        os.kill(os.getpid(), signum)


def temporary_suffix() -> str:
    """What makes a name a temporary one: nobody mistakes it for a finished output."""
    return f"{PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def temporary_sibling(path: str) -> str:
    """A name beside ``path`` (same file system, so the final rename is atomic) that nobody
    mistakes for a finished output."""
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(head, tail + temporary_suffix())


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


#: Replaced outputs being removed behind the caller, by path (:func:`discard`).
_DISCARDING: dict[str, threading.Thread] = {}
_DISCARD_LOCK = threading.Lock()


def discard(path: str) -> None:
    """Remove ``path``, an output that was replaced and now lies under a temporary name,
    behind the caller: unlinking gigabytes just written waits on their write-back (seconds
    for a C of gigabytes: docs/performance.md, "A fresh process"), which the new output does
    not need.
    What is not removed when the process exits is left to a process of its own
    (:func:`hand_over`), so that exit does not wait either; :func:`settle` waits."""
    thread = threading.Thread(target=_discarded, args=(path,), name="oocgemm-discard",
                              daemon=True)
    with _DISCARD_LOCK:
        if not _DISCARDING:
            atexit.register(hand_over)
        _DISCARDING[path] = thread
    thread.start()


def discarding() -> set[str]:
    """The replaced outputs this process is removing now (:func:`discard`)."""
    with _DISCARD_LOCK:
        return set(_DISCARDING)


def _discarded(path: str) -> None:
    try:
        remove(path)
    finally:
        with _DISCARD_LOCK:
            _DISCARDING.pop(path, None)


def settle(timeout: float | None = None) -> bool:
    """Wait for the replaced outputs being removed (:func:`discard`); whether none is left."""
    with _DISCARD_LOCK:
        threads = list(_DISCARDING.values())
    for thread in threads:
        thread.join(timeout)
    with _DISCARD_LOCK:
        return not _DISCARDING


def hand_over() -> None:
    """At exit: the replaced outputs not removed yet are removed by a detached process."""
    with _DISCARD_LOCK:
        left = list(_DISCARDING)
        _DISCARDING.clear()
    if left:
        code = "import shutil, sys\nfor p in sys.argv[1:]: shutil.rmtree(p, ignore_errors=True)"
        with contextlib.suppress(OSError):
            subprocess.Popen([sys.executable, "-c", code, *left], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)


def publish(temporary: str, final: str, *, replace: bool) -> None:
    """Move ``temporary`` to ``final``, atomically. With ``replace`` False, an output that
    appeared at ``final`` meanwhile (another process writing the same path) is left as it is
    and this raises :class:`OutputError`; with ``replace`` True it is replaced: a file by one
    rename, a directory by one exchange of the two names where the system has it (Linux), else
    moved aside first, removed after, and put back if the move fails. Several
    writers racing for one path end with one complete output and no leftovers; every failure
    is an OutputError."""
    try:
        if not replace:
            _publish_new(temporary, final)
            return
        for _ in range(100):
            if os.path.isdir(final) and not os.path.islink(final):
                try:
                    swapped = _exchange(temporary, final)
                except FileNotFoundError:  # another writer moved it first
                    continue
                if swapped:  # the old output now sits at the temporary name
                    discard(temporary)
                    return
                # No atomic exchange here: move the old aside, the new in, the old away.
                old = temporary + "-old"
                try:
                    os.rename(final, old)
                except FileNotFoundError:  # another writer moved it first
                    continue
                try:
                    os.rename(temporary, final)
                except OSError as exc:
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another writer won
                        shutil.rmtree(old, ignore_errors=True)
                        continue
                    with contextlib.suppress(OSError):  # the user's output goes back
                        os.rename(old, final)
                    raise
                discard(old)
                return
            try:
                os.replace(temporary, final)
                return
            except IsADirectoryError:  # a directory appeared meanwhile
                continue
        raise OutputError(f"cannot move the finished output to {final!r}: other writers kept "
                          f"replacing it")
    except FileExistsError:
        raise OutputError(f"out {final!r} appeared while this run computed (another process "
                          f"writing the same path?); it was left as it is and this result "
                          f"discarded; pass overwrite=True to replace it") from None
    except OSError as exc:
        raise OutputError(f"cannot move the finished output to {final!r}: {exc}") from None


def _exchange(first: str, second: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2`` with ``RENAME_EXCHANGE``), so that a
    crash never finds ``second`` missing; False where the system or file system has no such
    call."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_cwd, exchange = -100, 2  # AT_FDCWD, RENAME_EXCHANGE
    if renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), second)


@functools.cache
def _renameat2():
    try:
        return ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None


def _publish_new(temporary: str, final: str) -> None:
    if os.path.isdir(temporary):
        if os.path.lexists(final):  # rename would replace an empty directory or fail
            raise FileExistsError(final)
        os.rename(temporary, final)
    else:
        os.link(temporary, final)  # fails if final exists: no silent replacement
        os.remove(temporary)


def replace(temporary: str, final: str) -> None:
    """Move ``temporary`` to ``final``, replacing what is there (a file or a directory)."""
    publish(temporary, final, replace=True)


def cached_fraction(paths) -> float | None:
    """The share of the bytes of the files ``paths`` that the OS page cache holds now (0 to
    1; missing files left out), from ``mincore`` on a mapping of each: nothing is read.
    None where it cannot tell (not Linux, no file found, a call refused)."""
    libc = _libc()
    if libc is None:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    held = total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = libc.mmap(None, ctypes.c_size_t(size), 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = -(-size // page)
                vec = np.zeros(pages, dtype=np.uint8)
                if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size),
                                vec.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte))) != 0:
                    return None
                held += min(int(np.count_nonzero(vec & 1)) * page, size)
                total += size
            finally:
                libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        finally:
            os.close(fd)
    return held / total if total else None


@functools.cache
def _libc():
    """libc with mmap, mincore and munmap typed; None off Linux."""
    if os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc

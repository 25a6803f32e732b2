"""Temporary names and the final rename, shared by the file-backed sinks."""

from __future__ import annotations

import os
import shutil
import uuid

PARTIAL = ".oocgemm-partial-"


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


def replace(temporary: str, final: str) -> None:
    """Move ``temporary`` to ``final``, replacing what is there (a file or a directory)."""
    if os.path.isdir(final) and not os.path.islink(final):
        old = temporary + "-old"
        os.rename(final, old)
        os.rename(temporary, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(temporary, final)

"""``.npy`` files, read and written as numpy memmaps."""

from __future__ import annotations

import errno
import os

import numpy as np
from numpy.lib import format as npy_format

from ..errors import InputError, OutputError
from . import files
from .base import MatrixSink
from .memory import NumpySource


def open_npy(path: str, role: str) -> NumpySource:
    """Open a .npy file as a read-only memmap, with a clear error when it is broken."""
    if os.path.isdir(path):
        raise InputError(f"{role}: {path!r} is a directory, not a .npy file")
    if not os.path.isfile(path):
        raise InputError(f"{role}: no such file {path!r}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # np.load raises EOFError for an empty file
        raise InputError(f"{role}: {path!r} is not a readable .npy file (truncated or corrupt: "
                         f"{exc})") from None
    except OSError as exc:
        raise InputError(f"{role}: cannot open {path!r}: {exc}") from None
    if not isinstance(array, np.ndarray):  # np.load opens a zip file as an NpzFile
        names = list(array.files)
        array.close()
        raise InputError(npz_message(path, role, names))
    return NumpySource(array, name=path, on_disk=True, path=os.path.abspath(path))


def npz_message(path: str, role: str, names: list[str]) -> str:
    """Why a .npz file is not a matrix, and what to pass instead: one of its arrays."""
    if not names:
        return f"{role}: {path!r} is a .npz archive that holds no arrays; pass a .npy file"
    shown = ", ".join(repr(n) for n in names[:5]) + (", ..." if len(names) > 5 else "")
    return (f"{role}: {path!r} is a .npz archive, which holds several arrays ({shown}), not "
            f"one matrix; pass one of them: np.load({path!r})[{names[0]!r}] (read into "
            f"memory), or save it as a .npy file to read it from disk")


def _reserve(path: str) -> None:
    """Allocate the whole file now, so that a full disk is an error before the run instead of
    a SIGBUS when a write into the sparse memmap finds no block (file systems that cannot
    allocate ahead are left as they are)."""
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)


class NpySink(MatrixSink):
    """A new .npy memmap under a temporary name, renamed over ``path`` on commit."""

    def __init__(self, path: str, shape, dtype, replace: bool = False,
                 temporary: str | None = None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.name = path
        self.path = os.path.abspath(path)
        self.on_disk = True
        self._final = path
        self._replace = replace
        # None once committed, aborted or left for a resume (and where creating them failed)
        self._temporary: str | None
        self._array: np.memmap | None
        if temporary is not None:  # an interrupted run's output, continued (resume)
            self._temporary = temporary
            self._array = npy_format.open_memmap(temporary, mode="r+")
            if self._array.shape != self.shape or self._array.dtype != self.dtype:
                raise OutputError(f"{temporary!r} is not the output this run writes")
            return
        self._temporary = files.temporary_sibling(path)
        try:
            self._array = npy_format.open_memmap(self._temporary, mode="w+", dtype=self.dtype,
                                                 shape=self.shape)
            _reserve(self._temporary)
        except BaseException as exc:  # an interrupt too: what was begun goes
            self._array = None
            files.remove(self._temporary)
            self._temporary = None
            if not isinstance(exc, OSError):
                raise
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise  # not a matter of room: open_sink says so
            need = int(np.prod(self.shape)) * self.dtype.itemsize
            raise OutputError(f"out {path!r}: cannot make room for {need:,} bytes "
                              f"({exc.strerror or exc}); free some space or write elsewhere"
                              ) from None

    def write(self, rows, cols, block):
        self._array[rows[0]:rows[1], cols[0]:cols[1]] = block

    def array(self):
        """The memmap being written (under its temporary name until commit)."""
        return getattr(self, "_array", None)

    def commit(self):
        # No msync: it wrote the whole C back to disk before the call could return (seconds
        # a few GB, as long as storing C at the disk's rate), where the OS writes the pages
        # back behind the caller as it does a Zarr output's chunk files; the rename below
        # publishes what the page cache holds either way.
        del self._array
        files.publish(self._temporary, self._final, replace=self._replace)
        self._temporary = None
        return np.load(self._final, mmap_mode="r+")

    @property
    def temporary_path(self) -> str | None:
        """Where the output is written until its commit (None: written in place)."""
        return self._temporary

    def close_partial(self) -> None:
        """Leave the temporary output where it is (for a later resume), flushed."""
        array = getattr(self, "_array", None)
        if array is not None:
            array.flush()
        self._array = None
        self._temporary = None

    def abort(self):
        if self._temporary is not None:
            self._array = None
            files.remove(self._temporary)
            self._temporary = None

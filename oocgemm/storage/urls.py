"""Zarr inputs and outputs named by URL (``file://``, ``memory://``, ``s3://``, ``gs://``...):
whatever zarr-python opens through fsspec, with the caller's ``storage_options``.

``file://`` URLs become local paths (atomic renames, alias checks by file identity). Other
URLs are object stores or in-memory file systems: an output that does not exist yet is
written where it goes, flagged incomplete in its attributes until the last block is stored
(and removed if the run fails); one that exists (``overwrite``, or an update in place) is
written beside it under a temporary name and moved over it on commit.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse

from ..errors import InputError, OOCGemmError, OutputError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_url(obj) -> bool:
    """True for a string with a scheme (``memory://x``, ``s3://bucket/x``)."""
    return isinstance(obj, str) and bool(_SCHEME.match(obj))


def local(obj):
    """``file://`` URLs as local paths; everything else unchanged."""
    if isinstance(obj, str) and obj.lower().startswith("file://"):
        parsed = urllib.parse.urlparse(obj)
        if parsed.netloc not in ("", "localhost"):
            raise InputError(f"{obj!r}: a file:// URL names a local path (file:///abs/path)")
        return urllib.parse.unquote(parsed.path)
    return obj


def normal(url: str) -> str:
    """The URL as compared for aliasing: without trailing slashes."""
    return url.rstrip("/")


def filesystem(url: str, storage_options: dict | None):
    """(fsspec file system, path inside it) of a URL."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - a dependency of dask and zarr's URL support
        raise InputError(f"{url!r}: URLs need fsspec (pip install fsspec)") from None
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise InputError(f"{url!r}: cannot open this URL ({type(exc).__name__}: {exc}); "
                         f"a scheme like s3:// needs its fsspec package (s3fs, gcsfs)") from None


def exists(url: str, storage_options: dict | None, error: type[OOCGemmError] = InputError
           ) -> bool:
    """Whether anything is stored at ``url``; a store that cannot be reached raises ``error``
    (InputError for an input, OutputError for an output)."""
    fs, path = filesystem(url, storage_options)
    with _calling(url, "cannot reach", error):
        fs.invalidate_cache()  # zarr wrote through its own (async) instance since
        return bool(fs.exists(path))


def remove(url: str, storage_options: dict | None) -> None:
    fs, path = filesystem(url, storage_options)
    with _calling(url, "cannot remove", OutputError):
        fs.invalidate_cache()
        if fs.exists(path):
            fs.rm(path, recursive=True)


#: The names of Zarr metadata objects (format 3, and format 2's), copied last on a replace.
METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata")


def replace(temporary: str, final: str, storage_options: dict | None) -> None:
    """Move ``temporary`` over ``final`` (removing what ``final`` held), object by object: an
    object store has no rename of a prefix. ``final`` is removed first, then its chunks are
    copied and its metadata last, so that a reader finds no array at ``final`` until the
    whole new one is there (never the new metadata over old chunks, or the reverse).
    (fsspec's recursive ``mv`` copies the "directories" a listing names too, which are no
    objects on S3: it failed with NoSuchKey after copying every chunk.)"""
    fs, tmp_path = filesystem(temporary, storage_options)
    _, final_path = filesystem(final, storage_options)
    with _calling(final, f"cannot move {temporary!r} over", OutputError):
        fs.invalidate_cache()
        objects = sorted(fs.find(tmp_path))  # objects only, no directories
        if fs.exists(final_path):
            fs.rm(final_path, recursive=True)
        metadata = [p for p in objects if p.rsplit("/", 1)[-1] in METADATA]
        for group in ([p for p in objects if p not in metadata], metadata):
            if group:
                fs.copy(group, [final_path + p[len(tmp_path):] for p in group])
        fs.rm(tmp_path, recursive=True)
        fs.invalidate_cache()


@contextlib.contextmanager
def _calling(url: str, what: str, error: type[OOCGemmError]):
    """Errors of the file system (a store that cannot be reached, refused credentials, a
    missing bucket) as ``error``, naming the URL."""
    try:
        yield
    except OOCGemmError:
        raise
    except Exception as exc:  # OSError, botocore's and the other backends' own
        raise error(f"{what} {url!r} ({type(exc).__name__}: {exc})") from exc


def open_array(url: str, role: str, storage_options: dict | None):
    """An existing Zarr array at ``url``, read-only, with a clear error for everything else."""
    import zarr

    if not exists(url, storage_options, InputError):
        raise InputError(f"{role}: nothing at {url!r}")
    try:
        node = zarr.open(store=url, mode="r", storage_options=storage_options)
    except Exception as exc:
        raise InputError(f"{role}: {url!r} is not a readable Zarr array ({type(exc).__name__}: "
                         f"{exc})") from None
    if not isinstance(node, zarr.Array):
        raise InputError(f"{role}: {url!r} is a Zarr group, not an array")
    return node


def check_sink(url: str, storage_options: dict | None) -> None:
    """Refuse URL outputs that cannot be Zarr (a .npy over a URL)."""
    if url.lower().rstrip("/").endswith(".npy"):
        raise OutputError(f"out {url!r}: .npy outputs must be local paths; use a .zarr URL")

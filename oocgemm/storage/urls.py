"""Zarr inputs and outputs named by URL (``file://``, ``memory://``, ``s3://``, ``gs://``...):
whatever zarr-python opens through fsspec, with the caller's ``storage_options``.

``file://`` URLs become local paths (atomic renames, alias checks by file identity). Other
URLs are object stores or in-memory file systems: an output that does not exist yet is
written where it goes, flagged incomplete in its attributes until the last block is stored
(and removed if the run fails); one that exists (``overwrite``, or an update in place) is
written beside it under a temporary name and moved over it on commit.
"""

from __future__ import annotations

import re
import urllib.parse

from ..errors import InputError, OutputError

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


def exists(url: str, storage_options: dict | None) -> bool:
    fs, path = filesystem(url, storage_options)
    return fs.exists(path)


def remove(url: str, storage_options: dict | None) -> None:
    fs, path = filesystem(url, storage_options)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def replace(temporary: str, final: str, storage_options: dict | None) -> None:
    """Move ``temporary`` over ``final`` (removing what ``final`` held)."""
    fs, tmp_path = filesystem(temporary, storage_options)
    _, final_path = filesystem(final, storage_options)
    if fs.exists(final_path):
        fs.rm(final_path, recursive=True)
    fs.mv(tmp_path, final_path, recursive=True)


def open_array(url: str, role: str, storage_options: dict | None):
    """An existing Zarr array at ``url``, read-only, with a clear error for everything else."""
    import zarr

    if not exists(url, storage_options):
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

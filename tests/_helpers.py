"""Helpers for the tests: random matrices, the float64 reference and its error bound."""

from __future__ import annotations

import os
import threading

import numpy as np

from oocgemm.storage.files import PARTIAL, settle

#: How far the property-based (hypothesis) tests go: OOCGEMM_TEST_PROFILE, "ci" (the
#: default, sized for a 2-core machine) or "thorough" (full breadth); tests/conftest.py says more.
PROFILES = ("ci", "thorough")
PROFILE = os.environ.get("OOCGEMM_TEST_PROFILE", "ci").strip().lower() or "ci"
if PROFILE not in PROFILES:
    raise ValueError(f"OOCGEMM_TEST_PROFILE={PROFILE!r}: give one of {', '.join(PROFILES)}")
THOROUGH = PROFILE == "thorough"


def examples(ci: int, thorough: int) -> int:
    """The number of examples of a hypothesis test in the chosen profile."""
    return thorough if THOROUGH else ci


def fuzz_examples(ci: int, thorough: int) -> int:
    """The examples of a fuzzer: OOCGEMM_FUZZ_EXAMPLES where it is set, else :func:`examples`."""
    return int(os.environ.get("OOCGEMM_FUZZ_EXAMPLES") or examples(ci, thorough))


def rand(rng: np.random.Generator, shape, dtype="float64") -> np.ndarray:
    """Random normal entries (never zeros); complex dtypes get a random imaginary part."""
    dtype = np.dtype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def zarr_stores(chunks, **arrays) -> None:
    """Each array as a Zarr store of zarr's defaults (zstd) named after its keyword
    (``a=x``: ``a.zarr``, in the current folder), in chunks of ``chunks``."""
    import zarr

    for name, x in arrays.items():
        zarr.create_array(f"{name}.zarr", shape=x.shape, dtype=x.dtype, chunks=chunks)[...] = x


def poisoned(shape, dtype="float64") -> np.ndarray:
    """An array full of NaN (and one inf), to prove that its old content never leaks."""
    x = np.full(shape, np.nan, dtype=dtype)
    if x.size:
        x.flat[0] = np.inf
    return x


def op(x, transposed: bool):
    return np.asarray(x).T if transposed else np.asarray(x)


def reference(a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False):
    """``alpha * op(a) @ op(b) + beta * c`` in float64 / complex128, honouring BLAS rules
    (alpha == 0: no product; beta == 0: c not read)."""
    a, b = op(a, trans_a), op(b, trans_b)
    wide = np.complex128 if any(np.iscomplexobj(x) for x in (a, b, c) if x is not None) or \
        isinstance(alpha, complex) or isinstance(beta, complex) else np.float64
    m, n = a.shape[0], b.shape[1]
    result = np.zeros((m, n), dtype=wide)
    if alpha != 0:
        result += alpha * (a.astype(wide) @ b.astype(wide))
    if beta != 0:
        result += beta * np.asarray(c).astype(wide)
    return result


def assert_gemm(got, a, b, c=None, *, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                dtype=None):
    """``got`` equals the float64 reference within a rounding bound of the compute dtype.

    The bound is elementwise: 16 (K + 2) eps (|alpha| |op(a)| |op(b)| + |beta| |c|), the
    standard error bound of a dot product, with room to spare; NaN anywhere fails.
    """
    got = np.asarray(got)
    want = reference(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)
    assert got.shape == want.shape, (got.shape, want.shape)
    dtype = np.dtype(dtype if dtype is not None else got.dtype)
    eps = np.finfo(dtype).eps
    A, B = np.abs(op(a, trans_a)).astype(np.float64), np.abs(op(b, trans_b)).astype(np.float64)
    k = A.shape[1]
    scale = np.zeros(want.shape)
    if alpha != 0:
        scale += abs(alpha) * (A @ B)
    if beta != 0:
        scale += abs(beta) * np.abs(np.asarray(c)).astype(np.float64)
    bound = 16 * (k + 2) * eps * scale + np.finfo(np.float64).tiny
    assert np.all(np.isfinite(got)), "NaN or inf in the result"
    err = np.abs(got.astype(np.result_type(got.dtype, want.dtype)) - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert np.all(err <= bound), (f"max error {err.max():.3g} at {worst}: got {got[worst]}, "
                                  f"want {want[worst]} (bound {bound[worst]:.3g})")


def interrupt_write(monkeypatch, sink_class, at: int):
    """Make ``sink_class.write`` raise KeyboardInterrupt (Ctrl-C) from its call number ``at``
    on, the calls before writing as they do (the writers are threads: a call after the
    interrupted one may be under way on another, and must not get through either); returns
    the real ``write``, to put back."""
    real, writes, lock = sink_class.write, {"n": 0}, threading.Lock()

    def write(self, rows, cols, block):
        with lock:
            writes["n"] += 1
            late = writes["n"] >= at
        if late:
            raise KeyboardInterrupt
        real(self, rows, cols, block)

    monkeypatch.setattr(sink_class, "write", write)
    return real


def fail_on_call(monkeypatch, cls, name: str, at: int, exc: BaseException, *,
                 delay: float = 0.0) -> None:
    """Make method ``name`` of ``cls`` raise ``exc`` at its call number ``at`` (the calls
    before and after run as they do, each ``delay`` seconds later)."""
    import time

    real, calls, lock = getattr(cls, name), {"n": 0}, threading.Lock()

    def failing(self, *args, **kwargs):
        with lock:
            calls["n"] += 1
            now = calls["n"] == at
        if now:
            raise exc
        if delay:
            time.sleep(delay)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, failing)


def leftovers(directory) -> list[str]:
    """Temporary files of interrupted runs in ``directory`` (once the replaced outputs being
    removed behind their runs are gone)."""
    assert settle(timeout=60), "replaced outputs still being removed after a minute"
    return sorted(name for name in os.listdir(directory) if PARTIAL in name)


def cli(main):
    """``run(*args, code=0)`` and ``fails(*args)`` for the click command ``main``, through
    click's CliRunner: ``run`` checks the exit code and returns the result; ``fails`` expects
    a user's error (exit 2, 'error:' on stderr, nothing on stdout, no traceback) and returns
    stderr."""
    from click.testing import CliRunner

    def run(*args, code=0):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == code, (
            f"exit {result.exit_code} != {code}\nstdout:\n{result.stdout}\nstderr:\n"
            f"{result.stderr}\nexception: {result.exception!r}")
        return result

    def fails(*args) -> str:
        result = run(*args, code=2)
        assert "error:" in result.stderr
        assert "Traceback" not in result.output
        assert result.stdout == ""
        assert result.exception is None or isinstance(result.exception, SystemExit)
        return result.stderr

    return run, fails


def evicted(*paths) -> bool:
    """Every file under ``paths`` written to disk and dropped from the OS page cache
    (``POSIX_FADV_DONTNEED``: this process's hint for those files alone, not the machine's
    caches); whether the page cache then holds none of them (False on a file system that
    keeps them, such as tmpfs)."""
    from oocgemm.storage.files import cached_fraction

    files = [os.path.join(d, f) for p in paths for d, _, fs in os.walk(p) for f in fs]
    files += [p for p in paths if os.path.isfile(p)]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return cached_fraction(files) == 0.0

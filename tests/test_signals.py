"""SIGTERM stops a run like Ctrl-C: nothing committed, the temporary output removed, a true
message and exit code 143 (issue 18, item 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import leftovers

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: The subprocesses import the oocgemm of this checkout, whatever is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}


def test_sigterm_mid_run_commits_nothing(rng, workdir):
    a = rng.standard_normal((1500, 1500))
    np.save("a.npy", a)
    np.save("b.npy", a.T.copy())
    # No block is computed before the signal has come: every GEMM (on the compute thread, the
    # main one, where the signal's handler raises) waits, so that the signal finds no block
    # written, however late a loaded machine lets this test send it. (Writes under way when
    # a signal comes are finished, and their blocks kept for --resume.)
    code = ("import threading\nimport numpy as np\nfrom oocgemm.cli import main\n"
            "def matmul(*args, _matmul=np.matmul, **kwargs):\n"
            "    threading.Event().wait(60)\n"
            "    return _matmul(*args, **kwargs)\n"
            "np.matmul = matmul\n"
            "main(['multiply', 'a.npy', 'b.npy', '-o', 'c.zarr', "
            "'--device', 'cpu', '--tile', '100,100,100', '-q'])\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env=ENV)
    deadline = time.monotonic() + 60
    while not leftovers(".") and time.monotonic() < deadline:  # the run has started writing
        time.sleep(0.05)
    assert leftovers("."), "the run never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated; no output was written" in err
    assert not os.path.exists("c.zarr") and leftovers(".") == []


def test_a_npy_output_that_does_not_fit_fails_before_the_run(rng, workdir):
    """The whole .npy output is allocated before the run: a disk that cannot hold it (here a
    file-size limit, as `ulimit -f` sets) is an OutputError with nothing left behind, not a
    SIGBUS or a raw OSError after the work."""
    import resource

    np.save("a.npy", rng.standard_normal((1000, 20)))
    np.save("b.npy", rng.standard_normal((20, 1000)))

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    code = ("from oocgemm.cli import main; main(['multiply', 'a.npy', 'b.npy', '-o', 'c.npy', "
            "'--device', 'cpu', '-q'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          preexec_fn=limit, timeout=120, env=ENV)
    assert done.returncode == 2, done.stderr
    assert "error: out 'c.npy': cannot make room for 8,000,000 bytes" in done.stderr
    assert not os.path.exists("c.npy") and leftovers(".") == []


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_commit_is_told_truthfully(rng, workdir, suffix, sig):
    """A signal that arrives while the output is committed waits for the commit, and the
    message then says the output is whole (it said "no output was written")."""
    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    np.save("a.npy", a)
    np.save("b.npy", b)
    # The signal is sent from inside the commit, in a child process (its own signal handlers).
    code = ("import os, signal, sys\n"
            "from oocgemm.storage import npy, zarr_store\n"
            "from oocgemm.cli import main\n"
            "for sink in (npy.NpySink, zarr_store.ZarrSink):\n"
            "    def commit(self, _commit=sink.commit):\n"
            f"        os.kill(os.getpid(), {int(sig)})\n"
            "        return _commit(self)\n"
            "    sink.commit = commit\n"
            f"main(['multiply', 'a.npy', 'b.npy', '-o', 'c{suffix}', '--device', 'cpu', '-q'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                          timeout=120)
    how = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else 130), proc.stderr
    assert f"{how} after the output was complete" in proc.stderr
    assert "holds the whole result" in proc.stderr and "no output" not in proc.stderr
    got = np.load("c.npy") if suffix == ".npy" else __import__("zarr").open_array("c.zarr")[...]
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    assert leftovers(".") == []


def _handler_swaps(monkeypatch) -> list:
    """The signals whose handlers are set from now on (signal.signal, as the hold sets them)."""
    swaps = []
    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda signum, handler: swaps.append(signum)
                        or real(signum, handler))
    return swaps


@pytest.mark.parametrize("out", ["c.npy", "c.zarr"])
def test_an_output_in_storage_is_begun_and_committed_with_signals_held(rng, workdir,
                                                                       monkeypatch, out):
    import oocgemm

    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    swaps = _handler_swaps(monkeypatch)
    oocgemm.multiply(a, b, out, device="cpu", progress=False)
    assert swaps.count(signal.SIGINT) == swaps.count(signal.SIGTERM) == 4  # held, let go x2


def test_an_output_in_memory_is_not_held_for(rng, monkeypatch):
    """None, a numpy array: nothing is published, so no handler is swapped (a small
    product's call spent 0.06 ms on it); a memmap is flushed on commit, and is held for."""
    import oocgemm

    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    swaps = _handler_swaps(monkeypatch)
    out = np.full((40, 20), np.nan)
    oocgemm.multiply(a, b, out, device="cpu", progress=False)
    result = oocgemm.multiply(a, b, device="cpu", progress=False)
    assert swaps == []
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(result.out, a @ b, rtol=1e-12, atol=1e-12)


def test_a_memmap_output_is_held_for(rng, workdir, monkeypatch):
    import oocgemm

    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    out = np.lib.format.open_memmap("c.npy", mode="w+", dtype=np.float64, shape=(40, 20))
    swaps = _handler_swaps(monkeypatch)
    oocgemm.multiply(a, b, out, device="cpu", progress=False)
    assert swaps.count(signal.SIGINT) == 4
    np.testing.assert_allclose(np.load("c.npy"), a @ b, rtol=1e-12, atol=1e-12)

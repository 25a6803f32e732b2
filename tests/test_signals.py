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


def test_sigterm_mid_run_commits_nothing(rng, workdir):
    a = rng.standard_normal((1500, 1500))
    np.save("a.npy", a)
    np.save("b.npy", a.T.copy())
    code = ("from oocgemm.cli import main; main(['multiply', 'a.npy', 'b.npy', '-o', 'c.zarr', "
            "'--device', 'cpu', '--tile', '100,100,100', '-q'])")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not leftovers(".") and time.monotonic() < deadline:  # the run has started writing
        time.sleep(0.05)
    assert leftovers("."), "the run never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated; no output was written" in err
    assert not os.path.exists("c.zarr") and leftovers(".") == []

"""The examples run as a user would run them, in a fresh process."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _extra_args(script: pathlib.Path) -> list[str]:
    """Arguments an example asks the tests to add (a '# example-test-args: ...' line: a GPU
    example runs small, and on the CPU where there is no GPU)."""
    for line in script.read_text().splitlines():
        if line.startswith("# example-test-args:"):
            return shlex.split(line.partition(":")[2])
    return []


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(script, tmp_path):
    # the package of this checkout, whichever one is installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)] + _extra_args(script),
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "max relative error" in done.stdout


def test_there_is_a_quickstart():
    assert any(p.name == "quickstart.py" for p in EXAMPLES)

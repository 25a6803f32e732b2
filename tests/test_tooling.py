"""The tools CI holds the code to: ruff's rules and mypy on the public API (their settings are
in pyproject.toml; .pre-commit-config.yaml runs the same before a commit)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*command) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    done = _run("ruff", "check", "oocgemm", "benchmarks", "tests", "examples")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_public_api():
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra has it)")
    done = _run(sys.executable, "-m", "mypy")
    assert done.returncode == 0, done.stdout + done.stderr

"""Shared fixtures of the oocgemm test suite.

Every test gets its own seeded generator (the seed is derived from the test's id), so inputs are
fresh random matrices, different from test to test, and reproducible.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("oocgemm", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("oocgemm")


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's node id: different per test, stable across runs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh directory that is also the current directory (relative paths land in it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path

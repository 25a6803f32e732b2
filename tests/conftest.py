"""Shared fixtures of the oocgemm test suite.

Every test gets its own seeded generator (the seed is derived from the test's id), so inputs are
fresh random matrices, different from test to test, and reproducible.

How far the property-based (hypothesis) tests go is set by the environment variable
``OOCGEMM_TEST_PROFILE`` (``_helpers.PROFILE``):

``ci`` (the default)
    sized so that the whole suite runs in about two minutes on a 2-core machine
    (``python3 -m pytest -q -n auto``, as README.md and .ci/run give it);
``thorough``
    the hypothesis tests at full breadth, 2 to 7 times their ``ci`` examples (each test names
    both counts: ``_helpers.examples``), 500 for a test that names none. Run it before a
    release, or after changing the planner, the schedule or its checker
    (``OOCGEMM_TEST_PROFILE=thorough python3 -m pytest -n auto``).

``OOCGEMM_FUZZ_EXAMPLES=N`` sets the examples of the two fuzzers (tests/test_fuzz.py,
tests/test_aliasing.py) to N in either profile. The hypothesis settings profile
``oocgemm-<profile>`` is loaded too (no deadline: a product may take a while on a loaded
machine).

The tests are safe under pytest-xdist: each writes under its own ``tmp_path`` (or a temporary
folder of its own), opens no fixed port, and changes no state that outlives it.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from _helpers import PROFILE, PROFILES
from hypothesis import HealthCheck, settings

# Named apart from hypothesis's own "ci" profile (derandomized), which this one replaces even
# where hypothesis sees a CI machine: the examples differ from run to run, as they always did.
for _name in PROFILES:
    settings.register_profile(f"oocgemm-{_name}", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow],
                              max_examples=100 if _name == "ci" else 500)
settings.load_profile(f"oocgemm-{PROFILE}")


#: What keeps each pytest-xdist worker's BLAS on one thread (one worker per core already).
ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    """Under ``-n``, before the workers start (they inherit this environment): one BLAS thread
    each, as many workers as cores; threads that wait for a busy core spin and slow the run. A
    value set by the user stands."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ONE_THREAD:
            os.environ.setdefault(name, "1")


def pytest_report_header(config):
    return f"oocgemm test profile: {PROFILE} (OOCGEMM_TEST_PROFILE; tests/conftest.py)"


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's node id: different per test, stable across runs."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh directory that is also the current directory (relative paths land in it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def _no_plans_kept():
    """Each test plans afresh: the process's plans of small products
    (``oocgemm.planning.planner.SMALL_PLANS``) are not carried from one test into the next, where a
    test may patch what the planner reads."""
    from oocgemm.planning.planner import SMALL_PLANS

    SMALL_PLANS.clear()
    yield
    SMALL_PLANS.clear()

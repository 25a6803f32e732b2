"""Modules renamed so that their names say what they hold keep their old names as
deprecated aliases until oocgemm.version.OLD_NAMES_REMOVED_IN: importing one warns, naming
that version, and gives the same objects."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

from oocgemm import cuda
from oocgemm.version import OLD_NAMES_REMOVED_IN, __version__

ALIASES = [("oocgemm.hostinfo", "oocgemm.machine", "cores"),
           ("oocgemm.hints", "oocgemm.typing", "MatrixLike"),
           ("oocgemm.sysinfo", "oocgemm.info", "system_info"),
           ("oocgemm.testing", "oocgemm.random_matrices", "write_random")]
if cuda.device_count():  # the GPU's context imports CuPy
    ALIASES.append(("oocgemm.cuda.engine", "oocgemm.cuda.context", "PROCESS"))


@pytest.mark.parametrize("old,new,name", ALIASES)
def test_an_old_module_name_warns_and_gives_the_new_module_objects(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")) as caught:
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert f"goes in oocgemm {OLD_NAMES_REMOVED_IN}" in str(caught[0].message)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:3])


def test_the_old_names_are_gone_by_the_version_they_name():
    """A tripwire: the release that reaches OLD_NAMES_REMOVED_IN deletes the alias modules
    (and this list), or moves the date on with a reason."""
    here = [old for old, *_ in ALIASES if importlib.util.find_spec(old) is not None]
    assert _release(__version__) < _release(OLD_NAMES_REMOVED_IN) or not here, (
        f"oocgemm {__version__} still has {here}, to go in {OLD_NAMES_REMOVED_IN}")

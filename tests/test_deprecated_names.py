"""Modules renamed so that their names say what they hold keep their old names as
deprecated aliases: importing one warns and gives the same objects."""

from __future__ import annotations

import importlib
import sys

import pytest

from oocgemm import cuda

ALIASES = [("oocgemm.hostinfo", "oocgemm.machine", "cores"),
           ("oocgemm.hints", "oocgemm.typing", "MatrixLike"),
           ("oocgemm.sysinfo", "oocgemm.info", "system_info"),
           ("oocgemm.testing", "oocgemm.random_matrices", "write_random")]
if cuda.device_count():  # the GPU's context imports CuPy
    ALIASES.append(("oocgemm.cuda.engine", "oocgemm.cuda.context", "PROCESS"))


@pytest.mark.parametrize("old,new,name", ALIASES)
def test_an_old_module_name_warns_and_gives_the_new_module_objects(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)

"""The process's settings, read in this one module, in the manner of ``zarr.config``: each has
a default, an ``OOCGEMM_*`` environment variable that replaces the default, and a value set
in code (:func:`set`, for good or for a ``with`` block) that replaces both::

    import oocgemm.settings

    oocgemm.settings.get("gpu_encode")          # True, unless OOCGEMM_GPU_ENCODE says else
    with oocgemm.settings.set(gpu_decode=False):
        oocgemm.multiply("a.zarr", "b.zarr", "c.zarr")   # the inputs decoded on the host

The environment is read at each :func:`get` of a setting not set in code (an empty variable
counts as unset), so a variable set after ``import oocgemm`` counts too. Two settings are the
defaults of options of the same name (:class:`oocgemm.options.Options`: ``gpu_decode=``,
``gpu_encode=``; an option given replaces its setting); the others are paths. The rest of
the library reads the environment through here only (tests/test_tooling.py holds it to that;
the NVTX switches of :mod:`oocgemm.diagnostics.nvtx` and the BLAS threads that
:mod:`oocgemm.info` reports are the tools' own).

- ``gpu_decode`` (``OOCGEMM_GPU_DECODE``): 'auto' (the default), True ('on', '1') or False
  ('off', '0'): who decodes inputs stored as zstd frames on a GPU run;
- ``gpu_encode`` (``OOCGEMM_GPU_ENCODE``): True (the default; 'on', '1'), False ('off', '0'),
  or the experimental 'last' and 'frames': who compresses a zstd output on a GPU run;
- ``kernels`` (``OOCGEMM_KERNELS``): a folder of the kernels' .cu sources, in place of the
  package's;
- ``nvcomp`` (``OOCGEMM_NVCOMP``): a libnvcomp to try first.

:data:`SETTINGS` says more of each.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import OptionError

__all__ = ["SETTINGS", "Setting", "get", "parse", "reset", "set"]

_ON, _OFF = ("1", "on"), ("0", "off")


def _switch(value: Any, extra: tuple[str, ...]) -> bool | str | None:
    """``value`` as True, False or one of the words ``extra``; None where it is none."""
    kind = type(value)
    if isinstance(value, bool) or (kind.__module__ == "numpy"
                                   and kind.__name__ in ("bool", "bool_")):  # numpy's too
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _ON:
            return True
        if word in _OFF:
            return False
        if word in extra:
            return word
    return None


def _gpu_decode(value: Any) -> bool | str | None:
    return _switch(value, ("auto",))


def _gpu_encode(value: Any) -> bool | str | None:
    return _switch(value, ("last", "frames"))


def _path(value: Any) -> str | None:
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) and os.fspath(value) \
        else None


@dataclass(frozen=True)
class Setting:
    """One setting: its name, its environment variable, its default and how a value is read."""

    name: str
    env: str
    """The environment variable that replaces the default (``OOCGEMM_*``)."""
    default: Any
    """The value where neither code nor the environment gives one."""
    read: Callable[[Any], Any]
    """A value given (a string from the environment, or what code passed) as the setting's
    own (True, False, a word, a path), or None where it is not one."""
    values: str
    """The values it takes, in words (for the error that refuses another)."""
    doc: str
    """What it changes."""


#: Every setting, by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("gpu_decode", "OOCGEMM_GPU_DECODE", "auto", _gpu_decode,
            "'auto', True ('on', '1') or False ('off', '0')",
            "Who decodes inputs stored as zstd frames on a GPU run: 'auto', the GPU where the "
            "plan allows, nvCOMP is found and the cost model predicts it faster; True, the GPU "
            "wherever the plan allows; False, the host. The default of gpu_decode=."),
    Setting("gpu_encode", "OOCGEMM_GPU_ENCODE", True, _gpu_encode,
            "True ('on', '1'), False ('off', '0'), 'last' or 'frames'",
            "Who compresses a zstd output on a GPU run: True, the GPU (nvCOMP), a row stripe "
            "of C at a time, where nvCOMP is found and its buffers fit; False, the host, "
            "whole chunks; 'last' (experimental), the GPU a share of the last block's stripes "
            "and the host's encoders the others, a stripe each; 'frames' (experimental), the "
            "host's encoders every stripe. The default of gpu_encode=."),
    Setting("kernels", "OOCGEMM_KERNELS", None, _path, "a folder",
            "The folder of the kernels' .cu sources, in place of the package's."),
    Setting("nvcomp", "OOCGEMM_NVCOMP", None, _path, "a file",
            "A libnvcomp to try before the nvidia-libnvcomp wheel's and the loader's (read "
            "once, when nvCOMP is first looked for)."),
)}

_lock = threading.Lock()
_given: dict[str, Any] = {}  # the values set in code, by name


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise OptionError(f"unknown setting {name!r}; the settings are "
                          f"{', '.join(SETTINGS)}") from None


def parse(name: str, value: Any, where: str | None = None) -> Any:
    """``value`` as a value of the setting ``name`` (``'on'`` as True...); OptionError, naming
    ``where`` it came from (default: the setting's name), for one it does not take."""
    setting = _setting(name)
    got = setting.read(value)
    if got is None:
        raise OptionError(f"{where or name}={value!r}: {name} takes {setting.values} "
                          f"(default {setting.default!r})")
    return got


def get(name: str) -> Any:
    """The setting ``name``: the value set in code (:func:`set`), else its environment
    variable's (an empty one counts as unset), else its default.

    Raises
    ------
    OptionError
        An unknown name, or a variable that holds a value the setting does not take (the
        message names the variable and the values it takes).
    """
    setting = _setting(name)
    with _lock:
        if name in _given:
            return _given[name]
    raw = os.environ.get(setting.env, "")
    if not raw.strip():
        return setting.default
    return parse(name, raw, where=setting.env)


class set:  # noqa: N801 - named as zarr.config.set, which it mirrors
    """Set settings by name (``set(gpu_decode=False)``), checked as :func:`parse` checks them;
    None unsets one (its environment variable or default again). For good, or, as a context
    manager, for a ``with`` block: its end puts back what was set in code before.

    Raises
    ------
    OptionError
        An unknown name, or a value the setting does not take.
    """

    def __init__(self, **values: Any):
        new = {name: None if value is None else parse(name, value)
               for name, value in values.items()}
        with _lock:
            self._before = {name: _given.get(name) for name in new}
            _apply(new)

    def __enter__(self) -> set:
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _apply(self._before)


def _apply(values: dict[str, Any]) -> None:
    for name, value in values.items():
        if value is None:
            _given.pop(name, None)
        else:
            _given[name] = value


def reset() -> None:
    """Unset every setting set in code: the environment's or the defaults again."""
    with _lock:
        _given.clear()


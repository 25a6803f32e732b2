"""A long-lived engine: products that share their options and the device resources kept
between runs (pinned host memory, cuBLAS handles, compiled kernels, threads), freed when it
closes.

:func:`oocgemm.multiply` is the one-shot form: its runs share the process's resources,
which live until the process exits. An engine gives them a lifetime::

    with oocgemm.Engine(device="cuda", memory_limit="16GB") as engine:
        print(engine.plan("a.zarr", "b.zarr"))
        for a, b, out in products:
            engine.multiply(a, b, out)
    # the pinned memory and handles are freed here
"""

from __future__ import annotations

import threading
from typing import Any

from .api import MatrixLike, device_names, multiply, plan, resolve_device
from .errors import OptionError
from .options import PLANS, Options
from .planning import Plan
from .result import Result


class Engine:
    """Plans and runs products with the options it was made with (those of
    :class:`~oocgemm.options.Options`: ``device``, ``memory_limit``, ``host_memory_limit``,
    ``tile``, ``kernel``, ``gpu_decode``, ``gpu_encode``, ``out_options``,
    ``storage_options``); a call's own keywords take
    precedence. It owns the device resources its runs keep for the next, and frees them on
    :meth:`close` (or at the end of a ``with`` block). Safe to use from several threads.

    Raises
    ------
    OptionError
        An unknown or malformed option (when made), a call on a closed engine, or a close
        while a run is under way.
    DeviceError
        When made: a device unknown, or not found on this machine.
    """

    def __init__(self, **options: Any):
        self.options = Options.of("Engine()", PLANS, **options)
        # a device that cannot run (a name unknown, a GPU that is not there) is said now
        device_names(self.options.device) or resolve_device(self.options.device)
        self._given = self.options.keywords()
        self._lock = threading.Lock()
        self._resources: dict[str, Any] = {}
        self._running = 0
        self.closed = False

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._given.items())
        return f"Engine({given}{', closed' if self.closed else ''})"

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def plan(self, a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None,
             **keywords: Any) -> Plan:
        """:func:`oocgemm.plan` with this engine's options."""
        self._check_open()
        return plan(a, b, out, **{**self._given, **keywords})

    def multiply(self, a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None,
                 **keywords: Any) -> Result:
        """:func:`oocgemm.multiply` with this engine's options and resources."""
        if "engine" in keywords:
            raise OptionError("Engine.multiply runs on its own engine; leave engine= out")
        with self._lock:
            self._check_open()
            self._running += 1
        try:
            return multiply(a, b, out, engine=self, **{**self._given, **keywords})
        finally:
            with self._lock:
                self._running -= 1

    def resources(self, kind: str):
        """What this engine's runs on devices of ``kind`` keep between them (None where they
        keep nothing: the CPU)."""
        with self._lock:
            self._check_open()  # a closed engine runs nothing, on a CPU either
            if kind not in self._resources:
                from .backends import backend_of

                self._resources[kind] = backend_of(kind).resources()
            return self._resources[kind]

    def close(self) -> None:
        """Free the resources; later calls are refused. Closing twice is harmless."""
        with self._lock:
            if self._running:
                raise OptionError(f"Engine.close: {self._running} run(s) still under way")
            self.closed = True
            resources, self._resources = self._resources, {}
        for held in resources.values():
            if held is not None:
                held.close()

    def _check_open(self) -> None:
        if self.closed:
            raise OptionError("this oocgemm.Engine is closed")

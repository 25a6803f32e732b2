"""One product, ``out = alpha * op(a) @ op(b) + beta * c``, as an object with a life:
made (its options checked, its operands and output target opened and checked), planned
(:meth:`Product.plan`: the plan, from the facts of that I/O, without reading a byte),
executed (:meth:`Product.execute`: exactly that plan, then the output committed), closed
(:meth:`Product.close`, or the end of a ``with`` block: what it opened is released).

The stateful form, in the manner of nvmath-python's ``Matmul``; :func:`oocgemm.multiply`,
:func:`oocgemm.plan`, :class:`oocgemm.Engine`, the command line and ``oocgemm.dask`` are thin
wrappers over it::

    with oocgemm.Product("a.zarr", "b.zarr", "c.zarr", device="cuda") as product:
        print(product.plan())          # read nothing yet
        result = product.execute()     # runs the plan printed above

The run's I/O is opened and checked by :func:`~oocgemm.lifecycle.run.open_run` (the operands,
the output target, aliasing); the plan is made by :mod:`oocgemm.planning` (which never
touches storage) with the executor's staging handed over as data
(:mod:`oocgemm.runtime.staging`); the runtime (:func:`oocgemm.runtime.execute.execute`: one
executor, or one per device) replays the plan's schedule, planning again with smaller
blocks when memory runs short; the output is checked when asked and committed; the result
says what happened.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from .arguments import flag, scalar
from .backends import backend_of
from .devices import Device, device_names, planned_for, resolve_device
from .errors import BudgetError, ExecutionError, OptionError
from .kernel_catalog import check_kernel
from .labels import labelled
from .lifecycle.run import RunIO, chunk_counts, open_run
from .options import Options
from .planning import Plan, Problem
from .planning.planner import Facts, make_plan
from .result import Result
from .runtime.execute import execute
from .settings import get as setting
from .storage.identity import seen_through
from .strategies import strategy_of
from .typing import MatrixLike, Scalar
from .units import echo_size, format_size

__all__ = ["Product"]


class Product:
    """The product ``out = alpha * op(a) @ op(b) + beta * c`` of :func:`oocgemm.multiply`,
    in steps: :meth:`plan`, :meth:`execute`, :meth:`close` (a context manager too).

    Parameters
    ----------
    a, b, out, c, alpha, beta, trans_a, trans_b
        As for :func:`oocgemm.multiply`.
    options
        An :class:`~oocgemm.options.Options`, or a dict of option names, as the keywords.
    **keywords
        The options by name (:class:`~oocgemm.options.Options`: those of :func:`multiply`
        beside the operands and scalars); they take precedence over ``options``.

    Making it checks the options, the device, the operands and the output target and
    opens them (nothing is read but what describes them); what is opened is released by
    :meth:`close`, by the end of a ``with`` block, by a step that fails, or once
    :meth:`execute` has committed the output.

    Raises
    ------
    OOCGemmError
        As :func:`oocgemm.multiply`: each check at the step that makes it.
    """

    def __init__(self, a: MatrixLike, b: MatrixLike, out: MatrixLike | None = None, *,
                 c: MatrixLike | None = None, alpha: Scalar = 1.0, beta: Scalar = 0.0,
                 trans_a: bool = False, trans_b: bool = False,
                 options: Options | Mapping[str, Any] | None = None, **keywords: Any):
        if isinstance(options, Options) and not keywords:
            self.options = options
        else:
            given = options.keywords() if isinstance(options, Options) else dict(options or {})
            self.options = Options.of("Product()", **{**given, **keywords})
        #: Several devices (their names), or None for one.
        self.devices = device_names(self.options.device)
        alpha, beta = scalar("alpha", alpha), scalar("beta", beta)
        trans_a, trans_b = flag("trans_a", trans_a), flag("trans_b", trans_b)
        # x.T of a numpy x beside x: x itself, read transposed (a Gram product found)
        a, trans_a, b, trans_b = seen_through(a, trans_a, b, trans_b)
        #: The device the plan is made for (the first of several).
        self.device: Device = resolve_device(planned_for(self.devices, self.options.device))
        self._backend = backend_of(self.device)
        # (a GPU's context and cuBLAS start while the inputs open)
        self._backend.start([Device.named(d).index for d in self.devices] if self.devices
                            else [self.device.index])
        self._io: RunIO = open_run(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a,
                                   trans_b=trans_b, out_options=self.options.out_options,
                                   storage_options=self.options.storage_options)
        self._scalars = (alpha, beta, trans_a, trans_b)
        self._plan: Plan | None = None
        #: The budgets the plan was made within (memory_limit, host_memory_limit), bytes.
        self._limits: tuple[int, int] | None = None
        self._executed = False
        #: True once what it opened is released; it plans and runs nothing more.
        self.closed = False

    def __repr__(self) -> str:
        state = ("closed" if self.closed else "executed" if self._executed
                 else "planned" if self._plan is not None else "open")
        m, n, k = self._io.shape
        return f"Product({m}x{k} @ {k}x{n} -> {self._io.name}, {self.device}, {state})"

    # -- the steps -------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The validated :class:`~oocgemm.planning.Plan` (made the first time; the same
        object after), without reading any data. Print it for a summary; ``plan.schedule``
        lists the block operations; :meth:`execute` runs exactly it."""
        self._check_open()
        if self._plan is None:
            try:
                self._plan = self._make_plan()
            except BaseException as exc:  # no plan: what was opened is released now
                self._release(exc)
                if isinstance(exc, BudgetError) and self._limits is not None:
                    raise BudgetError(_in_users_units(str(exc), self.options, *self._limits)
                                      ) from None
                raise
        return self._plan

    def execute(self) -> Result:
        """Run the plan (:meth:`plan`'s, made now if it was not), check the product where
        ``verify`` asks, commit the output and release what was opened. Once per product.

        Returns
        -------
        Result
            ``result.out`` holds the product; ``result.plan`` the plan that ran to the end
            (``plan()``'s, or smaller blocks after memory ran short).

        Raises
        ------
        InputError
            An input named by a local path was rewritten, replaced or removed since the
            product was made (its shape and layout were read then); nothing is computed.
        """
        plan_ = self.plan()
        if self._executed:
            raise OptionError("this Product has run; make another for another run")
        self._executed = True
        o, io = self.options, self._io
        try:
            resources = o.engine.resources(self.device.kind) if o.engine is not None else None
            check = _Check(plan_, io) if o.verify else None  # C_in's part before it changes
            plan_ = io.begin(plan_, overwrite=o.overwrite, resume_=o.resume,
                             attributes=_attributes(plan_.problem))
            run = execute(plan_, io, self.devices, progress=o.progress,
                          record=bool(o.events), resources=resources)
            report = check.run(io.sink.array()) if check is not None else None
            result_out = io.commit()
        except BaseException as exc:
            self._release(exc)
            raise
        self.close()
        if io.out is None:  # a new array: an xarray input's labels on its rows and columns
            result_out = labelled(result_out, io.given["a"], io.given["b"], *self._scalars[2:])
        log = run.log
        # a resumed run's schedule skips the blocks kept: its flops are its GEMMs' only
        flops = run.plan.counts.flops if run.plan.work.done else run.plan.flops
        return Result(out=result_out, plan=run.plan, seconds=run.seconds, flops=flops,
                      bytes={**io.storage_bytes(), **log.traffic()}, log=log,
                      started_at=log.started_at, chunks=chunk_counts(run.readers),
                      verified=report, resumed=len(run.plan.work.done), replanned=run.replanned,
                      devices=run.shares, emulation=dict(log.notes),
                      emulation_seconds=dict(log.timed), out_name=io.name,
                      out_encoder=log.encoder)

    def close(self) -> None:
        """Release what the product opened (its sources; an output it began and did not
        commit is removed). Closing twice is harmless."""
        self._release(None)

    def __enter__(self) -> Product:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        self._release(exc)

    # -- inside ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise OptionError("this Product is closed" + (" (it has run)" if self._executed
                                                           else ""))

    def _release(self, exc: BaseException | None) -> None:
        if not self.closed:
            self.closed = True
            self._io.__exit__(type(exc) if exc is not None else None, exc,
                              exc.__traceback__ if exc is not None else None)

    def _make_plan(self) -> Plan:
        alpha, beta, trans_a, trans_b = self._scalars
        io = self._io
        m, n, k = io.shape
        op_a, op_b, op_c, op_out = io.operands()
        problem = Problem(m=m, n=n, k=k, itemsize=io.dtype.itemsize, dtype=io.dtype.name,
                          a=op_a, b=op_b, c=op_c, out=op_out, alpha=alpha, beta=beta,
                          trans_a=trans_a, trans_b=trans_b, shared=io.shared)
        plan = make_plan(problem, self._facts(problem))
        for advice in plan.warnings:
            _warn(advice)
        return plan

    def _facts(self, problem: Problem) -> Facts:
        """What the planner needs to know of this product's device and I/O."""
        options, backend = self.options, self._backend
        kernel = check_kernel(options.kernel, np.dtype(problem.dtype))
        if self.device.kind not in strategy_of(kernel).devices:
            raise OptionError(f"kernel={kernel!r} is a CUDA kernel, but the device is "
                              f"{self.device}; leave kernel unset on the CPU")
        model, mem, host = backend.budgets(self.device.index, options)
        self._limits = (mem, host)
        coding, asked = gpu_coding(options, backend.decodes)
        mode, encode = coding.gpu_decode, coding.gpu_encode
        assert mode is not None and encode is not None  # (decided: the option or the setting)
        return Facts(device=self.device, kernel=kernel, model=model, memory_limit=mem,
                     host_memory_limit=host, staging=backend.staging(problem, model, kernel),
                     tile=options.tile, gpu_decode=mode, gpu_encode=encode,
                     decoder_found=mode == "auto" and backend.decoder_found(),
                     cached=frozenset(self._cached(problem)),
                     write_back=self._io.write_back(),
                     given_limits=(options.memory_limit, options.host_memory_limit),
                     notes=asked)

    def _cached(self, problem: Problem) -> set[str]:
        """The stored inputs ('A', 'B') the OS page cache holds: each source on disk asked
        once (one matrix in both roles once)."""
        if not (problem.a.on_disk or problem.b.on_disk):
            return set()
        held = {"A"} if self._io.inputs_cached(("A",)) else set()
        if held if self._io.shared else self._io.inputs_cached(("B",)):
            held.add("B")
        return held


# ------------------------------------------------------------------------------------------
def _warn(message: str) -> None:
    """A RuntimeWarning, ``oocgemm: message``, pointing at the caller's line that led here
    (the first frame outside oocgemm)."""
    frame = inspect.currentframe()
    level, frame = 2, frame.f_back if frame is not None else None  # (2: _warn's caller)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("oocgemm"):
        frame, level = frame.f_back, level + 1
    warnings.warn("oocgemm: " + message, RuntimeWarning, stacklevel=level)


def gpu_coding(options: Options, gpu: bool) -> tuple[Options, tuple[str, ...]]:
    """``options`` with ``gpu_decode`` and ``gpu_encode`` decided for a plan on a GPU (``gpu``:
    a device whose backend decodes and encodes there) or the CPU, and the notes the plan
    takes of them. Each is the option where given, else its setting (:mod:`oocgemm.settings`:
    the environment's, else the default). ``gpu_decode``: 'auto' weighs decoding on the GPU
    where the plan allows and nvCOMP is found
    (:func:`~oocgemm.planning.planner.decoded_on_device`); True decodes there wherever the
    plan allows; False on the host. On the CPU the host decodes and encodes (both False)
    whatever was asked; an option given that asks for the GPU is noted in the plan."""
    decode = options.gpu_decode if options.gpu_decode is not None else setting("gpu_decode")
    encode = options.gpu_encode if options.gpu_encode is not None else setting("gpu_encode")
    notes: tuple[str, ...] = ()
    if not gpu:
        asked = [f"{name}={value!r}" for name, value, asks in (
            ("gpu_decode", options.gpu_decode, options.gpu_decode is True),
            ("gpu_encode", options.gpu_encode, options.gpu_encode not in (None, False)))
            if asks]
        if asked:
            notes = (f"{' and '.join(asked)} ask{'s' if len(asked) == 1 else ''} for a GPU; "
                     f"on the CPU the host decodes the inputs and encodes C",)
        decode = encode = False
    return dataclasses.replace(options, gpu_decode=decode, gpu_encode=encode), notes


def _in_users_units(message: str, options: Options, mem: int, host: int) -> str:
    """``message`` with the budgets it names (``memory_limit=977 KiB``, as the planner, which
    sees bytes only, writes them) in the user's own spelling beside their bytes
    (``memory_limit='1MB' (977 KiB)``: :func:`~oocgemm.units.echo_size`)."""
    for name, given, nbytes in (("host_memory_limit", options.host_memory_limit, host),
                                ("memory_limit", options.memory_limit, mem)):
        if given is None:  # a default: the planner's size is all there is to say
            continue
        # "memory_limit=" is not matched inside "host_memory_limit="; the replacement's
        # backslashes (a user's odd string) are kept as they are
        said = f"{name}={echo_size(given, nbytes)}".replace("\\", "\\\\")
        message = re.sub(rf"(?<!\w){name}={re.escape(format_size(nbytes))}", said, message)
    return message


class _Check:
    """``multiply(verify=True)``: Freivalds' vectors drawn, and what C_in contributes taken,
    before the run (an update in place overwrites C_in); the check run on the product before
    it is committed."""

    def __init__(self, plan: Plan, io: RunIO):
        from .freivalds import prepare_c_in, random_vectors

        prob = plan.problem
        self.prob, self.io = prob, io
        complex_ = (prob.dtype.startswith("complex") or isinstance(prob.alpha, complex)
                    or isinstance(prob.beta, complex))
        self.x = random_vectors(prob.n, 2, complex_, None)
        c_in = (io.out if io.in_place else io.given["c"]) if prob.reads_c else None
        self.side = prepare_c_in(c_in, self.x, storage_options=io.storage_options)

    def run(self, product):
        """The report on ``product`` (not committed yet), checked against the run's own open
        sources of A and B; ExecutionError when it fails (nothing is committed)."""
        from .freivalds import verify_sources
        from .storage import open_source

        prob, io = self.prob, self.io
        c = open_source(product, "c", io.storage_options, incomplete_ok=True)
        try:
            report = verify_sources(io.sources["A"], io.sources["B"], c, alpha=prob.alpha,
                                    beta=prob.beta, trans_a=prob.trans_a, trans_b=prob.trans_b,
                                    rounds=2, vectors=self.x, c_in_side=self.side,
                                    storage_options=io.storage_options)
        finally:
            c.close()
        if report.inconclusive:
            raise ExecutionError(f"the product could not be checked, so nothing was committed "
                                 f"(run without verify to keep it): {report}")
        if not report:
            raise ExecutionError(f"the product failed its check, so nothing was committed: "
                                 f"{report}")
        return report



def _attributes(prob: Problem) -> dict:
    """What a Zarr output records of the product that made it."""
    return {"m": prob.m, "n": prob.n, "k": prob.k, "alpha": _json_scalar(prob.alpha),
            "beta": _json_scalar(prob.beta), "trans_a": prob.trans_a, "trans_b": prob.trans_b}


def _json_scalar(x):
    return [x.real, x.imag] if isinstance(x, complex) else x

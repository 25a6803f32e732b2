"""What a run returns."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .units import format_seconds, format_size

if TYPE_CHECKING:
    from .diagnostics.timeline import Timeline


#: How ``str(result)`` names the keys of ``Result.bytes`` that need more than their key.
NAMES = {"decoded": "chunks decoded", "read": "read into slots"}


@dataclass
class Result:
    """The output and what it cost."""

    out: Any
    """The product: the committed Zarr array / memmap for a path, the given array, or a new
    numpy array for ``out=None``."""
    plan: Any
    """The :class:`~oocgemm.planning.Plan` that ran."""
    seconds: float
    """Wall time of the execution (planning and opening excluded), seconds."""
    flops: int
    """Floating-point operations this run did: the product's (:attr:`total_flops`), but for a
    resumed run, which does only those of the blocks it computed (not of those it kept)."""
    bytes: dict
    """Bytes per level: ``storage_read`` (taken from storage: the stored, compressed bytes of
    the chunks decoded, or what was read from a file's pages; the decoded size where a
    remote store does not say), ``decoded`` (bytes of the chunks decoded), ``read`` (what the
    READ operations copied into slots and stripes, out of decoded chunks, files or memory),
    ``storage_write``, ``h2d``, ``d2h``."""
    chunks: dict = field(default_factory=dict)
    """Per chunked on-disk operand ('A', 'B', 'C'): its ``chunks`` count, the ``decodes``
    the run made, ``decoded_bytes``, the most decoded bytes held at once (``peak_bytes``),
    whether its chunks were ``kept`` for the whole run or decoded ``into_ring``, or
    ``on_device`` (read as stored and decoded on the GPU: ``decodes`` counts the stored
    objects read), the readers' ``copy_seconds`` copying parts of decoded chunks into
    their destinations (summed over threads), and which chunks the host decoded
    (``decoded_at``: their [row, column] indices in the stored array, one entry a decode)."""
    replanned: list = field(default_factory=list)
    """How the run went on after running out of memory: one line each time it planned again
    with smaller blocks (and started the product again)."""
    started_at: float = 0.0
    """The wall-clock time (``time.time()``) of the events' zero."""
    devices: dict = field(default_factory=dict)
    """On several devices: per device (or 'cpu#1' executor), the ``groups`` and ``blocks``
    of C it computed, its ``seconds`` running them and its ``flops``."""
    resumed: int = 0
    """C blocks an interrupted run had finished, kept by ``resume=True`` (not recomputed)."""
    verified: Any = None
    """The :class:`~oocgemm.freivalds.VerifyReport` of ``multiply(verify=True)`` (None
    otherwise)."""
    emulation: dict = field(default_factory=dict)
    """With ``kernel='ozaki'``: how many block GEMMs ran emulated, per number of moduli
    ('ozaki, 22 moduli'), and how many fell back to native DGEMM, per reason ('native:
    infinities or NaN ...'). Empty otherwise."""
    emulation_seconds: dict = field(default_factory=dict)
    """With ``kernel='ozaki'`` on a GPU, and events recorded: GPU seconds of each phase of the
    emulated GEMMs, summed over them: ``convert`` (the panels' stats and residues, on a
    stream of their own beside the GEMMs), ``int8 gemm``, ``finish`` (digits, rounding,
    alpha and beta)."""
    out_name: str | None = None
    """The output's path, or how it is named ('result array', 'out (numpy array)')."""
    out_encoder: str | None = None
    """What compressed the output's chunks where the host's encoders did not ('nvCOMP 6.0.0
    zstd on the GPU'); None otherwise."""

    log: Any = field(default=None, repr=False, compare=False)
    """The run's :class:`~oocgemm.diagnostics.EventLog` (a :class:`MergedLog
    <oocgemm.runtime.multi_device.MergedLog>` on several devices), whose events
    :attr:`events` makes."""

    @functools.cached_property
    def events(self) -> list:
        """One :class:`~oocgemm.diagnostics.Event` per executed block operation, in start
        order; made when first read (:meth:`EventLog.extend
        <oocgemm.diagnostics.EventLog.extend>`: most runs' events are never read)."""
        return self.log.events() if self.log is not None else []

    @functools.cached_property
    def timeline(self) -> Timeline:
        """The overlap report of the run (:class:`~oocgemm.diagnostics.Timeline`): busy time
        per lane, compute idle (fill, drain, stalls), exposed copy time, rates per link, the
        bounding resource beside the plan's prediction. ``print(result.timeline)`` for a
        summary; ``.save('run.json')`` for Perfetto, ``.plot('run.png')`` for a Gantt chart.
        Empty when the run recorded no events (``events=False``)."""
        from .diagnostics.timeline import Timeline, plan_figures

        predicted, meta = plan_figures(self.plan)
        meta["storage"] = {key: self.bytes[key] for key in ("storage_read", "decoded")
                           if key in self.bytes}
        return Timeline.from_events(self.events, run_seconds=self.seconds, predicted=predicted,
                                    meta=meta)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """C as a numpy array (the array protocol): ``np.asarray(result)`` is ``result.out``
        itself where that is a numpy array or memmap, else read whole (a Zarr output). A
        CuPy ``out`` stays on the GPU: take ``result.out`` (as CuPy does, no silent copy)."""
        out = self.out
        if hasattr(out, "dims") and hasattr(out, "variable"):  # an xarray input's labels
            out = out.data
        if hasattr(out, "__cuda_array_interface__"):
            raise TypeError("C is a CuPy array (result.out): use result.out, or "
                            "result.out.get() for a numpy copy")
        if copy is False and not isinstance(out, np.ndarray):
            raise ValueError(f"C is a {type(out).__name__}: reading it makes a copy")
        return np.array(out, dtype=dtype, copy=True) if copy else np.asarray(out, dtype=dtype)

    @property
    def tflops(self) -> float:
        """Achieved TFLOP/s over the wall time: the flops this run did (:attr:`flops`)."""
        return self.flops / self.seconds / 1e12 if self.seconds > 0 else 0.0

    @property
    def total_flops(self) -> int:
        """Floating-point operations of the whole product (the plan's), those of the blocks
        a resumed run kept included."""
        return self.plan.flops

    def work(self) -> str:
        """'x of y GFLOP done here' for a resumed run (what it computed of the product's
        total); '' otherwise."""
        if not self.resumed:
            return ""
        return f"{self.flops / 1e9:.4g} of {self.total_flops / 1e9:.4g} GFLOP done here"

    def summary(self) -> dict:
        """The run as plain data (``--json``): the plan's fields (``Plan.summary``, the same
        schema as ``oocgemm plan --json``, its planned bytes as ``planned_bytes``), then what
        the run measured."""
        planned = self.plan.summary()
        planned["planned_bytes"] = planned.pop("bytes")
        return {
            **planned,
            "seconds": self.seconds,
            "tflops": self.tflops,
            "flops_done": self.flops,
            "bytes": dict(self.bytes),
            "out": self.out_name,
            "resumed_blocks": self.resumed,
            "replanned": list(self.replanned),
            "devices": dict(self.devices),
            "emulation": dict(self.emulation),
            "emulation_seconds": dict(self.emulation_seconds),
            "verified": None if self.verified is None else {
                "ok": self.verified.ok, "worst_ratio": self.verified.worst_ratio,
                "worst_row": self.verified.worst_row},
        }

    def __repr__(self) -> str:  # short: the whole array and every event are attributes
        p = self.plan.problem
        out = self.out_name or type(self.out).__name__
        return (f"Result(C[{p.m}x{p.n}] {p.dtype} K={p.k} on {self.plan.device}, "
                f"{format_seconds(self.seconds)}, {len(self.events)} events, out={out!r})")

    def __str__(self) -> str:
        p = self.plan.problem
        moved = ", ".join(f"{NAMES.get(k, k.replace('_', ' '))} {format_size(v)}"
                          for k, v in self.bytes.items() if v)
        return (f"C[{p.m}x{p.n}] ({p.dtype}, K={p.k}) on {self.plan.device}: "
                f"{format_seconds(self.seconds)}, {self.tflops * 1e3:.4g} GFLOP/s"
                + (f" ({self.work()})" if self.resumed else "")
                + (f"; moved {moved}" if moved else ""))

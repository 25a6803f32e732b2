"""The overlap report of a run, from its events: what each lane did, where the compute lane
waited, how much copying the computation hid, the rates each link reached, and what bounded the
run, beside the plan's prediction.

Definitions (every figure is a measure of unions of event intervals, so operations that run at
once on several threads count once):

- **wall**: from the first operation's start to the last one's end (planning, buffer
  allocation and teardown excluded; the run's own wall time is kept beside it).
- **busy** of a lane: the time it spent inside operations; its **fraction** is busy / wall.
- **compute**: GEMM and FILL operations. Its idle time splits into the **fill** (before the
  first one starts), the **drain** (after the last one ends) and the **stalls** (gaps between).
- **copies**: READ (source -> staging or working buffer), UPLOAD (H2D), FETCH (a stored object
  as stored -> staging buffer) and UPLOAD_STORED (its H2D), DOWNLOAD (D2H) and WRITE
  (-> output). **Exposed copy** time is the time some copy runs while nothing computes;
  **overlap** is the share of copy time that ran under computation.
- **links**: read (READ: into slots and stripes, out of decoded chunks, a file's pages or
  memory; FETCH: stored objects into the ring), h2d (UPLOAD, UPLOAD_STORED), d2h (DOWNLOAD),
  storage_write (WRITE), named as ``result.bytes`` names them; a link's
  busy time is the union of its operations on every lane, its rates bytes / busy and
  bytes / wall.
- **bound**: compute when it is busy at least 95% of the wall, else the resource (compute or a
  link) with the longest busy time.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..intervals import intersection, measure, union
from ..units import format_seconds, format_size
from .events import COMPUTE_KINDS, COPY_KINDS, Event
from .lanes import lane_family, lane_order

#: Compute busy at least this share of the wall: the run is compute-bound.
COMPUTE_BOUND = 0.95

#: Links between the levels, and the operation kinds that move bytes over each (a FETCH reads
#: as a READ does, an UPLOAD_STORED goes up as an UPLOAD does).
LINKS = {"read": ("read", "fetch"), "h2d": ("upload", "upload_stored"), "d2h": ("download",),
         "storage_write": ("write",)}

# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LaneStats:
    """What one lane did."""

    name: str
    """A CUDA stream ('compute', 'h2d', 'c') or a thread ('read-3', 'copy-0', 'compute')."""
    operations: int
    """Operations it ran."""
    busy: float
    """Seconds it spent inside operations."""
    fraction: float
    """``busy`` over the timeline's wall time (0 to 1)."""


@dataclass(frozen=True)
class LinkStats:
    """What one link moved: read, h2d, d2h or storage write."""

    name: str
    """'read', 'h2d', 'd2h' or 'storage_write' (as ``result.bytes`` names them)."""
    operations: int
    """Operations that used it."""
    bytes: int
    """Bytes they moved (data used in place counts 0)."""
    busy: float
    """Seconds during which at least one of them ran, on any lane."""
    rate: float
    """Bytes per second while busy (``bytes / busy``)."""
    average: float
    """Bytes per second over the timeline's wall time."""


@dataclass(frozen=True)
class Timeline:
    """The overlap report of one run; build it with :meth:`from_events` (or get it as
    ``result.timeline``). Times are seconds on the run's clock (0: the executor started).

    ``str(timeline)`` is a one-screen summary; :meth:`save` writes a Chrome trace (Perfetto,
    chrome://tracing), :meth:`load` reads one back, :meth:`plot` draws a Gantt chart.
    """

    events: tuple[Event, ...]
    """The block operations, in start order."""
    start: float
    """When the first operation started, seconds."""
    end: float
    """When the last operation ended, seconds."""
    lanes: tuple[LaneStats, ...]
    """Per lane, compute first, then the streams, the copy thread, readers and writers."""
    links: tuple[LinkStats, ...]
    """Per link that moved anything: read, h2d, d2h, storage write."""
    compute_busy: float
    """Seconds during which a GEMM or FILL ran (or a symmetric product's MIRROR or
    TRANSPOSE)."""
    fill: float
    """Seconds from the first operation to the first GEMM/FILL (the pipeline filling)."""
    drain: float
    """Seconds from the last GEMM/FILL's end to the last operation's end (draining)."""
    stalls: float
    """Seconds the compute lane waited between its first and last operation."""
    stall_count: int
    """Gaps between compute operations."""
    longest_stall: float
    """The longest of those gaps, seconds."""
    copy_busy: float
    """Seconds during which some copy ran (READ, UPLOAD, DOWNLOAD, WRITE)."""
    exposed_copy: float
    """Seconds during which some copy ran and nothing computed."""
    flops: int
    """Floating-point operations of the GEMMs."""
    bound: str
    """What bounded the run: 'compute' or a link's name (see the module's definitions)."""
    run_seconds: float | None = None
    """Wall time of the whole execution as ``multiply`` measured it (buffer set-up and
    teardown included), seconds; None when not known."""
    predicted: dict = field(default_factory=dict)
    """The plan's prediction: 'seconds' (total), 'bound', and seconds per resource
    ('compute', 'h2d', 'd2h', 'storage_read', 'storage_write', 'host_copy', 'decode',
    'device_decode', 'fill', 'drain'); empty when not known."""
    meta: dict = field(default_factory=dict)
    """The product: 'shape' [m, n, k], 'dtype', 'device', 'tile' [w, h, r], 'operations'
    (planned), and what the run took from 'storage' ({'storage_read', 'decoded'} bytes, as
    ``result.bytes``); a dask graph's runs (:func:`oocgemm.dask.timeline`) per worker
    ('workers': runs, flops, seconds, bytes read and decoded, chunks decoded) and per input
    how many workers decoded each stored chunk ('decoders': chunks, most and mean workers);
    empty when not known."""

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_events(cls, events, *, run_seconds: float | None = None,
                    predicted: dict | None = None, meta: dict | None = None) -> Timeline:
        """The report of ``events`` (:class:`~oocgemm.diagnostics.Event`, any order).

        Parameters
        ----------
        events
            The run's events (``result.events``).
        run_seconds
            The run's wall time as measured around the executor, seconds.
        predicted
            The plan's prediction (see :func:`plan_figures`).
        meta
            The product's description (see :func:`plan_figures`).
        """
        events = tuple(sorted(events, key=lambda e: (e.start, e.index)))
        start = min((e.start for e in events), default=0.0)
        end = max((e.end for e in events), default=0.0)
        wall = end - start

        lanes = _lane_stats(events, wall)
        links = _link_stats(events, wall)
        compute = union((e.start, e.end) for e in events if e.kind in COMPUTE_KINDS)
        copies = union((e.start, e.end) for e in events if e.kind in COPY_KINDS)
        compute_busy, copy_busy = measure(compute), measure(copies)
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(compute)]
        if compute:
            fill, drain = compute[0][0] - start, end - compute[-1][1]
        else:
            fill, drain = wall, 0.0

        bound = _bound(compute_busy, links, wall) if events else "none"
        return cls(events=events, start=start, end=end, lanes=tuple(lanes), links=tuple(links),
                   compute_busy=compute_busy, fill=fill, drain=drain, stalls=sum(gaps),
                   stall_count=len(gaps), longest_stall=max(gaps, default=0.0),
                   copy_busy=copy_busy, exposed_copy=copy_busy - intersection(copies, compute),
                   flops=sum(e.flops for e in events), bound=bound, run_seconds=run_seconds,
                   predicted=dict(predicted or {}), meta=dict(meta or {}))

    # -- derived figures --------------------------------------------------------------------------
    @property
    def wall(self) -> float:
        """Seconds from the first operation's start to the last one's end."""
        return self.end - self.start

    @property
    def compute_fraction(self) -> float:
        """Share of the wall time during which something computed (0 to 1)."""
        return self.compute_busy / self.wall if self.wall > 0 else 0.0

    @property
    def compute_idle(self) -> float:
        """Seconds nothing computed: fill + stalls + drain."""
        return self.wall - self.compute_busy

    @property
    def exposed_fraction(self) -> float:
        """Exposed copy time over the wall time (0 to 1)."""
        return self.exposed_copy / self.wall if self.wall > 0 else 0.0

    @property
    def overlap(self) -> float:
        """Share of the copy time that ran while something computed (1 without copies)."""
        return 1.0 - self.exposed_copy / self.copy_busy if self.copy_busy > 0 else 1.0

    @property
    def tflops(self) -> float:
        """TFLOP/s over the wall time."""
        return self.flops / self.wall / 1e12 if self.wall > 0 else 0.0

    @property
    def compute_tflops(self) -> float:
        """TFLOP/s while computing (the GEMMs' own rate)."""
        return self.flops / self.compute_busy / 1e12 if self.compute_busy > 0 else 0.0

    def __repr__(self) -> str:  # short: the events are an attribute
        return (f"Timeline({len(self.events)} events, {len(self.lanes)} lanes, wall "
                f"{format_seconds(self.wall)}, bound {self.bound!r})")

    def lane(self, name: str) -> LaneStats:
        """The figures of one lane."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(f"no lane {name!r}; lanes: {', '.join(x.name for x in self.lanes)}")

    def link(self, name: str) -> LinkStats:
        """The figures of one link: 'read', 'h2d', 'd2h', 'storage_write' (the keys of
        ``result.bytes``; 'storage write' with a space is taken too)."""
        for link in self.links:
            if link.name == name.replace(" ", "_"):
                return link
        raise KeyError(f"no link {name!r} moved anything; links: "
                       f"{', '.join(x.name for x in self.links) or 'none'}")

    def to_dict(self) -> dict:
        """The figures as plain data (for --json and logs); events excluded."""
        return {
            "wall_seconds": self.wall, "run_seconds": self.run_seconds,
            "operations": len(self.events),
            "compute": {"busy_seconds": self.compute_busy, "fraction": self.compute_fraction,
                        "fill_seconds": self.fill, "drain_seconds": self.drain,
                        "stall_seconds": self.stalls, "stalls": self.stall_count,
                        "longest_stall_seconds": self.longest_stall,
                        "tflops_over_wall": self.tflops,
                        "tflops_while_computing": self.compute_tflops},
            "copies": {"busy_seconds": self.copy_busy, "exposed_seconds": self.exposed_copy,
                       "exposed_fraction": self.exposed_fraction, "overlap": self.overlap},
            "lanes": {x.name: {"operations": x.operations, "busy_seconds": x.busy,
                               "fraction": x.fraction} for x in self.lanes},
            "links": {x.name: {"operations": x.operations, "bytes": x.bytes,
                               "busy_seconds": x.busy, "gbps_while_busy": x.rate / 1e9,
                               "gbps_over_wall": x.average / 1e9} for x in self.links},
            "flops": self.flops, "bound": self.bound, "predicted": dict(self.predicted),
            "meta": dict(self.meta),
        }

    # -- exporters --------------------------------------------------------------------------------
    def save(self, path) -> str:
        """Write the timeline as Chrome trace event JSON (open it in https://ui.perfetto.dev or
        chrome://tracing); return the path. See :mod:`oocgemm.diagnostics.trace`."""
        from .trace import write_chrome_trace

        return write_chrome_trace(self, path)

    @classmethod
    def load(cls, path) -> Timeline:
        """Read a timeline saved by :meth:`save` (the same figures, to the last bit).

        Raises
        ------
        InputError
            The file is missing, not JSON, or not a trace that oocgemm wrote.
        """
        from ..errors import InputError
        from .trace import read_chrome_trace

        try:
            timeline = cls.from_events(**read_chrome_trace(path))
        except (ValueError, TypeError, KeyError, ZeroDivisionError, AttributeError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{path}: not a timeline that oocgemm wrote, or one edited by hand "
                             f"({type(exc).__name__}: {exc})") from None
        if timeline.events and not timeline.wall > 0:
            raise InputError(f"{path}: its operations take no time at all; not a timeline that "
                             f"oocgemm wrote, or one edited by hand")
        return timeline

    def plot(self, path=None, *, title: str | None = None):
        """A Gantt chart, one row per lane, the summary in
        the title; written to ``path`` (PNG, SVG, PDF by its suffix) when given. Returns the
        matplotlib Figure. Needs matplotlib (``pip install 'oocgemm[plot]'``).

        Raises
        ------
        DependencyError
            matplotlib is not installed.
        """
        from .plot import plot_timeline

        return plot_timeline(self, path, title=title)

    # -- text -------------------------------------------------------------------------------------
    def headline(self) -> str:
        """One line: the product, its wall time and rate, compute busy and exposed copy."""
        m = self.meta
        what = ""
        if m.get("shape"):
            what = (f"C[{m['shape'][0]}x{m['shape'][1]}] {m.get('dtype', '')} (K={m['shape'][2]})"
                    f" on {m.get('device', '?')}: ")
        rate = f", {_rate(self.flops / self.wall)}" if self.flops and self.wall > 0 else ""
        return (f"{what}{format_seconds(self.wall)}{rate}; compute busy "
                f"{self.compute_fraction:.1%}, exposed copy {self.exposed_fraction:.1%}")

    def __str__(self) -> str:
        m = self.meta
        planned = m.get("operations")
        if not self.events:
            recorded = f" of {planned}" if planned else ""
            return (f"timeline: no block operations recorded (0{recorded}; "
                    f"multiply(..., events=False) records none)")
        # the schedule's operations, and the chunks the writer stored behind them
        stores = sum(1 for e in self.events if e.kind == "store")
        ran = len(self.events) - stores
        ops = (f"{ran} operations" + (f" of {planned} planned" if planned and planned != ran
                                      else "")
               + (f", {stores} chunks stored" if stores else ""))
        head = "timeline"
        if m.get("shape"):
            tile = "x".join(str(t) for t in m.get("tile", ()))
            head += (f"  C[{m['shape'][0]}x{m['shape'][1]}] {m.get('dtype', '')} "
                     f"(K={m['shape'][2]}) on {m.get('device', '?')}"
                     + (f", tile {tile}" if tile else ""))
        run = f" (the run: {format_seconds(self.run_seconds)})" if self.run_seconds else ""
        lines = [
            head,
            (f"  wall      {format_seconds(self.wall)}, first operation to last{run}; {ops}, "
             f"{len(self.lanes)} lanes"),
            (f"  compute   busy {self.compute_fraction:.1%}; idle "
             f"{format_seconds(self.compute_idle)}: fill {format_seconds(self.fill)}, stalls "
             + (f"{format_seconds(self.stalls)} in {self.stall_count} gaps (longest "
                f"{format_seconds(self.longest_stall)})" if self.stall_count else "none")
             + f", drain {format_seconds(self.drain)}"),
            (f"  copies    busy {format_seconds(self.copy_busy)}, exposed "
             f"{format_seconds(self.exposed_copy)} ({self.exposed_fraction:.1%} of the wall); "
             f"{self.overlap:.1%} of copy time overlapped compute"),
        ]
        lines += self._rate_and_links()
        stored = m.get("storage") or {}
        if stored.get("storage_read") or stored.get("decoded"):
            lines.append(f"  storage   {format_size(stored.get('storage_read', 0))} taken from "
                         f"storage, {format_size(stored.get('decoded', 0))} of chunks decoded"
                         + (" (the read link copies out of those)" if stored.get('decoded')
                            else ""))
        lines += self._graph_lines()
        lines.append(_wrap("  lanes     ", self._lane_summary()))
        shares = self.device_shares()
        if len(shares) > 1:
            most = max(x["flops"] for x in shares.values()) or 1
            mean = sum(x["flops"] for x in shares.values()) / len(shares)
            lines.append(_wrap("  devices   ", [
                f"{name} {x['flops'] / max(self.flops, 1):.0%} of the flops "
                f"(computing {self._of_wall(x['compute']):.0%} of the wall)"
                for name, x in shares.items()] + [f"balance {mean / most:.2f} (mean / most)"]))
        lines.append(f"  bound     {self._bound_text()}")
        return "\n".join(lines)

    def _graph_lines(self) -> list[str]:
        """A dask graph's runs (:func:`oocgemm.dask.timeline`): what each worker decoded, and
        how many of them decoded each stored chunk."""
        lines = []
        workers = self.meta.get("workers") or {}
        if workers:
            lines.append(_wrap("  workers   ", [
                f"{name} {x['tasks']} run{'s' if x['tasks'] != 1 else ''}, "
                f"{format_size(x['decoded'])} decoded "
                f"({x['decodes']} chunks), {format_size(x['storage_read'])} from storage"
                for name, x in workers.items()]))
        decoders = self.meta.get("decoders") or {}
        if decoders:
            lines.append(_wrap("  chunks    ", [
                f"{role}: {x['chunks']} decoded by {x['mean_workers']:.2g} workers on average, "
                f"{x['most_workers']} at most" for role, x in sorted(decoders.items())]))
        return lines

    def _rate_and_links(self) -> list[str]:
        """The report's lines of the flop rate and of each link that moved bytes."""
        lines = []
        if self.flops and self.compute_busy > 0 and self.wall > 0:
            lines.append(f"  rate      {_rate(self.flops / self.wall)} over the wall, "
                         f"{_rate(self.flops / self.compute_busy)} while computing")
        for i, link in enumerate(self.links):
            lines.append(f"  {'links' if i == 0 else '':<9} {link.name:<13} "
                         f"{format_size(link.bytes):>9}: {link.rate / 1e9:.3g} GB/s while busy "
                         f"({self._of_wall(link.busy):.0%} of the wall), "
                         f"{link.average / 1e9:.3g} GB/s overall")
        return lines

    def _of_wall(self, seconds: float) -> float:
        """``seconds`` over the wall time (0 for a timeline of instants)."""
        return seconds / self.wall if self.wall > 0 else 0.0

    def device_shares(self) -> dict[str, dict]:
        """Per device of a run on several (lanes named 'cuda:1/compute'): its flops and the
        seconds it computed; empty for a run on one device."""
        shares: dict[str, dict] = {}
        for e in self.events:
            device, _, lane = e.lane.rpartition("/")
            if not device:
                continue
            share = shares.setdefault(device, {"flops": 0, "spans": []})
            share["flops"] += e.flops
            if e.kind in COMPUTE_KINDS:
                share["spans"].append((e.start, e.end))
        return {name: {"flops": x["flops"], "compute": measure(union(x["spans"]))}
                for name, x in sorted(shares.items())}

    def _lane_summary(self) -> list[str]:
        families: dict[str, list[LaneStats]] = {}
        for lane in self.lanes:
            families.setdefault(lane_family(lane.name), []).append(lane)
        parts = []
        for family, lanes in families.items():
            if len(lanes) == 1:
                parts.append(f"{lanes[0].name} {lanes[0].fraction:.0%}")
                continue
            names = {x.name for x in lanes}
            together = measure(union((e.start, e.end) for e in self.events if e.lane in names))
            mean = sum(x.fraction for x in lanes) / len(lanes)
            parts.append(f"{family} x{len(lanes)} {mean:.0%} each "
                         f"({together / self.wall:.0%} together)")
        return parts

    def _bound_text(self) -> str:
        if self.bound == "compute" and self.compute_fraction >= COMPUTE_BOUND:
            text = f"compute (busy {self.compute_fraction:.1%} >= {COMPUTE_BOUND:.0%} of the wall)"
        else:
            busy = self.compute_busy if self.bound == "compute" else self.link(self.bound).busy
            half = "; nothing is busy half of it: waits dominate" if busy < 0.5 * self.wall else ""
            text = f"{self.bound}, the busiest ({format_seconds(busy)} of the wall{half})"
        p = self.predicted
        if p.get("bound"):
            text += (f"; predicted: {p['bound']}-bound, "
                     f"{format_seconds(p.get('seconds', 0.0))}")
        return text


def _lane_stats(events: tuple[Event, ...], wall: float) -> list[LaneStats]:
    """Per lane (in :func:`lane_order`), its operations and busy time."""
    by_lane: dict[str, list[Event]] = {}
    for e in events:
        by_lane.setdefault(e.lane, []).append(e)
    lanes = []
    for name in sorted(by_lane, key=lane_order):
        busy = measure(union((e.start, e.end) for e in by_lane[name]))
        lanes.append(LaneStats(name, len(by_lane[name]), busy,
                               busy / wall if wall > 0 else 0.0))
    return lanes


def _link_stats(events: tuple[Event, ...], wall: float) -> list[LinkStats]:
    """Per link that moved anything (:data:`LINKS`), its operations, bytes and rates."""
    links = []
    for name, kinds in LINKS.items():
        ops = [e for e in events if e.kind in kinds]
        if not ops:
            continue
        nbytes = sum(e.nbytes for e in ops)
        if not nbytes:  # data used in place: nothing crossed this link
            continue
        busy = measure(union((e.start, e.end) for e in ops))
        links.append(LinkStats(name, len(ops), nbytes, busy,
                               nbytes / busy if busy > 0 else 0.0,
                               nbytes / wall if wall > 0 else 0.0))
    return links


def _bound(compute_busy: float, links: list[LinkStats], wall: float) -> str:
    """What bounded a run that has events: 'compute' when it computed for
    :data:`COMPUTE_BOUND` of the wall time or more, else the busiest resource."""
    resources = {"compute": compute_busy, **{link.name: link.busy for link in links}}
    if wall > 0 and compute_busy >= COMPUTE_BOUND * wall:
        return "compute"
    return max(resources, key=resources.__getitem__)


def _rate(flops_per_second: float) -> str:
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:.3g} TFLOP/s"
    return f"{flops_per_second / 1e9:.3g} GFLOP/s"


def _wrap(prefix: str, parts: list[str], width: int = 100) -> str:
    lines, line = [], prefix
    for part in parts:
        text = part if line == prefix else ", " + part
        if len(line) + len(text) > width and line != prefix:
            lines.append(line + ",")
            line = " " * len(prefix) + part
        else:
            line += text
    lines.append(line)
    return "\n".join(lines)


def plan_figures(plan) -> tuple[dict, dict]:
    """(predicted, meta) of a :class:`~oocgemm.planning.Plan`, for :meth:`Timeline.from_events`."""
    pred = plan.prediction
    predicted = {"seconds": pred.total, "bound": pred.bound, "compute": pred.compute,
                 "h2d": pred.h2d, "d2h": pred.d2h, "storage_read": pred.storage_read,
                 "storage_write": pred.storage_write, "host_copy": pred.host_copy,
                 "decode": pred.decode, "device_decode": pred.device_decode,
                 "fill": pred.fill, "drain": pred.drain}
    prob = plan.problem
    meta = {"shape": [prob.m, prob.n, prob.k], "dtype": prob.dtype, "device": str(plan.device),
            "tile": list(plan.tile), "operations": len(plan.schedule.ops)}
    return predicted, meta

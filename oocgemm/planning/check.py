"""Prove a schedule's buffer discipline and data flow, without running it.

Two passes over the operation list:

1. Hazards. ``happens_before`` is the transitive closure of the declared dependencies and of
   program order on each in-order lane (:data:`~oocgemm.planning.schedule.ORDERED_LANES`: an
   executor runs a lane's operations one after the other, in schedule order), and nothing
   else: an executor may run any two operations with no path between them at once. Every read
   of a slot must come after the write that filled it (RAW), no slot may be overwritten before
   all readers of its previous content finished (WAR), and two writes of one slot are ordered
   (WAW).

   The closure is kept as vector clocks over a chain cover of the schedule: one chain per
   in-order lane, and one per pool kind and slot (the READs into a staging slot follow each
   other through the upload that empties it; the WRITEs out of one as well), with a chain of
   its own for an op that does not follow its chain's last op. Each op's clock holds, per
   chain, the latest op of that chain that happens before it: ``x`` happens before ``y`` when
   ``clock[y][chain[x]] >= x``. A valid schedule needs a few dozen chains whatever its length,
   so this pass is linear in the operations; it forgets reads and writes as later writes
   (checked to come after them) cover them, and reads that a later read of the same range
   (which they happen before) stands for.
2. Data flow, replayed symbolically: every slot holds a tag (which block of which operand, and
   for a C slot which K panels it has accumulated). Each GEMM must find A(i, q) and B(q, j) in
   its slots; every K panel is accumulated into its C block exactly once; every C block is
   written exactly once, complete; the blocks tile C exactly and the panels tile K.
"""

from __future__ import annotations

from collections.abc import Callable

from ..intervals import union
from .grid import chunk_region, chunks_of
from .schedule import ORDERED_LANES, WHOLE, Op, OpKind, Schedule, op_span, ordered_lane


class ScheduleError(AssertionError):
    """A schedule breaks a rule; the message names the operation."""


def check_schedule(schedule: Schedule, plan) -> None:
    """Raise :class:`ScheduleError` when ``schedule`` is not a correct replay of ``plan``."""
    _check_hazards(schedule)
    _check_dataflow(schedule, plan)


def _span(op, slot: str, schedule: Schedule, writing: bool) -> tuple[int, int]:
    """The elements of ``slot`` that ``op`` touches (:func:`op_span`), "the whole slot" made
    its size; a range past the slot's end is an error."""
    lo, hi = op_span(op, slot, writing)
    size = schedule.slots[slot]
    if hi == WHOLE:
        return lo, size
    if hi > size:
        raise ScheduleError(f"{op}: {'writes' if writing else 'reads'} {slot}[{lo}:{hi}] "
                            f"past its {size} elements")
    return lo, hi


def _check_hazards(schedule: Schedule) -> None:
    chains = _Chains()
    hazards = _Hazards(schedule)
    for position, op in enumerate(schedule.ops):
        _check_position(op, position)
        before = chains.add(op)
        for slot in op.src:
            hazards.read(op, slot, before)
        if op.dst is not None:
            hazards.write(op, op.dst, before)


def _check_position(op: Op, position: int) -> None:
    """``op`` sits at its own index and depends on earlier operations only."""
    if op.index != position:
        raise ScheduleError(f"op #{op.index} is at position {position}")
    for d in op.deps:
        if not 0 <= d < op.index:
            raise ScheduleError(f"{op}: depends on #{d}, which is not an earlier operation")


class _Hazards:
    """The reads and writes of each slot that later operations must still be ordered with
    (RAW, WAR, WAW; see the module's docstring)."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.writes: dict[str, list[tuple[int, int, int]]] = {}  # slot -> live (op, lo, hi)
        self.reads: dict[str, list[tuple[int, int, int]]] = {}   # slot -> (op, lo, hi) to order
        # slot -> a read whose RAW check passed, no write to the slot since
        self.verified: dict[str, tuple[int, int, int]] = {}

    def read(self, op: Op, slot: str, before: Callable[[int], bool]) -> None:
        """``op`` reads ``slot``: after its writers (RAW); later writes must wait for it."""
        if slot not in self.schedule.slots:
            raise ScheduleError(f"{op}: reads unknown slot {slot}")
        lo, hi = _span(op, slot, self.schedule, writing=False)
        seen = self.verified.get(slot)
        if not (seen is not None and seen[1] == lo and seen[2] == hi and before(seen[0])):
            self._check_raw(op, slot, lo, hi, before)
            self.verified[slot] = (op.index, lo, hi)
        # An earlier read inside [lo, hi) that happens before this one needs no check of
        # its own: whatever overwrites it must come after this read, hence after it.
        kept_reads = [r for r in self.reads.get(slot, ())
                      if not (lo <= r[1] and r[2] <= hi and before(r[0]))]
        kept_reads.append((op.index, lo, hi))
        self.reads[slot] = kept_reads

    def _check_raw(self, op: Op, slot: str, lo: int, hi: int,
                   before: Callable[[int], bool]) -> None:
        live = [w for w in self.writes.get(slot, ()) if w[1] < hi and lo < w[2]]
        if not live:
            raise ScheduleError(f"{op}: reads slot {slot} that nothing wrote")
        for writer, _, _ in live:
            if not before(writer):
                raise ScheduleError(
                    f"{op}: reads {slot} without waiting for its writer #{writer} (RAW)")

    def write(self, op: Op, slot: str, before: Callable[[int], bool]) -> None:
        """``op`` writes ``slot``: after the readers (WAR) and writers (WAW) of what it
        overwrites, which from now on are ordered through it."""
        schedule = self.schedule
        if slot not in schedule.slots:
            raise ScheduleError(f"{op}: writes unknown slot {slot}")
        lo, hi = _span(op, slot, schedule, writing=True)
        self.verified.pop(slot, None)
        for reader, rlo, rhi in self.reads.get(slot, ()):
            if rlo < hi and lo < rhi and reader != op.index and not before(reader):
                raise ScheduleError(
                    f"{op}: overwrites {slot} before its reader #{reader} finished (WAR)")
        # What this write covers is ordered through it from now on (WAR and WAW checked).
        self.reads[slot] = _outside(self.reads.get(slot, ()), lo, hi)
        for writer, wlo, whi in self.writes.get(slot, ()):
            if wlo < hi and lo < whi and not before(writer):
                raise ScheduleError(f"{op}: writes {slot} concurrently with #{writer} (WAW)")
        kept = _outside(self.writes.get(slot, ()), lo, hi)
        kept.append((op.index, lo, hi))
        self.writes[slot] = kept


def _outside(entries, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The parts of (op, a, b) ranges outside [lo, hi)."""
    kept = []
    for index, a, b in entries:
        if b <= lo or hi <= a:
            kept.append((index, a, b))
            continue
        if a < lo:
            kept.append((index, a, lo))
        if hi < b:
            kept.append((index, hi, b))
    return kept


class _Chains:
    """Happens-before as vector clocks over a chain cover (see the module's docstring)."""

    def __init__(self) -> None:
        self.clocks: list[list[int]] = []  # per op: chain -> latest op before it (or itself)
        self.chain_of: list[int] = []
        self.last: list[int] = [-1] * len(ORDERED_LANES)  # chain -> its last op
        self.lane_chain = {lane: c for c, lane in enumerate(ORDERED_LANES)}
        self.pool_chain: dict[tuple, int] = {}  # (kind, slot) -> chain

    def add(self, op: Op) -> Callable[[int], bool]:
        """Add ``op`` (its deps are earlier ops); return ``before(x)``: does op #x happen
        before ``op`` (or is it ``op``)?"""
        lane = ordered_lane(op)
        sources = list(op.deps)
        chain = self.lane_chain.get(lane) if lane is not None else None
        if chain is not None and self.last[chain] >= 0:
            sources.append(self.last[chain])  # program order on the lane
        clock: list[int] = []
        chain_of = self.chain_of
        for d in sorted(sources, reverse=True):
            c = chain_of[d]
            if c < len(clock) and clock[c] >= d:
                continue  # a later op of d's chain is in already, and all that came before d
            other = self.clocks[d]
            if not clock:
                clock = list(other)
                continue
            if len(other) > len(clock):
                clock.extend([-1] * (len(other) - len(clock)))
            for c, x in enumerate(other):
                if x > clock[c]:
                    clock[c] = x
        if chain is None:
            key = (op.kind, op.dst if op.dst is not None else (op.src[:1] or ("",))[0])
            chain = self.pool_chain.get(key)
            if chain is None or not (chain < len(clock) and clock[chain] == self.last[chain]):
                chain = self.pool_chain[key] = len(self.last)  # a chain of its own
                self.last.append(-1)
        if chain >= len(clock):
            clock.extend([-1] * (chain + 1 - len(clock)))
        clock[chain] = op.index
        self.last[chain] = op.index
        self.clocks.append(clock)
        chain_of.append(chain)

        def before(x: int) -> bool:
            c = chain_of[x]
            return c < len(clock) and clock[c] >= x
        return before


def _check_dataflow(schedule: Schedule, plan) -> None:
    prob = plan.problem
    _check_tiling("rows", plan.row_splits, prob.m)
    _check_tiling("columns", plan.col_splits, prob.n)
    if prob.computes_product:
        _check_tiling("K panels", plan.k_splits, prob.k)
    flow = _Dataflow(schedule, plan)
    for op in schedule.ops:
        flow.step(op)
    flow.check_every_block_written()
    if prob.computes_product:
        flow.check_every_panel_accumulated()


class _Dataflow:
    """The schedule replayed on tags: what each slot holds (see the module's docstring)."""

    def __init__(self, schedule: Schedule, plan) -> None:
        self.schedule, self.plan, self.prob = schedule, plan, plan.problem
        self.rows, self.cols, self.ks = plan.row_splits, plan.col_splits, plan.k_splits
        # slot -> (operand, key, state, covered ranges); a host stage holds one stripe
        self.content: dict[str, tuple] = {}
        self.cstate: dict[str, tuple] = {}  # C slot -> (block key, _Ranges of "input" / panel sets)
        self.want_panels = (frozenset(range(plan.grid[2])) if self.prob.computes_product
                            else frozenset())
        self.symmetric = plan.symmetric
        # A symmetric plan's diagonal blocks are final once mirrored; C is read as blocks are
        # written, never into a C slot.
        self.mirrored = ("mirrored", self.want_panels)
        self.reads_c_first = self.prob.reads_c and not self.symmetric
        self.written: dict[tuple[int, int], list] = {}
        self.accumulated: dict[tuple[int, int, int], list] = {}

    def want(self, key):
        """The state a finished C block is in."""
        return self.mirrored if self.symmetric and key[0] == key[1] else self.want_panels

    def region_of(self, operand, key):
        rows, cols, ks = self.rows, self.cols, self.ks
        if operand == "A":
            i, q = key
            want = ((rows[i], rows[i + 1]), (ks[q], ks[q + 1]))
            return want[::-1] if self.prob.trans_a else want
        if operand == "B":
            q, j = key
            want = ((ks[q], ks[q + 1]), (cols[j], cols[j + 1]))
            return want[::-1] if self.prob.trans_b else want
        i, j = key
        return ((rows[i], rows[i + 1]), (cols[j], cols[j + 1]))

    def expect_stripe(self, op, operand, key):
        """A stripe (staged) or the whole region: whole rows of it, inside it."""
        (r0, r1), (c0, c1) = self.region_of(operand, key)
        (s0, s1), (d0, d1) = op.region
        if (d0, d1) != (c0, c1) or not r0 <= s0 < s1 <= r1:
            raise ScheduleError(f"{op}: region {op.region} is not whole rows of {operand}{key} "
                                f"{((r0, r1), (c0, c1))}")
        return (s0 - r0) * (c1 - c0), (s1 - r0) * (c1 - c0), (r1 - r0) * (c1 - c0)

    def elements(self, key) -> int:
        """Elements of C's block ``key``."""
        (r0, r1), (c0, c1) = self.region_of("C", key)
        return (r1 - r0) * (c1 - c0)

    def step(self, op: Op) -> None:
        if op.kind is OpKind.READ:
            self.read(op)
        elif op.kind is OpKind.UPLOAD:
            self.upload(op)
        elif op.kind is OpKind.FETCH:
            self.fetch(op)
        elif op.kind is OpKind.UPLOAD_STORED:
            self.upload_stored(op)
        elif op.kind in (OpKind.GEMM, OpKind.FILL):
            self.compute(op)
        elif op.kind is OpKind.MIRROR:
            self.mirror(op)
        elif op.kind is OpKind.TRANSPOSE:
            self.transpose(op)
        elif op.kind is OpKind.DOWNLOAD:
            self.download(op)
        elif op.kind is OpKind.WRITE:
            self.write(op)
        elif op.kind is OpKind.DECODE:
            self.decode(op)

    # -- the operations, one method each ---------------------------------------------------
    def expect_object(self, op: Op) -> None:
        """A stored object of a panel decoded on the device: one object of the operand's
        grid (clipped at the array's edges), inside the panel."""
        x = self.plan.problem_operand(op.operand)
        if x.chunks is None:
            raise ScheduleError(f"{op}: objects of {op.operand}, which is not chunked")
        (r0, r1), (c0, c1) = self.region_of(op.operand, op.key)
        (s0, s1), (d0, d1) = op.region
        index = (s0 // x.chunks[0], d0 // x.chunks[1])
        if (chunk_region(index, x.chunks, x.shape) != op.region
                or not (r0 <= s0 < s1 <= r1 and c0 <= d0 < d1 <= c1)):
            raise ScheduleError(f"{op}: region {op.region} is not a stored object of "
                                f"{op.operand}{op.key} {((r0, r1), (c0, c1))}")

    def expect_decoded_on_device(self, op: Op, yes: bool) -> None:
        """``op`` moves an operand that the plan decodes on the device (``yes``: a FETCH, an
        UPLOAD_STORED, a DECODE), or one it does not (a READ, an UPLOAD)."""
        if (op.operand in self.plan.io.gpu_decode) != yes:
            raise ScheduleError(f"{op}: {op.kind.value} of {op.operand}, which the plan "
                                f"{'does not decode' if yes else 'decodes'} on the device")

    def fetch(self, op: Op) -> None:
        """A stored object, as stored, into a ring buffer."""
        self.expect_decoded_on_device(op, True)
        self.expect_object(op)
        self.content[_dst(op)] = (op.operand, op.key, "object", op.region)

    def read(self, op: Op) -> None:
        self.expect_decoded_on_device(op, False)
        prob = self.prob
        if op.operand in ("A", "B") and not prob.computes_product:
            raise ScheduleError(f"{op}: reads {op.operand} although no product is computed")
        if op.operand == "C" and not self.reads_c_first:
            raise ScheduleError(f"{op}: reads C although " + (
                "a symmetric product meets C as it writes" if prob.reads_c else "beta == 0"))
        lo, hi, total = self.expect_stripe(op, op.operand, op.key)
        dst = _dst(op)  # (that it fits the slot is checked with the hazards)
        self.content[dst] = (op.operand, op.key, "input", frozenset({(lo, hi)}))
        if op.operand == "C" and not dst.startswith("s"):
            self.cstate[dst] = (op.key, _Ranges())
            self.cstate[dst][1].set(lo, hi, "input")

    def upload(self, op: Op) -> None:
        self.expect_decoded_on_device(op, False)
        tag = self.content.get(op.src[0])
        lo, hi, total = self.expect_stripe(op, op.operand, op.key)
        if tag is None or tag[:2] != (op.operand, op.key) or tag[3] != frozenset({(lo, hi)}):
            raise ScheduleError(f"{op}: uploads {tag}, expected stripe {lo}:{hi} of "
                                f"{op.operand}{op.key}")
        if op.offset != lo:
            raise ScheduleError(f"{op}: stripe {lo}:{hi} uploaded at offset {op.offset}")
        dst = _dst(op)
        previous = self.content.get(dst)
        covered = set()
        if previous is not None and previous[:3] == (op.operand, op.key, "input"):
            covered = set(previous[3])
        covered.add((lo, hi))
        self.content[dst] = (op.operand, op.key, "input", _merge(covered))
        if op.operand == "C":
            if self.cstate.get(dst, (None,))[0] != op.key:
                self.cstate[dst] = (op.key, _Ranges())
            self.cstate[dst][1].set(lo, hi, "input")

    def upload_stored(self, op: Op) -> None:
        """A fetched object into its cell of a Z slot: the cell of its place in the panel's
        objects, row by row."""
        self.expect_decoded_on_device(op, True)
        self.expect_object(op)
        tag = self.content.get(op.src[0])
        if tag != (op.operand, op.key, "object", op.region):
            raise ScheduleError(f"{op}: uploads {tag}, expected the object {op.region} of "
                                f"{op.operand}{op.key}")
        x = self.plan.problem_operand(op.operand)
        assert x.chunks is not None
        (r0, _), (c0, c1) = self.region_of(op.operand, op.key)
        (ch_r, ch_c) = x.chunks
        # its place among the panel's objects, row by row (the panel starts on their edges)
        across = -(-c1 // ch_c) - c0 // ch_c
        place = ((op.region[0][0] - r0) // ch_r * across + (op.region[1][0] - c0) // ch_c)
        if op.offset != place * self.plan.object_cell(op.operand) // self.prob.itemsize:
            raise ScheduleError(f"{op}: object {place} of {op.operand}{op.key} uploaded at "
                                f"offset {op.offset}, not its cell's")
        z = _dst(op)
        previous = self.content.get(z)
        objects = set(previous[3]) if previous is not None and previous[:3] == (
            op.operand, op.key, "objects") else set()
        self.content[z] = (op.operand, op.key, "objects", frozenset(objects | {op.region}))

    def decode(self, op: Op) -> None:
        """A panel from every stored object it covers, each in its cell of the Z slot."""
        self.expect_decoded_on_device(op, True)
        x = self.plan.problem_operand(op.operand)
        assert x.chunks is not None
        region = self.region_of(op.operand, op.key)
        want = frozenset(chunk_region(index, x.chunks, x.shape)
                         for index in chunks_of(region, x.chunks))
        tag = self.content.get(op.src[0])
        if op.region != region or tag != (op.operand, op.key, "objects", want):
            raise ScheduleError(f"{op}: decodes {tag}, expected every object of "
                                f"{op.operand}{op.key} {region}")
        (r0, r1), (c0, c1) = region
        self.content[_dst(op)] = (op.operand, op.key, "input",
                                  frozenset({(0, (r1 - r0) * (c1 - c0))}))

    def compute(self, op: Op) -> None:
        """A GEMM or FILL: rows of a C block, started or accumulated into."""
        i, j = op.key
        c_slot = _dst(op)
        lo, hi, total = self.expect_stripe(op, "C", op.key)
        if op.offset != lo:
            raise ScheduleError(f"{op}: rows {lo}:{hi} of C{op.key} at offset {op.offset}")
        ranges = self.cstate.get(c_slot)
        if ranges is None or ranges[0] != op.key:
            ranges = self.cstate[c_slot] = (op.key, _Ranges())
        pieces = ranges[1].get(lo, hi)
        if len(set(pieces)) != 1:
            raise ScheduleError(f"{op}: rows {lo}:{hi} of C{op.key} are in mixed states "
                                f"{pieces}")
        previous = pieces[0]
        # A GEMM accumulates where the slot holds a partial sum of this block; elsewhere it
        # is the first touch (with beta == 1 the first GEMM has op.beta == 1 too).
        starts = op.kind is OpKind.FILL or not isinstance(previous, frozenset)
        panels = self.gemm_panels(op, lo, hi) if op.kind is OpKind.GEMM else self.fill_panels(op)
        if starts:
            self.check_start(op, c_slot, lo, hi, previous)
            ranges[1].set(lo, hi, panels)
        else:
            if op.beta != 1.0 or c_slot not in op.src:
                raise ScheduleError(f"{op}: accumulates into C{op.key} with beta={op.beta} "
                                    f"and sources {op.src}, expected beta=1 reading {c_slot}")
            ranges[1].set(lo, hi, previous | panels)

    def gemm_panels(self, op: Op, lo: int, hi: int) -> frozenset:
        """The K panel a GEMM adds, once its slots hold A(i, q) and B(q, j) whole."""
        (i, j), q = op.key, op.q
        a_tag, b_tag = self.content.get(op.src[0]), self.content.get(op.src[1])
        if op.upper != (self.symmetric and i == j):
            raise ScheduleError(f"{op}: upper={op.upper} on C{op.key} of a "
                                f"{'symmetric' if self.symmetric else 'general'} product")
        if self.prob.shared:  # one matrix: a slot holds a region, whichever role read it
            a_tag, b_tag = _as_role(a_tag, "A", (i, q), self.region_of), _as_role(
                b_tag, "B", (q, j), self.region_of)
        if not _whole(a_tag, "A", (i, q), self.region_of):
            raise ScheduleError(f"{op}: A slot {op.src[0]} holds {a_tag}, expected all of "
                                f"A{(i, q)}")
        if not _whole(b_tag, "B", (q, j), self.region_of):
            raise ScheduleError(f"{op}: B slot {op.src[1]} holds {b_tag}, expected all of "
                                f"B{(q, j)}")
        if op.alpha != self.prob.alpha:
            raise ScheduleError(f"{op}: alpha {op.alpha}, expected {self.prob.alpha}")
        self.accumulated.setdefault((i, j, q), []).append((lo, hi))
        return frozenset({q})

    def fill_panels(self, op: Op) -> frozenset:
        """None: a FILL adds no panel, and is only for a product that computes none."""
        if self.prob.computes_product:
            raise ScheduleError(f"{op}: FILL although a product is computed")
        return frozenset()

    def check_start(self, op: Op, c_slot: str, lo: int, hi: int, previous) -> None:
        """The first touch of these rows: beta * C (as read) or nothing (beta == 0)."""
        want_beta = self.prob.beta if self.reads_c_first else 0.0
        if op.beta != want_beta:
            raise ScheduleError(f"{op}: starts C{op.key} with beta={op.beta}, expected "
                                f"{want_beta}")
        if self.reads_c_first and previous != "input":
            raise ScheduleError(f"{op}: scales {previous}, expected rows {lo}:{hi} of "
                                f"C{op.key} as read")
        if (c_slot in op.src) != (op.beta != 0):
            raise ScheduleError(f"{op}: reads C exactly when beta != 0")

    def mirror(self, op: Op) -> None:
        lo, hi, total = self.expect_stripe(op, "C", op.key)
        entry = self.cstate.get(_dst(op))
        if not (self.symmetric and op.key[0] == op.key[1]) or op.src != (op.dst,):
            raise ScheduleError(f"{op}: mirrors C{op.key}, not a diagonal block of a "
                                f"symmetric product in its own slot")
        if op.offset != lo:
            raise ScheduleError(f"{op}: rows {lo}:{hi} of C{op.key} at offset {op.offset}")
        # Its rows take the transposes of every row above them: all must be final.
        if entry is None or entry[0] != op.key or any(
                st not in (self.want_panels, self.mirrored) for st in entry[1].get(0, hi)):
            raise ScheduleError(f"{op}: mirrors rows {lo}:{hi} of C{op.key} before every "
                                f"panel {sorted(self.want_panels)} is in rows 0:{hi}")
        entry[1].set(lo, hi, self.mirrored)

    def transpose(self, op: Op) -> None:
        across = op.key[::-1]
        if (not self.symmetric or op.key[0] == op.key[1]
                or op.region != self.region_of("C", op.key)):
            raise ScheduleError(f"{op}: transposes into C{op.key}, not a block across the "
                                f"diagonal of a symmetric product")
        elements = self.elements(across)
        if _finished(self.cstate.get(op.src[0]), across, 0, elements,
                     self.want_panels) is None:
            raise ScheduleError(f"{op}: transposes C{across} before every panel "
                                f"{sorted(self.want_panels)} is in it")
        self.cstate[_dst(op)] = (op.key, _Ranges())
        self.cstate[_dst(op)][1].set(0, elements, self.want_panels)

    def download(self, op: Op) -> None:
        lo, hi, total = self.expect_stripe(op, "C", op.key)
        if op.offset != lo:
            raise ScheduleError(f"{op}: stripe {lo}:{hi} downloaded from offset {op.offset}")
        state = _finished(self.cstate.get(op.src[0]), op.key, lo, hi, self.want(op.key))
        if state is None:
            raise ScheduleError(f"{op}: downloads rows {lo}:{hi} of C{op.key} before every "
                                f"panel {sorted(self.want_panels)} is in them")
        self.content[_dst(op)] = ("C", op.key, self.want(op.key), frozenset({(lo, hi)}))

    def write(self, op: Op) -> None:
        lo, hi, total = self.expect_stripe(op, "C", op.key)
        want_beta = self.prob.beta if (self.symmetric and self.prob.reads_c) else 0.0
        if op.beta != want_beta:
            raise ScheduleError(f"{op}: adds {op.beta} times C as it writes, expected "
                                f"{want_beta}")
        if op.src[0] in self.cstate:  # unstaged: straight from the C slot
            if _finished(self.cstate[op.src[0]], op.key, lo, hi, self.want(op.key)) is None:
                raise ScheduleError(f"{op}: writes C{op.key} before every panel "
                                    f"{sorted(self.want_panels)} is in it")
        else:
            tag = self.content.get(op.src[0])
            if tag is None or tag[:2] != ("C", op.key) or tag[2] != self.want(op.key):
                raise ScheduleError(f"{op}: writes {tag}, expected C{op.key} with panels "
                                    f"{sorted(self.want_panels)}")
            if tag[3] != frozenset({(lo, hi)}):
                raise ScheduleError(f"{op}: writes stripe {lo}:{hi} from a buffer holding "
                                    f"{tag[3]}")
        self.written.setdefault(op.key, []).append((lo, hi))

    # -- after the last operation ----------------------------------------------------------
    def expected_blocks(self) -> set[tuple[int, int]]:
        """Every block of the plan: its picked blocks (one device's group), or all but those
        an interrupted run wrote (resume)."""
        p, q_blocks, _ = self.plan.grid
        return set(self.plan.work.blocks) or (
            {(i, j) for i in range(p) for j in range(q_blocks) if i <= j or not self.symmetric}
            - set(self.plan.work.done))

    def check_every_block_written(self) -> None:
        """Each expected block of C written exactly once, whole (and no other)."""
        written = self.written
        for key, stripes in written.items():
            if not _tiles(stripes, self.elements(key)):
                raise ScheduleError(f"C{key}: stripes {sorted(stripes)} do not cover its "
                                    f"elements exactly once")
        expected_blocks = self.expected_blocks()
        expected_written = expected_blocks | (
            {(j, i) for i, j in expected_blocks} if self.symmetric else set())
        if set(written) != expected_written:
            missing, extra = expected_written - set(written), set(written) - expected_written
            raise ScheduleError(f"C blocks never written: {sorted(missing)[:5]}" if missing else
                                f"C blocks written that the plan leaves out: {sorted(extra)[:5]}")

    def check_every_panel_accumulated(self) -> None:
        """Each K panel accumulated into each expected block exactly once, over all of it."""
        for (i, j, q), parts in self.accumulated.items():
            if not _tiles(parts, self.elements((i, j))):
                raise ScheduleError(f"panel {(i, j, q)} accumulated over {sorted(parts)}, not "
                                    f"exactly once over the block")
        expected = len(self.expected_blocks()) * self.plan.grid[2]
        if len(self.accumulated) != expected:
            raise ScheduleError(f"{len(self.accumulated)} (i, j, q) products, expected "
                                f"{expected}")


def _dst(op: Op) -> str:
    """The slot ``op`` writes: every kind but WRITE (to storage) writes one."""
    if op.dst is None:
        raise ScheduleError(f"{op}: writes no slot")
    return op.dst


def _check_tiling(what: str, splits: tuple[int, ...], extent: int) -> None:
    tiles = splits[0] == 0 and splits[-1] == extent and all(
        b > a for a, b in zip(splits, splits[1:]))
    if not tiles and not (extent == 0 and splits == (0,)):
        raise ScheduleError(f"{what} {splits} do not tile [0, {extent})")


def _merge(ranges) -> frozenset:
    """Union of [lo, hi) ranges, merged where they touch."""
    return frozenset(union(ranges))


def _as_role(tag, operand: str, key, region_of):
    """A slot's tag as ``operand[key]`` where it holds that region of the one matrix both
    roles read (a product whose A and B are one stored matrix), else as it is."""
    if tag is None or tag[:2] == (operand, key) or tag[0] not in ("A", "B"):
        return tag
    if region_of(tag[0], tag[1]) == region_of(operand, key):
        return (operand, key) + tuple(tag[2:])
    return tag


def _whole(tag, operand: str, key, region_of) -> bool:
    """True when a slot's tag holds all of operand[key] as read from storage."""
    if tag is None or tag[:3] != (operand, key, "input"):
        return False
    (r0, r1), (c0, c1) = region_of(operand, key)
    return tag[3] == frozenset({(0, (r1 - r0) * (c1 - c0))})


def _tiles(parts, total: int) -> bool:
    """True when the [lo, hi) ranges cover [0, total) exactly once."""
    covered = sorted(parts)
    return (bool(covered) and covered[0][0] == 0 and covered[-1][1] == total
            and all(a[1] == b[0] for a, b in zip(covered, covered[1:])))


class _Ranges:
    """Disjoint [lo, hi) ranges of a slot, each with a state."""

    def __init__(self) -> None:
        self.parts: list[list] = []  # [lo, hi, state], sorted

    def get(self, lo: int, hi: int) -> list:
        """The states over [lo, hi), None for what no range covers."""
        states: list = []
        at = lo
        for a, b, state in self.parts:
            if b <= lo or a >= hi:
                continue
            if a > at:
                states.append(None)
            states.append(state)
            at = b
        if at < hi:
            states.append(None)
        return states

    def set(self, lo: int, hi: int, state) -> None:
        kept = []
        for a, b, old in self.parts:
            if b <= lo or a >= hi:
                kept.append([a, b, old])
                continue
            if a < lo:
                kept.append([a, lo, old])
            if b > hi:
                kept.append([hi, b, old])
        kept.append([lo, hi, state])
        self.parts = sorted(kept)


def _finished(entry, key, lo: int, hi: int, want) -> object:
    """The state of rows [lo, hi) of C[key] in a C slot when all of them hold every panel."""
    if entry is None or entry[0] != key:
        return None
    states = entry[1].get(lo, hi)
    return want if states and all(st == want for st in states) else None

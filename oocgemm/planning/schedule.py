"""The schedule: a plan expanded into the ordered block operations that executors replay.

Every operation names the buffer slots it reads and writes and the earlier operations it must
wait for. Slots are A0..A{n-1}, B.., C.. on the device side (GPU memory, or the CPU's working
buffers) and sR.., sO.. for host staging. The list is in program order (every dependency
points backwards). Device operations run on *in-order lanes* (:func:`ordered_lane`): an
executor runs each such lane's operations one after the other in schedule order, so that a
dependency on one of them stands for all earlier ones of its lane, and an operation needs no
dependency on its own lane at all. Each operation therefore names at most one dependency per
other in-order lane, plus the few pool operations (READ, FETCH, WRITE) it waits for; the checker
(:mod:`oocgemm.planning.check`) proves the buffer discipline under exactly that rule.

Staged plans (CUDA) move every panel and C block in row stripes through a ring of small host
buffers (sR0.. for what goes up, sO0.. for C coming down), so that pinned memory stays bounded
whatever the tile, and many reader threads can fill the ring in parallel.

The order: keep C_{ij} resident, stream the K panels of A and
B through ping-pong slots, store C_{ij}, move on. C blocks run in serpentine order (rows left to
right, then right to left) and K panels alternate direction, so consecutive blocks share a
panel; a panel already in a slot is never loaded again.

The in-core shape (:attr:`Plan.in_core <oocgemm.planning.plan.Plan.in_core>`: A, B and C fit
on the device at once, one slot each): B goes up whole, then A in row stripes cut where C's
stripes are; the GEMM runs C stripe by C stripe, each waiting only for the A stripes of its
own rows (the whole of A when A is stored transposed: its rows are not contiguous), and each
C stripe goes down and out as soon as its GEMM is done, while the next computes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

from .grid import chunk_region, chunks_of


class OpKind(str, enum.Enum):
    READ = "read"          # storage -> slot (host staging, or the working slot when unstaged)
    UPLOAD = "upload"      # host staging slot -> device slot
    FILL = "fill"          # C slot = beta * C slot (or zero): no product to compute
    GEMM = "gemm"          # C slot = alpha * A slot @ B slot + beta * C slot
    DOWNLOAD = "download"  # device C slot -> host staging slot
    WRITE = "write"        # slot -> storage
    MIRROR = "mirror"      # C slot rows: below the diagonal := the transpose of above it
    TRANSPOSE = "transpose"  # T slot := C slot transposed (the block across the diagonal)
    FETCH = "fetch"        # storage -> host staging slot: a stored object as stored (the device
                           # decodes it)
    UPLOAD_STORED = "upload_stored"  # host staging slot -> a cell of a Z slot: a fetched object
    DECODE = "decode"      # panel slot := the stored objects in a Z slot, decoded in place

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Op:
    """One block operation."""

    index: int
    """Position in the schedule."""
    kind: OpKind
    operand: str
    """'A', 'B' or 'C': whose data this operation moves or produces."""
    key: tuple[int, int]
    """Block key: A (i, q), B (q, j), C (i, j); i, j, q count blocks along M, N, K."""
    src: tuple[str, ...]
    """Slots read (empty for a storage read)."""
    dst: str | None
    """Slot written (None for a storage write)."""
    deps: tuple[int, ...]
    """Indices of the earlier operations this one waits for."""
    region: tuple[tuple[int, int], tuple[int, int]]
    """Rows and columns of the region, in the operand's stored layout (a transposed operand's
    panel is read as stored and used transposed)."""
    q: int = -1
    """K panel of a GEMM; -1 otherwise."""
    offset: int = 0
    """Element offset of this stripe in the device slot (UPLOAD: in ``dst``; UPLOAD_STORED: of
    its object's cell in ``dst``; DOWNLOAD: in ``src``). Staged plans move panels and C
    blocks in row stripes through a ring of small pinned buffers; a stripe's rows are
    contiguous in both buffers."""
    alpha: float | complex = 1.0
    """GEMM/FILL scale of the product."""
    beta: float | complex = 0.0
    """GEMM/FILL scale of the C slot's previous content (0: not read)."""
    nbytes: int = 0
    """Bytes moved (READ/UPLOAD/DOWNLOAD/WRITE); FETCH and UPLOAD_STORED: the bytes of the
    object's region, decoded (what it holds as stored is known once it is fetched)."""
    flops: int = 0
    """Floating-point operations (GEMM)."""
    upper: bool = False
    """GEMM on a diagonal block of a symmetric product: it computes the elements of its row
    stripe on and above the block's diagonal only (an executor may also compute the part of
    the stripe's own square below the diagonal; the block's MIRROR overwrites it)."""
    a_span: tuple[int, int] | None = None
    """GEMM: the element range ``[lo, hi)`` of its A slot that it reads, where that is its
    own rows only (the in-core shape, A not stored transposed); None: the whole panel."""

    @property
    def lane(self) -> str:
        """The stream or thread pool it runs on: its in-order lane (:func:`ordered_lane`), or
        'read' / 'write' (pools: a FETCH runs on the readers)."""
        return _lane(self.kind, self.operand) or POOLS.get(self.kind, self.kind.value)

    @property
    def elements(self) -> int:
        (r0, r1), (c0, c1) = self.region
        return (r1 - r0) * (c1 - c0)

    @property
    def shape(self) -> tuple[int, int]:
        """Stored shape of the region."""
        (r0, r1), (c0, c1) = self.region
        return (r1 - r0, c1 - c0)

    def __str__(self) -> str:
        where = ",".join(self.src) or "storage"
        to = self.dst or "storage"
        extra = f" q={self.q}" if self.kind is OpKind.GEMM else ""
        return (f"#{self.index:<5} {self.kind.value:<8} {self.operand}{self.key}{extra} "
                f"{where}->{to} deps={list(self.deps)}")


def quick_constructor(cls: type) -> Callable:
    """A constructor of the frozen slots dataclass ``cls``, taking what its ``__init__`` takes,
    five times faster: an instance of a mutable twin of the same slots, set by plain stores,
    then made a ``cls`` (its class assigned: the layouts are the same). A frozen dataclass's
    own ``__init__`` sets each field through ``object.__setattr__``: 1.6-1.9 us for an
    :class:`Op`'s 16 fields on the 2-core VM, 0.35 us this way; a schedule of small blocks
    makes a hundred thousand of them, and its run as many events."""
    fields = [(f.name, f.type, dataclasses.field(default=f.default))
              if f.default is not dataclasses.MISSING else (f.name, f.type)
              for f in dataclasses.fields(cls)]
    twin = dataclasses.make_dataclass(f"{cls.__name__}Draft", fields, slots=True)

    def make(*args, **kwargs):
        made = twin(*args, **kwargs)
        made.__class__ = cls
        return made

    return make


#: :class:`Op`'s constructor where the builder makes most of them.
new_op = quick_constructor(Op)


#: The in-order lanes: each runs its operations one at a time, in schedule order, in every
#: executor. CUDA: the streams ``h2d`` (A and B uploads, UPLOAD and UPLOAD_STORED), ``compute``
#: (GEMM, FILL), ``c`` (C uploads and downloads) and ``decode`` (DECODE: panels decoded on the
#: device). CPU: the compute thread (GEMM, FILL) and one copy thread that runs every UPLOAD,
#: UPLOAD_STORED, DOWNLOAD and DECODE in schedule order, which keeps ``h2d``'s order, ``c``'s
#: and ``decode``'s (and more). READs, FETCHes and WRITEs run on thread pools, in no order: no
#: lane.
ORDERED_LANES = ("h2d", "compute", "c", "decode")


#: What runs on the compute lane: the products and the elementwise work on C slots.
COMPUTE_OPS = frozenset({OpKind.GEMM, OpKind.FILL, OpKind.MIRROR, OpKind.TRANSPOSE})

#: The thread pool of each kind of operation that runs on one ('read': the readers, 'write':
#: the writers); the others run on an in-order lane.
POOLS = {OpKind.READ: "read", OpKind.FETCH: "read", OpKind.WRITE: "write"}


def _lane(kind: OpKind, operand: str) -> str | None:
    if kind in COMPUTE_OPS:
        return "compute"
    if kind is OpKind.DECODE:
        return "decode"
    if kind is OpKind.UPLOAD:
        return "c" if operand == "C" else "h2d"
    if kind is OpKind.UPLOAD_STORED:  # A or B, as their uploads
        return "h2d"
    if kind is OpKind.DOWNLOAD:
        return "c"
    return None


def ordered_lane(op: Op) -> str | None:
    """The in-order lane ``op`` runs on (one of :data:`ORDERED_LANES`), or None for a READ,
    FETCH or WRITE (thread pools, :data:`POOLS`). An operation that waits for op X of lane L
    also comes after every earlier op of L; an operation of lane L comes after every earlier
    op of L."""
    return _lane(op.kind, op.operand)


#: Which traffic level each kind of operation moves its bytes on: ``read`` is what READs put
#: into slots and stripes (out of decoded chunks, a file's pages or memory; what came from
#: storage is ``result.bytes['storage_read']``, counted by the sources), and what FETCHes put
#: into the ring as stored; ``h2d`` what UPLOADs and UPLOAD_STOREDs move up.
LEVELS = {OpKind.READ: "read", OpKind.FETCH: "read", OpKind.WRITE: "storage_write",
          OpKind.UPLOAD: "h2d", OpKind.UPLOAD_STORED: "h2d", OpKind.DOWNLOAD: "d2h"}


def traffic(items) -> dict[str, int]:
    """Bytes per level (read, storage_write, h2d, d2h) of operations, or of executed
    events (whose ``kind`` is the operation kind's value and ``nbytes`` what really moved)."""
    total = dict.fromkeys(LEVELS.values(), 0)
    for item in items:
        level = LEVELS.get(OpKind(item.kind))
        if level is not None:
            total[level] += item.nbytes
    return total


WHOLE = 1 << 62  # "to the end of the slot"


def op_span(op: Op, slot: str, writing: bool) -> tuple[int, int]:
    """The element range of ``slot`` that ``op`` reads (``writing=False``) or writes.

    Stripes (UPLOAD into a device slot, UPLOAD_STORED into its cell of one, DOWNLOAD out of
    one, an unstaged WRITE of a row stripe of its C slot) and GEMM/FILL on a C slot touch
    ``[offset, offset + elements)``; a GEMM reads its A and B panels whole, or its A slot's
    ``a_span`` where it has one (its rows of A, in the in-core shape); a MIRROR writes its row
    stripe and reads every row up to the stripe's last (the transposes of what it writes); a
    TRANSPOSE reads its C slot whole; a host buffer or a storage read/write touches the first
    ``elements``.
    """
    if (op.kind in (OpKind.UPLOAD, OpKind.UPLOAD_STORED) and writing
            or op.kind in (OpKind.DOWNLOAD, OpKind.WRITE) and not writing):
        return (op.offset, op.offset + op.elements)
    if op.kind is OpKind.MIRROR:
        return (op.offset if writing else 0, op.offset + op.elements)
    if op.kind in (OpKind.TRANSPOSE, OpKind.DECODE) and not writing:
        return (0, WHOLE)
    if op.kind in (OpKind.GEMM, OpKind.FILL):
        if slot == op.dst:
            return (op.offset, op.offset + op.elements)
        if op.a_span is not None and slot == op.src[0]:
            return op.a_span
        return (0, WHOLE)
    return (0, op.elements)


@dataclass(frozen=True)
class Counts:
    """How many operations of each kind a schedule holds and the bytes it moves: what
    ``print(plan)`` and ``plan.summary()`` show, computed without building the schedule
    (:func:`count_schedule`), or counted from a built one (:meth:`Schedule.counts`)."""

    ops: dict
    """OpKind -> number of operations of that kind (every kind present, 0 included)."""
    traffic: dict
    """Bytes per level: read, storage_write, h2d, d2h (as :func:`traffic`)."""
    flops: int = 0
    """Floating-point operations of the GEMMs (a symmetric product's: half and the
    diagonal)."""

    @property
    def total(self) -> int:
        """Operations in all."""
        return sum(self.ops.values())


@dataclass(frozen=True)
class Schedule:
    """The ordered operations of a plan, and the slot sizes they need (bytes)."""

    ops: tuple[Op, ...]
    slots: dict
    """Slot name -> capacity in elements."""
    transposed: dict
    """Operand -> whether its panels are used transposed ('A', 'B'; 'C' never)."""

    def traffic(self) -> dict[str, int]:
        """Bytes each level is planned to move: reads into slots, storage writes,
        host<->device copies."""
        return traffic(self.ops)

    def count(self, kind: OpKind) -> int:
        return sum(1 for op in self.ops if op.kind is kind)

    def counts(self) -> Counts:
        """Operations per kind and bytes per level, counted from the list."""
        ops = dict.fromkeys(OpKind, 0)
        flops = 0
        for op in self.ops:
            ops[op.kind] += 1
            flops += op.flops
        return Counts(ops=ops, traffic=self.traffic(), flops=flops)

    def __len__(self) -> int:
        return len(self.ops)

    def __str__(self) -> str:
        return "\n".join(str(op) for op in self.ops)


#: Operations a schedule stream (:func:`stream_schedule`) hands out at a time at most, but
#: for a block's stores: few enough that a run starts on its first GEMMs at once.
BATCH = 32


class _SlotState:
    """What a slot holds and who touched which of its elements since it got its content, while
    building. Entries are (op, lo, hi, lane). A slot that gets new content forgets them all
    (:meth:`refill`: every write of the new content waits for what the old one's readers, or
    writers, were); a read forgets the earlier reads of its lane that it covers (a write that
    waits for it comes after them too); a write forgets what it covers. So the lists hold what
    one content's operations left, whatever the length of the schedule."""

    __slots__ = ("name", "content", "writers", "readers", "last_use", "_memo")

    def __init__(self, name: str):
        self.name = name
        self.content: tuple | None = None
        self.writers: list[tuple] = []  # (op, lo, hi, lane) that produced the content
        self.readers: list[tuple] = []  # (op, lo, hi, lane) that read it since
        self.last_use = -1
        self._memo: tuple | None = None  # (lo, hi, producers): GEMMs ask for whole panels

    def producers(self, lo: int = 0, hi: int = WHOLE) -> list[int]:
        """Ops whose writes a reader of [lo, hi) must wait for."""
        memo = self._memo
        if memo is not None and memo[0] == lo and memo[1] == hi:
            return memo[2]
        found = [e[0] for e in self.writers if e[1] < hi and lo < e[2]]
        self._memo = (lo, hi, found)
        return found

    def hazards(self, lo: int = 0, hi: int = WHOLE) -> list[int]:
        """Ops a new writer of [lo, hi) must wait for: the readers of what is there, or its
        writers when nobody read it."""
        return ([e[0] for e in self.readers if e[1] < hi and lo < e[2]]
                or [e[0] for e in self.writers if e[1] < hi and lo < e[2]])

    def refill(self) -> list[int]:
        """The slot gets new content: return what every write of it must wait for (the old
        content's readers, or its writers when nobody read it) and forget the old content."""
        hazards = self.hazards()
        self.writers, self.readers, self._memo = [], [], None
        return hazards

    def read_whole(self, entry: tuple) -> None:
        """``entry`` read the whole content, on a lane whose every earlier reader it covers
        (the compute lane's GEMMs, a panel's only readers): its only reader now (a list of one
        entry takes it in its place: no new list a GEMM)."""
        readers = self.readers
        if len(readers) == 1:
            readers[0] = entry
        else:
            self.readers = [entry]

    def record(self, index: int, lo: int, hi: int, lane: str | None, writing: bool) -> None:
        # (Most lists hold one entry, which the new one covers: replaced without a scan.)
        entry = (index, lo, hi, lane)
        if not writing:
            readers = self.readers
            if lane is not None and readers:
                if len(readers) == 1:
                    e = readers[0]
                    if e[3] == lane and lo <= e[1] and e[2] <= hi:
                        self.readers = [entry]
                        return
                else:
                    self.readers = readers = [e for e in readers
                                              if not (e[3] == lane and lo <= e[1] and e[2] <= hi)]
            readers.append(entry)
            return
        writers = self.writers
        if len(writers) == 1 and lo <= writers[0][1] and writers[0][2] <= hi:
            self.writers = [entry]
        else:
            if writers:
                self.writers = writers = [e for e in writers if not (lo <= e[1] and e[2] <= hi)]
            writers.append(entry)
        if self.readers:
            self.readers = [e for e in self.readers if not (lo <= e[1] and e[2] <= hi)]
        self._memo = None


class _Builder:
    def __init__(self, plan) -> None:
        self.plan = plan
        prob = plan.problem
        self.prob = prob
        self.s = prob.itemsize
        self.ops: list[Op] = []  # the operations made and not yet handed out (stream)
        self.base = 0  # the index of self.ops[0]: the operations handed out before it
        self.lanes: list[str | None] = []  # ordered_lane of each op, by index
        self.clock = 0
        n_a, n_b = plan.staging.n_a, plan.staging.n_b
        names = ([f"A{i}" for i in range(n_a)] + [f"B{i}" for i in range(n_b)]
                 + [f"C{i}" for i in range(plan.n_c)] + [f"T{i}" for i in range(plan.n_t)])
        if plan.staged:
            names += ([f"sR{i}" for i in range(plan.staging.n_stage)]
                      + [f"sO{i}" for i in range(plan.staging.n_out)])
        names += [f"Z{x}{i}" for x in plan.io.gpu_decode for i in range(plan.io.n_z)]
        self.state = {name: _SlotState(name) for name in names}
        self.panel_slots = {"A": [self.state[f"A{i}"] for i in range(n_a)],
                            "B": [self.state[f"B{i}"] for i in range(n_b)]}
        self.holding: dict[tuple, _SlotState] = {}  # (operand, key) -> the A/B slot holding it
        self.fresh = {"A": 0, "B": 0}  # where fresh_slot() looks first
        self.c_first = self.reads_c_first()
        self.flop_factor = 8 if prob.dtype.startswith("complex") else 2  # as gemm_flops
        self.ring = plan.buffers.ring // self.s  # elements of a ring buffer going up
        self.out_ring = plan.buffers.out_ring // self.s  # ...and of one coming down
        self.stage_turn = {"sR": 0, "sO": 0, "T": 0, "ZA": 0, "ZB": 0}
        self.c_hazards: list[int] = []  # what the first writes of the current C block wait for
        self.rows, self.cols, self.ks = plan.row_splits, plan.col_splits, plan.k_splits
        self._orders: tuple[list[int], list[int]] | None = None  # panel_order's two orders

    # -- bookkeeping ---------------------------------------------------------------------
    def emit(self, kind, operand, key, src, dst, deps, region, **kw) -> int:
        """Append an op and record which elements of which slots it touches."""
        index = self.base + len(self.ops)
        lane = _lane(kind, operand)
        op = new_op(index=index, kind=kind, operand=operand, key=key, src=tuple(src), dst=dst,
                    deps=self.reduce(deps, lane), region=region, **kw)
        self.append(op, lane, [op_span(op, name, False) for name in src],
                    op_span(op, dst, True) if dst is not None else None)
        return index

    def append(self, op: Op, lane: str | None, reads: list[tuple[int, int]],
               writes: tuple[int, int] | None) -> None:
        """Append ``op`` (of ``lane``), which reads the element ranges ``reads`` of its
        ``src`` slots and writes ``writes`` of its ``dst`` (:func:`op_span`'s, which the
        busiest callers know without asking it)."""
        self.ops.append(op)
        self.lanes.append(lane)
        self.clock += 1
        clock, state, index = self.clock, self.state, op.index
        for name, (lo, hi) in zip(op.src, reads):
            slot = state[name]
            slot.record(index, lo, hi, lane, writing=False)
            slot.last_use = clock
        if writes is not None and op.dst is not None:
            slot = state[op.dst]
            slot.record(index, writes[0], writes[1], lane, writing=True)
            slot.last_use = clock

    def reduce(self, deps, lane: str | None) -> tuple[int, ...]:
        """The dependencies an op of ``lane`` needs: none on its own lane (it runs after those
        in order), the latest on each other in-order lane (it stands for the earlier ones),
        and every pool op (READ, WRITE: no order among them)."""
        lanes = self.lanes
        if len(deps) == 1:  # the common case (a stripe's read, a write's one reader)
            d = deps[0]
            return () if d is None or (lane is not None and lanes[d] == lane) else (d,)
        if len(deps) == 2:  # a GEMM's two panels, each read from storage (pool operations)
            d, e = deps
            if d is not None and e is not None and lanes[d] is None and lanes[e] is None:
                return (d, e) if d < e else (e, d) if e < d else (d,)
        latest: dict[str, int] | None = None  # (made only where another lane is named)
        pool = []
        for d in deps:
            if d is None:
                continue
            other = lanes[d]
            if other is None:
                pool.append(d)
            elif other != lane:
                if latest is None:
                    latest = {other: d}
                elif d > latest.get(other, -1):
                    latest[other] = d
        if latest:
            pool.extend(latest.values())
        return tuple(sorted(set(pool))) if len(pool) > 1 else tuple(pool)

    def write_deps(self, slot: str, *extra: int, lo: int = 0, hi: int = WHOLE) -> list[int]:
        return self.state[slot].hazards(lo, hi) + [e for e in extra if e is not None]

    def read_dep(self, slot: str, lo: int = 0, hi: int = WHOLE) -> list[int]:
        return self.state[slot].producers(lo, hi)

    def next_stage(self, ring: str) -> str:
        count = {"sR": self.plan.staging.n_stage, "sO": self.plan.staging.n_out,
                 "T": self.plan.n_t,
                 "ZA": self.plan.io.n_z, "ZB": self.plan.io.n_z}[ring]
        turn = self.stage_turn[ring]
        self.stage_turn[ring] = (turn + 1) % count
        return f"{ring}{turn}"

    def stripe_rows(self, region, down: bool = False, least: int | None = None) -> int:
        """Rows of each stripe of a stored region (:func:`stripe_rows`) going up, or coming
        down (``down``: C through the output ring), in ``least`` stripes at least (default:
        the plan's)."""
        (r0, r1), (c0, c1) = region
        if least is None:  # a ring of whole chunks (Plan.io.into_ring) moves a chunk in one stripe
            least = (self.plan.out_stripes if down
                     else 1 if self.plan.io.into_ring else self.plan.staging.min_stripes)
        return stripe_rows(r1 - r0, c1 - c0, self.out_ring if down else self.ring, least)

    def stripes(self, region, down: bool = False, least: int | None = None):
        """Row stripes of a stored region that fit one ring buffer: (sub-region, offset)."""
        (r0, r1), (c0, c1) = region
        cols = max(c1 - c0, 1)
        step = self.stripe_rows(region, down, least)
        for lo in range(r0, r1, step):
            hi = min(lo + step, r1)
            yield ((lo, hi), (c0, c1)), (lo - r0) * cols

    def load_stripes(self, region, cuts=None):
        """The stripes in which a region goes up: (sub-region, offset). With ``cuts`` (row
        ranges of the region, in order) no stripe crosses a cut's edge, and each cut goes up
        in its share of the plan's least number of stripes (the in-core shape: A's stripes
        end where C's do, so that a C stripe's GEMM waits for its own rows)."""
        if cuts is None:
            yield from self.stripes(region)
            return
        (r0, _), (c0, c1) = region
        least = -(-self.plan.staging.min_stripes // max(len(cuts), 1))
        for x0, x1 in cuts:
            for stripe, offset in self.stripes(((r0 + x0, r0 + x1), (c0, c1)), least=least):
                yield stripe, offset + x0 * (c1 - c0)

    # -- regions ---------------------------------------------------------------------------
    def region(self, operand: str, key: tuple[int, int]):
        if operand == "A":
            i, q = key
            mk = ((self.rows[i], self.rows[i + 1]), (self.ks[q], self.ks[q + 1]))
            return mk[::-1] if self.prob.trans_a else mk
        if operand == "B":
            q, j = key
            kn = ((self.ks[q], self.ks[q + 1]), (self.cols[j], self.cols[j + 1]))
            return kn[::-1] if self.prob.trans_b else kn
        i, j = key
        return ((self.rows[i], self.rows[i + 1]), (self.cols[j], self.cols[j + 1]))

    def nbytes(self, region) -> int:
        (r0, r1), (c0, c1) = region
        return (r1 - r0) * (c1 - c0) * self.s

    # -- loading -----------------------------------------------------------------------------
    def load(self, operand: str, key: tuple[int, int], dst: str, cuts=None) -> None:
        """Storage -> dst; through the staging ring, stripe by stripe, when staged (``cuts``:
        :meth:`load_stripes`)."""
        region = self.region(operand, key)
        hazards = self.state[dst].refill()  # every stripe waits for the old content's readers
        if operand in self.plan.io.gpu_decode:
            self.load_objects(operand, key, region, dst, hazards)
            return
        if not self.plan.staged:  # op_span: the first elements of dst, those of the region
            (r0, r1), (c0, c1) = region
            elements = (r1 - r0) * (c1 - c0)
            self.append(new_op(self.base + len(self.ops), OpKind.READ, operand, key, (), dst,
                           self.reduce(hazards, None), region, nbytes=elements * self.s),
                        None, [], (0, elements))
            return
        # Most operations of a staged schedule are these pairs, so they are appended here
        # directly, with what emit() would record: each ring buffer gets new content (its
        # read) and one reader (its upload); the stripes fill dst's fresh content in turn.
        lane = _lane(OpKind.UPLOAD, operand)
        waits = self.reduce(hazards, lane)  # besides its read, what every upload waits for
        target, ops, lanes = self.state[dst], self.ops, self.lanes
        for stripe, offset in self.load_stripes(region, cuts):
            stage = self.next_stage("sR")
            ring = self.state[stage]
            elements = self.nbytes(stripe) // self.s
            read = self.base + len(ops)
            ops.append(new_op(read, OpKind.READ, operand, key, (), stage,
                          self.reduce(ring.refill(), None), stripe,
                          nbytes=elements * self.s))
            ops.append(new_op(read + 1, OpKind.UPLOAD, operand, key, (stage,), dst,
                          tuple(sorted(waits + (read,))), stripe, nbytes=elements * self.s,
                          offset=offset))
            lanes += (None, lane)
            self.clock += 2
            ring.writers.append((read, 0, elements, None))
            ring.readers.append((read + 1, 0, elements, lane))
            ring.last_use = self.clock
            target.writers.append((read + 1, offset, offset + elements, lane))
            target._memo = None
            target.last_use = self.clock

    def load_objects(self, operand: str, key, region, dst: str, hazards: list[int]) -> None:
        """A panel decoded on the device (:attr:`Plan.io.gpu_decode`): each stored object it
        covers (a chunk file or a shard, row by row) fetched whole into a ring buffer (FETCH)
        and uploaded into its cell of the next Z slot (UPLOAD_STORED), then one DECODE of them
        all into ``dst`` (after the old content's readers, ``hazards``)."""
        z = self.next_stage("Z" + operand)
        z_hazards = self.state[z].refill()
        uploads = []
        for _, part, offset in object_cells(self.plan, operand, region):
            nbytes = self.nbytes(part)
            stage = self.next_stage("sR")
            fetch = self.emit(OpKind.FETCH, operand, key, (), stage,
                              self.state[stage].refill(), part, nbytes=nbytes)
            uploads.append(self.emit(OpKind.UPLOAD_STORED, operand, key, (stage,), z,
                                     [fetch] + z_hazards, part, nbytes=nbytes, offset=offset))
        self.emit(OpKind.DECODE, operand, key, (z,), dst, uploads + hazards, region,
                  nbytes=self.nbytes(region))

    def ensure(self, operand: str, key: tuple[int, int], pinned: set[str], cuts=None,
               own: bool = False) -> str:
        """The slot holding (operand, key), loading it into the least recently used slot
        (``cuts``: :meth:`load_stripes`); with ``own``, a slot of the operand's own."""
        # One stored matrix in both roles: a panel is what it holds, whichever role loaded it
        # (a diagonal block of X^T X takes A(i, q) and B(q, i), the same rows of X, from one
        # slot: read, staged and uploaded once).
        content = ("AB", self.region(operand, key)) if self.prob.shared else (operand, key)
        held = self.holding.get(content)
        if held is not None and own and held not in self.panel_slots[operand]:
            # A tail panel pinned in the other role's slot would take a slot that role's own
            # tail needs: loaded again into one of the operand's own (the other copy is let go).
            held.content = None
            del self.holding[content]
            held = None
        if held is not None:
            return held.name
        victim = self.fresh_slot(operand, pinned)
        if victim is None:
            for st in self.panel_slots[operand]:
                if st.name not in pinned and (victim is None or st.last_use < victim.last_use):
                    victim = st
        # The walk never asks for a new panel with every slot pinned (it pins the tail panels
        # one by one, at most as many as the operand has slots).
        assert victim is not None, f"every {operand} slot is pinned"
        self.load(operand, key, victim.name, cuts)
        if victim.content is not None:
            self.holding.pop(victim.content, None)
        victim.content = content
        self.holding[content] = victim
        return victim.name

    def fresh_slot(self, operand: str, pinned: set[str]) -> _SlotState | None:
        """The first of the operand's slots never used yet (the least recently used, first
        among equals: what the scan in :meth:`ensure` finds), in constant time: a plan that
        keeps every panel (:func:`~oocgemm.planning.finish.with_resident_panels`) has a slot
        for each, and fills them in order. None once every slot was used."""
        slots, at = self.panel_slots[operand], self.fresh[operand]
        while at < len(slots) and slots[at].last_use != -1:
            at += 1
        self.fresh[operand] = at
        if at < len(slots) and slots[at].name not in pinned:
            return slots[at]
        return None

    # -- the loop of figure 3 ----------------------------------------------------------------
    def build(self):
        self.walk()
        return Schedule(ops=tuple(self.ops), slots=self.slot_sizes(),
                        transposed=self.transposed())

    def transposed(self) -> dict:
        return {"A": self.prob.trans_a, "B": self.prob.trans_b, "C": False}

    def stream(self) -> Iterator[list[Op]]:
        """The operations in order, handed out as the walk makes them, a block's or
        :data:`BATCH` at a time; the builder keeps none of them (only their lanes, which later
        dependencies are reduced by)."""
        for _ in self.steps():
            if self.ops:
                batch, self.ops = self.ops, []
                self.base += len(batch)
                yield batch

    def walk(self) -> None:
        for _ in self.steps():
            pass

    def steps(self) -> Iterator[None]:
        """The walk, pausing after each block, and within a block once :data:`BATCH`
        operations are made (:meth:`stream` hands out what was made meanwhile)."""
        plan, prob = self.plan, self.prob
        p, q_blocks, _ = plan.grid
        order = self.block_order()
        last = p * (p + 1) // 2 - 1 if plan.symmetric else p * q_blocks - 1
        for t, (i, j) in order:
            c_slot = f"C{t % plan.n_c}"
            c_key = (i, j)
            c_region = self.region("C", c_key)
            if plan.in_core:
                self.in_core(c_key, c_slot, c_region)
                yield
                continue
            self.begin_block(c_key, c_slot)
            if not prob.computes_product:
                self.fill(c_key, c_slot, c_region)
                parts = None
            else:
                parts = yield from self.compute_block(t, c_key, c_slot, c_region,
                                                      taper=t == last, final=t == order[-1][0])
            self.store_block(c_key, c_slot, c_region, final=t == order[-1][0], parts=parts)
            yield

    def block_order(self) -> list[tuple[int, tuple[int, int]]]:
        """The blocks to compute, each with its place t in the whole run's order. Blocks
        skipped (resume) or picked out (one device's group) leave the others their places,
        which set their K order, for a bitwise-equal result."""
        plan = self.plan
        p, q_blocks, _ = plan.grid
        if plan.work.blocks:
            place = triangle_index if plan.symmetric else serpentine_index
            return [(place(i, j, q_blocks), (i, j)) for i, j in plan.work.blocks]
        done = set(plan.work.done)
        walk = triangle(p) if plan.symmetric else serpentine(p, q_blocks)
        return [(t, block) for t, block in enumerate(walk) if block not in done]

    def begin_block(self, c_key, c_slot, cuts=None) -> None:
        """A new block is new content for its C slot: loaded (the load waits for the old
        block's readers), or else started by its first GEMMs (or FILL), which wait."""
        if self.reads_c_first():
            self.load("C", c_key, c_slot, cuts=cuts)
            self.c_hazards = []
        else:
            self.c_hazards = self.state[c_slot].refill()

    def panel_order(self, t: int) -> list[int]:
        """The K panels of the ``t``-th block in the order it takes them (the same two lists
        for every block, made once: not to be changed)."""
        orders = self._orders
        if orders is None:
            nk = self.plan.grid[2]
            ramp = self.plan.ramp_pieces
            # Backwards, starting on the panel the previous block ended on, with the small
            # ramp pieces right after it, so that every block ends on full panels (the tail
            # below is what hides the drain).
            backwards = [nk - 1] + list(range(ramp)) + list(range(nk - 2, ramp - 1, -1))
            orders = self._orders = (list(range(nk)), list(dict.fromkeys(backwards)))
        return orders[t % 2]

    def compute_block(self, t: int, c_key, c_slot, c_region, *, taper: bool, final: bool
                      ) -> Generator[None, None, list[tuple[int, int]]]:
        """The GEMMs of block ``c_key`` (the ``t``-th), its tail in row stripes (``taper``:
        the run's last block in the whole order; ``final``: the last this walk computes),
        pausing every :data:`BATCH` operations; returns the row stripes of the tail."""
        plan = self.plan
        nk = len(self.ks) - 1  # (plan.grid[2])
        i, j = c_key
        w, h = c_region[0][1] - c_region[0][0], c_region[1][1] - c_region[1][0]
        # A symmetric product computes the blocks on and above the diagonal: a diagonal
        # block its upper triangle (then mirrored), one above it whole (then transposed
        # into the block across). C is read as the blocks are written (WRITE with beta):
        # the block across needs its own C, and the mirrored lower triangle C's lower one.
        diagonal = plan.symmetric and i == j
        panels = self.panel_order(t)
        # The last `tail` panels run in row stripes. In the run's last block (or
        # with one C slot) each stripe goes through all of them in turn, so that C's
        # rows become final one stripe at a time over several panels and travel back
        # while the rest computes: the drain of the run is one stripe, not one block.
        # Elsewhere the block's drain hides behind the next block's compute, and the
        # stripes go panel by panel, so that a GEMM waits for one panel, not for the
        # whole tail (the first block of a run, its panels arriving from cold, waited
        # long for them on each of two H200s: docs/performance.md, "Figures moved from
        # the code's docstrings"). The same GEMMs either way, each stripe's panels in
        # the same order: the same bits. Where only the run's last block is split
        # (Plan.staging.split_blocks, the CPU's), the others run every panel on the whole block:
        # which block that is does not depend on the run (a device's group, a resume),
        # so a block's bits do not either.
        settings = plan.staging
        tail = max(1, min(settings.tail_panels, nk, settings.n_a, settings.n_b))
        if settings.split_blocks == "last" and not taper:
            tail = 0
        head, rest = panels[:nk - tail], panels[nk - tail:]
        yield from self.head_gemms(c_key, head, first=panels[0], w=w, h=h, c_slot=c_slot,
                                   c_region=c_region, upper=diagonal)
        if not rest:
            if diagonal:  # every row is final
                self.mirror(c_key, c_slot, c_region, (0, w), h)
            return [(0, w)]
        pinned: set[str] = set()
        for q in rest:  # load the tail panels, each into a slot of its own
            # One matrix in both roles: each role's tail panels in its own slots (the pins
            # are counted per role), but where A(i, q) and B(q, j) are one panel (a diagonal
            # block), in one slot.
            own = not self.prob.shared or self.region("A", (i, q)) != self.region("B", (q, j))
            pinned.add(self.ensure("A", (i, q), pinned=pinned, own=own))
            pinned.add(self.ensure("B", (q, j), pinned=pinned, own=own))
        parts = _row_parts(w, settings.split_last, taper=taper)
        if final or plan.n_c < 2:
            sweep = [(rows, q) for rows in parts for q in rest]
        else:
            sweep = [(rows, q) for q in rest for rows in parts]
        for rows, q in sweep:
            self.gemm(i, j, q, first=q == panels[0], rows=rows, c_slot=c_slot,
                      c_region=c_region, h=h, pinned=pinned, upper=diagonal)
            if diagonal and q == rest[-1]:  # these rows and all above are final
                self.mirror(c_key, c_slot, c_region, rows, h)
            if len(self.ops) >= BATCH:
                yield
        return parts

    def store_block(self, c_key, c_slot, c_region, *, final: bool, parts) -> None:
        """Block ``c_key`` leaves (and a symmetric product's block across, its transpose);
        ``final``: the last block of the walk, which leaves in its row stripes ``parts``."""
        i, j = c_key
        if self.plan.symmetric and i != j:
            t_slot = self.transpose(c_key, c_slot, c_region)
            self.store(c_key, c_slot, c_region)
            across = (j, i)
            self.store(across, t_slot, self.region("C", across))
        elif final and self.prob.computes_product:
            # The run's last block leaves in the row stripes it became final in, each
            # as soon as it is (an unstaged plan writes its other blocks whole: they
            # leave while the next block computes).
            self.store(c_key, c_slot, c_region, parts=parts)
        else:
            self.store(c_key, c_slot, c_region)

    def in_core(self, c_key, c_slot, c_region) -> None:
        """The in-core shape's block (the whole product: one K panel, one slot each): B up
        whole, then A in row stripes that end where C's stripes do (C's rows too, when
        beta != 0); per C stripe its GEMM, waiting for its own rows of A only (all of A when
        A is stored transposed: its rows are not contiguous), then its download and write,
        which overlap the next stripes' GEMMs."""
        i, j = c_key
        (r0, _), (c0, c1) = c_region
        h = c1 - c0
        parts = [(s0 - r0, s1 - r0)
                 for ((s0, s1), _), _ in self.stripes(c_region, down=True)]
        self.ensure("B", (0, j), pinned=set())
        self.ensure("A", (i, 0), pinned=set(), cuts=None if self.prob.trans_a else parts)
        self.begin_block(c_key, c_slot, cuts=parts)
        for x0, x1 in parts:
            self.gemm(i, j, 0, first=True, rows=(x0, x1), c_slot=c_slot, c_region=c_region,
                      h=h, pinned=set())
            self.store(c_key, c_slot, ((r0 + x0, r0 + x1), (c0, c1)), base=x0 * h, least=1)

    def fill(self, c_key, c_slot, c_region) -> None:
        """C = beta * C (or zero): no product to compute."""
        reads_c = self.prob.reads_c
        src = (c_slot,) if reads_c else ()
        deps = self.read_dep(c_slot) if reads_c else self.c_hazards
        self.emit(OpKind.FILL, "C", c_key, src, c_slot, deps, c_region, alpha=0.0,
                  beta=self.prob.beta)

    def reads_c_first(self) -> bool:
        """The first GEMM of a block reads C: beta != 0 and not a symmetric product (whose
        blocks meet C as they are written)."""
        return self.prob.reads_c and not self.plan.symmetric

    def gemm(self, i, j, q, *, first, rows, c_slot, c_region, h, pinned, upper=False) -> None:
        """C[i, j] rows ``rows`` (+)= A(i, q) @ B(q, j): beta of the problem (or 0) on the first
        panel of the block, 1 after; ``upper``: on and above the diagonal only."""
        prob, state = self.prob, self.state
        # (a panel already held: ensure()'s first step, without its call)
        held = None if prob.shared else self.holding.get(("A", (i, q)))
        a_slot = held.name if held is not None else self.ensure("A", (i, q), pinned=pinned)
        held = None if prob.shared else self.holding.get(("B", (q, j)))
        # (one matrix in both roles: A's panel may sit in a B slot, which B must not take)
        b_slot = (held.name if held is not None
                  else self.ensure("B", (q, j), pinned=pinned | {a_slot}))
        beta = (prob.beta if self.c_first else 0.0) if first else 1.0
        r = self.ks[q + 1] - self.ks[q]
        x0, x1 = rows
        lo, hi = x0 * h, x1 * h
        # In the in-core shape a row-major A's stripe is contiguous: wait for its rows only.
        a_span = (x0 * r, x1 * r) if self.plan.in_core and not prob.trans_a else None
        a_state, c_state = state[a_slot], state[c_slot]
        deps = a_state.producers(*(a_span or ()))
        if b_slot != a_slot:
            deps = deps + state[b_slot].producers()
        if beta != 0:
            src: tuple[str, ...] = (a_slot, b_slot, c_slot)
            deps = deps + c_state.producers(lo, hi)
        else:
            src = (a_slot, b_slot)
            deps = deps + self.write_deps(c_slot, *self.c_hazards, lo=lo, hi=hi)
        index = self.base + len(self.ops)
        flops = (self.flop_factor * (x1 - x0) * h * r if not upper
                 else gemm_flops(prob.dtype, x1 - x0, h, r, upper, x1))
        self.ops.append(new_op(index, OpKind.GEMM, "C", (i, j), src, c_slot,
                           self.reduce(deps, "compute"),
                           ((c_region[0][0] + x0, c_region[0][0] + x1), c_region[1]), q, lo,
                           prob.alpha, beta, 0, flops, upper, a_span))
        self.lanes.append("compute")
        # What append() records, op_span's ranges written out: the A panel whole (or its
        # a_span), the B panel whole, its rows of C (read where beta != 0, and written).
        self.clock = clock = self.clock + 1
        a_lo, a_hi = a_span or (0, WHOLE)
        a_state.record(index, a_lo, a_hi, "compute", writing=False)
        a_state.last_use = clock
        b_state = state[b_slot]
        b_state.record(index, 0, WHOLE, "compute", writing=False)
        b_state.last_use = clock
        if beta != 0:
            c_state.record(index, lo, hi, "compute", writing=False)
        c_state.record(index, lo, hi, "compute", writing=True)
        c_state.last_use = clock

    def head_gemms(self, c_key, qs, *, first: int, w: int, h: int, c_slot: str, c_region,
                   upper: bool) -> Iterator[None]:
        """Block ``c_key``'s GEMMs over the K panels ``qs`` in turn, each on the whole block
        (``first``: the block's first panel), pausing every :data:`BATCH` operations: what
        :meth:`gemm` does for each, its invariants taken once and a panel already held found
        without a call (most of a schedule of small blocks is these)."""
        i, j = c_key
        prob, state, holding, ks = self.prob, self.state, self.holding, self.ks
        shared, alpha, factor, hi = prob.shared, prob.alpha, self.flop_factor, w * h
        first_beta = prob.beta if self.c_first else 0.0
        region = (c_region[0], c_region[1])  # its rows (0, w): the whole block's
        in_core_a = self.plan.in_core and not prob.trans_a
        c_state, none = state[c_slot], set[str]()
        ops, lanes, gemm = self.ops, self.lanes, OpKind.GEMM
        wrote = None  # this loop's last GEMM, once it wrote the block (C's only writer then)
        for q in qs:
            # (a panel already held: its slot's state, without ensure()'s call)
            a_state = None if shared else holding.get(("A", (i, q)))
            if a_state is None:
                a_state = state[self.ensure("A", (i, q), pinned=none)]
            b_state = None if shared else holding.get(("B", (q, j)))
            if b_state is None:
                # (one matrix in both roles: A's panel may sit in a B slot, which B must not
                # take)
                b_state = state[self.ensure("B", (q, j), pinned={a_state.name})]
            a_slot, b_slot = a_state.name, b_state.name
            beta = first_beta if q == first else 1.0
            r = ks[q + 1] - ks[q]
            a_span = (0, w * r) if in_core_a else None
            src: tuple[str, ...] = (a_slot, b_slot, c_slot) if beta != 0 else (a_slot, b_slot)
            aw, bw = a_state.writers, b_state.writers
            deps: tuple[int, ...]
            if (wrote is not None and a_span is None and len(aw) == 1 and len(bw) == 1
                    and aw[0][3] is None and bw[0][3] is None and a_slot != b_slot):
                # The common case, reduce()'s outcome worked out: each panel written whole
                # by one pool operation (its READ), and C by the GEMM before (this lane).
                x, y = aw[0][0], bw[0][0]
                deps = (x, y) if x < y else (y, x)
            else:
                deps = self.head_deps(a_state, b_state, a_span, c_slot, hi,
                                      reads_c=beta != 0, c_written=wrote is not None)
            index = self.base + len(ops)
            ops.append(new_op(index, gemm, "C", c_key, src, c_slot, deps,
                              region, q, 0, alpha, beta, 0,
                              gemm_flops(prob.dtype, w, h, r, upper, w) if upper
                              else factor * hi * r, upper, a_span))
            lanes.append("compute")
            # What append() records (as gemm() does), its outcome written out: only GEMMs read
            # a panel slot, so a read of the whole panel leaves itself its only reader (it
            # covers every earlier one, of its own lane); and the block's rows written whole
            # cover all that this content of the C slot had (its read with them).
            entry = (index, 0, WHOLE, "compute")
            if a_span is not None:
                a_state.record(index, *a_span, "compute", writing=False)
            else:
                a_state.read_whole(entry)
            b_state.read_whole(entry)
            self.clock = a_state.last_use = b_state.last_use = self.clock + 1
            if wrote is None:  # (the C slot's record, from the loop's last GEMM, after it)
                c_state.writers, c_state.readers, c_state._memo = [], [], None
            wrote = index
            if len(ops) >= BATCH:
                yield
                ops = self.ops  # (handed out: a new list)
        if wrote is not None:
            c_state.writers = [(wrote, 0, hi, "compute")]
            c_state.last_use = self.clock

    def head_deps(self, a_state, b_state, a_span, c_slot: str, hi: int, *, reads_c: bool,
                  c_written: bool) -> tuple[int, ...]:
        """What a head GEMM waits for (:meth:`head_gemms`), worked out in full: the producers
        of its panels (of A's ``a_span``), and of C's first ``hi`` elements where it reads
        them (none once the block's GEMMs wrote them: ``c_written``, of this lane) or the
        hazards of C's slot where it starts it."""
        found = a_state.producers(*(a_span or (0, WHOLE)))
        if b_state is not a_state:
            found = found + b_state.producers()
        if not reads_c:
            found = found + self.write_deps(c_slot, *self.c_hazards, lo=0, hi=hi)
        elif not c_written:
            found = found + self.state[c_slot].producers(0, hi)
        return self.reduce(found, "compute")

    def mirror(self, key, c_slot, c_region, rows, h) -> None:
        """Rows ``rows`` of a diagonal block: below the diagonal := above it, transposed."""
        x0, x1 = rows
        region = ((c_region[0][0] + x0, c_region[0][0] + x1), c_region[1])
        deps = (self.read_dep(c_slot, lo=0, hi=x1 * h)
                + self.write_deps(c_slot, lo=x0 * h, hi=x1 * h))
        self.emit(OpKind.MIRROR, "C", key, (c_slot,), c_slot, deps, region, offset=x0 * h)

    def transpose(self, key, c_slot, c_region) -> str:
        """The block across the diagonal into a T slot: the finished block, transposed."""
        t_slot = self.next_stage("T")
        (r0, r1), (c0, c1) = c_region
        deps = self.state[t_slot].refill() + self.read_dep(c_slot)
        self.emit(OpKind.TRANSPOSE, "C", key[::-1], (c_slot,), t_slot, deps, ((c0, c1), (r0, r1)))
        return t_slot

    def store(self, key, c_slot, region, parts=None, base: int = 0,
              least: int | None = None) -> None:
        """C slot -> storage; through the output ring, stripe by stripe (in ``least`` at
        least), when staged, ``region`` starting ``base`` elements into the slot; else whole,
        or in the row ``parts`` given (the run's last block), each waiting for its own rows
        only. A symmetric product's blocks meet C here (``beta``: the writer adds beta times
        C's region as read)."""
        beta = self.prob.beta if (self.prob.reads_c and self.plan.symmetric) else 0.0
        if not self.plan.staged:
            (r0, _), cols = region
            h = cols[1] - cols[0]
            for x0, x1 in parts or [(0, region[0][1] - r0)]:
                lo, hi = x0 * h, x1 * h
                self.emit(OpKind.WRITE, "C", key, (c_slot,), None,
                          self.read_dep(c_slot, lo=lo, hi=hi), ((r0 + x0, r0 + x1), cols),
                          nbytes=(hi - lo) * self.s, beta=beta, offset=lo)
            return
        for stripe, offset in self.stripes(region, down=True, least=least):
            offset += base
            stage = self.next_stage("sO")
            nbytes = self.nbytes(stripe)
            produced = self.read_dep(c_slot, lo=offset, hi=offset + self.nbytes(stripe) // self.s)
            down = self.emit(OpKind.DOWNLOAD, "C", key, (c_slot,), stage,
                             self.state[stage].refill() + produced, stripe, nbytes=nbytes,
                             offset=offset)
            self.emit(OpKind.WRITE, "C", key, (stage,), None, [down], stripe, nbytes=nbytes,
                      beta=beta)

    def slot_sizes(self) -> dict[str, int]:
        w, h, r = self.plan.tile
        computes = self.prob.computes_product
        sizes = {"A": w * r if computes else 0, "B": r * h if computes else 0, "C": w * h,
                 "T": w * h}
        sizes |= {"sR": self.ring, "sO": self.out_ring}
        sizes |= {f"Z{x}": self.plan.z_slot(x) // self.s for x in self.plan.io.gpu_decode}
        return {name: sizes[name[:2] if name[0] in "sZ" else name[0]] for name in self.state}


class _Counter(_Builder):
    """The builder's walk with nothing built: counts operations and bytes per load, per GEMM
    and per store (a load's stripes counted, not listed), and keeps only what the walk's
    choices depend on (which panel each slot holds, and when it was last used)."""

    def __init__(self, plan) -> None:
        super().__init__(plan)
        self.counted = dict.fromkeys(OpKind, 0)
        self.moved = dict.fromkeys(LEVELS.values(), 0)
        self.gemms = 0
        self.flops = 0
        # (region shape, coming down) -> its stripes
        self.stripe_counts: dict[tuple[int, int, bool, int | None], int] = {}

    def _stripes(self, region, down: bool = False, least: int | None = None) -> int:
        (r0, r1), (c0, c1) = region
        shape = (r1 - r0, c1 - c0, down, least)
        count = self.stripe_counts.get(shape)
        if count is None:
            count = self.stripe_counts[shape] = -(-shape[0] // self.stripe_rows(region, down,
                                                                                least))
        return count

    def load(self, operand, key, dst, cuts=None) -> None:
        region = self.region(operand, key)
        nbytes = self.nbytes(region)
        stripes = 1
        read, upload = OpKind.READ, OpKind.UPLOAD
        if operand in self.plan.io.gpu_decode:  # an object a stripe, and its DECODE
            x = self.plan.problem_operand(operand)
            assert x.chunks is not None
            stripes = len(chunks_of(region, x.chunks))
            self.counted[OpKind.DECODE] += 1
            read, upload = OpKind.FETCH, OpKind.UPLOAD_STORED
        elif self.plan.staged and cuts is None:
            stripes = self._stripes(region)
        elif self.plan.staged:  # a few cuts (the in-core shape's C stripes): listed
            stripes = sum(1 for _ in self.load_stripes(region, cuts))
        self.counted[read] += stripes
        self.moved["read"] += nbytes
        if self.plan.staged:
            self.counted[upload] += stripes
            self.moved["h2d"] += nbytes
        self.clock += 1  # the slot's last use, in the builder's order
        self.state[dst].last_use = self.clock

    def fill(self, c_key, c_slot, c_region) -> None:
        self.counted[OpKind.FILL] += 1

    def gemm(self, i, j, q, *, first, rows, c_slot, c_region, h, pinned, upper=False) -> None:
        a = self.ensure("A", (i, q), pinned=pinned)
        b = self.ensure("B", (q, j), pinned=pinned | {a})
        self.gemms += 1
        self.flops += gemm_flops(self.prob.dtype, rows[1] - rows[0], h,
                                 self.ks[q + 1] - self.ks[q], upper, rows[1])
        self.clock += 1
        self.state[a].last_use = self.state[b].last_use = self.clock

    def head_gemms(self, c_key, qs, *, first: int, w: int, h: int, c_slot: str, c_region,
                   upper: bool) -> Iterator[None]:
        i, j = c_key
        for q in qs:
            self.gemm(i, j, q, first=q == first, rows=(0, w), c_slot=c_slot,
                      c_region=c_region, h=h, pinned=set(), upper=upper)
        yield from ()

    def mirror(self, key, c_slot, c_region, rows, h) -> None:
        self.counted[OpKind.MIRROR] += 1

    def transpose(self, key, c_slot, c_region) -> str:
        self.counted[OpKind.TRANSPOSE] += 1
        return self.next_stage("T")

    def store(self, key, c_slot, region, parts=None, base: int = 0,
              least: int | None = None) -> None:
        nbytes = self.nbytes(region)
        stripes = (self._stripes(region, down=True, least=least) if self.plan.staged
                   else len(parts or [None]))
        if self.plan.staged:
            self.counted[OpKind.DOWNLOAD] += stripes
            self.moved["d2h"] += nbytes
        self.counted[OpKind.WRITE] += stripes
        self.moved["storage_write"] += nbytes

    def count(self) -> Counts:
        self.walk()
        self.counted[OpKind.GEMM] = self.gemms
        return Counts(ops=self.counted, traffic=self.moved, flops=self.flops)


def _row_parts(rows: int, parts: int, taper: bool = False) -> list[tuple[int, int]]:
    """``[0, rows)`` cut into at most ``parts`` near-equal ranges of whole rows; with
    ``taper`` the last range is cut again into halving pieces (1/2, 1/4, 1/8, 1/8 of it), so
    that the last rows to become final, what is left to copy after the run's last GEMM, are
    few (the end of the whole product)."""
    parts = max(1, min(parts, rows))
    bounds = [rows * p // parts for p in range(parts + 1)]
    if taper and parts > 1:
        lo, hi = bounds[-2], bounds[-1]
        span = hi - lo
        bounds[-1:] = [lo + span // 2, lo + 3 * span // 4, lo + 7 * span // 8, hi]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def object_cells(plan, operand: str, region) -> list[tuple[tuple[int, int], tuple, int]]:
    """The stored objects that a panel ``region`` of ``operand`` decoded on the device
    (:attr:`Plan.io.gpu_decode <oocgemm.planning.plan.IOChoices.gpu_decode>`) covers, row by row:
    ``(index in the object grid, its region clipped at the array's edges, the offset of its
    cell in the Z slot in elements)``. Where a load's UPLOAD_STOREDs put them and its DECODE
    finds them."""
    x = plan.problem_operand(operand)
    cell = plan.object_cell(operand) // plan.problem.itemsize
    return [(index, chunk_region(index, x.chunks, x.shape), k * cell)
            for k, index in enumerate(chunks_of(region, x.chunks))]


def decode_batches(ops) -> list[tuple[int, ...]]:
    """The DECODEs of ``ops`` (a schedule's operations) in the batches a device may run each
    as one (indices): consecutive DECODEs of the decode lane, a panel of each operand at most,
    none waiting for an earlier one of its batch, directly or through the operations between
    them. So a K step's A and B panels decode together: a GPU decodes a zstd frame on one
    thread block, and chunks of one large frame give a panel few frames. Linear: the
    operations after a batch opened are looked at once."""
    batches: list[tuple[int, ...]] = []
    members: list[Op] = []
    after: set[int] = set()  # operations since the batch opened that wait for a member
    for op in ops:
        if op.kind is OpKind.DECODE:
            if members and all(m.operand != op.operand for m in members) \
                    and after.isdisjoint(op.deps):
                members.append(op)
            else:
                if members:
                    batches.append(tuple(m.index for m in members))
                members, after = [op], set()
            after.add(op.index)
        elif members and not after.isdisjoint(op.deps):
            after.add(op.index)
    if members:
        batches.append(tuple(m.index for m in members))
    return batches


def stripe_rows(rows: int, cols: int, ring: int, min_stripes: int) -> int:
    """Rows of each stripe in which a staged region of ``rows`` x ``cols`` moves through the
    ring (the last one may have fewer): as many as fit one ring buffer of ``ring`` elements,
    and at most a ``min_stripes``-th of the region."""
    return max(1, min(ring // max(cols, 1), -(-rows // max(min_stripes, 1))))


def gemm_flops(dtype: str, rows: int, h: int, r: int, upper: bool = False, x1: int = 0) -> int:
    """Floating-point operations of a GEMM of ``rows`` rows of a C block ``h`` wide over a
    K panel ``r`` deep (complex counts 4x); ``upper``: rows ending at ``x1`` of a diagonal
    block, on and above its diagonal only (the stripe's square's upper triangle, and all that
    lies right of the square)."""
    factor = 8 if dtype.startswith("complex") else 2
    if not upper:
        return factor * rows * h * r
    return factor * r * (rows * (h - x1) + rows * (rows + 1) // 2)


def triangle(rows: int):
    """The blocks (i, j) on and above the diagonal of a ``rows`` x ``rows`` grid, row by row,
    alternating direction, so that neighbours share a row or column; the second to last row
    goes leftwards to the diagonal. A block above the diagonal writes twice the output of
    one on it in the same time, and a block's output leaves while the next computes: so the
    run ends on two diagonal blocks, whose output hides behind their compute, not on a
    transposed block's."""
    for i in range(rows):
        span = range(rows - 1, i - 1, -1) if _leftwards(i, rows) else range(i, rows)
        for j in span:
            yield i, j


def _leftwards(i: int, rows: int) -> bool:
    return (rows - i) % 2 == 0


def triangle_index(i: int, j: int, cols: int) -> int:
    """The place of block (i, j), i <= j, in :func:`triangle` order."""
    before = i * cols - i * (i - 1) // 2
    return before + (cols - 1 - j if _leftwards(i, cols) else j - i)


def serpentine_index(i: int, j: int, cols: int) -> int:
    """The place of block (i, j) in :func:`serpentine` order."""
    return i * cols + (j if i % 2 == 0 else cols - 1 - j)


def serpentine(rows: int, cols: int):
    """(i, j) row by row, alternating direction, so that neighbours share a row or column."""
    for i in range(rows):
        span = range(cols) if i % 2 == 0 else range(cols - 1, -1, -1)
        for j in span:
            yield i, j


def build_schedule(plan) -> Schedule:
    """Expand a plan into its ordered block operations."""
    return _Builder(plan).build()


@dataclass(frozen=True)
class Stream:
    """A schedule to replay, its operations made as they are consumed
    (:func:`stream_schedule`), or those of a built :class:`Schedule`."""

    slots: dict
    """Slot name -> capacity in elements (as :attr:`Schedule.slots`)."""
    transposed: dict
    """As :attr:`Schedule.transposed`."""
    batches: Iterator[Sequence[Op]]
    """The operations in schedule order, a few at a time; each is taken once."""


def stream_schedule(plan) -> Stream:
    """The operations of ``plan``'s schedule in order, made as they are taken: the same
    operations as :func:`build_schedule`'s, none listed before the walk gets to it, none kept
    after (an executor starts on the first GEMM while the walk has a block made, and the
    list of a schedule of a hundred thousand operations is never held)."""
    builder = _Builder(plan)
    return Stream(builder.slot_sizes(), builder.transposed(), builder.stream())


def built_stream(schedule: Schedule) -> Stream:
    """A built schedule as a :class:`Stream`."""
    return Stream(schedule.slots, schedule.transposed,
                  iter((schedule.ops,) if schedule.ops else ()))


def count_schedule(plan) -> Counts:
    """What :func:`build_schedule` would hold (operations per kind, bytes per level), counted
    by the same walk without listing the operations: one step per load, GEMM and store."""
    return _Counter(plan).count()

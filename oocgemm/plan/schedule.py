"""The schedule: a plan expanded into the ordered block operations that executors replay.

Every operation names the buffer slots it reads and writes and the earlier operations it must
wait for. Slots are A0..A{n-1}, B.., C.. on the device side (GPU memory, or the CPU's working
buffers) and sA.., sB.., sC.. for host staging. The list is in program order (every dependency
points backwards), so an executor may dispatch it in order onto its lanes and wait on
dependencies only; the checker (:mod:`oocgemm.plan.check`) proves the buffer discipline.

Staged plans (CUDA) move every panel and C block in row stripes through a ring of small host
buffers (sR0.. for what goes up, sO0.. for C coming down), so that pinned memory stays bounded
whatever the tile, and many reader threads can fill the ring in parallel.

The order follows the seed paper's figure 3: keep C_{ij} resident, stream the K panels of A and
B through ping-pong slots, store C_{ij}, move on. C blocks run in serpentine order (rows left to
right, then right to left) and K panels alternate direction, so consecutive blocks share a
panel; a panel already in a slot is never loaded again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class OpKind(str, enum.Enum):
    READ = "read"          # storage -> slot (host staging, or the working slot when unstaged)
    UPLOAD = "upload"      # host staging slot -> device slot
    FILL = "fill"          # C slot = beta * C slot (or zero): no product to compute
    GEMM = "gemm"          # C slot = alpha * A slot @ B slot + beta * C slot
    DOWNLOAD = "download"  # device C slot -> host staging slot
    WRITE = "write"        # slot -> storage

    def __str__(self) -> str:
        return self.value


#: The lane (stream or thread pool) each kind runs on, in the executors' shared vocabulary.
LANES = {
    OpKind.READ: "read",
    OpKind.UPLOAD: "h2d",
    OpKind.FILL: "compute",
    OpKind.GEMM: "compute",
    OpKind.DOWNLOAD: "d2h",
    OpKind.WRITE: "write",
}


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
    """Element offset of this stripe in the device slot (UPLOAD: in ``dst``; DOWNLOAD: in
    ``src``). Staged plans move panels and C blocks in row stripes through a ring of small
    pinned buffers; a stripe's rows are contiguous in both buffers."""
    alpha: float | complex = 1.0
    """GEMM/FILL scale of the product."""
    beta: float | complex = 0.0
    """GEMM/FILL scale of the C slot's previous content (0: not read)."""
    nbytes: int = 0
    """Bytes moved (READ/UPLOAD/DOWNLOAD/WRITE)."""
    flops: int = 0
    """Floating-point operations (GEMM)."""

    @property
    def lane(self) -> str:
        return LANES[self.kind]

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


@dataclass(frozen=True)
class Schedule:
    """The ordered operations of a plan, and the slot sizes they need (bytes)."""

    ops: tuple[Op, ...]
    slots: dict
    """Slot name -> capacity in elements."""
    transposed: dict
    """Operand -> whether its panels are used transposed ('A', 'B'; 'C' never)."""

    def traffic(self) -> dict[str, int]:
        """Bytes each level moves: storage reads/writes and host<->device copies."""
        total = {"storage_read": 0, "storage_write": 0, "h2d": 0, "d2h": 0}
        for op in self.ops:
            if op.kind is OpKind.READ:
                total["storage_read"] += op.nbytes
            elif op.kind is OpKind.WRITE:
                total["storage_write"] += op.nbytes
            elif op.kind is OpKind.UPLOAD:
                total["h2d"] += op.nbytes
            elif op.kind is OpKind.DOWNLOAD:
                total["d2h"] += op.nbytes
        return total

    def count(self, kind: OpKind) -> int:
        return sum(1 for op in self.ops if op.kind is kind)

    def __len__(self) -> int:
        return len(self.ops)

    def __str__(self) -> str:
        return "\n".join(str(op) for op in self.ops)


class _SlotState:
    """What a slot holds and who touched it last, while the schedule is being built."""

    __slots__ = ("name", "content", "writers", "readers", "last_use")

    def __init__(self, name: str):
        self.name = name
        self.content: tuple | None = None
        self.writers: list[int] = []   # the op(s) that produced the current content
        self.readers: list[int] = []   # ops that read the current content
        self.last_use = -1

    def hazards(self) -> list[int]:
        """Ops a new writer of this slot must wait for: the readers of the current content,
        or its writers when nobody read it."""
        return list(self.readers) if self.readers else list(self.writers)


class _Builder:
    def __init__(self, plan):
        self.plan = plan
        prob = plan.problem
        self.prob = prob
        self.s = prob.itemsize
        self.ops: list[Op] = []
        self.clock = 0
        names = ([f"A{i}" for i in range(plan.n_a)] + [f"B{i}" for i in range(plan.n_b)]
                 + [f"C{i}" for i in range(plan.n_c)])
        if plan.staged:
            names += [f"sR{i}" for i in range(plan.n_stage)] + [f"sO{i}" for i in range(plan.n_out)]
        self.state = {name: _SlotState(name) for name in names}
        self.stage_turn = {"sR": 0, "sO": 0}
        self.rows, self.cols, self.ks = plan.row_splits, plan.col_splits, plan.k_splits

    # -- bookkeeping ---------------------------------------------------------------------
    def emit(self, kind, operand, key, src, dst, deps, region, partial=False, **kw) -> int:
        """Append an op. ``partial``: it writes one stripe of ``dst``; the stripes of one load
        together make the slot's new content."""
        index = len(self.ops)
        deps = tuple(sorted(set(deps)))
        self.ops.append(Op(index=index, kind=kind, operand=operand, key=key, src=tuple(src),
                           dst=dst, deps=deps, region=region, **kw))
        self.clock += 1
        for name in src:
            st = self.state[name]
            st.readers.append(index)
            st.last_use = self.clock
        if dst is not None:
            st = self.state[dst]
            if partial and st.writers and not st.readers and self.ops[st.writers[-1]].key == key:
                st.writers.append(index)
            else:
                st.writers, st.readers = [index], []
            st.last_use = self.clock
        return index

    def write_deps(self, slot: str, *extra: int) -> list[int]:
        return self.state[slot].hazards() + [e for e in extra if e is not None]

    def read_dep(self, slot: str) -> list[int]:
        return list(self.state[slot].writers)

    def next_stage(self, ring: str) -> str:
        count = self.plan.n_stage if ring == "sR" else self.plan.n_out
        turn = self.stage_turn[ring]
        self.stage_turn[ring] = (turn + 1) % count
        return f"{ring}{turn}"

    def stripes(self, region):
        """Row stripes of a stored region that fit one ring buffer: (sub-region, offset)."""
        (r0, r1), (c0, c1) = region
        cols = max(c1 - c0, 1)
        step = max(1, self.plan.buffers.ring // self.s // cols)
        for lo in range(r0, r1, step):
            hi = min(lo + step, r1)
            yield ((lo, hi), (c0, c1)), (lo - r0) * cols

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
    def load(self, operand: str, key: tuple[int, int], dst: str) -> None:
        """Storage -> dst; through the staging ring, stripe by stripe, when staged."""
        region = self.region(operand, key)
        if not self.plan.staged:
            self.emit(OpKind.READ, operand, key, (), dst, self.write_deps(dst), region,
                      nbytes=self.nbytes(region))
            return
        hazards = self.write_deps(dst)  # every stripe waits for the slot's previous readers
        for stripe, offset in self.stripes(region):
            stage = self.next_stage("sR")
            nbytes = self.nbytes(stripe)
            read = self.emit(OpKind.READ, operand, key, (), stage, self.write_deps(stage), stripe,
                             nbytes=nbytes)
            self.emit(OpKind.UPLOAD, operand, key, (stage,), dst, hazards + [read], stripe,
                      nbytes=nbytes, offset=offset, partial=offset > 0)

    def ensure(self, operand: str, key: tuple[int, int], pinned: set[str]) -> str:
        """The slot holding (operand, key), loading it into the least recently used slot."""
        count = self.plan.n_a if operand == "A" else self.plan.n_b
        slots = [self.state[f"{operand}{i}"] for i in range(count)]
        for st in slots:
            if st.content == (operand, key):
                return st.name
        victim = min((st for st in slots if st.name not in pinned), key=lambda st: st.last_use)
        self.load(operand, key, victim.name)
        victim.content = (operand, key)
        return victim.name

    # -- the loop of figure 3 ----------------------------------------------------------------
    def build(self):
        plan, prob = self.plan, self.prob
        p, q_blocks, nk = plan.grid
        for t, (i, j) in enumerate(serpentine(p, q_blocks)):
            c_slot = f"C{t % plan.n_c}"
            c_key = (i, j)
            c_region = self.region("C", c_key)
            w, h = c_region[0][1] - c_region[0][0], c_region[1][1] - c_region[1][0]
            self.state[c_slot].content = ("C", c_key)
            if prob.reads_c:
                self.load("C", c_key, c_slot)
            if not prob.computes_product:
                src = (c_slot,) if prob.reads_c else ()
                deps = self.read_dep(c_slot) if prob.reads_c else self.write_deps(c_slot)
                self.emit(OpKind.FILL, "C", c_key, src, c_slot, deps, c_region,
                          alpha=0.0, beta=prob.beta)
            else:
                panels = range(nk) if t % 2 == 0 else range(nk - 1, -1, -1)
                for n_done, q in enumerate(panels):
                    a_slot = self.ensure("A", (i, q), pinned=set())
                    b_slot = self.ensure("B", (q, j), pinned=set())
                    beta = (prob.beta if prob.reads_c else 0.0) if n_done == 0 else 1.0
                    src = (a_slot, b_slot) + ((c_slot,) if beta != 0 else ())
                    deps = self.read_dep(a_slot) + self.read_dep(b_slot)
                    deps += self.read_dep(c_slot) if beta != 0 else self.write_deps(c_slot)
                    r = self.ks[q + 1] - self.ks[q]
                    factor = 8 if prob.dtype.startswith("complex") else 2
                    self.emit(OpKind.GEMM, "C", c_key, src, c_slot, deps, c_region, q=q,
                              alpha=prob.alpha, beta=beta, flops=factor * w * h * r)
            self.store(c_key, c_slot, c_region)
        return Schedule(ops=tuple(self.ops), slots=self.slot_sizes(),
                        transposed={"A": prob.trans_a, "B": prob.trans_b, "C": False})

    def store(self, key, c_slot, region) -> None:
        """C slot -> storage; through the output ring, stripe by stripe, when staged."""
        if not self.plan.staged:
            self.emit(OpKind.WRITE, "C", key, (c_slot,), None, self.read_dep(c_slot), region,
                      nbytes=self.nbytes(region))
            return
        produced = self.read_dep(c_slot)
        for stripe, offset in self.stripes(region):
            stage = self.next_stage("sO")
            nbytes = self.nbytes(stripe)
            down = self.emit(OpKind.DOWNLOAD, "C", key, (c_slot,), stage,
                             self.write_deps(stage, *produced), stripe, nbytes=nbytes,
                             offset=offset)
            self.emit(OpKind.WRITE, "C", key, (stage,), None, [down], stripe, nbytes=nbytes)

    def slot_sizes(self) -> dict[str, int]:
        w, h, r = self.plan.tile
        computes = self.prob.computes_product
        sizes = {"A": w * r if computes else 0, "B": r * h if computes else 0, "C": w * h}
        ring = self.plan.buffers.ring // self.s
        return {name: (ring if name.startswith("s") else sizes[name[0]]) for name in self.state}


def serpentine(rows: int, cols: int):
    """(i, j) row by row, alternating direction, so that neighbours share a row or column."""
    for i in range(rows):
        span = range(cols) if i % 2 == 0 else range(cols - 1, -1, -1)
        for j in span:
            yield i, j


def build_schedule(plan) -> Schedule:
    """Expand a plan into its ordered block operations."""
    return _Builder(plan).build()

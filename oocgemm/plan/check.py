"""Prove a schedule's buffer discipline and data flow, without running it.

Two passes over the operation list:

1. Hazards. ``happens_before`` is the transitive closure of the declared dependencies (and
   nothing else: an executor may run any two operations with no path between them at once,
   on different lanes). Every read of a slot must come after the write that filled it (RAW), no
   slot may be overwritten before all readers of its previous content finished (WAR), and two
   writes of one slot are ordered (WAW).
2. Data flow, replayed symbolically: every slot holds a tag (which block of which operand, and
   for a C slot which K panels it has accumulated). Each GEMM must find A(i, q) and B(q, j) in
   its slots; every K panel is accumulated into its C block exactly once; every C block is
   written exactly once, complete; the blocks tile C exactly and the panels tile K.
"""

from __future__ import annotations

from collections import Counter

from .schedule import OpKind, Schedule


class ScheduleError(AssertionError):
    """A schedule breaks a rule; the message names the operation."""


def check_schedule(schedule: Schedule, plan) -> None:
    """Raise :class:`ScheduleError` when ``schedule`` is not a correct replay of ``plan``."""
    _check_hazards(schedule)
    _check_dataflow(schedule, plan)


def _span(op, slot: str, schedule: Schedule, writing: bool) -> tuple[int, int]:
    """Element range of ``slot`` that ``op`` touches: a stripe at its offset in a device slot,
    the whole content otherwise."""
    if op.kind is OpKind.UPLOAD and writing:
        return (op.offset, op.offset + op.elements)
    if op.kind is OpKind.DOWNLOAD and not writing:
        return (op.offset, op.offset + op.elements)
    if op.kind in (OpKind.GEMM, OpKind.FILL):
        return (0, schedule.slots[slot])  # a GEMM touches its whole panels and C block
    return (0, op.elements)


def _check_hazards(schedule: Schedule) -> None:
    ops = schedule.ops
    ancestors: list[int] = []  # bitset per op of every op that happens before it
    writes: dict[str, list[tuple[int, int, int]]] = {}  # slot -> live (op, lo, hi) writes
    reads: dict[str, list[tuple[int, int, int]]] = {}   # slot -> (op, lo, hi) reads to order
    for op in ops:
        if op.index != len(ancestors):
            raise ScheduleError(f"op #{op.index} is at position {len(ancestors)}")
        bits = 0
        for d in op.deps:
            if not 0 <= d < op.index:
                raise ScheduleError(f"{op}: depends on #{d}, which is not an earlier operation")
            bits |= ancestors[d] | (1 << d)
        ancestors.append(bits)

        def before(earlier: int) -> bool:
            return bool(bits >> earlier & 1)

        for slot in op.src:
            if slot not in schedule.slots:
                raise ScheduleError(f"{op}: reads unknown slot {slot}")
            lo, hi = _span(op, slot, schedule, writing=False)
            live = [w for w in writes.get(slot, []) if w[1] < hi and lo < w[2]]
            if not live:
                raise ScheduleError(f"{op}: reads slot {slot} that nothing wrote")
            for writer, _, _ in live:
                if not before(writer):
                    raise ScheduleError(
                        f"{op}: reads {slot} without waiting for its writer #{writer} (RAW)")
            reads.setdefault(slot, []).append((op.index, lo, hi))
        if op.dst is not None:
            slot = op.dst
            if slot not in schedule.slots:
                raise ScheduleError(f"{op}: writes unknown slot {slot}")
            lo, hi = _span(op, slot, schedule, writing=True)
            if hi > schedule.slots[slot]:
                raise ScheduleError(f"{op}: writes {slot}[{lo}:{hi}] past its {schedule.slots[slot]} elements")
            kept_reads = []
            for reader, rlo, rhi in reads.get(slot, []):
                overlap = rlo < hi and lo < rhi
                if overlap and reader != op.index and not before(reader):
                    raise ScheduleError(
                        f"{op}: overwrites {slot} before its reader #{reader} finished (WAR)")
                if not (lo <= rlo and rhi <= hi):  # a covered read is ordered through this write
                    kept_reads.append((reader, rlo, rhi))
            reads[slot] = kept_reads
            kept = []
            for writer, wlo, whi in writes.get(slot, []):
                if wlo < hi and lo < whi and not before(writer):
                    raise ScheduleError(f"{op}: writes {slot} concurrently with #{writer} (WAW)")
                if not (lo <= wlo and whi <= hi):
                    kept.append((writer, wlo, whi))
            kept.append((op.index, lo, hi))
            writes[slot] = kept


def _check_dataflow(schedule: Schedule, plan) -> None:
    prob = plan.problem
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    p, q_blocks, nk = plan.grid
    _check_tiling("rows", rows, prob.m)
    _check_tiling("columns", cols, prob.n)
    if prob.computes_product:
        _check_tiling("K panels", ks, prob.k)
    content: dict[str, tuple] = {}
    written: dict[tuple[int, int], list] = {}
    accumulated: Counter = Counter()

    def region_of(operand, key):
        if operand == "A":
            i, q = key
            want = ((rows[i], rows[i + 1]), (ks[q], ks[q + 1]))
            return want[::-1] if prob.trans_a else want
        if operand == "B":
            q, j = key
            want = ((ks[q], ks[q + 1]), (cols[j], cols[j + 1]))
            return want[::-1] if prob.trans_b else want
        i, j = key
        return ((rows[i], rows[i + 1]), (cols[j], cols[j + 1]))

    def expect_stripe(op, operand, key):
        """A stripe (staged) or the whole region: whole rows of it, inside it."""
        (r0, r1), (c0, c1) = region_of(operand, key)
        (s0, s1), (d0, d1) = op.region
        if (d0, d1) != (c0, c1) or not r0 <= s0 < s1 <= r1:
            raise ScheduleError(f"{op}: region {op.region} is not whole rows of {operand}{key} "
                                f"{((r0, r1), (c0, c1))}")
        return (s0 - r0) * (c1 - c0), (s1 - r0) * (c1 - c0), (r1 - r0) * (c1 - c0)

    for op in schedule.ops:
        if op.kind is OpKind.READ:
            if op.operand in ("A", "B") and not prob.computes_product:
                raise ScheduleError(f"{op}: reads {op.operand} although no product is computed")
            if op.operand == "C" and not prob.reads_c:
                raise ScheduleError(f"{op}: reads C although beta == 0")
            lo, hi, total = expect_stripe(op, op.operand, op.key)
            if hi - lo > schedule.slots[op.dst]:
                raise ScheduleError(f"{op}: {hi - lo} elements do not fit slot {op.dst}")
            # (operand, key, state, covered ranges); a host stage holds one stripe
            content[op.dst] = (op.operand, op.key, "input", frozenset({(lo, hi)}))
        elif op.kind is OpKind.UPLOAD:
            tag = content.get(op.src[0])
            lo, hi, total = expect_stripe(op, op.operand, op.key)
            if tag is None or tag[:2] != (op.operand, op.key) or tag[3] != frozenset({(lo, hi)}):
                raise ScheduleError(f"{op}: uploads {tag}, expected stripe {lo}:{hi} of "
                                    f"{op.operand}{op.key}")
            if op.offset != lo:
                raise ScheduleError(f"{op}: stripe {lo}:{hi} uploaded at offset {op.offset}")
            previous = content.get(op.dst)
            covered = set()
            if previous is not None and previous[:3] == (op.operand, op.key, "input"):
                covered = set(previous[3])
            covered.add((lo, hi))
            content[op.dst] = (op.operand, op.key, "input", _merge(covered))
        elif op.kind in (OpKind.GEMM, OpKind.FILL):
            i, j = op.key
            c_slot = op.dst
            previous = content.get(c_slot)
            # A GEMM accumulates when the slot already holds a partial sum of this block;
            # otherwise it is the block's first touch (with beta == 1 the first GEMM also has
            # op.beta == 1, so op.beta alone cannot tell).
            starts = op.kind is OpKind.FILL or not (
                previous is not None and previous[:2] == ("C", op.key) and previous[2] != "input")
            if op.kind is OpKind.GEMM:
                q = op.q
                a_tag, b_tag = content.get(op.src[0]), content.get(op.src[1])
                if not _whole(a_tag, "A", (i, q), region_of):
                    raise ScheduleError(f"{op}: A slot {op.src[0]} holds {a_tag}, expected all of A{(i, q)}")
                if not _whole(b_tag, "B", (q, j), region_of):
                    raise ScheduleError(f"{op}: B slot {op.src[1]} holds {b_tag}, expected all of B{(q, j)}")
                if op.alpha != prob.alpha:
                    raise ScheduleError(f"{op}: alpha {op.alpha}, expected {prob.alpha}")
                accumulated[(i, j, q)] += 1
                panels = frozenset({q})
            else:
                if prob.computes_product:
                    raise ScheduleError(f"{op}: FILL although a product is computed")
                panels = frozenset()
            if starts:
                # The first touch of this C block: beta * C (read) or nothing (beta == 0).
                want_beta = prob.beta if prob.reads_c else 0.0
                if op.beta != want_beta:
                    raise ScheduleError(f"{op}: starts C{op.key} with beta={op.beta}, expected {want_beta}")
                if prob.reads_c and not _whole(previous, "C", op.key, region_of):
                    raise ScheduleError(f"{op}: scales {previous}, expected all of C{op.key} as read")
                if (c_slot in op.src) != (op.beta != 0):
                    raise ScheduleError(f"{op}: reads C exactly when beta != 0")
                content[c_slot] = ("C", op.key, panels, None)
            else:
                if op.beta != 1.0 or c_slot not in op.src:
                    raise ScheduleError(f"{op}: accumulates into C{op.key} with beta={op.beta} "
                                        f"and sources {op.src}, expected beta=1 reading {c_slot}")
                content[c_slot] = ("C", op.key, previous[2] | panels, None)
        elif op.kind is OpKind.DOWNLOAD:
            tag = content.get(op.src[0])
            lo, hi, total = expect_stripe(op, "C", op.key)
            if op.offset != lo:
                raise ScheduleError(f"{op}: stripe {lo}:{hi} downloaded from offset {op.offset}")
            if tag is None or tag[:2] != ("C", op.key) or tag[2] == "input":
                raise ScheduleError(f"{op}: downloads {tag}, expected C{op.key}")
            content[op.dst] = ("C", op.key, tag[2], frozenset({(lo, hi)}))
        elif op.kind is OpKind.WRITE:
            tag = content.get(op.src[0])
            lo, hi, total = expect_stripe(op, "C", op.key)
            want = frozenset(range(nk)) if prob.computes_product else frozenset()
            if tag is None or tag[:2] != ("C", op.key) or tag[2] != want:
                raise ScheduleError(f"{op}: writes {tag}, expected C{op.key} with panels {sorted(want)}")
            if tag[3] is not None and tag[3] != frozenset({(lo, hi)}):
                raise ScheduleError(f"{op}: writes stripe {lo}:{hi} from a buffer holding {tag[3]}")
            written.setdefault(op.key, []).append((lo, hi))

    for key, stripes in written.items():
        (r0, r1), (c0, c1) = region_of("C", key)
        total = (r1 - r0) * (c1 - c0)
        covered = sorted(stripes)
        if covered[0][0] != 0 or covered[-1][1] != total or any(
                a[1] != b[0] for a, b in zip(covered, covered[1:])):
            raise ScheduleError(f"C{key}: stripes {covered} do not cover its {total} elements exactly once")
    expected_blocks = {(i, j) for i in range(p) for j in range(q_blocks)}
    if set(written) != expected_blocks:
        missing = expected_blocks - set(written)
        raise ScheduleError(f"C blocks never written: {sorted(missing)[:5]}")
    if prob.computes_product:
        for key, times in accumulated.items():
            if times != 1:
                raise ScheduleError(f"panel {key} accumulated {times} times")
        if len(accumulated) != p * q_blocks * nk:
            raise ScheduleError(f"{len(accumulated)} (i, j, q) products, expected {p * q_blocks * nk}")


def _check_tiling(what: str, splits: tuple[int, ...], extent: int) -> None:
    if splits[0] != 0 or splits[-1] != extent or any(b <= a for a, b in zip(splits, splits[1:])):
        if not (extent == 0 and splits == (0,)):
            raise ScheduleError(f"{what} {splits} do not tile [0, {extent})")


def _merge(ranges) -> frozenset:
    """Union of [lo, hi) ranges, merged where they touch."""
    merged: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return frozenset((lo, hi) for lo, hi in merged)


def _whole(tag, operand: str, key, region_of) -> bool:
    """True when a slot's tag holds all of operand[key] as read from storage."""
    if tag is None or tag[:3] != (operand, key, "input"):
        return False
    (r0, r1), (c0, c1) = region_of(operand, key)
    return tag[3] == frozenset({(0, (r1 - r0) * (c1 - c0))})

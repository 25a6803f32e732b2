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


def _check_hazards(schedule: Schedule) -> None:
    ops = schedule.ops
    ancestors: list[int] = []  # bitset per op of every op that happens before it
    last_writer: dict[str, int] = {}
    readers_since_write: dict[str, list[int]] = {}
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
            writer = last_writer.get(slot)
            if writer is None:
                raise ScheduleError(f"{op}: reads slot {slot} that nothing wrote")
            if not before(writer):
                raise ScheduleError(f"{op}: reads {slot} without waiting for its writer #{writer} (RAW)")
            readers_since_write.setdefault(slot, []).append(op.index)
        if op.dst is not None:
            slot = op.dst
            if slot not in schedule.slots:
                raise ScheduleError(f"{op}: writes unknown slot {slot}")
            for reader in readers_since_write.get(slot, []):
                if reader != op.index and not before(reader):
                    raise ScheduleError(
                        f"{op}: overwrites {slot} before its reader #{reader} finished (WAR)")
            writer = last_writer.get(slot)
            if writer is not None and not before(writer):
                raise ScheduleError(f"{op}: writes {slot} concurrently with #{writer} (WAW)")
            last_writer[slot] = op.index
            readers_since_write[slot] = []


def _check_dataflow(schedule: Schedule, plan) -> None:
    prob = plan.problem
    rows, cols, ks = plan.row_splits, plan.col_splits, plan.k_splits
    p, q_blocks, nk = plan.grid
    _check_tiling("rows", rows, prob.m)
    _check_tiling("columns", cols, prob.n)
    if prob.computes_product:
        _check_tiling("K panels", ks, prob.k)
    content: dict[str, tuple] = {}
    written: Counter = Counter()
    accumulated: Counter = Counter()

    def expect_region(op, operand, key):
        if operand == "A":
            i, q = key
            want = ((rows[i], rows[i + 1]), (ks[q], ks[q + 1]))
            want = want[::-1] if prob.trans_a else want
        elif operand == "B":
            q, j = key
            want = ((ks[q], ks[q + 1]), (cols[j], cols[j + 1]))
            want = want[::-1] if prob.trans_b else want
        else:
            i, j = key
            want = ((rows[i], rows[i + 1]), (cols[j], cols[j + 1]))
        if op.region != want:
            raise ScheduleError(f"{op}: region {op.region}, expected {want}")
        (r0, r1), (c0, c1) = want
        capacity = schedule.slots.get(op.dst or op.src[0], 0)
        if (r1 - r0) * (c1 - c0) > capacity:
            raise ScheduleError(f"{op}: {r1 - r0}x{c1 - c0} does not fit its slot ({capacity} elements)")

    for op in schedule.ops:
        if op.kind is OpKind.READ:
            if op.operand in ("A", "B") and not prob.computes_product:
                raise ScheduleError(f"{op}: reads {op.operand} although no product is computed")
            if op.operand == "C" and not prob.reads_c:
                raise ScheduleError(f"{op}: reads C although beta == 0")
            expect_region(op, op.operand, op.key)
            content[op.dst] = (op.operand, op.key, "input")
        elif op.kind is OpKind.UPLOAD:
            tag = content.get(op.src[0])
            if tag is None or tag[:2] != (op.operand, op.key):
                raise ScheduleError(f"{op}: uploads {tag}, expected {op.operand}{op.key}")
            content[op.dst] = tag
        elif op.kind in (OpKind.GEMM, OpKind.FILL):
            i, j = op.key
            c_slot = op.dst
            previous = content.get(c_slot)
            starts = op.beta != 1.0 or op.kind is OpKind.FILL
            if op.kind is OpKind.GEMM:
                q = op.q
                a_tag, b_tag = content.get(op.src[0]), content.get(op.src[1])
                if a_tag is None or a_tag[:2] != ("A", (i, q)):
                    raise ScheduleError(f"{op}: A slot {op.src[0]} holds {a_tag}, expected A{(i, q)}")
                if b_tag is None or b_tag[:2] != ("B", (q, j)):
                    raise ScheduleError(f"{op}: B slot {op.src[1]} holds {b_tag}, expected B{(q, j)}")
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
                if prob.reads_c and (previous is None or previous != ("C", op.key, "input")):
                    raise ScheduleError(f"{op}: scales {previous}, expected C{op.key} as read")
                if (c_slot in op.src) != (op.beta != 0):
                    raise ScheduleError(f"{op}: reads C exactly when beta != 0")
                content[c_slot] = ("C", op.key, panels)
            else:
                if previous is None or previous[:2] != ("C", op.key) or previous[2] == "input":
                    raise ScheduleError(f"{op}: accumulates into {previous}, expected C{op.key}")
                content[c_slot] = ("C", op.key, previous[2] | panels)
        elif op.kind is OpKind.DOWNLOAD:
            content[op.dst] = content.get(op.src[0])
        elif op.kind is OpKind.WRITE:
            tag = content.get(op.src[0])
            expect_region(op, "C", op.key)
            want = frozenset(range(nk)) if prob.computes_product else frozenset()
            if tag is None or tag[:2] != ("C", op.key) or tag[2] != want:
                raise ScheduleError(f"{op}: writes {tag}, expected C{op.key} with panels {sorted(want)}")
            written[op.key] += 1

    expected_blocks = {(i, j) for i in range(p) for j in range(q_blocks)}
    if set(written) != expected_blocks or any(v != 1 for v in written.values()):
        missing = expected_blocks - set(written)
        twice = [k for k, v in written.items() if v != 1]
        raise ScheduleError(f"C blocks not written exactly once: missing {sorted(missing)[:5]}, "
                            f"repeated {twice[:5]}")
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

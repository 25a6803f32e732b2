"""Each rule of the schedule checker, broken once: the schedule of a small plan with one
operation changed (or dropped) fails with the rule's message. test_schedule.py mutates schedules
at random; these are the rules that no random mutation there reaches."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from test_schedule import make_plan, with_op, without

import oocgemm
from oocgemm.planning import OpKind, ScheduleError, Work, check_schedule


def staged_plan():
    """Two C blocks of 3 rows, two K panels; C read (beta != 0) and staged in row stripes."""
    return make_plan(6, 5, 4, (3, 5, 2), beta=-0.5, staged=True, stripe=5, n_stage=2, n_out=2)


def unstaged_plan():
    return make_plan(6, 5, 4, (3, 5, 2), beta=-0.5)


def gram_plan():
    """X^T X: diagonal blocks mirrored stripe by stripe (each block split, as the CUDA
    executor's are), the blocks above transposed across."""
    x = np.ones((60, 48))
    plan = oocgemm.plan(x, x, device="cpu", trans_a=True, tile=(16, 16, 30))
    assert plan.symmetric
    return replace(plan, staging=replace(plan.staging, split_blocks="every"))


def nth(schedule, kind: OpKind, n: int = 0, **where):
    return [op for op in schedule.ops if op.kind is kind
            and all(getattr(op, k) == v for k, v in where.items())][n]


def changed(schedule, which: OpKind, n: int = 0, where=None, **changes):
    """The schedule with its ``n``-th operation of kind ``which`` changed."""
    op = nth(schedule, which, n, **(where or {}))
    return with_op(schedule, replace(op, **changes))


def dropped(schedule, kind: OpKind, n: int = 0, **where):
    return without(schedule, nth(schedule, kind, n, **where).index)


def misplaced(schedule):
    ops = list(schedule.ops)
    ops[3] = replace(ops[3], index=7)
    return dataclasses.replace(schedule, ops=tuple(ops))


def all_but_writes_of(schedule, key):
    for op in reversed(schedule.ops):
        if op.kind is OpKind.WRITE and op.key == key:
            schedule = without(schedule, op.index)
    return schedule


CASES = {
    # the hazard pass
    "op at another position": (staged_plan, misplaced, "is at position 3"),
    "reads an unknown slot": (staged_plan, lambda s: changed(s, OpKind.GEMM, src=("Z0", "B0")),
                              "reads unknown slot Z0"),
    "writes an unknown slot": (staged_plan, lambda s: changed(s, OpKind.READ, dst="Z0"),
                               "writes unknown slot Z0"),
    # the data flow: loads
    "a read larger than its slot": (
        staged_plan, lambda s: changed(s, OpKind.READ, region=((0, 2), (0, 5))),
        r"writes sR0\[0:10\] past its 5 elements"),
    "a stripe uploaded at another offset": (
        staged_plan, lambda s: changed(s, OpKind.UPLOAD, 1, offset=0),
        "stripe 5:10 uploaded at offset 0"),
    # GEMM and FILL
    "a GEMM at another offset": (
        staged_plan, lambda s: changed(s, OpKind.GEMM, offset=5, region=((0, 1), (0, 5))),
        r"rows 0:5 of C\(0, 0\) at offset 5"),
    "a GEMM past its C slot's end": (staged_plan, lambda s: changed(s, OpKind.GEMM, offset=5),
                                     r"reads C0\[5:20\] past its 15 elements"),
    "an upload past its slot's end": (
        staged_plan, lambda s: changed(s, OpKind.UPLOAD, 1, offset=12),
        r"writes C0\[12:17\] past its 15 elements"),
    "a GEMM over rows in mixed states": (
        unstaged_plan,
        lambda s: changed(s, OpKind.READ, where={"operand": "C"}, region=((0, 2), (0, 5))),
        r"rows 0:15 of C\(0, 0\) are in mixed states \['input', None\]"),
    "a FILL in a product": (staged_plan, lambda s: changed(s, OpKind.GEMM, kind=OpKind.FILL),
                            "FILL although a product is computed"),
    "the first GEMM scales another block's C": (
        unstaged_plan,
        lambda s: changed(s, OpKind.READ, where={"operand": "C"}, key=(1, 0),
                          region=((3, 6), (0, 5))),
        r"scales None, expected rows 0:15 of C\(0, 0\) as read"),
    "the first GEMM does not read C": (
        staged_plan, lambda s: changed(s, OpKind.GEMM, src=("A0", "B0")),
        "reads C exactly when beta != 0"),
    "a later GEMM scales what it accumulates": (
        staged_plan, lambda s: changed(s, OpKind.GEMM, 1, beta=0.5),
        r"accumulates into C\(0, 0\) with beta=0.5"),
    # MIRROR and TRANSPOSE (a symmetric product)
    "a MIRROR out of another slot": (
        gram_plan, lambda s: changed(s, OpKind.MIRROR, src=("C0", "C0")),
        "not a diagonal block of a symmetric product in its own slot"),
    "a MIRROR at another offset": (gram_plan, lambda s: changed(s, OpKind.MIRROR, 1, offset=0),
                                   r"rows 64:128 of C\(0, 0\) at offset 0"),
    "a MIRROR before the last panel": (
        gram_plan, lambda s: dropped(s, OpKind.GEMM, 1), "mirrors rows 0:64 of C"),
    "a TRANSPOSE into another region": (
        gram_plan, lambda s: changed(s, OpKind.TRANSPOSE, region=((16, 32), (0, 15))),
        "not a block across the diagonal"),
    "a TRANSPOSE before the last panel": (
        gram_plan, lambda s: dropped(s, OpKind.GEMM, 8), r"transposes C\(0, 1\) before"),
    # DOWNLOAD and WRITE
    "a stripe downloaded from another offset": (
        staged_plan, lambda s: changed(s, OpKind.DOWNLOAD, 1, offset=0),
        "stripe 5:10 downloaded from offset 0"),
    "a write that adds C": (staged_plan, lambda s: changed(s, OpKind.WRITE, beta=1.0),
                            "adds 1.0 times C as it writes, expected 0.0"),
    "a write of another block's buffer": (
        staged_plan, lambda s: changed(s, OpKind.WRITE, key=(1, 0), region=((3, 4), (0, 5))),
        r"writes \('C', \(0, 0\).*expected C\(1, 0\) with panels"),
    "a write of another stripe": (
        staged_plan, lambda s: changed(s, OpKind.WRITE, 1, region=((0, 1), (0, 5))),
        r"writes stripe 0:5 from a buffer holding frozenset\(\{\(5, 10\)\}\)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rule_is_enforced(case):
    make, mutate, message = CASES[case]
    plan = make()
    check_schedule(plan.schedule, plan)  # unmutated: fine
    with pytest.raises(ScheduleError, match=message):
        check_schedule(mutate(plan.schedule), plan)


def test_products_of_blocks_the_plan_leaves_out_are_caught():
    """A schedule that computes a block the plan leaves out, and does not write it."""
    plan = unstaged_plan()
    picked = replace(plan, work=Work(blocks=((0, 0),)))
    schedule = all_but_writes_of(plan.schedule, (1, 0))
    with pytest.raises(ScheduleError, match=r"4 \(i, j, q\) products, expected 2"):
        check_schedule(schedule, picked)

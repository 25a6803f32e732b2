"""A plan made ready to run once its tile is chosen (by the planner, the user, a resume or a
replan after memory ran short: :mod:`oocgemm.planning.planner`): stripes no larger than its
regions, validated against its budgets, and the operands it decodes straight into the ring
or keeps whole in host memory chosen for that tile."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ..errors import OOCGemmError
from ..units import format_seconds, format_size
from .plan import Plan, with_ring_decodes

#: A tile the user gave is advised against (:func:`with_tile_advice`) where it is predicted
#: to take more than this many times as long as the planner's own choice, and more than
#: :data:`ADVICE_FLOOR` seconds longer (a product of milliseconds is left alone).
SLOWER_THAN_PLANNER = 3.0
ADVICE_FLOOR = 0.1

def finished(plan: Plan) -> Plan:
    """``plan`` with its tile chosen, ready to run (a plan finished again, for another tile,
    decides its ring decodes and kept operands anew, and decodes on the host)."""
    if plan.staged and not plan.in_core:  # small products need no 32 MB stripes
        w, h, r = plan.tile
        default = int(Plan.__dataclass_fields__["stripe"].default)  # type: ignore[arg-type]
        plan = dataclasses.replace(plan, stripe=min(default, max(w * r, r * h, w * h)))
    # (inputs decoded on the device are asked for of a finished plan, its tile in hand:
    # oocgemm.planning.planner.decoded_on_device; a replan's tile may cut their objects)
    host_io = dataclasses.replace(plan.io, cache=(), into_ring=(), gpu_decode=())
    done = with_cache(with_ring_decodes(with_resident_panels(
        dataclasses.replace(plan, io=host_io)).validate()))
    return dataclasses.replace(done, decisions=tuple(
        d for d in done.decisions if not d.startswith(FINISHING)) + _finishing(done))


#: The steps :func:`finished` takes for a tile, as its decisions name them.
FINISHING = ("stripes: ", "ring decodes: ", "kept chunks: ")


def _finishing(plan: Plan) -> tuple[str, ...]:
    """What :func:`finished` chose for ``plan``'s tile, in words (:attr:`Plan.decisions`)."""
    said = []
    if plan.staged:
        said.append(f"stripes: ring buffers of {format_size(plan.stripe * plan.problem.itemsize)}"
                    f" (stripes of whole rows, no larger than the tile's regions)")
    if plan.io.into_ring:
        said.append(f"ring decodes: {' and '.join(plan.io.into_ring)} decoded straight into the "
                    f"pinned ring (every read one whole chunk, read once)")
    if plan.io.cache:
        said.append(f"kept chunks: {' and '.join(plan.io.cache)} kept in host memory as decoded "
                    f"({format_size(plan.cache_bytes)} of host_memory_limit), each chunk "
                    f"decoded once")
    return tuple(said)


def with_tile_advice(plan: Plan, planner: Callable[[], Plan]) -> Plan:
    """``plan`` (of a tile the user gave) with a warning where its predicted time is more than
    :data:`SLOWER_THAN_PLANNER` times (and :data:`ADVICE_FLOOR` seconds more than) that of
    the plan ``planner()`` makes without the tile (the same problem, budgets and device):
    both predictions, and the advice to leave ``tile=`` out (:attr:`Plan.warnings`, which
    making the plan warns of). Unchanged where the planner finds no plan of its own."""
    try:
        chosen = planner()
    except OOCGemmError:
        return plan
    mine, theirs = plan.prediction.total, chosen.prediction.total
    if mine <= SLOWER_THAN_PLANNER * theirs or mine - theirs <= ADVICE_FLOOR:
        return plan
    (w, h, r), (w0, h0, r0) = plan.tile, chosen.tile
    return dataclasses.replace(plan, warnings=plan.warnings + (
        f"tile=({w}, {h}, {r}) is predicted to take {format_seconds(mine)}, "
        f"{mine / theirs:.1f} times the {format_seconds(theirs)} of the planner's own choice "
        f"for this product and these budgets (w={w0} h={h0} r={r0}); leave tile= out to let "
        f"the planner choose",))


def with_resident_panels(plan: Plan) -> Plan:
    """``plan`` (unstaged: the CPU's) with a slot for every panel of an input, where it has
    more panels than slots, so that each panel is read once and kept (:attr:`Plan.resident`)
    rather than again for every C block (two reads for each GEMM with the default two
    slots): for an input used in place (:attr:`Plan.in_place`) always, its slots being views
    of it (no memory); for one read from storage or copied, where its panels fit in what the
    rest of the plan leaves of memory_limit (the smaller input first; not one matrix in both
    roles). Said in the plan's notes. The GEMMs and their order are the same, and so are the
    bits. (4000² in 128³ blocks: 38,921 operations instead of 100,363; from .npy files on the
    2-core VM 7.2 s instead of 20; Zarr 3000², 3.0 s instead of 8.0.)"""
    prob = plan.problem
    if plan.staged or not prob.computes_product:
        return plan
    p, q, nk = plan.grid
    notes = list(plan.notes)
    inputs = sorted((("A", "n_a", p * nk), ("B", "n_b", q * nk)),
                    key=lambda x: prob.operand_bytes(x[0]))
    for name, field, panels in inputs:
        if getattr(plan.staging, field) >= panels or (name == "A" and nk == 1):
            continue  # (one K panel: each of A's is shared by its row of blocks already)
        staging = (dataclasses.replace(plan.staging, n_a=panels) if field == "n_a"
                   else dataclasses.replace(plan.staging, n_b=panels))
        trial = dataclasses.replace(plan, staging=staging)
        if name in plan.in_place:
            notes.append(f"{name} in place: a slot (a view, no memory) for each of its {panels} "
                         f"panels, each read once")
        elif not prob.shared and trial.device_bytes <= plan.memory_limit:
            size = trial.device_bytes - plan.device_bytes
            notes.append(f"{name} kept as read: a slot for each of its {panels} panels "
                         f"({format_size(size)} of memory_limit), each read once")
        else:
            continue
        plan = trial
    return dataclasses.replace(plan, notes=tuple(notes)) if len(notes) > len(plan.notes) \
        else plan


def with_cache(plan: Plan) -> Plan:
    """Keep the decoded chunks of chunked on-disk operands (Zarr) in host memory for the whole
    run where they fit in what the rest leaves of host_memory_limit (a kept operand no longer
    needs its streaming window): every chunk is then read and decoded once, and the decoders
    run ahead of the executor as far as storage allows (storage is many times slower than
    PCIe). Those that streaming would decode more than once (panels reloaded, chunks cut
    by panel edges) come first, the most repeated decode bytes first; then the larger. A .npy
    memmap is left to the OS page cache, which already is that cache: a copy of it cost the
    GPU benchmark much of its rate from warm .npy files (docs/performance.md, "Figures moved
    from the code's docstrings")."""
    priority = {}
    for report in plan.chunk_reports():
        if report.operand in ("A", "B"):
            repeated = (report.decodes - report.n_chunks) * report.chunks[0] * report.chunks[1]
            priority[report.operand] = (repeated, plan.problem.operand_bytes(report.operand))
    chosen: tuple[str, ...] = ()
    ringed = set(plan.io.into_ring)  # decoded into the ring: nothing to keep
    for name in sorted((x for x in priority if x not in ringed), key=lambda x: priority[x],
                       reverse=True):
        kept = ("A", "B") if plan.problem.shared else (name,)  # one matrix: kept for both
        trial = dataclasses.replace(plan, io=dataclasses.replace(
            plan.io, cache=tuple(sorted(set(chosen + kept)))))
        if trial.host_bytes <= plan.host_memory_limit:
            chosen = trial.io.cache
    if not chosen:
        return plan
    return dataclasses.replace(plan, io=dataclasses.replace(plan.io, cache=chosen)).validate()


def on_object_edges(plan: Plan, operands: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """Tiles near ``plan.tile`` whose blocks and K panels start on the stored objects' edges
    of ``operands`` (what decoding them on the device needs, :attr:`Plan.io.gpu_decode`),
    largest blocks first: the K panel rounded up to a common multiple of their objects' K
    sides; the block's rows (of A's objects) and columns (of B's) rounded up, then halved on
    the objects' edges down to one object. The blocks start on the output's chunk edges
    too, where it has chunks of its own (C blocks that cut its chunks are gathered across
    blocks, and no stripe of them is compressed on the device: blocks that cut the output's
    chunks took far longer than blocks on them, docs/performance.md, "C compressed on the
    GPU by default"): where no common multiple fits, the whole extent. Each clipped to the
    problem."""
    prob = plan.problem
    w, h, r = plan.tile
    out = prob.out.chunks if prob.out is not None and prob.out.chunks else (1, 1)
    sides = {"w": out[0], "h": out[1], "k": 1}
    for name in operands:
        x = plan.problem_operand(name)
        rows, cols = x.chunks
        if (prob.trans_a if name == "A" else prob.trans_b):
            rows, cols = cols, rows  # (op(A)'s rows, its K) or (op(B)'s K, its columns)
        if name == "A":
            sides["w"], sides["k"] = math.lcm(sides["w"], rows), math.lcm(sides["k"], cols)
        else:
            sides["h"], sides["k"] = math.lcm(sides["h"], cols), math.lcm(sides["k"], rows)

    def choices(x: int, side: int, extent: int) -> list[int]:
        found, x = [], min(-(-x // side) * side, extent)
        while True:
            found.append(x)
            if x <= side:
                return found
            x = max(side, x // 2 // side * side)

    depth = min(-(-r // sides["k"]) * sides["k"], prob.k)
    tiles = [(a, b, depth) for a in choices(w, sides["w"], prob.m)
             for b in choices(h, sides["h"], prob.n)]
    return sorted(dict.fromkeys(tiles), key=lambda t: -t[0] * t[1])

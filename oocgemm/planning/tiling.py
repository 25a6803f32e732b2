"""The planner: choose the C block w×h and the K panel r from the memory budgets.

Pure Python: it sees a :class:`Problem` (shapes, dtype, chunking) and budgets in bytes, never
storage. Its choice becomes a frozen :class:`~oocgemm.planning.plan.Plan`
(:mod:`oocgemm.planning.plan`) that validates itself and expands into the schedule that every
executor replays.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import BudgetError, operand_name
from ..kernel_catalog import DEFAULT
from ..strategies import Native, strategy_of
from ..units import format_seconds, format_size
from .chunks import assembly_bytes, most_touched, window_bytes
from .model import DeviceModel
from .problem import Problem
from .schedule import stripe_rows
from .staging import StagingSettings

#: Per-operation dispatch cost the CUDA model charges (Python, stream and thread hand-offs),
#: seconds: :attr:`DeviceModel.op_overhead <oocgemm.planning.model.DeviceModel.op_overhead>`'s
#: default.
OP_OVERHEAD = 40e-6
#: A budget is refused when its best tile is predicted to take more than SLOWDOWN times the
#: product's time with every operand read once (the whole product as one tile), and more than
#: SLOW_FLOOR seconds: such a budget turns the run into millions of tiny operations.
SLOWDOWN = 20.0
SLOW_FLOOR = 10.0
#: Elements of a staged plan's ring buffer (32 MiB of float64): pageable -> pinned copies
#: of a stripe by many reader threads at once.
DEFAULT_STRIPE = 4 << 20


@dataclass(frozen=True)
class Buffers:
    """Bytes of every buffer the executor allocates for a plan."""

    c: int
    """Each C block buffer (C0, C1...), device side."""
    a: int
    """Each A panel buffer (A0, A1...), device side."""
    b: int
    """Each B panel buffer (B0, B1...), device side."""
    accumulator: int
    """Scratch for accumulating into C where the executor needs it (CPU), device side."""
    ring: int
    """Each pinned ring buffer for what goes up (0 when the plan is not staged): a stripe of
    whole rows, at least one row of the widest region."""
    out_ring: int = 0
    """Each pinned ring buffer for C stripes coming down: as ``ring``, but never larger than
    the default stripe (a ring of whole chunks, :attr:`Plan.io.into_ring`, is for what goes up)."""
    a_converted: int = 0
    """Beside each A buffer, its panel converted for emulated products (``kernel='ozaki'``
    on a GPU): residues and the rows' exponents."""
    b_converted: int = 0
    """Beside each B buffer, its converted panel."""
    emulation: int = 0
    """The emulation's int32 products of a chunk of C's rows, device side."""


def _default(strategy: Native | None) -> Native:
    """``strategy``, or the default kernel's (cuBLAS on a GPU, numpy's BLAS on the CPU)."""
    return strategy if strategy is not None else strategy_of(DEFAULT)


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds per resource for a tiling; the pipelined run takes about ``total``."""

    compute: float
    h2d: float
    d2h: float
    storage_read: float
    storage_write: float
    host_copy: float
    """Copies between host memory and the executor's buffers (staging, in-memory operands)."""
    fill: float
    drain: float
    overhead: float
    """Seconds of the operations' dispatch (``operations`` at the model's
    :attr:`~oocgemm.planning.model.DeviceModel.op_overhead`)."""
    decode: float = 0.0
    """Decoding chunks of compressed storage (the decoder threads together)."""
    device_decode: float = 0.0
    """Decoding the panels of operands decoded on the device (its decode stream)."""
    operations: int = 0
    """About how many operations the schedule has (:func:`_operations`)."""

    @property
    def bound(self) -> str:
        resources = self._resources()
        return max(resources, key=resources.__getitem__)

    def _resources(self) -> dict[str, float]:
        return {"compute": self.compute, "h2d": self.h2d, "d2h": self.d2h,
                "storage_read": self.storage_read, "decode": self.decode,
                "device_decode": self.device_decode,
                "storage_write": self.storage_write, "host_copy": self.host_copy}

    @property
    def total(self) -> float:
        return max(self._resources().values()) + self.fill + self.drain + self.overhead

    def parts(self) -> dict[str, float]:
        """Seconds of each resource, and the fill, drain and dispatch the total adds to the
        largest of them."""
        return {**self._resources(), "fill": self.fill, "drain": self.drain,
                "overhead": self.overhead}

    def describe(self) -> str:
        return ", ".join(f"{name.replace('_', ' ')} {format_seconds(v)}"
                         for name, v in self._resources().items() if v)


def tile_buffers(prob: Problem, tile: tuple[int, int, int], model: DeviceModel, stripe: int,
                 strategy: Native | None = None) -> Buffers:
    """Buffer sizes in bytes; ``stripe`` is the ring buffer's elements (0: not staged). A GPU
    that emulates (``kernel='ozaki'``, staged) keeps each panel's conversion beside it."""
    w, h, r = tile
    s = prob.itemsize
    product = prob.computes_product
    c = w * h * s
    a = w * r * s if product else 0
    b = r * h * s if product else 0
    acc = c if (model.accumulate_pass and product and (prob.k > r or prob.reads_c)) else 0
    ring = max(stripe, w, h, r) * s if stripe else 0
    out_ring = max(min(stripe, DEFAULT_STRIPE), w, h) * s if stripe else 0
    conv = _default(strategy).converted(*prob.clipped(tile)) if stripe and product else None
    if conv is None:
        return Buffers(c=c, a=a, b=b, accumulator=acc, ring=ring, out_ring=out_ring)
    return Buffers(c=c, a=a, b=b, accumulator=acc, ring=ring, out_ring=out_ring,
                   a_converted=conv.a,
                   b_converted=conv.b, emulation=conv.scratch)


def device_bytes(buf: Buffers, n_c: int, n_a: int, n_b: int) -> int:
    """Device-side bytes of a plan's buffers with ``n_c``, ``n_a`` and ``n_b`` slots."""
    return (n_c * buf.c + n_a * (buf.a + buf.a_converted) + n_b * (buf.b + buf.b_converted)
            + buf.accumulator + buf.emulation)


def decode_window(prob: Problem, tile: tuple[int, int, int], kept: tuple[str, ...] = ()) -> int:
    """Bytes of decoded chunks that the streamed chunked operands hold at most: the chunks of
    two loads of each (the load being read, and the next one its decoders run ahead into),
    each load's region placed on multiples of its shape; where the product is one C block,
    every load follows the one before it along K, and the two span ``2r`` of it. One matrix
    in both roles of a Gram product holds, per step, the chunks along K of both roles'
    columns, counted once."""
    w, h, r = tile
    one_block = w >= prob.m and h >= prob.n
    # per role: the operand, the stored axis that is K, its width across K
    roles = {"A": (prob.a, prob.k_axis("A"), w), "B": (prob.b, prob.k_axis("B"), h)}

    def two_loads(name: str, both: bool = False) -> int:
        x, along, width = roles[name]
        assert x.chunks is not None
        k_chunk, o_chunk = x.chunks[along], x.chunks[1 - along]
        k_total, o_total = x.shape[along], x.shape[1 - along]
        k_chunks = (most_touched(2 * r, k_chunk, k_total, step=r) if one_block
                    else 2 * most_touched(r, k_chunk, k_total))
        across = most_touched(width, o_chunk, o_total)
        if both:  # a Gram product: B reads the same K rows of X, h wide
            across = min(across + most_touched(h, o_chunk, o_total), -(-o_total // o_chunk))
        return k_chunks * across * k_chunk * o_chunk * prob.itemsize

    total = 0
    if prob.computes_product:
        if prob.shared:  # one reader for both roles
            if "A" not in kept and prob.a.decoded:
                total += two_loads("A", both=True) if prob.gram else (two_loads("A")
                                                                      + two_loads("B"))
        else:
            total += sum(two_loads(name) for name in ("A", "B")
                         if name not in kept and roles[name][0].decoded)
    c = prob.c
    if prob.reads_c and c is not None and c.decoded and "C" not in kept:
        total += 2 * window_bytes((w, h), c.chunks, prob.itemsize, c.shape)
    return total


def assembly_window(prob: Problem, tile: tuple[int, int, int], ring: int, min_stripes: int,
                    chunks: tuple[int, int] | None = None) -> int:
    """Bytes of output chunks assembled in host memory (:func:`.chunks.assembly_bytes`) when
    C blocks of ``tile`` leave a staged ring of ``ring`` elements in stripes (0: not staged,
    blocks are written whole); ``chunks``: the output's (default: the problem's output
    operand's, where it is on disk)."""
    if chunks is None and prob.out is not None and prob.out.on_disk:
        chunks = prob.out.chunks
    block = (min(tile[0], prob.m), min(tile[1], prob.n))
    if not chunks or min(block) == 0:  # an empty product writes nothing
        return 0
    stripe = stripe_rows(*block, ring, min_stripes) if ring else 0
    return assembly_bytes(block, chunks, stripe, prob.itemsize)


def _amplification(size: int, chunk: int | None, on_disk: bool) -> float:
    """How many bytes are read per byte wanted when panels of ``size`` cut chunks of ``chunk``."""
    if not on_disk or not chunk or size <= 0:
        return 1.0
    return max(1.0, min(most_touched(size, chunk) * chunk, size + 2 * chunk) / size)


def predict(prob: Problem, tile: tuple[int, int, int], model: DeviceModel, *, staged: bool,
            split_last: int = 1, split_blocks: str = "every", ramp: int = 0, tail: int = 1,
            cache: tuple[str, ...] = (),
            decodes: dict | None = None, stripe: int = 4 << 20, min_stripes: int = 1,
            strategy: Native | None = None, symmetric: bool = False, in_core: bool = False,
            gpu_decode: tuple[str, ...] = (), resident: tuple[str, ...] = ()) -> Prediction:
    """Predict each resource's busy time for a tiling (seconds). ``split_last`` and ``ramp``
    shrink the drain (one row stripe of the last block) and the fill (the first piece of the
    first panel); ``split_blocks``: whether every block's tail runs in ``split_last`` GEMMs
    (``'every'``) or the run's last block's only (``'last'``). ``decodes``: the plan's
    :class:`~oocgemm.planning.chunks.ChunkReport` per operand, when known (else the chunk
    decodes are estimated from the tile). ``stripe`` and ``min_stripes``: a staged plan's ring
    buffer (elements) and the fewest stripes a region is cut into, which set how many operations
    each load takes. ``strategy``: the kernel's (:attr:`Plan.strategy
    <oocgemm.planning.plan.Plan.strategy>`; cuBLAS where None), its compute time where it
    differs from the dtype's GEMM (``kernel='ozaki[:N]'`` on a GPU:
    :meth:`oocgemm.strategies.Ozaki.seconds`).
    ``symmetric``: a Gram product computed as one (the blocks on and above the diagonal, half of
    each diagonal block). ``in_core``: the in-core shape, whose first GEMM waits for all of B
    and A's first stripe.
    ``gpu_decode``: the operands whose panels the device decodes, each load all of its
    frames (:attr:`Plan.io.gpu_decode <oocgemm.planning.plan.IOChoices.gpu_decode>`). ``resident``:
    the operands whose every panel is loaded once (:attr:`Plan.resident
    <oocgemm.planning.plan.Plan.resident>`)."""
    m, n, k, s = prob.m, prob.n, prob.k, prob.itemsize
    w, h, r = prob.clipped(tile)
    p, q = math.ceil(m / w) if m else 0, math.ceil(n / h) if n else 0
    nk = math.ceil(k / r) if prob.computes_product else 0
    complex_ = prob.dtype.startswith("complex")
    busy = _busy(prob, (w, h, r), (p, q, nk), model, staged=staged,
                 strategy=_default(strategy),
                 symmetric=symmetric, decodes=decodes, cache=cache, gpu_decode=gpu_decode,
                 resident=resident)
    fill = _fill_seconds(prob, (w, h, r), nk, model, staged=staged, ramp=ramp,
                         split_last=split_last, in_core=in_core)
    # The last block's C leaves after its last panels: with `tail` panels run stripe by
    # stripe, its rows become final over those panels' time, and only what the copies cannot
    # keep up with (at least one stripe) is left at the end.
    out_disk, out_in_place = _output_kind(prob, staged)
    per_byte = 1 / (_write_rate(prob, model) if out_disk else model.memory_copy)
    per_byte += 1 / model.d2h if model.d2h else 0.0
    per_byte += 1 / model.first_touch if model.first_touch else 0.0
    block_out = 0 if out_in_place else w * h * s * per_byte
    tail_compute = min(tail, nk) * model.gemm_seconds(w, h, r, s, complex_) if nk else 0.0
    drain = max(block_out / max(1, min(split_last, w)), block_out - tail_compute)
    stripes = min(tail, nk) * (max(1, min(split_last, w)) - 1)  # GEMMs a split block adds
    every = split_blocks == "every"
    n_ops = _operations((p, q), nk, (w, h, r), staged=staged, stripe=stripe,
                        min_stripes=min_stripes, reads_c=prob.reads_c,
                        gemms=nk + (stripes if every else 0), resident=resident)
    n_ops += 0 if every else stripes
    return Prediction(**busy, fill=fill, drain=drain, overhead=n_ops * model.op_overhead,
                      operations=n_ops)


def _output_kind(prob: Problem, staged: bool) -> tuple[bool, bool]:
    """(C goes to storage, C is computed where it goes: an unstaged run's output in memory
    in a BLAS layout)."""
    out_disk = prob.out.on_disk if prob.out is not None else False
    return out_disk, prob.out is not None and prob.out.zero_copy and not staged


def _busy(prob: Problem, tile: tuple[int, int, int], grid: tuple[int, int, int],
          model: DeviceModel, *, staged: bool, strategy: Native, symmetric: bool,
          decodes: dict | None = None, cache: tuple[str, ...] = (),
          gpu_decode: tuple[str, ...] = (), resident: tuple[str, ...] = ()) -> dict[str, Any]:
    """Each resource's busy seconds over the run of the tiling ``tile`` (clipped) of
    ``grid`` blocks and panels: :class:`Prediction`'s ``compute``, ``decode``,
    ``device_decode``, ``h2d``, ``d2h``, ``storage_read``, ``storage_write`` and
    ``host_copy``. A ``resident`` operand's panels are each loaded once."""
    m, n, s = prob.m, prob.n, prob.itemsize
    w, h, _ = tile
    c_bytes = m * n * s
    a_loads, b_loads, compute = _loads_and_compute(prob, tile, grid, model, staged=staged,
                                                   strategy=strategy, symmetric=symmetric)
    if "A" in resident:
        a_loads = min(a_loads, prob.m * prob.k * s)
    if "B" in resident:
        b_loads = min(b_loads, prob.k * prob.n * s)
    c_in = c_bytes if prob.reads_c else 0
    # Chunked storage is read and decoded a whole chunk at a time: a load reads the chunks
    # its panel touches (more than the panel where its edges cut chunks), a kept operand
    # each chunk once.
    # (Along K a chunk stays decoded for the consecutive panels that share it.)
    amp_a = _amplification(w, prob.a_chunks_mk()[0], prob.a.decoded)
    amp_b = _amplification(h, prob.b_chunks_kn()[1], prob.b.decoded)
    decode = 0.0
    if model.decode:
        decode = _decode_seconds(prob, model, (a_loads, b_loads, c_in), (amp_a, amp_b),
                                 decodes, cache, gpu_decode)
        if model.decode_on_compute_cores:  # the cores that decode are the cores that compute
            compute += decode
    device_decode = _device_decode_seconds(prob, model, grid, (a_loads, b_loads), gpu_decode)
    out_disk, out_in_place = _output_kind(prob, staged)
    storage_read, storage_write, host_copy = _storage_and_copies(
        prob, model, (a_loads * amp_a, b_loads * amp_b, c_in), (amp_a, amp_b), cache,
        staged=staged, out_disk=out_disk, out_in_place=out_in_place)
    return {"compute": compute, "decode": decode, "device_decode": device_decode,
            "h2d": (a_loads + b_loads + c_in) / model.h2d if model.h2d else 0.0,
            "d2h": c_bytes / model.d2h if model.d2h else 0.0,
            "storage_read": storage_read, "storage_write": storage_write,
            "host_copy": host_copy}


def _resource_floor(prob: Problem, block: tuple[int, int], model: DeviceModel, *,
                    staged: bool, strategy: Native, symmetric: bool) -> float:
    """A floor of :func:`predict`'s total (without a plan's ``cache`` or ``decodes``) for the
    C block ``block`` (w, h) at any K depth r: its busiest resource at r = K, where each is
    least busy (A loaded the fewest times, the GEMMs' smallest overhead; a kernel that times
    its own compute, the emulation, times it no longer for a deeper panel), without fill,
    drain or overhead. A third of a prediction's cost: :func:`choose_tile` passes over the
    blocks whose floor is above a time it already has."""
    m, n, k = prob.m, prob.n, prob.k
    w, h, r = prob.clipped((block[0], block[1], k))
    p, q = math.ceil(m / w) if m else 0, math.ceil(n / h) if n else 0
    nk = 1 if prob.computes_product and k else 0
    return max(_busy(prob, (w, h, r), (p, q, nk), model, staged=staged, strategy=strategy,
                     symmetric=symmetric).values())


def _loads_and_compute(prob: Problem, tile: tuple[int, int, int], grid: tuple[int, int, int],
                       model: DeviceModel, *, staged: bool, strategy: Native,
                       symmetric: bool
                       ) -> tuple[float, float, float]:
    """Bytes of A and B loaded over the run, and the seconds of compute (GEMMs, or C's copy
    when no product is computed)."""
    m, n, k, s = prob.m, prob.n, prob.k, prob.itemsize
    w, h, r = tile
    p, q, nk = grid
    blocks = p * q
    if not (prob.computes_product and blocks):
        return 0, 0, m * n * s / model.memory_copy
    # Serpentine order: an A row panel is reloaded for every C block unless it is the
    # only K panel; B panels are reloaded for every block row.
    a_loads: float = m * k * s * (1 if nk == 1 else q)
    b_loads: float = k * n * s * p
    flops: float = prob.flops
    if symmetric:  # row i computes p - i blocks; a diagonal block takes B from A's slot
        a_loads = m * k * s * (1 if nk == 1 else (p + 1) / 2)
        b_loads = k * n * s * (p - 1) / 2
        # a block above the diagonal in full, one on it from its diagonal up
        flops = prob.flops * (p * (p - 1) / 2 + p * (w + 1) / (2 * w)) / (p * p)
    complex_ = prob.dtype.startswith("complex")
    compute = flops / (model.flops * (2.0 if s == 4 and not complex_ else 1.0)) * (
        1 + model.half_size / w + model.half_size / h + model.half_size / r)
    emulated = (strategy.seconds(prob, (w, h, r), model, a_loads + b_loads)
                if staged else None)
    if emulated is not None:
        compute = emulated
    if model.accumulate_pass:
        passes = blocks * (nk - 1 + (1 if prob.reads_c else 0))
        compute += passes * 3 * w * h * s / model.memory_copy
    return a_loads, b_loads, compute


def _decode_seconds(prob: Problem, model: DeviceModel, loads: tuple[float, float, float],
                    amps: tuple[float, float], decodes: dict | None,
                    cache: tuple[str, ...], gpu_decode: tuple[str, ...] = ()) -> float:
    """Seconds of chunk decoding on the host: the plan's reports where known, a kept
    operand's chunks once, else what the loads touch (none of an operand the device
    decodes)."""
    s = prob.itemsize
    decode = 0.0
    for name, operand, nbytes, amp in (("A", prob.a, loads[0], amps[0]),
                                       ("B", prob.b, loads[1], amps[1]),
                                       ("C", prob.c, loads[2], 1.0)):
        if operand is None or not operand.decoded or not nbytes or name in gpu_decode:
            continue
        if name == "B" and prob.shared and ("A" in (decodes or {}) or "A" in cache):
            continue  # one matrix: A's report (or A kept) counts its decodes in both roles
        report = (decodes or {}).get(name)
        if report is not None:
            decoded = report.decodes * math.prod(report.chunks) * s
        elif name in cache:
            decoded = math.prod(operand.shape) * s
        else:
            decoded = nbytes * amp
        frame = math.prod(operand.zstd_frames or operand.chunks or (1,)) * s
        decode += decoded / model.decode + decoded / frame * model.decode_frame
    return decode


def _device_decode_seconds(prob: Problem, model: DeviceModel, grid: tuple[int, int, int],
                           loads: tuple[float, float], gpu_decode: tuple[str, ...]) -> float:
    """Seconds of the device's decoding (:attr:`Plan.io.gpu_decode
    <oocgemm.planning.plan.IOChoices.gpu_decode>`): every load decodes its panel, a K step's
    panels in one batch (:func:`~oocgemm.planning.schedule.decode_batches`), which takes its
    largest frame at the rate of one frame (a thread block) and all of it at the device's
    rate."""
    if not gpu_decode or not model.device_decode:
        return 0.0
    s = prob.itemsize
    nbytes, frame = 0.0, 0
    for name, operand, loaded in (("A", prob.a, loads[0]), ("B", prob.b, loads[1])):
        if name in gpu_decode and operand is not None and operand.zstd_frames is not None:
            nbytes += loaded
            frame = max(frame, math.prod(operand.zstd_frames) * s)
    p, q, nk = grid
    return nbytes / model.device_decode + p * q * nk * frame / model.device_decode_frame


def _storage_and_copies(prob: Problem, model: DeviceModel, read: tuple[float, float, float],
                        amps: tuple[float, float], cache: tuple[str, ...], *, staged: bool,
                        out_disk: bool, out_in_place: bool) -> tuple[float, float, float]:
    """Seconds of storage reads, storage writes and host memory copies. Storage traffic runs
    at storage rates; copies between host memory and the executor's buffers share one
    resource, the host's memory bandwidth (reads and writes together). ``read``: the bytes
    A, B and C are read in (chunk amplification included)."""
    m, n, k, s = prob.m, prob.n, prob.k, prob.itemsize
    c_bytes = m * n * s
    storage_read = storage_write = host_copy = 0.0
    reads = [(read[0], prob.a, m * k * s * amps[0] if "A" in cache else None),
             (read[1], prob.b, k * n * s * amps[1] if "B" in cache else None)]
    if prob.shared and "A" in cache:  # one matrix kept: B's loads come from host memory
        reads[1] = (read[1], prob.b, 0)
    if prob.reads_c and prob.c is not None:
        reads.append((read[2], prob.c, None))
    for nbytes, operand, once in reads:
        # (stored bytes: the decoded bytes' share that storage moves)
        rate = (model.memory_copy if operand.cached else model.storage_read) / operand.stored
        if operand.on_disk and once is not None:  # read once, reloads come from host memory
            storage_read += min(once, nbytes) / rate
            host_copy += max(nbytes - once, 0) / model.memory_copy
        elif operand.on_disk:
            storage_read += nbytes / rate
        elif not (operand.zero_copy and not staged):  # else used in place
            host_copy += nbytes / model.memory_copy
    if out_disk:
        storage_write = c_bytes / _write_rate(prob, model)
    elif not out_in_place:
        host_copy += c_bytes / model.memory_copy
    return storage_read, storage_write, host_copy


def _write_rate(prob: Problem, model: DeviceModel) -> float:
    """Bytes/s C is stored at: the page cache's where it takes all of C, else the disk's."""
    taken = prob.out is not None and prob.out.cached
    return model.cache_write if taken else model.storage_write


def _fill_seconds(prob: Problem, tile: tuple[int, int, int], nk: int, model: DeviceModel, *,
                  staged: bool, ramp: int, split_last: int, in_core: bool) -> float:
    """Seconds before the first GEMM can start: the first pieces of A's and B's first
    panels read, uploaded and touched."""
    w, h, r = tile
    s = prob.itemsize
    first_panels = 0
    if prob.computes_product:
        r_first = max(r >> ramp, 1) if nk > 1 else r
        a_first = w * r_first * s // (max(split_last, 1) if in_core else 1)
        first_panels = sum(nbytes for nbytes, operand in ((a_first, prob.a),
                                                          (r_first * h * s, prob.b))
                           if not (operand.zero_copy and not staged))
    stored = any(x.on_disk and not x.cached for x in (prob.a, prob.b))
    fill = first_panels / (model.storage_read if stored else model.memory_copy)
    fill += first_panels / model.h2d if model.h2d else 0.0
    fill += first_panels / model.first_touch if model.first_touch else 0.0
    return fill


def _operations(grid: tuple[int, int], nk: int, tile: tuple[int, int, int], *, staged: bool,
                stripe: int, min_stripes: int, reads_c: bool, gemms: int,
                resident: tuple[str, ...] = ()) -> int:
    """About how many operations the schedule has: per C block (``grid``: blocks along M and
    N), a load of each K panel of A and B (a READ, or a READ and an UPLOAD per stripe when
    staged; a ``resident`` operand's panels once in all), its GEMMs, and C's store (and load
    when beta != 0). Each costs the model's ``op_overhead`` to dispatch, so the planner does
    not pick tiles whose thin panels are cut into millions of stripes."""
    w, h, r = tile
    p, q = grid
    blocks = p * q
    a_loads = (p if "A" in resident else blocks) * nk
    b_loads = (q if "B" in resident else blocks) * nk
    if not staged:
        return blocks * (gemms + 1 + (1 if reads_c else 0)) + a_loads + b_loads

    ring = max(stripe, w, h, r)  # elements of a ring buffer (Buffers.ring)
    out_ring = max(min(stripe, DEFAULT_STRIPE), w, h)  # Buffers.out_ring

    def stripes(rows: int, cols: int, buffer: int = ring) -> int:
        return -(-rows // stripe_rows(rows, cols, buffer, min_stripes))

    c_moves = 2 * stripes(w, h, out_ring) + (2 * stripes(w, h) if reads_c else 0)
    return (blocks * (gemms + c_moves)
            + 2 * (a_loads * stripes(w, r) + b_loads * stripes(r, h)))


def _candidates(extent: int, align: int | None, floor: int) -> list[int]:
    """Block sizes worth trying along one dimension: balanced splits (chunk-aligned where the
    storage has chunks) and powers of two down to 1 for the smallest budgets."""
    if extent <= 0:
        return [1]
    sizes = set()
    count = 1.0
    while True:
        size = math.ceil(extent / int(count))
        if size < floor and int(count) > 1:
            break
        sizes.add(size)
        if align and align < extent:
            sizes.add(min(math.ceil(size / align) * align, extent))
            if size > align:
                sizes.add(size // align * align)
            elif align % size:  # the nearest size that divides a chunk
                sizes.add(align // math.ceil(align / size))
        if size == 1:
            break
        count = count + 1 if count < 4 else count * 1.5
    power = 1
    while power < extent:
        sizes.add(power)
        power *= 2
    return sorted(sizes)


def _aligned(sizes: list[int], align: int | None, extent: int, within: bool = False
             ) -> list[int]:
    """The sizes that are whole chunks (or the full extent), and with ``within`` those that
    divide a chunk (panels that never straddle two); all of them without chunks."""
    if not align or align >= extent:
        return sizes
    return [s for s in sizes if s % align == 0 or s == extent or (within and align % s == 0)]


def _with_granule(chunk: int | None, granule: int) -> int | None:
    """The alignment for one dimension: whole chunks, in multiples of the device's granule
    where that stays within four chunks (storage alignment matters more)."""
    if granule <= 1:
        return chunk
    if not chunk:
        return granule
    both = math.lcm(chunk, granule)
    return both if both <= 4 * max(chunk, granule) else chunk


def _r_candidates(rs: list[int], fits) -> list[int]:
    """The K depths worth predicting for one (w, h): the largest that fits and a few below
    (the prediction trades fill time against per-GEMM efficiency)."""
    lo, hi = 0, len(rs) - 1
    if not fits(rs[0]):
        return []
    while lo < hi:  # largest index that fits; memory grows with r
        mid = (lo + hi + 1) // 2
        if fits(rs[mid]):
            lo = mid
        else:
            hi = mid - 1
    picks = {rs[lo]}
    for step in (1, 2, 3, 5, 8):
        if lo - step >= 0:
            picks.add(rs[lo - step])
    return sorted(picks)


#: Rows of C that a GEMM of the in-core shape computes at the least: each stripe's GEMM stays
#: large enough to run near the device's rate (at these sizes the copies take the time, not
#: the GEMMs).
IN_CORE_ROWS = 256

#: Bytes a stripe of the in-core shape moves at the least. Each stripe costs the executor
#: host work (a reader's task, a copy call, two timed events), which at these sizes is more
#: than the overlap wins: fewer, larger stripes ran small products quicker
#: (docs/performance.md, "Figures moved from the code's docstrings").
IN_CORE_STRIPE_BYTES = 8 << 20


def in_core_shape(prob: Problem, model: DeviceModel, memory_limit: int, *, staged: bool,
                  settings: StagingSettings, strategy: Native | None = None,
                  symmetric: bool = False) -> dict | None:
    """The plan's fields of the in-core shape (:attr:`Plan.in_core`) for ``prob``, its
    ``staging`` the executor's ``settings`` made for it, or None where it does not apply.

    It applies to a staged plan of a product (not emulated, not a symmetric or one-matrix
    product) when A, B and C fit in ``memory_limit`` at once, and when computing it takes no
    longer than moving A up (at the slowest of storage or host copies and host-to-device):
    then loading B whole before the first GEMM costs nothing that the panelled shape would
    not, and the product is one upload, one GEMM and one download, overlapped in stripes.
    Larger products keep the panelled shape, whose first GEMM starts after a piece of a
    panel.

    Notes
    -----
    C comes down in the settings' ``split_last`` stripes at the least (a GEMM each), and A
    and B go up in ``min_stripes``; fewer where a stripe would hold fewer than
    ``IN_CORE_STRIPE_BYTES`` or C fewer than ``IN_CORE_ROWS`` rows. The ring has a buffer
    for each stripe of A and B and each of C (at most the staging's), each holding the
    largest stripe, rounded up to a power of two (so that products of nearby shapes reuse
    the same pinned buffers) and no larger than the default stripe.
    """
    if not (staged and prob.computes_product and not symmetric and not prob.shared
            and _default(strategy).in_core):
        return None
    m, n, k, s = prob.m, prob.n, prob.k, prob.itemsize
    if (m * k + k * n + m * n) * s > memory_limit:
        return None
    up = model.storage_read if prob.a.on_disk else model.memory_copy
    if model.h2d:
        up = min(up, model.h2d)
    compute = model.gemm_seconds(m, n, k, s, prob.dtype.startswith("complex"))
    if compute > prob.operand_bytes("A") / up:
        return None
    def at_most(count: int, elements: int) -> int:  # stripes of IN_CORE_STRIPE_BYTES or more
        return max(1, min(count, elements * s // IN_CORE_STRIPE_BYTES))

    parts = at_most(min(settings.split_last, m // IN_CORE_ROWS), m * n)
    min_stripes = at_most(settings.min_stripes, min(m * k, k * n))  # A and B alike, A by C's
    rows = -(-m // parts)
    share = -(-min_stripes // parts)
    needed = max(rows * n,  # a C stripe coming down (or going up)
                 stripe_rows(rows, k, m * k, share) * k,  # a stripe of A's rows
                 stripe_rows(k, n, k * n, min_stripes) * n)  # a stripe of B
    stripe = min(1 << (needed - 1).bit_length(), DEFAULT_STRIPE)
    return dict(tile=(m, n, k), in_core=True, n_c=1, stripe=stripe, staging=replace(
        settings, n_a=1, n_b=1, tail_panels=1, ramp=0, split_last=parts, min_stripes=min_stripes,
        n_stage=2 * min_stripes, n_out=parts))  # a ring buffer for every stripe


def choose_tile(prob: Problem, model: DeviceModel, memory_limit: int, host_memory_limit: int,
                *, staged: bool, n_c: int = 2, n_a: int = 2, n_b: int = 2, n_stage: int = 16,
                n_out: int = 4, stripe: int = 4 << 20, readers: int = 4,
                split_last: int = 1, split_blocks: str = "every", ramp: int = 0,
                tail_panels: int = 1, min_stripes: int = 1, strategy: Native | None = None,
                symmetric: bool = False) -> tuple[int, int, int]:
    """The (w, h, r) with the lowest predicted time that fits both budgets (with ``strategy``:
    its memory and its time, where a GPU emulates).

    Raises
    ------
    BudgetError
        When not even a 1×1×1 tile fits; the message says how much the smallest tile needs.
    """
    m, n, k = max(prob.m, 1), max(prob.n, 1), max(prob.k, 1)
    a_m, a_k = prob.a_chunks_mk()
    b_k, b_n = prob.b_chunks_kn()
    out_m, out_n = prob.out.chunks if (prob.out is not None and prob.out.chunks) else (None, None)
    align_m = _with_granule(out_m or a_m, model.granule)
    align_n = _with_granule(out_n or b_n, model.granule)
    align_k = _with_granule(a_k or b_k, model.granule)
    floor = model.smallest_side
    ws = _candidates(m, align_m, floor)
    hs = _candidates(n, align_n, floor)
    rs = _candidates(k, align_k, floor) if prob.computes_product else [1]
    strategy = _default(strategy)
    depth = strategy.max_depth(staged)
    if depth is not None:
        rs = [r for r in rs if r <= depth] or [depth]

    def fits(tile):
        plan_bufs = tile_buffers(prob, tile, model, stripe if staged else 0, strategy)
        transposed = 1 if symmetric and tile[0] < prob.m else 0  # a T slot (Plan.n_t)
        dev = device_bytes(plan_bufs, n_c + transposed, n_a, n_b)
        host = (n_stage * plan_bufs.ring + n_out * plan_bufs.out_ring + decode_window(prob, tile)
                + assembly_window(prob, tile, plan_bufs.out_ring // prob.itemsize, min_stripes))
        return dev <= memory_limit and host <= host_memory_limit, dev, host

    def seconds(tile, full=False):
        pred = predict(prob, tile, model, staged=staged, split_last=split_last,
                       split_blocks=split_blocks, ramp=ramp, symmetric=symmetric,
                       tail=min(tail_panels, n_a, n_b), stripe=stripe, min_stripes=min_stripes,
                       strategy=strategy)
        return pred if full else pred.total

    def blocks(ws, hs):  # a symmetric product's C blocks are square
        return [(w, w) for w in ws] if symmetric else [(w, h) for w in ws for h in hs]

    def best_depth(w, h, rs):
        """(time, tile) of the best K depth for the block (w, h) (None where none fits),
        first among equals."""
        best = None
        if fits((w, h, 1))[0]:
            for r in _r_candidates(rs, lambda r: fits((w, h, r))[0]):
                # Prefer square-ish, larger tiles on ties (fewer, larger operations).
                t = seconds((w, h, r)) * (1 + 1e-9 * (abs(w - h) - w - h - r))
                if best is None or t < best[0]:
                    best = (t, (w, h, r))
        return best

    def search(ws, hs, rs):
        # Each block's floor (its busiest resource at any depth) is known in microseconds,
        # and no depth is predicted below it: a block whose floor is above a time already
        # found is passed over. The time to beat comes first from the blocks of the lowest
        # floors; then every block is taken in order, so that among equal times the first
        # still wins, as without the floors.
        floors = {pair: _resource_floor(prob, pair, model, staged=staged, strategy=strategy,
                                        symmetric=symmetric)
                  * (1 - 1e-9 * (pair[0] + pair[1] + k)) for pair in blocks(ws, hs)}
        known = {}
        bar = math.inf
        for pair in sorted(floors, key=floors.__getitem__):
            known[pair] = best_depth(*pair, rs)
            if known[pair] is not None:
                bar = known[pair][0]
                break
        best, best_time = None, math.inf
        for pair, floor in floors.items():
            if floor > min(bar, best_time):
                continue
            found = known[pair] if pair in known else best_depth(*pair, rs)
            if found is not None and found[0] < best_time:
                best_time, best = found
        return best

    @functools.cache
    def slow() -> float:
        """The time above which a tile is too slow (with room for the whole product)."""
        return max(SLOW_FLOOR, SLOWDOWN * seconds((m, n, k)))

    def too_slow(tile) -> bool:
        return seconds(tile) > slow()

    def smallest_budgets(host_first=False):
        """(device, host) bytes of the least demanding tile that is not too slow (least
        device memory first, or least host memory among those that fit the device's)."""
        best = None
        for w, h in blocks(ws, hs):
            if _resource_floor(prob, (w, h), model, staged=staged, strategy=strategy,
                               symmetric=symmetric) > slow():
                continue  # too slow at every depth
            for r in rs:
                if not too_slow((w, h, r)):
                    _, dev, host = fits((w, h, r))
                    key = (host, dev) if host_first else (dev, host)
                    if (best is None or key < best) and not (host_first and
                                                             dev > memory_limit):
                        best = key
                    break  # a deeper r needs more memory
        return best[::-1] if host_first and best else best

    if in_place(prob, staged) and not symmetric and depth is None and fits((m, n, k))[0]:
        # Nothing moves whatever the tile, so one block, one panel has the fewest operations
        # and is never predicted slower (tests/test_planner.py): the search, hundreds of
        # predictions (tens of milliseconds before a small product), is not needed.
        return (m, n, k)
    # Chunk-aligned tiles first: a panel that cuts chunks decodes them twice, a cost the
    # prediction hides whenever storage is not the bottleneck. Unaligned sizes only when no
    # aligned tile fits the budgets.
    best = search(_aligned(ws, align_m, m), _aligned(hs, align_n, n),
                  _aligned(rs, align_k, k, within=True) if prob.computes_product else rs)
    if best is None:
        best = search(ws, hs, rs)
    if best is not None and too_slow(best):
        raise _too_slow_error(best, seconds(best, full=True), seconds((m, n, k)),
                              smallest_budgets(), memory_limit, host_memory_limit)
    if best is None:
        raise _no_tile_error(prob, fits((1, 1, 1)), smallest_budgets, memory_limit,
                             host_memory_limit, (n_c, n_a, n_b))
    return best


def in_place(prob: Problem, staged: bool) -> bool:
    """Whether an unstaged run of ``prob`` uses every operand in place (in memory, in a layout
    BLAS takes) and writes C into memory it is given: no tile then moves a byte."""
    operands = [prob.a, prob.b, prob.out] + ([prob.c] if prob.reads_c else [])
    return (not staged and prob.computes_product
            and all(x is not None and x.zero_copy for x in operands))


def _too_slow_error(best: tuple[int, int, int], pred: Prediction, whole: float,
              need: tuple[int, int] | None, memory_limit: int,
              host_memory_limit: int) -> BudgetError:
    """Why the best tile within the budgets is refused: the budgets that fall short (and what
    the least demanding tile that is not too slow takes), its operations and its time against
    ``whole``, the predicted seconds with room for the whole product."""
    short = [f"{name}={format_size(limit)}"
             + (f" (it takes {format_size(want)} or more)" if want > limit else "")
             for name, limit, want in (("memory_limit", memory_limit, need[0] if need else 0),
                                       ("host_memory_limit", host_memory_limit,
                                        need[1] if need else 0))
             if not need or want > limit]
    w, h, r = best
    return BudgetError(
        f"{' and '.join(short)} {'leaves' if len(short) == 1 else 'leave'} only tiles of "
        f"w={w} h={h} r={r}: "
        f"{pred.operations:,} operations, predicted "
        f"{format_seconds(pred.total)} against {format_seconds(whole)} with "
        f"room for the whole product")


def _no_tile_error(prob: Problem, smallest: tuple[bool, int, int],
             smallest_budgets: Callable[..., tuple[int, int] | None], memory_limit: int,
             host_memory_limit: int, buffers: tuple[int, int, int]) -> BudgetError:
    """Why no tile fits: the budget that even a 1x1x1 tile (``smallest``: fits, device and host
    bytes) exceeds, or the chunks that must be decoded whole."""
    _, dev, host = smallest
    if dev <= memory_limit and decode_window(prob, (1, 1, 1)):
        budgets = smallest_budgets(host_first=True)
        return BudgetError(_chunks_too_large(prob, host_memory_limit,
                                             budgets[1] if budgets else host))
    which, need, limit = (("memory_limit", dev, memory_limit) if dev > memory_limit
                          else ("host_memory_limit", host, host_memory_limit))
    n_c, n_a, n_b = buffers
    return BudgetError(
        f"{which}={format_size(limit)} is too small for any tile: even w=h=r=1 needs "
        f"{format_size(need)} ({n_c} C, {n_a} A and {n_b} B buffers)")


def _chunks_too_large(prob: Problem, limit: int, need: int) -> str:
    """Why a host budget fits no tile when chunks must be decoded whole: the largest chunk,
    its size, and the budget that would work."""
    stored = [(name, x) for name, x in (("a", prob.a), ("b", prob.b), ("c", prob.c))
              if x is not None and x.decoded and (name != "c" or prob.reads_c)]
    name, x = max(stored, key=lambda item: math.prod(item[1].chunks or (0,)))
    assert x.chunks is not None
    size = math.prod(x.chunks) * prob.itemsize
    what = operand_name(name, x.name)
    return (f"host_memory_limit={format_size(limit)} is too small for any tile: {what} is "
            f"stored in chunks of {x.chunks[0]}x{x.chunks[1]} ({format_size(size)} each, "
            f"decoded whole; a run holds one being read and the next being decoded); "
            f"host_memory_limit={format_size(need)} would work, or store it in smaller chunks")

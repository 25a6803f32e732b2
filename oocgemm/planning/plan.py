"""The plan of one product: a frozen :class:`Plan` (the tile the planner chose in
:mod:`~oocgemm.planning.tiling`, the budgets it was checked against, the staging) that
validates itself, expands into the schedule every executor replays, predicts its time and
prints its summary.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ..devices import Device
from ..errors import BudgetError, OptionError
from ..kernel_catalog import DEFAULT
from ..strategies import strategy_of
from ..units import format_seconds, format_size
from .chunks import chunk_region, on_chunk_edges
from .model import DeviceModel
from .problem import Problem
from .schedule import OpKind, stripe_rows
from .staging import StagingSettings
from .tiling import (
    DEFAULT_STRIPE,
    Buffers,
    Prediction,
    assembly_window,
    decode_window,
    device_bytes,
    predict,
    tile_buffers,
)


@dataclass(frozen=True)
class CFrames:
    """C stored from zstd frames, a row stripe at a time, and which stripes the GPU
    compresses: the choice of the GPU encode pass
    (:func:`~oocgemm.planning.planner.gpu_encode_pass`), which the CUDA executor runs."""

    downloads: frozenset[int] = frozenset()
    """The DOWNLOADs (schedule indices) that compress their stripe on the GPU on its way down."""
    writes: frozenset[int] = frozenset()
    """Their WRITEs (schedule indices), which hand the output the stripe's frames (the other
    WRITEs hand it the stripe)."""
    stripes: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = ()
    """(rows, cols) of C of each of those stripes, in schedule order."""
    ring: int = 0
    """Bytes each output ring buffer needs for a stripe's frames, sizes and statuses (0: no
    stripe is the GPU's)."""
    host: bool = False
    """The host's encoders make the other stripes into frames, a stripe each; False: every
    stripe is the GPU's."""


@dataclass(frozen=True)
class IOChoices:
    """How a plan's run does its I/O: which operands' decoded chunks are kept, decoded
    straight into the ring or on the device, how many compressed slots, who compresses C
    and which of its stripes (:attr:`Plan.io`)."""

    cache: tuple[str, ...] = ()
    """Chunked on-disk operands ('A', 'B') whose decoded chunks stay in host memory for the
    whole run, so that every chunk is decoded once; counted in ``host_bytes``. The others
    are streamed: a load's chunks are dropped after its last read (``decode_window``)."""
    into_ring: tuple[str, ...] = ()
    """Compressed chunked operands ('A', 'B') whose every read in the schedule is one whole
    chunk, read once: a staged plan whose ring buffers are a chunk each, so that a reader
    decodes each chunk straight into its pinned ring buffer (no decoded chunk held, no copy
    out of one; :func:`with_ring_decodes`)."""
    gpu_decode: tuple[str, ...] = ()
    """Operands ('A', 'B') of zstd frames (:attr:`Operand.zstd_frames
    <oocgemm.planning.problem.Operand.zstd_frames>`) decoded on the device: a load reads each
    stored object it covers (a chunk file or a shard) whole, as stored, into a ring buffer,
    uploads it into its cell of a compressed slot (``ZA0``.., ``ZB0``..: :attr:`n_z` of them),
    and one DECODE puts every frame of them in place in the panel slot. Its panels and blocks
    start on the objects' edges; staged plans only, not the in-core shape."""
    n_z: int = 2
    """Compressed slots of each operand decoded on the device (:attr:`gpu_decode`)."""
    gpu_encode: bool | str = True
    """Who compresses C where a CUDA run stores it from zstd frames (the ``gpu_encode``
    option, else its setting): True, the GPU every stripe, where nvCOMP is found and its
    buffers fit the budgets; False, the host, whole chunks; 'last' or 'frames', shares that
    :func:`~oocgemm.planning.planner.gpu_encode_pass` spells out. False on the CPU."""
    c_frames: CFrames | None = None
    """Which of C's stripes the GPU compresses where a staged run stores C from zstd frames:
    decided once the output is open, for the writer of a run
    (:func:`~oocgemm.planning.planner.gpu_encode_pass`); None: C's chunks gathered and
    encoded whole on the host (or no output was open when the plan was made)."""


@dataclass(frozen=True)
class Work:
    """What of the product a plan computes (:attr:`Plan.work`): every block, but those an
    interrupted run already wrote, or only a device's group."""

    done: tuple[tuple[int, int], ...] = ()
    """C blocks (i, j) an interrupted run already wrote (``resume=True``): the schedule skips
    them, and computes every other block as the whole run would."""
    blocks: tuple[tuple[int, int], ...] = ()
    """When set, the only C blocks (i, j) the schedule computes, in this order, each as the
    whole run would (a group of blocks for one of several devices)."""


@dataclass(frozen=True)
class Plan:
    """A validated tiling of one product, and the budget it was checked against.

    ``plan.schedule`` expands it into the block operations that executors replay.
    """

    problem: Problem
    device: Device
    """The device it is made for (``str``: 'cpu', 'cuda:0'...)."""
    model: DeviceModel
    """Rates used for the prediction."""
    tile: tuple[int, int, int]
    """(w, h, r): C block rows, C block columns, K panel depth, in elements."""
    memory_limit: int
    """Bytes the device-side buffers may take (GPU memory, or the CPU's working buffers)."""
    host_memory_limit: int
    """Bytes host staging may take."""
    staged: bool = False
    """True when panels go storage -> host staging slot -> device slot (CUDA); False when
    readers fill the working slots directly (CPU)."""
    n_c: int = 2
    """C block buffers: two, so that storing block t overlaps computing block t+1."""
    stripe: int = DEFAULT_STRIPE
    """Elements per ring buffer (a stripe of whole rows of a panel or C block) when staged."""
    staging: StagingSettings = StagingSettings()
    """How the executor moves the data: its readers, rings, panel slots, the row stripes of
    the last panels and the ramp of the first (the backend's settings, as the planner's
    passes left them for the tile)."""
    io: IOChoices = IOChoices()
    """How the run's I/O is done: which operands' decoded chunks are kept, decoded into the
    ring or on the device, who compresses C and which of its stripes."""
    chosen_by: str = "planner"
    """'planner' or 'tile' (the user's override)."""
    kernel: str = DEFAULT
    """The per-block GEMM on a GPU: 'cublas' or a kernel of ``kernels/`` (``kernel=``)."""
    work: Work = Work()
    """What of the product the plan computes: the blocks an interrupted run already wrote,
    or the only blocks it computes (a device's group)."""
    symmetric: bool = False
    """A Gram product (:attr:`Problem.gram`) computed as one: square C blocks (w == h), only
    those on and above the diagonal computed (a diagonal block's upper triangle, then
    mirrored), each block above the diagonal also written transposed across it. ``work``'s
    ``done`` and ``blocks`` then name blocks on and above the diagonal."""
    in_core: bool = False
    """The in-core shape (:func:`in_core_shape`): A, B and C on the device at once, one slot
    each, one C block and one K panel; B goes up first, A in row stripes, and C is computed,
    downloaded and written stripe by stripe (``split_last`` stripes at least), each GEMM
    waiting for its own rows of A only."""
    notes: tuple[str, ...] = ()
    """What the planning chose beyond the staging's settings and why, in words:
    ``print(plan)`` and :meth:`summary` show them."""
    warnings: tuple[str, ...] = ()
    """What the planning advises against (a tile the user gave that is predicted far slower
    than the planner's own choice: :func:`~oocgemm.planning.finish.with_tile_advice`), in
    words: making the plan warns of each (a RuntimeWarning), and ``print(plan)`` and
    :meth:`summary` show them."""

    decisions: tuple[str, ...] = ()
    """What each of the planner's passes chose and why (:mod:`oocgemm.planning.planner`), in
    order, one line each (``'tile: ...'``, ``'gpu decode: ...'``): ``print(plan)`` and
    :meth:`summary` show them."""

    @functools.cached_property
    def strategy(self):
        """The kernel's strategy object (:func:`~oocgemm.strategies.strategy_of`), looked
        up once: where it runs, its memory, staging and cost."""
        return strategy_of(self.kernel)

    # ---- geometry -------------------------------------------------------------------------
    @property
    def row_splits(self) -> tuple[int, ...]:
        return _splits(self.problem.m, self.tile[0])

    @property
    def col_splits(self) -> tuple[int, ...]:
        return _splits(self.problem.n, self.tile[1])

    @property
    def k_splits(self) -> tuple[int, ...]:
        if not self.problem.computes_product:
            return (0,)
        splits = _splits(self.problem.k, self.tile[2])
        ramp = self.staging.ramp
        if ramp and len(splits) > 2:
            r, g = splits[1], max(self.staging.ramp_granule, 1)
            pieces = {(r >> h) // g * g for h in range(ramp, 0, -1)}
            splits = (0,) + tuple(sorted(x for x in pieces if 0 < x < r)) + splits[1:]
        return splits

    @property
    def ramp_pieces(self) -> int:
        """How many of the first K panels are ramp pieces (smaller than ``r``)."""
        if not self.problem.computes_product:
            return 0
        return len(self.k_splits) - len(_splits(self.problem.k, self.tile[2]))

    @property
    def grid(self) -> tuple[int, int, int]:
        """Blocks along M, blocks along N, panels along K."""
        return (len(self.row_splits) - 1, len(self.col_splits) - 1, len(self.k_splits) - 1)

    @property
    def n_blocks(self) -> int:
        """C blocks the plan computes (a symmetric plan: those on and above the diagonal)."""
        p, q, _ = self.grid
        return p * (p + 1) // 2 if self.symmetric else p * q

    @property
    def n_t(self) -> int:
        """T slots (a symmetric plan's blocks across the diagonal, on their way out): one
        when some block lies above the diagonal."""
        return 1 if self.symmetric and self.grid[0] > 1 else 0

    @property
    def flops(self) -> int:
        """Floating-point operations the schedule's GEMMs do: the problem's, or for a
        symmetric plan about half of them."""
        return self.counts.flops if self.symmetric else self.problem.flops

    @property
    def out_stripes(self) -> int:
        """Stripes a staged C block comes down in at the least: ``min_stripes``, or in the
        in-core shape ``split_last`` (a GEMM and a download per stripe)."""
        return self.staging.split_last if self.in_core else self.staging.min_stripes

    def stripe_rows(self, rows: int, cols: int) -> int:
        """Rows of each stripe in which a staged C block of ``rows`` x ``cols`` moves down
        through the output ring: as many as one ring buffer holds, and at most an
        ``out_stripes``-th."""
        return stripe_rows(rows, cols, self.buffers.out_ring // self.problem.itemsize,
                           self.out_stripes)

    # ---- memory ---------------------------------------------------------------------------
    @functools.cached_property
    def buffers(self) -> Buffers:
        """The buffers' sizes (made once: a kept plan of a small product is asked for them
        at each run)."""
        return tile_buffers(self.problem, self.tile, self.model, self.stripe if self.staged else 0,
                            self.strategy)

    @property
    def device_bytes(self) -> int:
        # (a slot of an operand used in place is a view of it: no memory of its own)
        n_a, n_b = (0 if x in self.in_place else n
                    for x, n in (("A", self.staging.n_a), ("B", self.staging.n_b)))
        return (device_bytes(self.buffers, self.n_c + self.n_t, n_a, n_b)
                + sum(self.io.n_z * self.z_slot(x) for x in self.io.gpu_decode)
                + self.decode_scratch)

    # ---- operands decoded on the device ---------------------------------------------------
    def problem_operand(self, operand: str):
        """The problem's :class:`~oocgemm.planning.problem.Operand` of 'A' or 'B'."""
        return self.problem.a if operand == "A" else self.problem.b

    def object_cell(self, operand: str) -> int:
        """Bytes of one stored object's cell in a Z slot (``io.gpu_decode``): what its zstd
        frames take at most (zstd's bound), and a shard's index, rounded to 256 bytes and to
        whole elements."""
        cell = self.object_frames(operand) * (zstd_bound(self.frame_bytes(operand)) + 16) + 4
        step = math.lcm(256, self.problem.itemsize)
        return -(-cell // step) * step

    def object_frames(self, operand: str) -> int:
        """zstd frames a stored object of ``operand`` holds at most (a chunk: one; a shard:
        its inner chunks)."""
        x = self.problem_operand(operand)
        assert x.chunks is not None and x.zstd_frames is not None
        return math.prod(-(-c // f) for c, f in zip(x.chunks, x.zstd_frames))

    def frame_bytes(self, operand: str) -> int:
        """Bytes one zstd frame of ``operand`` decodes into (a whole frame, an edge's too)."""
        x = self.problem_operand(operand)
        assert x.zstd_frames is not None
        return math.prod(x.zstd_frames) * self.problem.itemsize

    def panel_objects(self, operand: str) -> int:
        """Stored objects a panel of ``operand`` covers at most (its panels start on the
        objects' edges: :meth:`_check_gpu_decode`)."""
        x = self.problem_operand(operand)
        assert x.chunks is not None
        w, h, r = self.tile
        rows, cols = (w, r) if operand == "A" else (r, h)
        if (self.problem.trans_a if operand == "A" else self.problem.trans_b):
            rows, cols = cols, rows
        return (-(-min(rows, x.shape[0]) // x.chunks[0])
                * -(-min(cols, x.shape[1]) // x.chunks[1]))

    def panel_frames(self, operand: str) -> int:
        """zstd frames a panel of ``operand`` decodes at most."""
        return self.panel_objects(operand) * self.object_frames(operand)

    def z_slot(self, operand: str) -> int:
        """Bytes of a Z slot: a cell for each stored object a panel of ``operand`` covers."""
        return self.panel_objects(operand) * self.object_cell(operand)

    @property
    def decode_scratch(self) -> int:
        """Bytes a device decodes a batch's frames into before it places them (whole frames,
        an edge's too, of the largest panel of each operand decoded on the device: a K step's
        A and B panels decode as one batch, :func:`~oocgemm.planning.schedule.decode_batches`;
        one, used by the batches in turn)."""
        return sum(self.panel_frames(x) * self.frame_bytes(x) for x in self.io.gpu_decode)

    @property
    def host_bytes(self) -> int:
        buf = self.buffers
        staging = self.staging.n_stage * buf.ring + self.staging.n_out * buf.out_ring
        return staging + self.decode_window + self.assembly_window + self.cache_bytes

    @property
    def decode_window(self) -> int:
        """Host memory the decoded chunks of streamed operands take at most."""
        return decode_window(self.problem, self.tile,
                             kept=self.io.cache + self.io.into_ring + self.io.gpu_decode)

    @property
    def assembly_window(self) -> int:
        """Host memory the output's chunks take at most while their rows arrive in stripes."""
        return assembly_window(self.problem, self.tile,
                               self.buffers.out_ring // self.problem.itemsize if self.staged
                               else 0,
                               self.out_stripes)

    @property
    def cache_bytes(self) -> int:
        """Host memory the cached operands take once read (compute dtype)."""
        kept = set(self.io.cache)
        if self.problem.shared and kept >= {"A", "B"}:
            kept.discard("B")  # one matrix, kept once for both roles
        return sum(self.problem.operand_bytes(name) for name in kept)

    @property
    def decoded_bytes(self) -> int:
        """Bytes of chunks the run decodes at most (:meth:`chunk_reports`; compute dtype)."""
        return sum(r.decodes * math.prod(r.chunks) for r in self.chunk_reports()
                   ) * self.problem.itemsize

    def chunk_reports(self) -> list:
        """Loads and decodes of each chunked on-disk operand
        (:class:`oocgemm.planning.chunks.ChunkReport`), from the geometry alone."""
        from .chunks import estimate, gram_estimate, one_matrix

        reports = [estimate(self, name) for name in ("A", "B", "C")]
        if self.symmetric:
            reports[:2] = [gram_estimate(self)]
        elif self.problem.shared and reports[0] is not None and reports[1] is not None:
            reports[:2] = [one_matrix(reports[0], reports[1])]
        return [replace(r, into_ring=True, decodes=r.n_chunks) if r.operand in self.io.into_ring
                else r for r in reports if r is not None]

    # ---- schedule and prediction ----------------------------------------------------------
    @functools.cached_property
    def schedule(self):
        """The ordered block operations (:class:`oocgemm.planning.schedule.Schedule`)."""
        from .schedule import build_schedule

        return build_schedule(self)

    def replay(self):
        """The schedule to run (:class:`oocgemm.planning.schedule.Stream`): the built one
        where :attr:`schedule` was asked for, else its operations made as they are taken
        (:func:`~oocgemm.planning.schedule.stream_schedule`: the same operations in the same
        order), so that a run starts before the walk reaches the last block."""
        from .schedule import built_stream, stream_schedule

        built = self.__dict__.get("schedule")  # functools.cached_property's, once made
        return built_stream(built) if built is not None else stream_schedule(self)

    @property
    def resident(self) -> tuple[str, ...]:
        """Operands with a slot for each of their panels ('A', 'B'): each panel is loaded
        once and kept (:func:`~oocgemm.planning.finish.with_resident_panels`)."""
        p, q, nk = self.grid
        slots = (("A", self.staging.n_a, p * nk), ("B", self.staging.n_b, q * nk))
        return tuple(x for x, n, panels in slots if panels and n >= panels)

    @property
    def in_place(self) -> tuple[str, ...]:
        """What an unstaged run uses where it is and moves no bytes for: 'A' and 'B' where
        they are in memory in a layout BLAS takes (a READ binds its slot to a view), 'C' where
        the output is (a C slot is a view of the output's region, so a WRITE has nothing to
        store), but not in a symmetric product that reads C (its C slots are scratch: the
        output may be C, still to be read as blocks are written). Such a READ or WRITE takes
        microseconds: the CPU executor runs it on its compute lane, in schedule order."""
        if self.staged:
            return ()
        prob = self.problem
        out = prob.out is not None and prob.out.zero_copy and not (self.symmetric
                                                                   and prob.reads_c)
        return tuple(name for name, used in (("A", prob.a.zero_copy), ("B", prob.b.zero_copy),
                                             ("C", out)) if used)

    @functools.cached_property
    def counts(self):
        """Operations per kind and bytes per level of :attr:`schedule`, counted without
        building it (:class:`oocgemm.planning.schedule.Counts`): what ``print(plan)`` and
        :meth:`summary` show."""
        from .schedule import count_schedule

        return count_schedule(self)

    @property
    def prediction(self) -> Prediction:
        s = self.staging
        return predict(self.problem, self.tile, self.model, staged=self.staged,
                       split_last=s.split_last, split_blocks=s.split_blocks, ramp=s.ramp,
                       strategy=self.strategy, tail=min(s.tail_panels, s.n_a, s.n_b),
                       cache=self.io.cache, symmetric=self.symmetric,
                       decodes={r.operand: r for r in self.chunk_reports()},
                       stripe=self.stripe, min_stripes=s.min_stripes, in_core=self.in_core,
                       gpu_decode=self.io.gpu_decode, resident=self.resident)

    def validate(self) -> Plan:
        """Check the plan against its budgets; raise :class:`BudgetError` when it does not fit."""
        w, h, r = self.tile
        if min(w, h, r) < 1:
            raise OptionError(f"tile must be positive integers, got {self.tile}")
        if self.symmetric and (not self.problem.gram or w != h):
            raise OptionError(f"tile (w={w}, h={h}, r={r}): a symmetric product takes square C "
                              f"blocks (w == h)")
        slots = (self.staging.n_a, self.staging.n_b, self.n_c)
        if self.in_core and (self.grid[:2] != (1, 1) or self.grid[2] > 1
                             or slots != (1, 1, 1) or not self.staged):
            raise OptionError(f"tile (w={w}, h={h}, r={r}): the in-core shape is one staged C "
                              f"block and one K panel, one slot each")
        if self.staging.split_blocks not in ("every", "last"):
            raise OptionError(f"split_blocks={self.staging.split_blocks!r}: expected 'every' or "
                              f"'last'")
        depth = self.strategy.max_depth(self.staged)
        if depth is not None and r > depth:
            raise OptionError(f"tile r={r}: kernel={self.kernel!r} on a GPU takes K panels of "
                              f"at most {depth} (its int32 products stay exact up to there)")
        self._check_gpu_decode()
        if self.device_bytes > self.memory_limit:
            raise BudgetError(
                f"tile (w={w}, h={h}, r={r}) needs {format_size(self.device_bytes)} of "
                f"{self.model.memory} memory "
                f"({self._device_breakdown()}), over memory_limit={format_size(self.memory_limit)}")
        if self.host_bytes > self.host_memory_limit:
            raise BudgetError(
                f"tile (w={w}, h={h}, r={r}) needs {format_size(self.host_bytes)} of host staging, "
                f"over host_memory_limit={format_size(self.host_memory_limit)}")
        return self

    def _check_gpu_decode(self) -> None:
        """Panels decoded on the device: staged, not in core, of operands of zstd frames,
        every load starting on the objects' edges (whole objects, clipped at the array's
        end only)."""
        prob = self.problem
        for name in self.io.gpu_decode:
            x = self.problem_operand(name)
            why = ("it is not stored as zstd frames in local files" if x.zstd_frames is None
                   else "the plan is not staged" if not self.staged
                   else "the in-core shape loads A in row stripes" if self.in_core
                   else "one matrix in both roles" if prob.shared else None)
            if why is None:
                assert x.chunks is not None
                outer = self.row_splits if name == "A" else self.col_splits
                splits = (outer, self.k_splits) if name == "A" else (self.k_splits, outer)
                if (prob.trans_a if name == "A" else prob.trans_b):
                    splits = splits[::-1]
                if not on_chunk_edges(splits, x.chunks, x.shape):
                    why = (f"its blocks or K panels cut its stored objects of "
                           f"{x.chunks[0]}x{x.chunks[1]}")
                elif self.buffers.ring < self.object_cell(name):
                    why = (f"its ring buffers ({format_size(self.buffers.ring)}) are smaller "
                           f"than a stored object's cell ({format_size(self.object_cell(name))})")
            if why is not None:
                raise OptionError(f"tile {self.tile}: {name} cannot be decoded on the device: "
                                  f"{why}")

    def _device_breakdown(self) -> str:
        buf = self.buffers
        parts = [f"C {self.n_c + self.n_t}x{format_size(buf.c)}"]
        for x, n, size in (("A", self.staging.n_a, buf.a), ("B", self.staging.n_b, buf.b)):
            parts.append(f"{x} {n} views in place" if x in self.in_place
                         else f"{x} {n}x{format_size(size)}")
        for x in self.io.gpu_decode:
            parts.append(f"compressed {x} {self.io.n_z}x{format_size(self.z_slot(x))}")
        if self.io.gpu_decode:
            parts.append(f"decoding {format_size(self.decode_scratch)}")
        if buf.accumulator:
            parts.append(f"accumulator {format_size(buf.accumulator)}")
        if buf.emulation:
            parts.append(f"converted A {self.staging.n_a}x{format_size(buf.a_converted)}, "
                         f"converted B {self.staging.n_b}x{format_size(buf.b_converted)}, "
                         f"int32 products "
                         f"{format_size(buf.emulation)}")
        return ", ".join(parts)

    def summary(self) -> dict:
        """The plan as plain data (for --json and logs)."""
        pred = self.prediction
        counts = self.counts
        p, q, nk = self.grid
        return {
            "shape": {"m": self.problem.m, "n": self.problem.n, "k": self.problem.k},
            "dtype": self.problem.dtype,
            "device": str(self.device),
            "tile": {"w": self.tile[0], "h": self.tile[1], "r": self.tile[2]},
            "chosen_by": self.chosen_by,
            # the CPU runs numpy's BLAS unless it emulates (kernel='ozaki')
            "kernel": self.kernel if self.model.kernels or self.strategy.emulated else None,
            "grid": {"row_blocks": p, "col_blocks": q, "k_panels": nk},
            "operations": counts.total,
            "device_bytes": self.device_bytes,
            "memory_limit": self.memory_limit,
            "host_bytes": self.host_bytes,
            "host_memory_limit": self.host_memory_limit,
            "bytes": {**counts.traffic, "decoded": self.decoded_bytes},
            "flops": self.flops,
            "symmetric": self.symmetric,
            "shared": self.problem.shared,
            "in_core": self.in_core,
            "gpu_decode": list(self.io.gpu_decode),
            "gpu_encode": self.io.gpu_encode,
            "predicted_seconds": pred.total,
            "predicted_bound": pred.bound,
            "predicted_parts": pred.parts(),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "decisions": list(self.decisions),
            "chunks": {r.operand: {"chunks": list(r.chunks), "grid": list(r.grid), "kept": r.kept,
                                   "into_ring": r.into_ring, "loads": r.loads,
                                   "decodes": r.decodes, "stored": round(r.stored, 4)}
                       for r in self.chunk_reports()},
        }

    def __str__(self) -> str:
        prob, (w, h, r), (p, q, nk) = self.problem, self.tile, self.grid
        pred = self.prediction
        traffic = self.counts.traffic
        ta, tb = ("ᵀ" if prob.trans_a else ""), ("ᵀ" if prob.trans_b else "")
        lines = [
            f"oocgemm plan: C[{prob.m}x{prob.n}] = {prob.alpha:g}·A{ta}·B{tb}"
            + (f" + {prob.beta:g}·C" if prob.reads_c else "") + f"  ({prob.dtype}, K={prob.k})",
            f"  device      {self.device}"
            + ("  (staged through pinned host buffers)" if self.staged else "")
            + (f", kernel {self.kernel}" if self.kernel != DEFAULT else ""),
            f"  tile        w={w} h={h} r={r}  ({self.chosen_by})",
            *([f"  operands    A and B are one stored matrix ({prob.a.name}): each chunk read "
               f"and decoded once for both, a panel both need staged once"]
              if prob.shared else []),
            f"  blocks      {p}x{q} C blocks, {nk} K panels each, {self.counts.total} operations"
            + (f" ({len(self.work.done)} blocks done before, resumed)" if self.work.done else ""),
            *([f"  in core     A, B and C on the device at once: B up, then A in row stripes; "
               f"{self.counts.ops[OpKind.GEMM]} GEMMs, each C stripe down as its GEMM ends"]
              if self.in_core else []),
            f"  memory      {format_size(self.device_bytes)} of {format_size(self.memory_limit)}"
            f" ({self._device_breakdown()})",
            f"  host        {format_size(self.host_bytes)} of {format_size(self.host_memory_limit)}"
            + (f" (staging, decoded chunks, and {' and '.join(self.io.cache)} kept in memory as "
               f"read: {format_size(self.cache_bytes)})" if self.io.cache else
               " (staging and decoded chunks)"),
            "  traffic     " + ", ".join(
                f"{TRAFFIC_NAMES.get(k, k.replace('_', ' '))} {format_size(v)}"
                for k, v in {**traffic, "decoded": self.decoded_bytes}.items() if v),
            *(f"  {'chunks' if n == 0 else '':<12}{report.describe()}"
              for n, report in enumerate(self.chunk_reports())),
            *([f"  on device   {' and '.join(self.io.gpu_decode)} go up as stored and are "
               f"decoded on the device, a panel's zstd frames at once"]
              if self.io.gpu_decode else []),
            f"  work        {self.flops / 1e9:.4g} GFLOP"
            + (f" (symmetric: the {self.n_blocks} blocks on and above the diagonal of "
               f"{p}x{q}, each above it also written across; {prob.flops / 1e9:.4g} GFLOP in "
               f"full)" if self.symmetric else ""),
            f"  predicted   {format_seconds(pred.total)} on {self.model.name} "
            f"({pred.bound}-bound; {pred.describe()})",
            *(f"  {'notes' if n == 0 else '':<12}{note}" for n, note in enumerate(self.notes)),
            *(f"  {'decided' if n == 0 else '':<12}{text}"
              for n, text in enumerate(self.decisions)),
            *(f"  {'warning':<12}{text}" for text in self.warnings),
        ]
        return "\n".join(lines)


def kept_built(plan: Plan, **changes) -> Plan:
    """``plan`` with ``changes`` to fields that nothing it has built depends on (who
    compresses C, what was decided), keeping what it built already (its schedule, counts,
    buffers: a schedule of a hundred thousand operations is not built twice)."""
    changed = replace(plan, **changes)
    for name, value in plan.__dict__.items():
        if isinstance(getattr(Plan, name, None), functools.cached_property):
            changed.__dict__[name] = value
    return changed


def zstd_bound(nbytes: int) -> int:
    """The most bytes zstd's frame of ``nbytes`` takes (``ZSTD_COMPRESSBOUND``)."""
    small = (128 << 10) - nbytes >> 11 if nbytes < 128 << 10 else 0
    return nbytes + (nbytes >> 8) + small


def _splits(extent: int, step: int) -> tuple[int, ...]:
    if extent == 0:
        return (0,)
    return tuple(range(0, extent, step)) + (extent,)


#: How ``print(plan)`` names the traffic levels (``Counts.traffic``, and the chunks decoded).
TRAFFIC_NAMES = {"read": "read into slots", "decoded": "chunks decoded (at most)"}


def with_gpu_decode(plan: Plan, operands: tuple[str, ...]) -> Plan:
    """``plan`` with ``operands`` decoded on the device (:attr:`Plan.io.gpu_decode`), its ring
    buffers large enough for one stored object's cell each, validated (OptionError where a
    panel cuts an object, BudgetError where it no longer fits). Each load reads its objects
    from storage (the page cache, warm)."""
    trial = replace(plan, io=replace(plan.io, gpu_decode=tuple(operands), into_ring=tuple(
        x for x in plan.io.into_ring if x not in operands), cache=tuple(
        x for x in plan.io.cache if x not in operands)))
    cell = max((trial.object_cell(x) for x in operands
                if trial.problem_operand(x).zstd_frames is not None), default=0)
    stripe = max(plan.stripe, -(-cell // plan.problem.itemsize))
    return replace(trial, stripe=stripe).validate()


def with_ring_decodes(plan: Plan) -> Plan:
    """``plan`` with ring buffers of one chunk each where that lets the readers decode the
    chunks of a compressed operand straight into the pinned ring (:attr:`Plan.io.into_ring`):
    where every read of the operand in the staged schedule is then one whole chunk, each
    chunk read once (a plan of one C block, the tall-skinny product), and the budget still
    holds. Else ``plan`` unchanged.

    A decoded chunk would otherwise be copied out of into the ring stripe by stripe, a copy
    that took the readers a sizeable share of the thread time their decoding took on the
    same cores (docs/performance.md, "Gram products"). The output ring keeps its own,
    smaller buffers (:attr:`Buffers.out_ring`)."""
    prob = plan.problem
    one_block = len(plan.row_splits) == len(plan.col_splits) == 2  # each panel loaded once
    if not (plan.staged and prob.computes_product and one_block):
        return plan
    able = [name for name, x in (("A", prob.a), ("B", prob.b))
            if x.decoded and x.decodes_into and x.chunks]
    candidates: list[tuple[str, ...]] = (
        ([("A", "B")] if "A" in able else []) if prob.shared else [(name,) for name in able])
    for roles in candidates:
        x = prob.a if roles[0] == "A" else prob.b
        assert x.chunks is not None
        trial = replace(plan, stripe=x.chunks[0] * x.chunks[1],
                        io=replace(plan.io, into_ring=roles, cache=()))
        if trial.host_bytes > plan.host_memory_limit or trial.device_bytes > plan.memory_limit:
            continue
        seen: set[tuple[int, int]] = set()
        for op in trial.schedule.ops:
            if op.kind is OpKind.READ and op.operand in roles:
                (r0, _), (c0, _) = op.region
                index = (r0 // x.chunks[0], c0 // x.chunks[1])
                if index in seen or chunk_region(index, x.chunks, x.shape) != op.region:
                    break
                seen.add(index)
        else:
            return trial.validate()
    return plan

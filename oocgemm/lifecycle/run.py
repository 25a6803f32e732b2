"""The I/O of one run, assembled in one place and owned until it ends.

:func:`open_run` turns what the user passed into a :class:`RunIO` before anything is planned:
the operands opened and checked against each other (shapes, dtypes, ``c`` and an update in
place, one matrix in both roles), the output target checked, and that it shares no storage
with an input (:func:`~oocgemm.storage.identity.check_output`). The planner takes its facts
(:meth:`RunIO.operands`) and never touches storage. With the plan, :meth:`RunIO.begin` opens
the output: its layout, its journal (resuming an interrupted run when asked). Executors read
through :meth:`RunIO.readers` and write through :meth:`RunIO.writer`, each at the storage's
grain. :meth:`RunIO.commit` publishes the output. Used as a context manager, it closes the
sources and, when the run ends by an error before its commit, removes what it wrote, or
keeps the journaled blocks of an interrupted run for ``resume=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import machine
from ..arguments import check_dtype, check_matrix
from ..backends import backend_of
from ..errors import DTypeError, InputError, OptionError, OutputError, ShapeError
from ..planning import Operand, Plan
from ..planning.planner import OutputFacts, gpu_encode_pass
from ..storage import MatrixSource, exists, is_path, open_sink, open_source, urls
from ..storage.files import signals_deferred
from ..storage.identity import check_output, one_matrix, remembered
from . import resume
from .outputs import check_out, check_out_options, output_layout


@dataclass
class RunIO:
    """The sources, the output and (once begun) the sink of one run."""

    sources: dict[str, MatrixSource]
    """'A', 'B', and 'C' when C is read (beta != 0)."""
    out: Any
    """What the user passed as ``out`` (a local path resolved through links)."""
    out_operand: Operand
    in_place: bool
    """C is read from ``out`` itself (beta != 0 without ``c``)."""
    shared: bool
    """a and b are one matrix (each chunk read and decoded once for both roles)."""
    shape: tuple[int, int, int]
    """(M, N, K)."""
    dtype: np.dtype
    out_options: dict
    """Checked ``out_options`` of a new Zarr output (empty otherwise)."""
    given: dict
    """What the user passed as a, b and c (local paths for ``file://`` URLs)."""
    storage_options: dict | None = None
    sink: Any = None
    """The output being written, once :meth:`begin` opened it."""
    committed: bool = False
    _opened: list = field(default_factory=list)
    """Every source opened, used or not: closed at the end."""
    _journal: Any = None
    """The journal of a resumed run, until its sink is made."""
    _signatures: dict | None = None
    """The inputs' signatures of a journaled run."""
    _plan: Any = None
    """The plan being run."""
    signed: dict = field(default_factory=dict)
    """The signatures of the matrices read from local paths when they were opened ('A', 'B',
    'C': :func:`~oocgemm.lifecycle.resume.local_signatures`): their shapes and layouts were
    read then, and :meth:`begin` refuses to read files that changed since."""

    # -- before the plan ---------------------------------------------------------------
    def operands(self) -> tuple[Operand, Operand, Operand | None, Operand]:
        """What the planner knows of a, b, c (None when not read) and out."""
        c = self.sources.get("C")
        return (self._operand(self.sources["A"]), self._operand(self.sources["B"]),
                None if c is None else self._operand(c), self.out_operand)

    def inputs_cached(self, names=("A", "B"), share: float = 0.9) -> bool:
        """Whether the OS page cache holds at least ``share`` of the stored bytes of each of
        the inputs ``names`` (a sample of their objects; nothing is read). False where a
        source cannot tell."""
        for name in names:
            fraction = self.sources[name].cached_fraction()
            if fraction is None or fraction < share:
                return False
        return True

    def write_back(self) -> int:
        """Bytes of the output's writes the OS page cache takes before it holds the writers
        to the disk's rate (:func:`oocgemm.machine.write_back_room`) where the output is a
        local path; 0 otherwise."""
        if not is_path(self.out) or urls.is_url(self.out):
            return 0
        return machine.write_back_room()

    def _operand(self, src: MatrixSource) -> Operand:
        rows, cols = src.shape
        zero_copy = src.view((0, rows), (0, cols), self.dtype) is not None
        # (a compressed input's stored share; uncompressed ones are read in the parts needed)
        stored = src.stored_fraction() if src.on_disk and src.chunks and not src.sliced else 1.0
        return Operand((rows, cols), src.chunks, src.on_disk, src.name, zero_copy=zero_copy,
                       sliced=src.sliced, decodes_into=src.decodes_into, stored=stored,
                       zstd_frames=getattr(src, "zstd_frames", None)
                       if src.dtype == self.dtype else None)

    def layout(self, plan: Plan) -> dict:
        """The layout of the output path a run of ``plan`` writes (:func:`output_layout`);
        an array given as ``out`` (or none) has its own."""
        if not is_path(self.out):
            return {}
        original = self.sources.get("C") if self.in_place else None
        return output_layout(plan, self.out_options, original)

    # -- the run -----------------------------------------------------------------------
    def begin(self, plan: Plan, *, overwrite: bool, resume_: bool, attributes: dict) -> Plan:
        """Open the output for a run of ``plan``, with its journal where the output is a
        path of inputs stored as files; with ``resume_``, continue the interrupted run of
        this product. The plan to run (the interrupted run's, with its blocks done)."""
        inputs = self.read_paths(plan.problem.reads_c)
        now = resume.local_signatures(inputs)
        self._check_unchanged(now)
        signatures = resume.signatures(self.out, inputs, now)
        journal = temporary = None
        if resume_:
            if signatures is None:
                raise OptionError(resume.not_resumable(self.out, inputs))
            plan, journal, temporary = resume.resumable(
                plan, self.out, lambda p: self._fingerprint(p, signatures))
            if journal is None and not (overwrite or self.in_place) and exists(self.out):
                raise OutputError(resume.nothing_to_resume(os.fspath(self.out)))
        elif signatures is not None:
            resume.warn_kept(os.fspath(self.out))
        self._journal = journal  # closed by __exit__ when the sink is never made
        layout = self.layout(plan)
        with self._held():
            self.sink = self._open_sink(plan, layout, overwrite, attributes, temporary)
            if signatures is not None:
                from .journal import Journal, JournaledSink

                if journal is None:
                    journal = Journal(self.sink.temporary_path, resume.header(
                        plan, resume.fingerprint(plan, signatures, self.out, self.in_place,
                                                 layout)))
                self.sink = JournaledSink(self.sink, journal, plan.row_splits, plan.col_splits)
        self._signatures, self._plan = signatures, plan
        return plan

    def read_paths(self, reads_c: bool) -> dict:
        """What the user passed for each matrix the run reads ('A', 'B', and 'C' where
        ``reads_c``: ``c``, or ``out`` updated in place)."""
        inputs = {"A": self.given["a"], "B": self.given["b"]}
        if reads_c:
            inputs["C"] = self.out if self.in_place else self.given["c"]
        return inputs

    def _check_unchanged(self, now: dict) -> None:
        """InputError where a matrix read from a local path is not the file (or folder) that
        was opened: rewritten, replaced or removed since, its bytes would be read with the
        shape and layout read then (``now``: the signatures taken again)."""
        for role, signed in self.signed.items():
            if now.get(role, signed) == signed:
                continue
            name = {"A": "a", "B": "b"}.get(role, "out (read as c)" if self.in_place else "c")
            path = self.read_paths(True)[role]
            how = "was removed" if now[role] == "missing" else "was rewritten or replaced"
            raise InputError(f"{name}: {os.fspath(path)!r} {how} after it was opened (its "
                             f"shape and layout were read then); nothing was computed: make a "
                             f"new Product, or call multiply again, to read it as it is now")

    def _fingerprint(self, plan: Plan, signatures: dict) -> dict:
        return resume.fingerprint(plan, signatures, self.out, self.in_place, self.layout(plan))

    def _open_sink(self, plan: Plan, layout: dict, overwrite: bool, attributes: dict,
                   temporary):
        prob = plan.problem
        sink = open_sink(self.out, shape=(prob.m, prob.n), dtype=prob.dtype,
                         options=layout, overwrite=overwrite, in_place=self.in_place,
                         attributes=attributes, storage_options=self.storage_options,
                         temporary=temporary)
        c_in = self.sources.get("C")
        if self.in_place and hasattr(sink, "guard") and sink.path is None and \
                hasattr(c_in, "lock"):  # a given zarr.Array read as C and written
            sink.guard(c_in)
        return sink

    def replanned(self, plan: Plan) -> None:
        """The run starts again with ``plan`` (other blocks): the journal follows."""
        from .journal import JournaledSink

        self._plan = plan
        if isinstance(self.sink, JournaledSink):
            assert self._signatures is not None  # a journal: inputs stored as files
            self.sink = self.sink.regrid(plan.row_splits, plan.col_splits, resume.header(
                plan, self._fingerprint(plan, self._signatures)))

    def readers(self, plan: Plan, sources: dict | None = None) -> dict:
        """The sources read at their grain for ``plan`` (:func:`chunk_readers`)."""
        return chunk_readers(plan, self.sources if sources is None else sources)

    def writer(self, plan: Plan):
        """The sink written at its grain for ``plan`` (:func:`chunk_writer`)."""
        return chunk_writer(plan, self.sink)

    def encoded(self, plan: Plan, writer) -> Plan:
        """``plan`` for a run into ``writer`` (:meth:`writer`'s, or a sink of its own), with
        who compresses C's stripes decided by the planner's GPU encode pass
        (:func:`~oocgemm.planning.planner.gpu_encode_pass`) from what is known only now the
        output is open (:func:`output_facts`)."""
        return gpu_encode_pass(plan, output_facts(plan, writer))

    def commit(self):
        """Publish the output (an interrupt waits for the commit to end); what the run
        returns as ``result.out``."""
        with self._held():  # a signal that arrives here is raised as the block ends
            result = self.sink.commit()
            self.committed = True
        if self._signatures is not None:
            resume.name_left_behind(os.fspath(self.out))
        return result

    def _held(self):
        """Signals held back while the output is created or committed
        (:func:`~oocgemm.storage.files.signals_deferred`), but for an array in memory
        (None, a numpy array, a CuPy array): nothing is published there, and swapping the
        handlers at the begin and the commit is a cost a small product's call notices
        (docs/performance.md, "Figures moved from the code's docstrings")."""
        out = self.out
        in_memory = out is None or (isinstance(out, np.ndarray) and not isinstance(out, np.memmap)
                                    ) or hasattr(out, "__cuda_array_interface__")
        return contextlib.nullcontext() if in_memory else signals_deferred()

    @property
    def name(self) -> str:
        """The output, for messages and ``result.out_name``."""
        return os.fspath(self.out) if is_path(self.out) else self.sink.name

    def storage_bytes(self) -> dict:
        """What the run took from storage, apart from what its READs copied into slots: the
        stored bytes read (compressed chunks, or a file's pages) and the bytes decoded, summed
        over the distinct sources (one matrix in both roles counts once)."""
        distinct = {id(src): src for src in self.sources.values()}.values()
        return {"storage_read": sum(src.bytes_read for src in distinct),
                "decoded": sum(src.decoded_bytes for src in distinct)}

    # -- the end -----------------------------------------------------------------------
    def __enter__(self) -> RunIO:
        return self

    def __exit__(self, kind, exc, traceback) -> None:
        try:
            if exc is not None:
                self._failed(exc)
        finally:
            for src in self._opened:
                src.close()

    def _failed(self, exc: BaseException) -> None:
        """The run ends by ``exc``: a committed output stays (and the exception says so); an
        interrupt keeps the journaled blocks for resume=True; anything else removes what the
        run wrote."""
        from .journal import JournaledSink

        if self.committed:  # an interrupt after the commit: the output is whole, and stays
            exc.oocgemm_committed = self.name  # type: ignore[attr-defined]
            exc.add_note(f"oocgemm: {self.name} was complete and committed before this "
                         f"interrupt")
            return
        if self.sink is None:
            if self._journal is not None:
                self._journal.close()
            return
        with signals_deferred():
            sink = self.sink
            if isinstance(exc, KeyboardInterrupt) and isinstance(sink, JournaledSink) \
                    and sink.keep():  # finished blocks stay, for resume=True
                p, q, _ = self._plan.grid
                blocks = p * q
                exc.oocgemm_resumable = (  # type: ignore[attr-defined]
                    sink.journal.temporary, len(sink.journal.blocks), blocks)
                exc.add_note(f"oocgemm: {len(sink.journal.blocks)} of {blocks} C blocks "
                             f"are kept in {sink.journal.temporary}; resume=True finishes "
                             f"the product")
            else:
                sink.abort()


def open_run(a, b, out, *, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
             out_options=None, storage_options=None) -> RunIO:
    """The operands of ``out = alpha * op(a) @ op(b) + beta * c`` opened and checked against
    each other, and the output target checked, before any work.

    Raises
    ------
    OOCGemmError
        InputError, ShapeError, DTypeError, OptionError, OutputError (an output that cannot
        be written, or shares storage with an input).
    """
    a, b, c, out = (urls.local(os.fspath(x)) if is_path(x) else x for x in (a, b, c, out))
    if is_path(out) and not out.strip():
        raise OutputError("out is an empty path; name a .zarr or .npy output")
    if is_path(out) and not urls.is_url(out) and os.path.islink(out):
        out = os.path.realpath(out)  # the output goes where the link points; the link stays
    opened: list[MatrixSource] = []
    try:
        return _opened(a, b, out, c, alpha, beta, trans_a, trans_b, out_options,
                       storage_options, opened)
    except BaseException:
        for src in opened:
            src.close()
        raise


def _opened(a, b, out, c, alpha, beta, trans_a, trans_b, out_options, storage_options,
            opened: list) -> RunIO:
    def source(x, role: str, name: str | None = None) -> MatrixSource:
        src = open_source(x, role, storage_options)
        opened.append(src)
        check_matrix(name or role, src)
        return src

    identify = remembered()
    src_a, src_b = source(a, "a"), source(b, "b")
    shared = one_matrix(a, src_a, b, src_b, identify=identify)  # by what is behind them
    if shared:  # one source for both roles: each chunk read and decoded once
        opened.remove(src_b)
        src_b.close()
        src_b = src_a
    m, k, n = _dimensions(src_a, src_b, trans_a, trans_b)
    src_c, in_place = None, False
    if c is not None:  # its shape is checked whenever it is given, read only when beta != 0
        src_c = source(c, "c")
        _check_c_shape(src_c, (m, n, k), "c")
    if beta != 0 and c is None:
        if out is None or (is_path(out) and not exists(out, storage_options)):
            raise OptionError("beta != 0 reads C: pass c=..., or an existing out to update in "
                              "place")
        src_c = source(out, "out (read as c, beta != 0)", "out")
        _check_c_shape(src_c, (m, n, k), f"out {os.fspath(out)!r}" if is_path(out) else "out",
                       in_place=True)
        in_place = True
    reads_c = src_c is not None and beta != 0
    if out is not None:  # by what is behind out and the inputs, never by name
        read_c = ("c", c, src_c) if (c is not None and beta != 0) else None
        in_place |= check_output(out, [("a", a, src_a), ("b", b, src_b)], read_c,
                                 identify=identify)
    dtype = _dtype(src_a, src_b, src_c if reads_c else None, alpha, beta)
    if in_place and is_path(out) and src_c is not None and np.dtype(src_c.dtype) != dtype:
        # A stored output updated in place is written anew and swapped in: in the product's
        # dtype it would change the user's array's type.
        raise DTypeError(f"out {os.fspath(out)!r} is {np.dtype(src_c.dtype)} and is updated in "
                         f"place (beta != 0, C read from out), but the product is {dtype}: an "
                         f"update in place keeps out's dtype; give a and b that dtype, or "
                         f"write the product to another out")
    out_operand = check_out(out, (m, n), dtype)
    out_options = check_out_options(out, out_options, (m, n), dtype, in_place)
    if out_options.get("chunks") is not None:  # align the C blocks to what a write rewrites
        out_operand = dataclasses.replace(
            out_operand, chunks=out_options.get("shards") or out_options["chunks"])
    sources = {"A": src_a, "B": src_b}
    if src_c is not None and reads_c:
        sources["C"] = src_c
    io = RunIO(sources=sources, out=out, out_operand=out_operand, in_place=in_place,
               shared=shared, shape=(m, n, k), dtype=dtype, out_options=out_options,
               given={"a": a, "b": b, "c": c}, storage_options=storage_options,
               _opened=list(opened))
    io.signed = resume.local_signatures(io.read_paths(reads_c))
    return io


def _dimensions(src_a, src_b, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    """(M, K, N) of op(a) @ op(b)."""
    m, k = src_a.shape[::-1] if trans_a else src_a.shape
    k2, n = src_b.shape[::-1] if trans_b else src_b.shape
    if k != k2:
        raise ShapeError(
            "inner dimensions differ: a is "
            f"{tuple(src_a.shape)}{' (transposed)' if trans_a else ''}, "
            f"b is {tuple(src_b.shape)}{' (transposed)' if trans_b else ''}: op(a) has {k} "
            f"columns, op(b) has {k2} rows")
    return m, k, n


def _check_c_shape(src: MatrixSource, mnk: tuple[int, int, int], what: str,
                   in_place: bool = False) -> None:
    m, n, k = mnk
    if tuple(src.shape) != (m, n):
        note = "it is updated in place as c; " if in_place else ""
        raise ShapeError(f"{what} has shape {tuple(src.shape)}, expected {(m, n)} ({note}op(a) "
                         f"is {(m, k)}, op(b) is {(k, n)})")


def _dtype(src_a, src_b, src_c, alpha, beta) -> np.dtype:
    """The compute dtype: the operands' (C's where it is read), checked."""
    dtypes = [check_dtype("a", src_a.dtype), check_dtype("b", src_b.dtype)]
    if src_c is not None:
        dtypes.append(check_dtype("c", src_c.dtype))
    dtype = np.result_type(*dtypes)
    if (isinstance(alpha, complex) or isinstance(beta, complex)) and dtype.kind != "c":
        raise DTypeError(f"alpha={alpha!r}, beta={beta!r}: complex scalars need complex operands, "
                         f"got {dtype}")
    return dtype


def chunk_readers(plan: Plan, sources: dict) -> dict:
    """The sources with every chunked on-disk one read at its grain
    (:class:`~oocgemm.storage.chunked.ChunkReader`): each chunk decoded once per load, or
    once per run for the operands the plan keeps."""
    from ..planning.chunks import loads
    from ..storage.base import ChunkedSource
    from ..storage.chunked import ChunkReader, DiskQueue

    # The CUDA executor's host threads mostly wait on copies: decode on every core there.
    readers = plan.staging.readers
    decoders = max(readers, machine.cores()) if plan.staged else readers
    wrapped = dict(sources)
    disk = DiskQueue()  # the cold sources' decodes, in the order the schedule needs them
    prob = plan.problem
    planned = {"A": prob.a, "B": prob.b, "C": prob.c}
    for name, src in sources.items():
        operand = planned.get(name)  # as the plan reads it: whole chunks, or slices of them
        whole = operand.decoded if operand is not None else not src.sliced
        if name == "B" and prob.shared:
            wrapped["B"] = wrapped["A"]  # one reader: each chunk decoded once for both roles
        elif (src.on_disk and src.chunks is not None and whole
              and isinstance(src, ChunkedSource) and name not in plan.io.gpu_decode):
            roles = ("A", "B") if name == "A" and plan.problem.shared else (name,)
            # (cold: its reads come from the disk itself, as far as the plan was told)
            cold = operand is not None and not operand.cached
            wrapped[name] = ChunkReader(src, loads(plan.schedule.ops, roles, src.chunks),
                                        kept=name in plan.io.cache, decoders=decoders,
                                        gap=len(roles), into=name in plan.io.into_ring,
                                        disk=disk if cold else None)
    return wrapped


def chunk_writer(plan: Plan, sink):
    """The sink written at its grain (:class:`~oocgemm.storage.chunked.ChunkWriter`) where
    the output is stored in chunks on disk: each chunk encoded once, whole (not once per row
    stripe that cuts it), on the encoder threads, behind compute. Else the sink itself."""
    from ..planning.tiling import assembly_window
    from ..storage.chunked import ChunkWriter

    if not sink.on_disk or not sink.chunks:
        return sink
    ring = plan.buffers.out_ring // plan.problem.itemsize if plan.staged else 0
    budget = assembly_window(plan.problem, plan.tile, ring, plan.out_stripes, sink.chunks)
    if not budget:
        return sink
    return ChunkWriter(sink, plan.row_splits, plan.col_splits, budget=budget)


def output_facts(plan: Plan, writer) -> OutputFacts:
    """What the planner's GPU encode pass needs to know of a run of ``plan`` into ``writer``:
    the chunks that ``writer`` stores from zstd frames (a chunk writer of an output that takes
    them: :meth:`ChunkWriter.framing <oocgemm.storage.chunked.ChunkWriter.framing>`), and
    nvCOMP's buffers for stripes of that framing, where the device's backend finds it
    (:meth:`Backend.encoder <oocgemm.backends.Backend.encoder>`)."""
    framing = writer.framing() if hasattr(writer, "write_frames") else None
    if framing is None:
        return OutputFacts(frame_chunks=None)
    return OutputFacts(frame_chunks=tuple(writer.chunks),
                       encoder=backend_of(plan.device).encoder(framing))


def chunk_counts(readers: dict) -> dict:
    """What the chunk readers did, per operand: chunks, decodes (and which chunks), decoded
    and peak bytes, the readers' time copying out of decoded chunks."""
    from ..storage.chunked import ChunkReader

    counts: dict = {}
    seen: dict[int, str] = {}  # one reader for one matrix in both roles: reported once, as A
    for name, src in readers.items():
        if src.objects_read:  # decoded on the device, from its objects as stored
            assert src.chunks is not None
            rows, cols = src.shape
            counts[name] = {"chunks": -(-rows // src.chunks[0]) * -(-cols // src.chunks[1]),
                            "decodes": src.objects_read, "decoded_bytes": src.decoded_bytes,
                            "peak_bytes": 0, "kept": False, "into_ring": False,
                            "on_device": True, "copy_seconds": 0.0, "roles": name}
        if not isinstance(src, ChunkReader):
            continue
        if id(src) in seen:
            counts[seen[id(src)]]["roles"] += name
            continue
        seen[id(src)] = name
        counts[name] = {"chunks": src.n_chunks, "decodes": src.decodes,
                        "decoded_bytes": src.decoded_bytes, "peak_bytes": src.peak_bytes,
                        "kept": src.kept, "into_ring": src.into, "on_device": False,
                        "copy_seconds": src.copy_seconds, "roles": name,
                        "decoded_at": sorted(src.decoded_at)}
    return counts

"""How each executor stages a run, as data the planner takes: the settings (readers, ring
sizes, stripes, slots) that size the buffers the tile must fit. The planner is handed them
as a :class:`~oocgemm.planning.planner.Staging` before any executor exists (the device's
:meth:`Backend.staging <oocgemm.backends.Backend.staging>` asks the functions here), and each
executor replays plans made with its own (``CpuExecutor.staging`` and
``CudaExecutor.staging`` are the functions here). Nothing here imports CuPy."""

from __future__ import annotations

from ..kernel_catalog import DEFAULT
from ..planning.staging import StagingSettings
from ..strategies import strategy_of


def cpu_settings(problem, model, kernel: str = DEFAULT) -> StagingSettings:
    """The CPU executor's: 4 reader threads; the last K panel of the run's last block runs in
    4 row stripes (tapering ones), so that it is written stripe by stripe as its rows become
    final rather than all after its last GEMM. Only that block (``split_blocks='last'``):
    another block's C is written while the next one computes, and its stripes were GEMMs
    for nothing (3,072 of them in a 4000² product in 128³ blocks). Then what the kernel's
    strategy changes (:meth:`oocgemm.strategies.Native.cpu_staging`)."""
    return strategy_of(kernel).cpu_staging(
        StagingSettings(readers=4, split_last=4, split_blocks="last"), problem)


def cuda_settings(problem, model, kernel: str = DEFAULT) -> StagingSettings:
    """The CUDA executor's.

    Pageable -> pinned copies need many threads to approach PCIe rates; the ring holds two
    stripes per reader, and small regions are spread over all readers. The first panel runs
    in pieces (r/4, r/4, r/2: two halvings came out ahead of three), so that the first GEMM
    starts early. The last 4 panels of a block run row stripe by row stripe, 8 stripes (16
    drained faster but ran the GEMMs slower, and the run with them), with 5 slots each for
    A and B (4 resident + 1 for the next block's first panel), so that C's rows become final
    over 4 panels' time and leave while the rest computes. Then what the kernel's strategy changes
    (:meth:`oocgemm.strategies.Native.cuda_staging`: a Gram product's 16 output stripes,
    an emulation's slots)."""
    from .. import machine

    readers = max(4, min(10, machine.cores() - 4))
    settings = StagingSettings(readers=readers, n_stage=2 * readers, n_out=8, split_last=8,
                               ramp=2, min_stripes=readers, tail_panels=4, n_a=5, n_b=5,
                               ramp_granule=max(model.granule, problem.a_chunks_mk()[1] or 1,
                                                problem.b_chunks_kn()[0] or 1))
    return strategy_of(kernel).cuda_staging(settings, problem)

"""What an executor's staging of a product is, as data the planner takes: whether its data
moves through staging buffers (:class:`Staging`), and the settings (:class:`StagingSettings`:
readers, ring sizes, stripes, slots) that size the buffers a tile must fit. Each backend
makes them (:meth:`Backend.staging <oocgemm.backends.Backend.staging>`, from the policies in
:mod:`oocgemm.runtime.staging`)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StagingSettings:
    """How an executor moves one product's data, which sizes the buffers a tile must fit: its
    readers, rings, panel slots, the stripes of its last panels and the ramp of its first
    (:attr:`Plan.staging <oocgemm.planning.Plan.staging>`, the backend's settings as the
    planner's passes left them: the in-core shape and the CPU's resident panels change
    them for the tile).

    Three things that size the buffers stay on the plan: ``staged`` (whether the data goes
    through staging buffers at all: the backend's kind, :attr:`Staging.staged`, not one of
    its settings, and what most of the plan's geometry asks first), ``stripe`` (the ring
    buffers' size, which no backend sets: the planner's passes size it for each tile, its
    regions, its ring decodes and the objects decoded on the device) and ``n_c`` (C's
    slots, which no backend sets either: two, one in the in-core shape)."""

    readers: int = 4
    """Reader threads the executor may run (and as many chunk decoders)."""
    n_stage: int = 16
    """Pinned ring buffers for what goes up (A, B, C stripes) when staged."""
    n_out: int = 4
    """Pinned ring buffers for C stripes coming down when staged."""
    split_last: int = 1
    """Row stripes the last K panel's GEMM of each block is cut into, so that C starts its
    way back while the rest of the block computes (1: not cut)."""
    split_blocks: str = "every"
    """The blocks whose tail panels run in row stripes: ``'every'`` block (the CUDA
    executor's: each block's C starts down while its last panels compute, stripe by stripe),
    or the ``'last'`` block of the whole run only (its place in the whole order, the same in
    a device's group of blocks and in a resumed run; the CPU's, whose other blocks' stripes
    sped nothing up: each computes its last panel in one GEMM). Either way a block's bits do
    not depend on the run it is in, nor on where C goes."""
    tail_panels: int = 1
    """The last K panels of each block, run in row stripes (``split_last`` stripes): in a
    run's last block stripe by stripe, so that C's rows become final over several panels,
    elsewhere panel by panel; needs that many A and B slots (one more lets the next block's
    first panels arrive meanwhile)."""
    ramp: int = 0
    """Halvings of the first K panel: with 3 it runs as r/8, r/8, r/4, r/2, so that the first
    GEMM starts after an eighth of a panel has arrived (pieces stay multiples of
    ``ramp_granule``)."""
    ramp_granule: int = 1
    """Smallest piece of a ramped first panel (a chunk or the device's granule)."""
    min_stripes: int = 1
    """Stripes a staged region is cut into at the least, so that small regions (the ramp's
    first pieces) are copied by several readers at once."""
    n_a: int = 2
    """A panel buffers (ping-pong A0/A1; a slot per panel where the panels are kept:
    :attr:`Plan.resident <oocgemm.planning.Plan.resident>`)."""
    n_b: int = 2
    """B panel buffers (ping-pong B0/B1; likewise)."""

    def tiling(self) -> dict:
        """Those the tile search takes (:func:`~oocgemm.planning.tiling.choose_tile`): all
        but the ramp's granule."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "ramp_granule"}


@dataclass(frozen=True)
class Staging:
    """An executor's staging of one product (its backend's policy, as data)."""

    staged: bool
    """True: the data moves through pinned staging buffers between storage and the device
    (the CUDA executor); False: the executor works in place (the CPU's)."""
    settings: StagingSettings = StagingSettings()
    """The settings it runs the plan with."""

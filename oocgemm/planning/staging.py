"""What an executor's staging of a product is, as data the planner takes: whether its data
moves through staging buffers (:class:`Staging`), and the settings (:class:`StagingSettings`:
readers, ring sizes, stripes, slots) that size the buffers a tile must fit. Each backend
makes them (:meth:`Backend.staging <oocgemm.backends.Backend.staging>`, from the policies in
:mod:`oocgemm.runtime.staging`)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class StagingSettings:
    """How an executor moves one product's data: the plan's fields of that name (each
    default the :class:`~oocgemm.planning.Plan`'s), which size the buffers a tile must fit.
    Documented on the plan's fields."""

    readers: int = 4
    n_stage: int = 16
    n_out: int = 4
    split_last: int = 1
    split_blocks: str = "every"
    tail_panels: int = 1
    ramp: int = 0
    ramp_granule: int = 1
    min_stripes: int = 1
    n_a: int = 2
    n_b: int = 2

    def plan_fields(self) -> dict:
        """The settings as the plan's fields, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def tiling(self) -> dict:
        """Those the tile search takes (:func:`~oocgemm.planning.tiling.choose_tile`): all
        but the ramp's granule."""
        return {k: v for k, v in self.plan_fields().items() if k != "ramp_granule"}

    @classmethod
    def of(cls, plan) -> StagingSettings:
        """The settings ``plan`` (a :class:`~oocgemm.planning.Plan`) runs with."""
        return cls(**{f.name: getattr(plan, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Staging:
    """An executor's staging of one product (its backend's policy, as data)."""

    staged: bool
    """True: the data moves through pinned staging buffers between storage and the device
    (the CUDA executor); False: the executor works in place (the CPU's)."""
    settings: StagingSettings = StagingSettings()
    """The settings it runs the plan with."""

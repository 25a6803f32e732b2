"""Pure planning: tiling, memory model, the schedule as data. No I/O, no GPU."""

from .check import ScheduleError, check_schedule
from .finish import finished, on_object_edges, with_tile_advice
from .model import DeviceModel, cpu_model, cuda_model
from .plan import IOChoices, Plan, Work, with_gpu_decode, with_ring_decodes
from .problem import Operand, Problem
from .schedule import (
                       ORDERED_LANES,
                       Counts,
                       Op,
                       OpKind,
                       Schedule,
                       build_schedule,
                       count_schedule,
                       ordered_lane,
                       serpentine,
)
from .tiling import Prediction, choose_tile, in_core_shape, in_place, predict

__all__ = ["ORDERED_LANES", "Counts", "DeviceModel", "IOChoices", "Op", "OpKind", "Operand",
           "Plan", "Prediction", "Problem", "Schedule", "ScheduleError", "Work", "build_schedule",
           "check_schedule", "choose_tile", "count_schedule", "cpu_model", "cuda_model", "finished",
           "in_core_shape", "in_place", "on_object_edges",
           "ordered_lane", "predict", "serpentine", "with_gpu_decode",
           "with_ring_decodes", "with_tile_advice"]

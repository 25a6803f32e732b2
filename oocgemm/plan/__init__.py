"""Pure planning: tiling, memory model, the schedule as data. No I/O, no GPU."""

from .check import ScheduleError, check_schedule
from .model import DeviceModel, cpu_model, cuda_model
from .problem import Operand, Problem
from .schedule import Op, OpKind, Schedule, build_schedule, serpentine
from .tiling import Plan, Prediction, choose_tile, predict

__all__ = ["DeviceModel", "Op", "OpKind", "Operand", "Plan", "Prediction", "Problem", "Schedule",
           "ScheduleError", "build_schedule", "check_schedule", "choose_tile", "cpu_model",
           "cuda_model", "predict", "serpentine"]

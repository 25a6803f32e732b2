"""What a kind of device means, in one place: a :class:`Backend` per kind ('cpu', 'cuda'),
registered once in :data:`BACKENDS`, holds its cost model, its budgets, its executor's
staging policy and executor, its start-up, what runs keep between them, and the facts the
planner asks of it (can it decode zstd frames, is its decoder found). Nothing else compares
a kind's name: code asks :func:`backend_of` a device or a device's name and uses what comes
back. CuPy is imported only by the CUDA backend's methods, when a run needs it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from . import machine
from .devices import Device
from .errors import BudgetError, DeviceError
from .planning.model import DeviceModel, cpu_model, cuda_model
from .planning.staging import Staging
from .units import echo_size, format_size, parse_size


@dataclass(frozen=True)
class Backend:
    """A kind of device: the CPU's (this class) or a GPU's (:class:`CudaBackend`)."""

    kind: str = "cpu"
    """The kind's name, as device names start ('cpu', 'cuda')."""
    staged: bool = False
    """The executor moves data through pinned staging buffers (the CUDA executor) rather than
    working on the host's buffers in place (the CPU's)."""
    executor: str = "oocgemm.runtime.cpu:CpuExecutor"
    """The executor class, ``module:name``, imported when a run needs it."""
    decodes: bool = False
    """Its executor can decode zstd frames on the device (:attr:`Plan.io.gpu_decode
    <oocgemm.planning.plan.IOChoices.gpu_decode>`)."""
    working_memory_is_host: bool = True
    """Its working buffers (``memory_limit``) are host memory: host memory running short
    halves them too."""

    def model(self) -> DeviceModel:
        """The device's rates, for the planner's predictions."""
        return cpu_model()

    def memory(self, index: int, options) -> int:
        """The bytes of ``memory_limit`` (the option, or a quarter of host memory)."""
        total = machine.total_memory()
        return parse_size(options.memory_limit, total, name="memory_limit") or total // 4

    def budgets(self, index: int, options) -> tuple[DeviceModel, int, int]:
        """(model, memory_limit, host_memory_limit) in bytes for a run on device ``index``."""
        total = machine.total_memory()
        host = parse_size(options.host_memory_limit, total,
                          name="host_memory_limit") or total // 4
        return self.model(), self.memory(index, options), host

    def staging(self, problem, model: DeviceModel, kernel: str) -> Staging:
        """Its executor's staging of ``problem`` with ``kernel``."""
        from .runtime.staging import cpu_settings

        return Staging(self.staged, cpu_settings(problem, model, kernel))

    def start(self, indices) -> None:
        """Begin the device's start-up (contexts, libraries) in the background, while the
        inputs open and the plan is made: nothing to do on the CPU."""

    def start_now(self, index: int) -> None:
        """Take device ``index``'s start-up steps now (a worker's warm-up): nothing to take
        on the CPU."""

    def decoder_found(self) -> bool:
        """Its zstd decoder is found (a fact for the planner)."""
        return False

    def encoder(self, framing) -> Any:
        """Its encoder's buffers for C's stripes in ``framing`` (a
        :class:`~oocgemm.storage.frames.Framing`), where it compresses C on the device and
        the encoder is found (a fact for the planner's GPU encode pass:
        :class:`~oocgemm.planning.planner.EncoderSizes`); else None."""
        return None

    def free_memory(self, index: int) -> int | None:
        """Bytes free on device ``index`` now, where the device has memory of its own."""
        return None

    def resources(self) -> Any:
        """A new holder of what its runs keep between them (an :class:`oocgemm.Engine`'s),
        or None where they keep nothing."""
        return None

    def executor_class(self):
        """The executor class (imported now)."""
        module, name = self.executor.split(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class CudaBackend(Backend):
    """A CUDA GPU's."""

    kind: str = "cuda"
    staged: bool = True
    executor: str = "oocgemm.runtime.cuda_executor:CudaExecutor"
    decodes: bool = True
    working_memory_is_host: bool = False

    def model(self) -> DeviceModel:
        return cuda_model()

    def memory(self, index: int, options) -> int:
        """The option (at most what is free), or 90% of the GPU's free memory."""
        from . import cuda

        free, total = cuda.memory_info(index)
        mem = parse_size(options.memory_limit, total, name="memory_limit") or int(free * 0.9)
        if mem > free:
            raise BudgetError(f"memory_limit={echo_size(options.memory_limit, mem)} is more "
                              f"than the {format_size(free)} free on cuda:{index}")
        return mem

    def staging(self, problem, model: DeviceModel, kernel: str) -> Staging:
        from .runtime.staging import cuda_settings

        return Staging(self.staged, cuda_settings(problem, model, kernel))

    def start(self, indices) -> None:
        from .cuda import startup

        startup.ahead(indices)

    def start_now(self, index: int) -> None:
        """The context, cuBLAS and a pinned buffer (:func:`oocgemm.cuda.startup.times`)."""
        from .cuda import startup

        startup.times(index, start=True)

    def decoder_found(self) -> bool:
        from .cuda import nvcomp

        return nvcomp.library() is not None

    def encoder(self, framing) -> Any:
        """nvCOMP's buffers for C's stripes in ``framing`` (:class:`oocgemm.cuda.nvcomp.Sizes`),
        where nvCOMP is found."""
        from .cuda import nvcomp

        return nvcomp.Sizes(framing) if nvcomp.library() is not None else None

    def free_memory(self, index: int) -> int | None:
        from . import cuda

        return cuda.memory_info(index)[0]

    def resources(self) -> Any:
        from .cuda.context import Resources

        return Resources()


#: The backends by kind.
BACKENDS: dict[str, Backend] = {"cpu": Backend(), "cuda": CudaBackend()}


def backend_of(device) -> Backend:
    """The backend of ``device``: a :class:`~oocgemm.devices.Device`, a device's name
    ('cuda:1', 'cpu#2') or a kind's."""
    kind = device.kind if isinstance(device, Device) else Device.named(str(device)).kind
    try:
        return BACKENDS[kind]
    except KeyError:
        raise DeviceError(f"unknown executor {kind!r}; known: {', '.join(sorted(BACKENDS))}"
                          ) from None


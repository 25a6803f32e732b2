"""Devices by name: what ``device=`` says ('auto', 'cpu', 'cuda', 'cuda:N', 'cuda:all', a
list), resolved against what this machine has."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DeviceError


@dataclass(frozen=True)
class Device:
    """One device, as a plan is made for it; its name (``str``) is 'cpu' or 'cuda:N'."""

    kind: str
    """'cpu' or 'cuda'."""
    index: int = 0
    """The GPU's number (0 on the CPU)."""

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @classmethod
    def named(cls, name: str) -> Device:
        """The device of an executor's name as :func:`device_names` gives them ('cpu',
        'cuda:N'; 'cpu#2', a second CPU executor, is the CPU), nothing asked of the machine
        (:func:`resolve_device` checks a user's name against it)."""
        kind, _, index = name.partition("#")[0].partition(":")
        if not (index or "0").isdigit():
            raise DeviceError(f"device {name!r}: expected 'cpu' or 'cuda:N' with N a GPU number")
        return cls(kind, int(index or 0))


def device_names(device) -> list[str] | None:
    """The executors of a run on several devices: ``device`` a list of device names (the
    same kind; 'cpu' may repeat, as several CPU executors, named 'cpu#1', 'cpu#2'...) or
    'cuda:all'; None for one device."""
    from . import cuda

    if isinstance(device, str):
        if device.strip().lower() != "cuda:all":
            return None
        count = cuda.device_count()
        if count == 0:
            resolve_device("cuda")  # says why there is none
        return [f"cuda:{i}" for i in range(count)]
    if not isinstance(device, (list, tuple)) or not device:
        raise DeviceError(f"device must be a name ('auto', 'cpu', 'cuda', 'cuda:N', "
                          f"'cuda:all') or a list of them, got {device!r}")
    kinds = {str(d).strip().lower().partition(":")[0] for d in device}
    if "auto" in kinds or len(kinds) > 1:
        raise DeviceError(f"devices {list(device)}: all of one kind, GPUs ('cuda:N') or the "
                          f"CPU ('cpu')")
    resolved = [resolve_device(d) for d in device]
    if resolved[0].kind == "cuda":
        names = [f"cuda:{d.index}" for d in resolved]
        if len(set(names)) < len(names):
            raise DeviceError(f"devices {list(device)}: a GPU named twice")
        return names
    return [f"cpu#{n}" for n in range(len(resolved))]


def planned_for(devices: list[str] | None, device):
    """The device a plan is made for: the first of several (each one's plan), or ``device``."""
    return devices[0].partition("#")[0] if devices else device


def resolve_device(device) -> Device:
    """'auto' (a GPU when CuPy sees one, else the CPU), 'cpu', 'cuda', 'cuda:N'."""
    from . import cuda

    if not isinstance(device, str):
        raise DeviceError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    name = device.strip().lower()
    if name == "cpu":
        return Device("cpu")
    if name == "auto":
        return Device("cuda", 0) if cuda.device_count() > 0 else Device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise DeviceError(f"device {device!r}: expected 'cuda:N' with N a GPU number")
        index = int(index_text)
        count = cuda.device_count()
        if count == 0:
            why = ("CuPy is not installed (pip install 'oocgemm[cuda12]' or 'oocgemm[cuda13]')"
                   if not cuda.cupy_installed() else "no CUDA GPU was found")
            raise DeviceError(f"device {device!r}: {why}; use device='cpu' or 'auto'")
        if index >= count:
            raise DeviceError(f"device {device!r}: only {count} GPU(s) found "
                              f"(cuda:0..cuda:{count - 1})")
        return Device("cuda", index)
    raise DeviceError(f"unknown device {device!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


#: The commands whose runs may start a GPU (``oocgemm plan`` asks one for its free memory).
GPU_COMMANDS = frozenset({"multiply", "gram", "plan"})


def command_gpus(argv: list[str]) -> list[int] | None | bool:
    """The GPUs an ``oocgemm`` command line will use, read from its words before anything
    is parsed (to start them beside the imports): a list of indices, None for all of them
    ('cuda:all'), False where it will use none or cannot tell (another command, help, the
    CPU, a name the parser will refuse)."""
    if not argv or argv[0] not in GPU_COMMANDS or "-h" in argv or "--help" in argv:
        return False
    name = "auto"
    for i, word in enumerate(argv):
        if word == "--device" and i + 1 < len(argv):
            name = argv[i + 1]
        elif word.startswith("--device="):
            name = word.partition("=")[2]
    indices = []
    for part in (p.strip() for p in name.strip().lower().split(",")):
        if part == "cuda:all":
            return None
        try:
            device = Device("cuda", 0) if part == "auto" else Device.named(part)
        except DeviceError:
            return False
        if device.kind != "cuda" or "#" in part:
            return False
        indices.append(device.index)
    return indices

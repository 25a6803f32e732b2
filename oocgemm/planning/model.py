"""The cost model that decides tile sizes (docs/design.md, "Planner").

A C block of w×h costs 2·w·h·K flops and moves (w·K + K·h)·s bytes of A and B: the flops per
byte moved are about 2 / (s·(1/w + 1/h)), so w and h should be large. The model predicts the time
of each resource (compute, host->device, device->host, storage) over the whole schedule; the
pipelined run takes about the largest of them plus the fill and drain that nothing hides.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import machine


@dataclass(frozen=True)
class DeviceModel:
    """Rates of one executor's resources. Defaults are rates measured on the H100 machine
    (docs/performance.md, "Figures moved from the code's docstrings")."""

    name: str
    """'cuda' or 'cpu'."""
    flops: float
    """Sustained GEMM rate on large blocks, flop/s (float64; float32 is taken as twice)."""
    h2d: float
    """Host-to-device bandwidth, bytes/s (0: the executor does not copy to a device)."""
    d2h: float
    """Device-to-host bandwidth, bytes/s."""
    storage_read: float = 1.9e9
    """Storage read bandwidth for on-disk operands, stored bytes/s (a compressed operand's
    reads move its :attr:`~oocgemm.planning.problem.Operand.stored` share of the bytes it
    decodes)."""
    storage_write: float = 1.9e9
    """Storage write bandwidth, bytes/s."""
    memory_copy: float = 10e9
    """Host memory copy bandwidth for in-memory operands, bytes/s."""
    cache_write: float = 1.5e9
    """Bytes/s at which C's writes go into the OS page cache (new pages allocated and
    filled, the writers together) where it takes all of them (:attr:`Operand.cached
    <oocgemm.planning.problem.Operand.cached>` of the output): the OS writes them back
    after the call."""
    first_touch: float = 0.0
    """Bytes/s at which fresh host buffers are first written (page faults); 0 where buffers
    are device memory. Charged to the fill (first panels) and the drain (last C block)."""
    half_size: int = 256
    """A GEMM of w×h×r runs at flops / (1 + half_size/w + half_size/h + half_size/r):
    small blocks do not fill the device."""
    memory: str = "GPU"
    """What ``memory_limit`` bounds on the device, in words ('GPU', or the CPU's 'working'
    memory)."""
    kernels: bool = True
    """``kernel=`` chooses the device's GEMM (a GPU's); False: numpy's BLAS runs every GEMM
    that is not emulated (the CPU)."""
    smallest_side: int = 64
    """The smallest block side the planner's search tries (where the product is larger):
    smaller blocks do not fill the device."""
    granule: int = 1
    """Block sizes the device runs best at multiples of (cuBLAS DGEMM runs markedly slower
    with 10923-sized operands than with 11008 = 43·256: docs/performance.md, "Figures moved
    from the code's docstrings"); chunk alignment comes first."""
    decode: float = 0.0
    """Bytes/s at which the decoder threads together decode compressed chunks (0: not
    charged)."""
    decode_frame: float = 0.0
    """Seconds the decoder threads together take per compressed frame, besides its bytes
    (many small frames, as in shards of small chunks, decode slower than a few large)."""
    device_decode: float = 0.0
    """Bytes/s at which the device decodes zstd frames of a batch together (nvCOMP; 0: it
    does not)."""
    device_decode_frame: float = 0.0
    """Bytes/s at which the device decodes one zstd frame: on one thread block, so a batch
    takes at least its largest frame at this rate."""
    decode_on_compute_cores: bool = False
    """True where the decoders run on the cores that compute (the CPU): their times add up
    instead of overlapping."""
    accumulate_pass: bool = False
    """True when accumulating into C costs an extra pass over the C block (numpy: no
    in-place beta), charged at ``memory_copy``."""
    int8_ops: float = 0.0
    """Sustained int8 tensor-core GEMM rate, ops/s, for emulated float64 products
    (``kernel='ozaki'``; 0: the device emulates with its float64 rate, as numpy does)."""
    finish_digit: float = 0.0
    """Seconds the emulation's finish adds per element of C, modulus and K panel, as it runs
    beside the int8 GEMMs (digits, rounding, alpha and beta)."""
    convert_digit: float = 0.0
    """Seconds the conversion adds per element of a loaded A or B panel and modulus
    (residues)."""
    convert_element: float = 0.0
    """Seconds the conversion adds per element of a loaded A or B panel (its stats)."""
    op_overhead: float = 40e-6
    """Seconds each operation of the schedule costs to dispatch, beside its work (Python,
    stream and thread hand-offs)."""

    def gemm_seconds(self, w: int, h: int, r: int, itemsize: int, complex_: bool = False) -> float:
        flops = (8 if complex_ else 2) * w * h * r
        rate = self.flops * (2.0 if itemsize == 4 and not complex_ else 1.0)
        return flops / rate * (1 + self.half_size / max(w, 1) + self.half_size / max(h, 1)
                               + self.half_size / max(r, 1))


@functools.cache
def cuda_model() -> DeviceModel:
    """H100 80GB over PCIe gen5, as measured there (its DGEMM rate, its PCIe rate each way);
    a GEMM with r = 128 runs at about half rate."""
    # Every rate below was measured, on the H100 machine or (the decoders' frames, the
    # device's decodes) the H200 machine; the figures and how the model met them:
    # docs/performance.md, "Figures moved from the code's docstrings" (the cost model).
    # memory_copy: the host's staging copies together, on many threads, while C streams out
    # beside A and B streaming in. decode: whole zstd chunks decoded from their files
    # straight into the buffers (zarr-python's pipelines, which layouts that are not plain
    # chunk files still take, are slower: oocgemm.storage.zarr_store.direct).
    # int8_ops, finish_digit, convert_digit: the emulation's int8 GEMMs sustained, and the
    # finish and the conversion as they added to the compute lane's time out of core.
    # decode_frame: shards of small chunks (many small frames) cost the host's decoders more
    # than large chunks of the same bytes. device_decode, device_decode_frame: nvCOMP decodes
    # a frame on one thread block, so a batch takes its largest frame at one block's rate
    # plus all of it at the batch's rate (docs/performance.md, "Who decodes the inputs").
    # cache_write: C's chunk files and .npy pages written by the writer threads together
    # while the page cache takes them (n = 32768 and 49152 on the H200 machine).
    # storage_read: stored bytes of whole chunk files read cold and decoded as a run reads
    # them (each asked of the OS whole ahead of its decode), beside its uploads, GEMMs and
    # C's writes (n = 32768 Zarr inputs on the H200 machines, whose disks read 1.5-2.2 GB/s
    # raw): docs/performance.md, "First contact on the GPU, session 36".
    return DeviceModel(name="cuda", flops=55e12, h2d=55e9, d2h=55e9, memory_copy=25e9,
                       cache_write=3.5e9, storage_read=1.8e9,
                       half_size=128, granule=256, decode=8e9, decode_frame=1e-4,
                       device_decode=20e9,
                       device_decode_frame=1.0e9, int8_ops=1.04e15,
                       finish_digit=4.5e-12, convert_digit=2.4e-12, convert_element=8e-12)


def cpu_model() -> DeviceModel:
    """numpy BLAS on this host: a float64 rate per core, times its cores (measured:
    docs/performance.md, "Figures moved from the code's docstrings")."""
    return _cpu_model(machine.cores())


@functools.cache
def _cpu_model(cores: int) -> DeviceModel:
    # Copies into fresh buffers fault pages in (first_touch), several times slower than
    # copies between warm buffers (memory_copy). zstd chunk files decode straight into the
    # buffers at a rate per core (decode), quicker than through zarr-python's pipeline.
    # Measured on a 2-core VM: docs/performance.md, "Figures moved from the code's
    # docstrings" (the cost model).
    return DeviceModel(name="cpu", flops=35e9 * cores, h2d=0.0, d2h=0.0, half_size=16,
                       smallest_side=16, memory="working", kernels=False,
                       memory_copy=6e9, first_touch=1.5e9, accumulate_pass=True,
                       decode=1.0e9 * cores, decode_on_compute_cores=True)

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
    """Rates of one executor's resources. Defaults are figures measured on the H100 machine."""

    name: str
    """'cuda' or 'cpu'."""
    flops: float
    """Sustained GEMM rate on large blocks, flop/s (float64; float32 is taken as twice)."""
    h2d: float
    """Host-to-device bandwidth, bytes/s (0: the executor does not copy to a device)."""
    d2h: float
    """Device-to-host bandwidth, bytes/s."""
    storage_read: float = 1.9e9
    """Storage read bandwidth for on-disk operands, bytes/s."""
    storage_write: float = 1.9e9
    """Storage write bandwidth, bytes/s."""
    memory_copy: float = 10e9
    """Host memory copy bandwidth for in-memory operands, bytes/s."""
    first_touch: float = 0.0
    """Bytes/s at which fresh host buffers are first written (page faults); 0 where buffers
    are device memory. Charged to the fill (first panels) and the drain (last C block)."""
    half_size: int = 256
    """A GEMM of w×h×r runs at flops / (1 + half_size/w + half_size/h + half_size/r):
    small blocks do not fill the device."""
    granule: int = 1
    """Block sizes the device runs best at multiples of (cuBLAS DGEMM on an H100 runs ~17%
    slower with 10923-sized operands than with 11008 = 43·256); chunk alignment comes first."""
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
    """H100 80GB over PCIe gen5, as measured there: 55 TFLOP/s DGEMM, 55 GB/s each way; a
    GEMM with r = 128 runs at about half rate."""
    # Host staging copies run on many threads; while C streams out beside A and B streaming
    # in, the host's copies together reached ~25 GB/s on the H100 machine (16 cores).
    # Whole zstd chunks decode at 9.2 GB/s from their files straight into the buffers (16
    # threads, 256 MB chunks; 1.7-2.9 GB/s through zarr-python's pipelines, which layouts
    # that are not plain chunk files still take: oocgemm.storage.zarr_store.direct).
    # The emulation (kernel='ozaki', H100, 2026-11-24): int8 GEMMs 1036-1050 TOPS sustained
    # (batched, 2048 x 16384 x 8192-16384); the finish and the conversion as they added to
    # the compute lane's time out of core at n = 32768 (16 moduli, tiles 16384^2 x 2560 and
    # 16384 x 32768 x 8192: 2.38 s and 1.62 s against 2.39 s and 1.62 s modelled).
    # Shards of 512² chunks (2 MiB frames) took the host's decoders 0.8 s longer than 4096²
    # chunks for the same 17 GB (8,192 frames against 128; H200 machine, session 29).
    # nvCOMP 6.0's zstd decode on the H200 (2026-11-27, session 29, n = 32768 runs): a batch
    # takes its largest frame at 1.0 GB/s (one thread block) plus all of it at 20 GB/s: 32
    # K steps of 12 frames of 128 MiB ran 6.1 s (5.9 modelled), 16 of them 3.5 s (3.4), 32
    # of hundreds of 2 MiB frames 1.8 s (1.8).
    return DeviceModel(name="cuda", flops=55e12, h2d=55e9, d2h=55e9, memory_copy=25e9,
                       half_size=128, granule=256, decode=8e9, decode_frame=1e-4,
                       device_decode=20e9,
                       device_decode_frame=1.0e9, int8_ops=1.04e15,
                       finish_digit=4.5e-12, convert_digit=2.4e-12, convert_element=8e-12)


def cpu_model() -> DeviceModel:
    """numpy BLAS on this host: about 35 GFLOP/s per core in float64 (0.56 TFLOP/s on 16)."""
    return _cpu_model(machine.cores())


@functools.cache
def _cpu_model(cores: int) -> DeviceModel:
    # Copies into fresh buffers fault pages in: ~1.5 GB/s on a 2-core VM, against ~6 GB/s
    # for copies between warm buffers.
    # zstd chunk files decode at about 1 GB/s a core straight into the buffers (2.1 GB/s on
    # the 2-core VM; 0.5 GB/s a core through zarr-python's pipeline).
    return DeviceModel(name="cpu", flops=35e9 * cores, h2d=0.0, d2h=0.0, half_size=16,
                       memory_copy=6e9, first_touch=1.5e9, accumulate_pass=True,
                       decode=1.0e9 * cores, decode_on_compute_cores=True)

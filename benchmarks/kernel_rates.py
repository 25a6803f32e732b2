"""The per-block kernels of ``kernels/`` against cuBLAS and the FMA peak of the CUDA cores, and
their clock, board power and energy per flop (``python -m benchmarks kernels``, ``power``).
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta

import numpy as np

from oocgemm import cuda
from oocgemm import kernel_catalog as catalog
from oocgemm.errors import OptionError
from oocgemm.info import gpu_info

from .common import check_dtype, check_room, tolerance

#: Targets of ``python -m benchmarks kernels`` (H100): SIMT kernels against the FMA peak,
#: the tensor-core kernel against cuBLAS at the largest size.
KERNEL_TARGETS = {"opt": ("fma_peak", 0.80), "regblock": ("fma_peak", 0.80),
                  "dmma": ("cublas", 0.90)}


#: FMA units of one SM by compute capability (major * 10 + minor) and precision, from NVIDIA's
#: architecture whitepapers; chips not listed get no nominal peak.
FMA_UNITS_PER_SM = {"float64": {60: 32, 70: 32, 80: 32, 90: 64},
                    "float32": {60: 64, 70: 64, 80: 64, 86: 128, 89: 128, 90: 128}}


def nominal_fma_rate(capability: int, sms: int, clock_khz: int, dtype="float64") -> float | None:
    """FLOP/s of every FMA unit busy every cycle at ``clock_khz`` (the SM's top clock), or None
    for a chip :data:`FMA_UNITS_PER_SM` does not list: the yardstick for the measured peak."""
    units = FMA_UNITS_PER_SM[np.dtype(dtype).name].get(capability)
    return None if units is None else 2.0 * units * sms * clock_khz * 1e3


def _nominal_fma_gflops(dt) -> float | None:
    import cupy

    from oocgemm.cuda import kernels as kmod

    dev = cupy.cuda.Device()
    rate = nominal_fma_rate(kmod.capability(dev.id), dev.attributes["MultiProcessorCount"],
                            dev.attributes["ClockRate"], dt)
    return None if rate is None else rate / 1e9


def kernel_benchmark(sizes=(1024, 2048, 4096, 8192), *, kernels=None, dtype="float64",
                     repeat: int = 5, seed: int = 0, on_step=None) -> dict:
    """GFLOP/s of each kernel of ``kernels/`` and of cuBLAS on n³ products (random operands,
    CUDA events, medians of ``repeat``), the FMA peak of the CUDA cores (measured, and nominal
    where :data:`FMA_UNITS_PER_SM` knows the chip), and each kernel's registers, shared memory
    and local memory (spills).

    ``on_step(size, rates)`` is called after each size. Relative errors are against cuBLAS.
    """
    dt = check_dtype(dtype)
    names = _kernel_names(kernels, catalog.KERNELS, dt)
    if not cuda.device_count():
        raise OptionError("the kernel benchmark needs a GPU (none found)")
    from oocgemm.cuda import kernels as kmod

    from . import baselines, fma

    result: dict = {"benchmark": "kernels", "dtype": dt.name, "gpu": gpu_info(),
                    "fma_peak_gflops": fma.fma_peak(dt) / 1e9,
                    "fma_nominal_gflops": _nominal_fma_gflops(dt), "sizes": {},
                    "resources": {k: kmod.resources(k, dt) for k in names}}
    for n in sizes:
        check_room(4 * n * n * dt.itemsize, f"a {n}^3 product")  # a, b, c and the reference
        rates = baselines.square_rates(names, n, dt, repeat=repeat, seed=seed)
        for entry in rates.values():
            entry["gflops"] = 2 * n ** 3 / entry["seconds"] / 1e9
            entry["correct"] = entry["max_rel_error"] <= tolerance(dt, n)
        result["sizes"][n] = rates
        if on_step is not None:
            on_step(n, rates)
    largest = result["sizes"][max(sizes)]
    result["targets"] = {}
    for name, (against, ratio) in KERNEL_TARGETS.items():
        if name not in largest:
            continue
        base = result["fma_peak_gflops"] if against == "fma_peak" else largest["cublas"]["gflops"]
        got = largest[name]["gflops"] / base
        result["targets"][name] = {"against": against, "ratio": got, "target": ratio,
                                   "met": got >= ratio}
    return result



def _kernel_names(kernels, default, dt) -> list[str]:
    """The kernels of ``kernels/`` asked for (``default`` when none are) that run in ``dt``;
    OptionError for a name the catalog does not know."""
    names = list(kernels or default)
    unknown = [k for k in names if k not in catalog.KERNELS]
    if unknown:
        raise OptionError(f"unknown kernel(s) {', '.join(unknown)}; known: "
                          f"{', '.join(catalog.KERNELS)}")
    return [k for k in names if dt.name in catalog.KERNELS[k].dtypes]



#: The measuring builds of ``python -m benchmarks power``: what the CUDA-core kernels reach when
#: their operands cost less to move. Their products are wrong on purpose (kernels/*.cu).
KERNEL_BOUNDS = {"l1": ("OOCGEMM_STAGING", 1, "operand loads hit in L1 (no L2 or HBM traffic)"),
                 "loop": ("OOCGEMM_STAGING", 2, "the multiply loop alone (nothing staged)")}
BOUNDED_KERNELS = ("opt", "regblock")
#: The CUDA cores' own rows of ``python -m benchmarks power`` (``benchmarks/kernels/fma_peak.cu``):
#: name -> (operands of ``fma_outer``, or None for the FMA-peak kernel; what it measures).
THROUGHPUT_ROWS = {
    "fma_peak": (None, "the FMA peak: independent chains whose operands settle (little toggling)"),
    "fma_outer": ("random", "a GEMM's inner-loop FMAs kept in registers, random operands"),
    "fma_outer:const": ("constant", "the same instructions on constant operands"),
}
POWER_KERNELS = ("opt", "regblock", "dmma")


def kernel_power(size: int = 8192, *, kernels=None, seconds: float = 2.5, dtype="float64",
                 seed: int = 0, on_entry=None) -> dict:
    """Rate, SM clock and board power of each kernel run alone, back to back on one size³
    product for about ``seconds``, while ``nvidia-smi`` samples the GPU; likewise cuBLAS and the
    CUDA cores' throughput kernels (:data:`THROUGHPUT_ROWS`: the FMA peak, and a GEMM's FMAs in
    registers on random and on constant operands, which shows what the data costs), and the
    measuring builds of opt and regblock (:data:`KERNEL_BOUNDS`): how fast they run when their
    operands cost less or nothing to move.

    Each entry: TFLOP/s, its fraction of the FMA peak, median SM clock and board power over the
    run (its first 0.6 s left out, while the clock settles), the fraction of samples under the power
    cap, and the energy per flop above the idle board's power. A kernel at the power limit runs
    at (limit - idle) / (energy per flop). ``on_entry(name, entry)`` is called after each.
    """
    dt = check_dtype(dtype)
    names = _kernel_names(kernels, POWER_KERNELS, dt)
    if seconds <= 0:
        raise OptionError(f"seconds must be positive, got {seconds!r}")
    if not cuda.device_count():
        raise OptionError("the power benchmark needs a GPU (none found)")
    import cupy

    from . import baselines, fma
    from .power import PowerSampler

    check_room(4 * size * size * dt.itemsize, f"a {size}^3 product")  # a, b, c, reference
    cases, bound_of = {}, {}
    for name in names:
        cases[name] = (name, ())
        if name in BOUNDED_KERNELS:
            for tag, (macro, value, _) in KERNEL_BOUNDS.items():
                cases[f"{name}:{tag}"] = (name, ((macro, value),))
                bound_of[f"{name}:{tag}"] = tag
    launches, errors = baselines.square_launches(cases, size, dt, seed)
    cupy.cuda.Device().synchronize()

    def run_alone(fn) -> float:
        fn()
        cupy.cuda.Device().synchronize()
        start, count = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            fn()
            cupy.cuda.Device().synchronize()
            count += 1
        return 2 * size ** 3 * count / (time.perf_counter() - start)

    settle, rest = min(0.6, seconds / 4), min(1.0, seconds / 2)  # short runs in the tests
    entries: dict = {}
    gpu = cupy.cuda.Device().pci_bus_id
    with PowerSampler(gpu) as sampler:
        time.sleep(rest)
        t0 = sampler.now()
        time.sleep(min(1.5, seconds))
        idle = sampler.window(t0, sampler.now())
        # The throughput kernels make ~4 launches of seconds / 3 (a sizing one, then 3 timed).
        throughput = {
            name: (functools.partial(fma.fma_peak, dt, seconds=seconds / 3) if operands is None
                   else functools.partial(fma.fma_outer, dt, seconds=seconds / 3,
                                          operands=operands, seed=seed))
            for name, (operands, _) in THROUGHPUT_ROWS.items()}
        for name, launch in [*throughput.items(), *launches.items()]:
            t0 = sampler.now()
            rate = launch() if name in throughput else run_alone(launch)
            t1 = sampler.now()
            time.sleep(rest)  # the next one starts on a cooler board
            window = sampler.window(t0 + timedelta(seconds=settle), t1)
            entry = {"tflops": rate / 1e12, **window}
            if name in bound_of:  # a measuring build: its product is wrong on purpose
                entry["bound"] = KERNEL_BOUNDS[bound_of[name]][2]
            elif name in errors:
                entry["max_rel_error"] = errors[name]
                entry["correct"] = errors[name] <= tolerance(dt, size)
            entries[name] = entry
            if on_entry is not None:
                on_entry(name, entry)
    peak = entries["fma_peak"]["tflops"]
    for entry in entries.values():
        entry["of_fma_peak"] = entry["tflops"] / peak
        if idle.get("samples") and entry.get("samples"):
            entry["pj_per_flop"] = (entry["power_w"] - idle["power_w"]) / entry["tflops"]
    return {"benchmark": "kernel power", "dtype": dt.name, "size": size, "seconds": seconds,
            "gpu": gpu_info(), "idle": idle, "entries": entries}

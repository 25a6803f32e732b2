"""Ozaki scheme II on the GPU against cuBLAS DGEMM, in one process (issue 21).

    python -m benchmarks ozaki-gpu [--sizes 8192,16384] [--n 32768] [--memory-limit 16GB]
                                   [--kernel ozaki:16] [--spreads 0,8,30] [--json out.json]

1. **Ceilings**: DGEMM and the int8 GEMM each repeated back to back for some seconds (the
   clocks settle under the power cap within a few), the median rate of the second half. The
   emulation cannot beat the int8 rate divided by its number of moduli (one int8 GEMM each).
   And :func:`overlap`: whether memory-bound work (as conversion and finish are) runs beside
   the int8 GEMMs for free.
2. **In core** (operands on the GPU): cuBLAS DGEMM and the emulated product
   (:class:`benchmarks.in_core.InCore`, the whole K one panel) at each size, alternated, each
   sustained; then one emulated product timed by phase (conversion, int8 GEMMs, finish), as
   pipelined and with the phases in turn on one stream (what each costs alone).
3. **Out of core**, n³ from host memory under the GPU memory limit: ``oocgemm.multiply``
   with cuBLAS and with the emulation, best of two runs each after a warm-up.
4. **Accuracy** per exponent spread (inputs normal times 2^u, u uniform in [-s/2, s/2]):
   max |C - C_ref| / (|A||B|) over sampled entries, C_ref in ``np.longdouble``, native DGEMM
   beside the emulation on the same inputs, in core at each size and out of core.
"""

from __future__ import annotations

import sys
import time

import numpy as np

#: Sampled rows and columns of C the accuracy is measured on.
SAMPLE_ROWS, SAMPLE_COLS = 8, 64


# -- timing --------------------------------------------------------------------------------------

def sustained(fn, ops: float, seconds: float) -> dict:
    """``fn`` (enqueues one GEMM of ``ops`` operations on the current stream) back to back for
    about ``seconds``: the median rate (ops/s) of the second half of the repeats, each timed
    with CUDA events, and the repeats' count."""
    import cupy

    fn()
    cupy.cuda.get_current_stream().synchronize()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 4:
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(begin, end) / 1e3)
    half = times[len(times) // 2:]
    return {"rate": ops / float(np.median(half)), "repeats": len(times),
            "seconds_each": float(np.median(half))}


def alternated(fns: dict, ops: float, seconds: float, rounds: int = 2) -> dict:
    """Each of ``fns`` (name: callable) :func:`sustained` for ``seconds``, in ``rounds``
    rounds that run them in turn, so that each meets the clocks of the whole run: the best
    round's rate of each (the others in ``rates``)."""
    runs: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            runs[name].append(sustained(fn, ops, seconds))
    return {name: {**max(r, key=lambda x: x["rate"]), "rates": [x["rate"] for x in r]}
            for name, r in runs.items()}


# -- operands and errors -------------------------------------------------------------------------

def device_spread(shape, bits: int, seed: int):
    """Normal values times 2^u, u uniform in [-bits/2, bits/2], on the current GPU."""
    import cupy

    rng = cupy.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if bits:
        x = cupy.ldexp(x, rng.integers(-(bits // 2), bits // 2 + 1, shape).astype(np.int32))
    return x


def host_spread(n: int, bits: int, seed: int, band: int = 2048) -> np.ndarray:
    """:func:`device_spread` of n x n made on the GPU a band of rows at a time, in host
    memory (pageable, as users' arrays are)."""
    out = np.empty((n, n))
    for r0 in range(0, n, band):
        rows = min(band, n - r0)
        device_spread((rows, n), bits, seed * 100003 + r0).get(out=out[r0:r0 + rows])
    return out


def sample(n_rows: int, n_cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (np.sort(rng.choice(n_rows, min(SAMPLE_ROWS, n_rows), replace=False)),
            np.sort(rng.choice(n_cols, min(SAMPLE_COLS, n_cols), replace=False)))


def sampled_error(c_entries, a_rows, b_cols) -> float:
    """max |C - C_ref| / (|A||B|) over sampled entries: ``c_entries`` (rows x cols of C),
    ``a_rows`` (those rows of A), ``b_cols`` (those columns of B), on the host; C_ref and
    |A||B| in np.longdouble."""
    x, y = a_rows.astype(np.longdouble), b_cols.astype(np.longdouble)
    ref, scale = x @ y, np.abs(x) @ np.abs(y)
    diff = np.abs(np.asarray(c_entries, dtype=np.longdouble) - ref)
    return float(np.max(diff / np.where(scale > 0, scale, 1)))


# -- the cases -----------------------------------------------------------------------------------

def _int8(rows: int, cols: int, depth: int, batch: int):
    """A batched int8 x int8 -> int32 GEMM on uniform residues, in the emulation's layout:
    (enqueue it on the current stream, its operations, whether it computed exactly)."""
    import cupy

    from oocgemm.cuda.ozaki import int8_gemm

    rng = cupy.random.default_rng(2)
    a = rng.integers(-128, 128, (batch, rows, depth)).astype(np.int8)
    b = rng.integers(-128, 128, (batch, cols, depth)).astype(np.int8)
    c = cupy.empty((batch, rows, cols), dtype=np.int32)

    def run():
        int8_gemm(cupy.cuda.device.get_cublas_handle(), a.data.ptr, b.data.ptr, c.data.ptr,
                  rows, cols, depth, lda=depth, ldb=depth, ldc=cols, stride_a=rows * depth,
                  stride_b=cols * depth, stride_c=rows * cols, batch=batch)

    def exact() -> bool:
        run()
        want = a[0, :64].astype(np.float64) @ b[0, :64].astype(np.float64).T
        return bool((c[0, :64, :64].astype(np.float64) == want).all())

    return run, 2.0 * rows * cols * depth * batch, exact


def ceilings(seconds: float) -> dict:
    """DGEMM and int8 rates sustained on this GPU: what bounds the emulation."""
    import cupy

    def dgemm(n):
        rng = cupy.random.default_rng(1)
        a, b, c = rng.standard_normal((n, n)), rng.standard_normal((n, n)), cupy.empty((n, n))
        return sustained(lambda: cupy.matmul(a, b, out=c), 2.0 * n ** 3, seconds)

    def int8(rows, cols, depth, batch):
        run, ops, exact = _int8(rows, cols, depth, batch)
        ok = exact()
        return {**sustained(run, ops, seconds), "exact": ok,
                "shape": [rows, cols, depth, batch]}

    cases = {"dgemm_16384": lambda: dgemm(16384),
             "int8_2048x16384x8192x16": lambda: int8(2048, 16384, 8192, 16),
             "int8_2048x16384x16384x16": lambda: int8(2048, 16384, 16384, 16),
             "int8_1024x16384x8192x16": lambda: int8(1024, 16384, 8192, 16),
             "int8_2048x16384x4096x16": lambda: int8(2048, 16384, 4096, 16)}
    out = {}
    for name, case in cases.items():
        out[name] = case()
        cupy.get_default_memory_pool().free_all_blocks()
    out["overlap"] = overlap(seconds)
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def overlap(seconds: float, copy_bytes: int = 8 << 30) -> dict:
    """Whether memory-bound work hides under the int8 GEMMs for free, as the emulation's
    conversion and finish would need to: the int8 GEMM of a chunk (2048 x 16384 x 8192, 16
    moduli) and a device-to-device copy of ``copy_bytes`` (HBM-bound, as those kernels are),
    each alone, then each under the other on two streams (the other given 1.5 times the work
    and enqueued first; ``covered``: it was still running when the measured one ended).
    ``shared``: the two rates at once as fractions of their rates alone, summed: 2 where the
    overlap is free, 1 where they take turns."""
    import cupy

    run, ops, _ = _int8(2048, 16384, 8192, 16)
    src = cupy.ones(copy_bytes // 8)
    dst = cupy.empty_like(src)

    def copy():
        cupy.copyto(dst, src)

    work = {"int8": (run, ops), "copy": (copy, 2.0 * copy_bytes)}  # bytes read and written
    alone = {name: sustained(fn, amount, seconds) for name, (fn, amount) in work.items()}
    together = {}
    for name, other in (("int8", "copy"), ("copy", "int8")):
        counts = {k: max(2, int(seconds / alone[k]["seconds_each"])) for k in work}
        counts[other] = counts[other] * 3 // 2
        marks = {}
        cupy.cuda.Device().synchronize()
        for key in (other, name):  # a few hundred launches each: no queue fills
            with cupy.cuda.Stream(non_blocking=True) as stream:
                begin, end = cupy.cuda.Event(), cupy.cuda.Event()
                begin.record(stream)
                for _ in range(counts[key]):
                    work[key][0]()
                end.record(stream)
                marks[key] = (begin, end)
        cupy.cuda.Device().synchronize()
        elapsed = cupy.cuda.get_elapsed_time(*marks[name]) / 1e3
        together[name] = {"rate": work[name][1] * counts[name] / elapsed, "seconds": elapsed,
                          "covered": cupy.cuda.get_elapsed_time(marks[name][1],
                                                                marks[other][1]) > 0}
    fractions = {name: together[name]["rate"] / alone[name]["rate"] for name in work}
    return {"alone": {k: v["rate"] for k, v in alone.items()},
            "together": together, "fractions": fractions,
            "shared": sum(fractions.values())}


def in_core(n: int, kernels, spreads, seconds: float, seed: int = 0) -> dict:
    """cuBLAS DGEMM against the emulation with each of ``kernels`` on n³, operands on the
    GPU: the rates, alternated and sustained (each emulated product converts its operands
    afresh); one product's phases; the accuracy per spread."""
    import cupy

    from benchmarks.in_core import InCore

    out: dict = {"n": n, "kernels": {}}
    c = cupy.empty((n, n))
    emulators = {kernel: InCore(n, n, n, kernel) for kernel in kernels}
    a, b = device_spread((n, n), 0, seed), device_spread((n, n), 0, seed + 1)
    fns = {"dgemm": lambda: cupy.matmul(a, b, out=c)}
    for kernel, emulate in emulators.items():
        fns[kernel] = lambda emulate=emulate: emulate(a, b, c)
    out["rates"] = alternated(fns, 2.0 * n ** 3, seconds)
    for kernel in kernels:
        out["kernels"][kernel] = {"accuracy": {}}
        for key, serial in (("phases", False), ("serial", True)):
            timed = InCore(n, n, n, kernel, timing=True, serial=serial)
            timed(a, b, c)  # a warm-up
            cupy.cuda.Device().synchronize()
            before = timed.emulator.seconds()
            start = time.perf_counter()
            timed(a, b, c)
            cupy.cuda.Device().synchronize()
            wall = time.perf_counter() - start
            out["kernels"][kernel][key] = {"wall": wall, **{
                phase: seconds - before.get(phase, 0.0)
                for phase, seconds in timed.emulator.seconds().items()}}
    rows, cols = sample(n, n, seed + 2)
    for bits in spreads:
        x, y = device_spread((n, n), bits, seed + 10 + bits), device_spread((n, n), bits,
                                                                            seed + 11 + bits)
        x_rows, y_cols = x[rows].get(), y[:, cols].get()
        cupy.matmul(x, y, out=c)
        native = sampled_error(c[rows][:, cols].get(), x_rows, y_cols)
        for kernel, emulate in emulators.items():
            note = emulate(x, y, c)
            error = sampled_error(c[rows][:, cols].get(), x_rows, y_cols)
            out["kernels"][kernel]["accuracy"][bits] = {
                "native": native, "emulated": error, "ratio": error / native, "note": note}
    return out


def out_of_core(n: int, kernels, memory_limits, spreads, repeat: int = 2,
                seed: int = 0) -> dict:
    """``oocgemm.multiply`` n³ from host memory with cuBLAS and with each of ``kernels``,
    under each GPU memory limit (timed on the first spread, best of ``repeat`` after a
    warm-up; the other spreads for accuracy only, under the first limit)."""
    import oocgemm

    result: dict = {"n": n, "limits": {}}
    c = np.empty((n, n))
    c.fill(0)  # pages touched once, outside every timing
    rows, cols = sample(n, n, seed + 2)
    for bits in spreads:
        a, b = host_spread(n, bits, seed + 20 + bits), host_spread(n, bits, seed + 21 + bits)
        a_rows, b_cols = a[rows], b[:, cols]
        timed = bits == spreads[0]
        for limit in memory_limits if timed else memory_limits[:1]:
            runs = result["limits"].setdefault(limit, {})
            for name, which in (("dgemm", None), *((k, k) for k in kernels)):
                best = None
                for _ in range(repeat + 1 if timed else 1):
                    c.fill(np.nan)
                    run = oocgemm.multiply(a, b, c, device="cuda", memory_limit=limit,
                                           kernel=which, progress=False)
                    best = run if best is None or run.seconds < best.seconds else best
                entry = runs.setdefault(name, {"accuracy": {}})
                entry["accuracy"][bits] = sampled_error(c[rows][:, cols], a_rows, b_cols)
                if timed:
                    pred = best.plan.prediction
                    entry.update(seconds=best.seconds, tflops=best.tflops,
                                 tile=list(best.plan.tile), emulation=dict(best.emulation),
                                 emulation_seconds=dict(best.emulation_seconds),
                                 predicted=pred.total, bound=pred.bound,
                                 compute_busy=_compute_busy(best), bytes=dict(best.bytes))
    return result


def _compute_busy(run) -> float:
    """The share of the run's wall time the compute lane was busy."""
    busy = sum(e.end - e.start for e in run.events if e.lane == "compute")
    return busy / run.seconds if run.seconds else 0.0


def benchmark(sizes=(8192, 16384), n: int = 32768, *, kernels=("ozaki:16",),
              memory_limits=("16GB",), spreads=(0, 8, 30), seconds: float = 4.0) -> dict:
    """Every case in one process."""
    import cupy

    from oocgemm.info import gpu_info

    out: dict = {"benchmark": "ozaki-gpu", "gpu": gpu_info(), "date": time.strftime("%Y-%m-%d"),
                 "kernels": list(kernels), "ceilings": ceilings(seconds)}
    out["in_core"] = []
    for size in sizes:
        out["in_core"].append(in_core(size, kernels, spreads, seconds))
        cupy.get_default_memory_pool().free_all_blocks()
    if n:
        out["out_of_core"] = out_of_core(n, kernels, memory_limits, spreads)
    return out


def report(res: dict) -> str:
    """The results as text; rates in TFLOP/s (T/s for the int8 ceilings), ratios against
    DGEMM measured alongside (in core: sustained, alternated with it; out of core: its own
    run, and the in-core DGEMM ceiling of 16384³ measured first)."""
    lines = [f"ozaki-gpu on {res['gpu'].get('name', '?')}, {res['date']}"]
    for name, entry in res["ceilings"].items():
        if name == "overlap":
            f, alone = entry["fractions"], entry["alone"]
            covered = all(x["covered"] for x in entry["together"].values())
            lines.append(f"  overlap: int8 {alone['int8'] / 1e12:.0f} T/s and copy "
                         f"{alone['copy'] / 1e9:.0f} GB/s alone; at once {f['int8']:.2f} and "
                         f"{f['copy']:.2f} of those (sum {entry['shared']:.2f}: 2 free, 1 "
                         f"taking turns; covered {covered})")
            continue
        extra = f", exact {entry['exact']}" if "exact" in entry else ""
        lines.append(f"  ceiling {name:28s} {entry['rate'] / 1e12:7.1f} T/s "
                     f"({entry['repeats']} repeats{extra})")
    dgemm_ceiling = res["ceilings"]["dgemm_16384"]["rate"]
    for entry in res.get("in_core", []):
        rates = entry["rates"]
        native = rates["dgemm"]["rate"]
        lines.append(f"  in core {entry['n']}^3: dgemm {native / 1e12:.1f} TFLOP/s; "
                     + "; ".join(f"{k} {v['rate'] / 1e12:.1f} ({v['rate'] / native:.3f}x)"
                                 for k, v in rates.items() if k != "dgemm"))
        for kernel, got in entry["kernels"].items():
            for key, what in (("phases", "one product"), ("serial", "the phases in turn")):
                phases = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in got[key].items())
                lines.append(f"    {kernel}, {what}: {phases}")
            for bits, acc in got["accuracy"].items():
                lines.append(f"    {kernel}, spread 2^{bits}: native {acc['native']:.2e}, "
                             f"emulated {acc['emulated']:.2e} ({acc['ratio']:.2f}x; "
                             f"{acc['note']})")
    ooc = res.get("out_of_core")
    for limit, runs in (ooc or {}).get("limits", {}).items():
        d = runs["dgemm"]
        lines.append(f"  out of core {ooc['n']}^3, {limit}: dgemm {d['seconds']:.2f} s "
                     f"({d['tflops']:.1f} TFLOP/s, tile {d['tile']}, compute busy "
                     f"{d['compute_busy']:.0%}, {d['bytes']['h2d'] / 1e9:.1f} GB up)")
        for kernel, e in runs.items():
            if kernel == "dgemm":
                continue
            if "seconds" in e:
                lines.append(
                    f"    {kernel}: {e['seconds']:.2f} s ({e['tflops']:.1f} TFLOP/s, "
                    f"{e['tflops'] / d['tflops']:.3f}x dgemm's run, "
                    f"{e['tflops'] * 1e12 / dgemm_ceiling:.3f}x the in-core DGEMM ceiling; tile "
                    f"{e['tile']}, compute busy {e['compute_busy']:.0%}, "
                    f"{e['bytes']['h2d'] / 1e9:.1f} GB up, predicted "
                    f"{e['predicted']:.2f} s, {e['bound']}; {e['emulation']}; GPU phases "
                    + ", ".join(f"{k} {v:.2f} s" for k, v in e["emulation_seconds"].items())
                    + ")")
            for bits, err in e["accuracy"].items():
                lines.append(f"    {kernel}, spread 2^{bits}: native {d['accuracy'][bits]:.2e}, "
                             f"emulated {err:.2e} ({err / d['accuracy'][bits]:.2f}x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    from .common import write_json

    parser = argparse.ArgumentParser(prog="python -m benchmarks ozaki-gpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8192,16384", help="in-core n, comma-separated")
    parser.add_argument("--n", type=int, default=32768, help="out-of-core n (0: none)")
    parser.add_argument("--memory-limit", default="16GB",
                        help="GPU memory limits of the out-of-core runs, comma-separated")
    parser.add_argument("--kernel", default="ozaki:16",
                        help="kernels to emulate with, comma-separated")
    parser.add_argument("--spreads", default="0,8,30")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="seconds each sustained rate runs")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = tuple(int(x) for x in args.sizes.split(",") if x)
    spreads = tuple(int(x) for x in args.spreads.split(",") if x)
    limits = tuple(x for x in args.memory_limit.split(",") if x)
    kernels = tuple(x for x in args.kernel.split(",") if x)
    res = benchmark(sizes, args.n, kernels=kernels, memory_limits=limits,
                    spreads=spreads, seconds=args.seconds)
    write_json(args.json, res)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

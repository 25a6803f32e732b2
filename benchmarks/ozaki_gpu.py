"""Ozaki scheme II on the GPU against cuBLAS DGEMM, in one process (issue 21).

    python -m benchmarks ozaki-gpu [--sizes 8192,16384] [--n 32768] [--memory-limit 16GB]
                                   [--kernel ozaki:16] [--spreads 0,8,30] [--json out.json]
    python -m benchmarks ozaki-gpu --ceilings-only

1. **Ceilings**: DGEMM and the int8 GEMM each repeated back to back for some seconds (the
   clocks settle under the power cap within a few), the median rate of the second half. The
   emulation cannot beat the int8 rate divided by its number of moduli (one int8 GEMM each).
2. **In core** (operands on the GPU): cuBLAS DGEMM and the emulated product
   (:class:`oocgemm.cuda.ozaki.InCore`, the whole K one panel) at each size, alternated, each
   sustained; then one emulated product timed by phase (conversion, int8 GEMMs, finish).
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

def ceilings(seconds: float) -> dict:
    """DGEMM and int8 rates sustained on this GPU: what bounds the emulation."""
    import cupy

    from oocgemm.cuda.ozaki import int8_gemm

    def dgemm(n):
        rng = cupy.random.default_rng(1)
        a, b, c = rng.standard_normal((n, n)), rng.standard_normal((n, n)), cupy.empty((n, n))
        return sustained(lambda: cupy.matmul(a, b, out=c), 2.0 * n ** 3, seconds)

    def int8(rows, cols, depth, batch):
        """Batched int8 x int8 -> int32 on uniform residues, in the emulation's layout."""
        rng = cupy.random.default_rng(2)
        a = rng.integers(-128, 128, (batch, rows, depth)).astype(np.int8)
        b = rng.integers(-128, 128, (batch, cols, depth)).astype(np.int8)
        c = cupy.empty((batch, rows, cols), dtype=np.int32)
        handle = cupy.cuda.device.get_cublas_handle()

        def run():
            int8_gemm(handle, a.data.ptr, b.data.ptr, c.data.ptr, rows, cols, depth, lda=depth,
                      ldb=depth, ldc=cols, stride_a=rows * depth, stride_b=cols * depth,
                      stride_c=rows * cols, batch=batch)

        run()
        want = a[0, :64].astype(np.float64) @ b[0, :64].astype(np.float64).T
        out = sustained(run, 2.0 * rows * cols * depth * batch, seconds)
        out["exact"] = bool((c[0, :64, :64].astype(np.float64) == want).all())
        out["shape"] = [rows, cols, depth, batch]
        return out

    cases = {"dgemm_16384": lambda: dgemm(16384),
             "int8_2048x16384x8192x16": lambda: int8(2048, 16384, 8192, 16),
             "int8_2048x16384x16384x16": lambda: int8(2048, 16384, 16384, 16),
             "int8_2048x8192x8192x16": lambda: int8(2048, 8192, 8192, 16),
             "int8_1024x16384x4096x16": lambda: int8(1024, 16384, 4096, 16)}
    out = {}
    for name, case in cases.items():
        out[name] = case()
        cupy.get_default_memory_pool().free_all_blocks()
    return out


def in_core(n: int, kernel: str, spreads, seconds: float, seed: int = 0) -> dict:
    """cuBLAS DGEMM against the emulation on n³, operands on the GPU."""
    import cupy

    from oocgemm.cuda.ozaki import InCore

    out: dict = {"n": n, "kernel": kernel}
    c_native, c_emulated = cupy.empty((n, n)), cupy.empty((n, n))
    emulate = InCore(n, n, n, kernel)
    out.update(_in_core_rates(n, emulate, c_native, c_emulated, seconds, seed))
    timed = InCore(n, n, n, kernel, timing=True)
    a, b = device_spread((n, n), 0, seed), device_spread((n, n), 0, seed + 1)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    timed(a, b, c_emulated)
    cupy.cuda.Device().synchronize()
    out["phases"] = {"wall": time.perf_counter() - start, **timed.emulator.seconds()}
    out["accuracy"] = {}
    rows, cols = sample(n, n, seed + 2)
    for bits in spreads:
        a, b = device_spread((n, n), bits, seed + 10 + bits), device_spread((n, n), bits,
                                                                            seed + 11 + bits)
        note = emulate(a, b, c_emulated)
        cupy.matmul(a, b, out=c_native)
        a_rows, b_cols = a[rows].get(), b[:, cols].get()
        native = sampled_error(c_native[rows][:, cols].get(), a_rows, b_cols)
        emulated = sampled_error(c_emulated[rows][:, cols].get(), a_rows, b_cols)
        out["accuracy"][bits] = {"native": native, "emulated": emulated,
                                 "ratio": emulated / native if native else None, "note": note}
    return out


def _in_core_rates(n: int, emulate, c_native, c_emulated, seconds: float, seed: int) -> dict:
    """The sustained rates of cuBLAS DGEMM and of ``emulate``, alternated, on normal
    operands; each emulated product converts its operands afresh."""
    import cupy

    a, b = device_spread((n, n), 0, seed), device_spread((n, n), 0, seed + 1)
    notes = set()
    rates = alternated({"dgemm": lambda: cupy.matmul(a, b, out=c_native),
                        "emulated": lambda: notes.add(emulate(a, b, c_emulated))},
                       2.0 * n ** 3, seconds)
    return {**rates, "ratio": rates["emulated"]["rate"] / rates["dgemm"]["rate"],
            "notes": sorted(notes)}


def out_of_core(n: int, kernel: str, memory_limit: str, spreads, repeat: int = 2,
                seed: int = 0) -> dict:
    """``oocgemm.multiply`` n³ from host memory with cuBLAS and with the emulation."""
    import oocgemm

    result: dict = {"n": n, "kernel": kernel, "memory_limit": memory_limit, "runs": {}}
    c = np.empty((n, n))
    c.fill(0)  # pages touched once, outside every timing
    rows, cols = sample(n, n, seed + 2)
    for bits in spreads:
        a, b = host_spread(n, bits, seed + 20 + bits), host_spread(n, bits, seed + 21 + bits)
        a_rows, b_cols = a[rows], b[:, cols]
        timed = bits == spreads[0]
        for name, which in (("dgemm", None), ("emulated", kernel)):
            best = None
            for _ in range(repeat + 1 if timed else 1):  # the first warms up
                c.fill(np.nan)
                run = oocgemm.multiply(a, b, c, device="cuda", memory_limit=memory_limit,
                                       kernel=which, progress=False)
                best = run if best is None or run.seconds < best.seconds else best
            entry = result["runs"].setdefault(name, {"accuracy": {}})
            entry["accuracy"][bits] = sampled_error(c[rows][:, cols], a_rows, b_cols)
            if timed:
                entry.update(seconds=best.seconds, tflops=best.tflops,
                             tile=list(best.plan.tile), emulation=dict(best.emulation),
                             emulation_seconds=dict(best.emulation_seconds),
                             predicted=best.plan.prediction.total)
    runs = result["runs"]
    result["ratio"] = runs["emulated"]["tflops"] / runs["dgemm"]["tflops"]
    return result


def benchmark(sizes=(8192, 16384), n: int = 32768, *, kernel: str = "ozaki:16",
              memory_limit: str = "16GB", spreads=(0, 8, 30), seconds: float = 4.0,
              ceilings_only: bool = False) -> dict:
    """Every case in one process; the ratios against the in-core DGEMM sustained here."""
    from oocgemm.sysinfo import gpu_info

    out: dict = {"benchmark": "ozaki-gpu", "gpu": gpu_info(), "date": time.strftime("%Y-%m-%d"),
                 "kernel": kernel, "ceilings": ceilings(seconds)}
    if ceilings_only:
        return out
    import cupy

    out["in_core"] = []
    for size in sizes:
        out["in_core"].append(in_core(size, kernel, spreads, seconds))
        cupy.get_default_memory_pool().free_all_blocks()
    if n:
        out["out_of_core"] = out_of_core(n, kernel, memory_limit, spreads)
        dgemm = out["ceilings"]["dgemm_16384"]["rate"]
        out["out_of_core"]["vs_incore_dgemm"] = out["out_of_core"]["runs"]["emulated"][
            "tflops"] * 1e12 / dgemm
    return out


def report(res: dict) -> str:
    lines = [f"ozaki-gpu on {res['gpu'].get('name', '?')}, {res['date']}, kernel {res['kernel']}"]
    for name, entry in res["ceilings"].items():
        extra = f", exact {entry['exact']}" if "exact" in entry else ""
        lines.append(f"  ceiling {name:28s} {entry['rate'] / 1e12:7.1f} T/s "
                     f"({entry['repeats']} repeats{extra})")
    for entry in res.get("in_core", []):
        phases = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in entry["phases"].items())
        lines.append(f"  in core {entry['n']}^3: dgemm {entry['dgemm']['rate'] / 1e12:.1f}, "
                     f"emulated {entry['emulated']['rate'] / 1e12:.1f} TFLOP/s "
                     f"({entry['ratio']:.3f}x; {', '.join(entry['notes'])}); one product: "
                     f"{phases}")
        for bits, acc in entry["accuracy"].items():
            lines.append(f"    spread 2^{bits}: native {acc['native']:.2e}, emulated "
                         f"{acc['emulated']:.2e} ({acc['ratio']:.2f}x; {acc['note']})")
    ooc = res.get("out_of_core")
    if ooc:
        d, e = ooc["runs"]["dgemm"], ooc["runs"]["emulated"]
        lines.append(f"  out of core {ooc['n']}^3, {ooc['memory_limit']}: dgemm {d['seconds']:.2f}"
                     f" s ({d['tflops']:.1f} TFLOP/s, tile {d['tile']}), emulated "
                     f"{e['seconds']:.2f} s ({e['tflops']:.1f} TFLOP/s, tile {e['tile']}): "
                     f"{ooc['ratio']:.3f}x; {ooc['vs_incore_dgemm']:.3f}x the in-core DGEMM "
                     f"ceiling; {e['emulation']}; phases "
                     + ", ".join(f"{k} {v:.2f} s" for k, v in e["emulation_seconds"].items()))
        for bits in d["accuracy"]:
            nat, emu = d["accuracy"][bits], e["accuracy"][bits]
            lines.append(f"    spread 2^{bits}: native {nat:.2e}, emulated {emu:.2e} "
                         f"({emu / nat:.2f}x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    from .common import write_json

    parser = argparse.ArgumentParser(prog="python -m benchmarks ozaki-gpu",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8192,16384", help="in-core n, comma-separated")
    parser.add_argument("--n", type=int, default=32768, help="out-of-core n (0: none)")
    parser.add_argument("--memory-limit", default="16GB")
    parser.add_argument("--kernel", default="ozaki:16")
    parser.add_argument("--spreads", default="0,8,30")
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="seconds each sustained rate runs")
    parser.add_argument("--ceilings-only", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = tuple(int(x) for x in args.sizes.split(",") if x)
    spreads = tuple(int(x) for x in args.spreads.split(",") if x)
    res = benchmark(sizes, args.n, kernel=args.kernel, memory_limit=args.memory_limit,
                    spreads=spreads, seconds=args.seconds, ceilings_only=args.ceilings_only)
    write_json(args.json, res)
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

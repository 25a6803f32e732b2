"""``python -m benchmarks SUBCOMMAND``: the measurements beside oocgemm, one subcommand each.

    python -m benchmarks cpu --size 4096            # oocgemm on the CPU against numpy.matmul
    python -m benchmarks gpu                        # against in-core cuBLAS, cuBLASXt, dask + CuPy
    python -m benchmarks small                      # small products against CuPy (or numpy)
    python -m benchmarks kernels                    # the kernels of kernels/ against cuBLAS
    python -m benchmarks power                      # their SM clock, board power, energy per flop
    python -m benchmarks bandwidth                  # host memcpy and host<->device copies
    python -m benchmarks planning                   # the planner's tile search, large products
    python -m benchmarks zarr-io make ...           # python -m benchmarks.zarr_io, and likewise
    python -m benchmarks zarr-product ...           # zarr_product, dask_matmul, gpu_decode,
                                                    # gpu_decode_product, zarr_inputs,
                                                    # ozaki_gpu, gram, s3, scaling,
                                                    # dask_scaling, scaling_model, fresh,
                                                    # gpu_small_blocks, small_blocks,
                                                    # npy_product, cold_reads

Errors that a bad option causes print ``error: <message>`` and exit with status 2; a result
that differs from its reference beyond the tolerance exits with status 1.
"""

from __future__ import annotations

import importlib

import click

from oocgemm.cli import ErrorHandlingGroup, echo_json


@click.group(cls=ErrorHandlingGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Benchmarks of oocgemm against its baselines; each subcommand is one benchmark."""


def _case_names(cases: str | None) -> tuple[str, ...] | None:
    """--cases "a, b" as ("a", "b"); None when not given (the benchmark's own default)."""
    return tuple(c.strip() for c in cases.split(",")) if cases else None


def _sizes(sizes: str) -> tuple[int, ...]:
    """--sizes "1024,2048" as (1024, 2048); a usage error (exit 2) for anything but
    positive integers."""
    try:
        ns = tuple(int(x) for x in sizes.split(","))
    except ValueError:
        ns = ()
    if not ns or min(ns) < 1:
        raise click.BadParameter(f"expected N,N,... (positive integers), got {sizes!r}",
                                 param_hint="--sizes")
    return ns


def _seconds(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


_as_json = click.option("--json", "as_json", is_flag=True,
                        help="Print the results as JSON on stdout.")


def _common(command):
    """The option every benchmark takes (--json), and the click context."""
    return _as_json(click.pass_context(command))


# ------------------------------------------------------------------------------------------
# cpu
# ------------------------------------------------------------------------------------------
@main.command()
@click.option("--size", type=click.IntRange(min=1), default=4096, show_default=True,
              help="N: the operands are NxN.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed rounds (each times numpy then oocgemm); medians are reported.")
@click.option("--dtype", default="float64", show_default=True,
              help="float32, float64, complex64 or complex128.")
@_common
def cpu(ctx, size, repeat, dtype, as_json):
    """oocgemm.multiply(device='cpu') against numpy.matmul on in-memory operands."""
    from .products import cpu_benchmark

    def on_step(step, t_numpy, t_oocgemm):
        click.echo(f"  round {step + 1}/{repeat}: numpy {_seconds(t_numpy)}, "
                   f"oocgemm {_seconds(t_oocgemm)}", err=True)

    if not as_json:
        click.echo(f"cpu: {size}x{size} {dtype}, {repeat} round(s)...", err=True)
    res = cpu_benchmark(size=size, repeat=repeat, dtype=dtype,
                        on_step=None if as_json else on_step)
    if as_json:
        echo_json(res)
    else:
        npy, ooc = res["numpy"], res["oocgemm"]
        w, h, r = ooc["tile"]
        click.echo("\n".join([
            f"CPU benchmark: {size}x{size} @ {size}x{size} {res['dtype']}, median of "
            f"{repeat}, {res['cores']} cores, BLAS {res['blas']}",
            f"  numpy.matmul     {_seconds(npy['median_seconds']):>9}  "
            f"{npy['gflops']:8.2f} GFLOP/s",
            f"  oocgemm (cpu)    {_seconds(ooc['median_seconds']):>9}  "
            f"{ooc['gflops']:8.2f} GFLOP/s   (execution alone "
            f"{_seconds(ooc['execute_median_seconds'])}; tile w={w} h={h} r={r}, "
            f"{ooc['operations']} operations)",
            f"  ratio            {res['ratio']:.3f}  (target >= {res['target_ratio']:.2f}: "
            f"{'met' if res['meets_target'] else 'NOT met'})",
            f"  max rel. error   {res['max_rel_error']:.3g}  (tolerance {res['tolerance']:.3g}: "
            f"{'ok' if res['correct'] else 'FAILED'})",
        ]))
    if not res["correct"]:
        click.echo(f"error: oocgemm's result differs from numpy's: max relative error "
                   f"{res['max_rel_error']:.3g} > {res['tolerance']:.3g}", err=True)
        ctx.exit(1)


# ------------------------------------------------------------------------------------------
# gpu
# ------------------------------------------------------------------------------------------
GPU_SIZE, GPU_MEMORY_LIMIT, GPU_REPEAT = 32768, "16GB", 3
"""``gpu``'s product (N^3, float64), the GPU memory the CUDA executor may use, and the timed
runs of each oocgemm case (the best is reported): those of docs/performance.md's figures."""


@main.command()
@click.option("--big", type=click.IntRange(min=1), default=None,
              help="One product of this size instead (operands beyond GPU memory).")
@click.option("--cases", default=None,
              help="Comma-separated subset of incore,numpy,npy,cublasxt,dask.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Where the .npy operands are written (default: a temp dir).")
@_common
def gpu(ctx, big, cases, workdir, as_json):
    """The CUDA executor against in-core cuBLAS on one block, cuBLASXt and dask with CuPy
    chunks, on one GPU: 32768^3 float64 under a 16 GB limit, the best of 3 runs each."""
    from .products import gpu_benchmark, gpu_big_benchmark

    if big:
        res = gpu_big_benchmark(big)
        if as_json:
            echo_json(res)
        else:
            click.echo(f"GPU product beyond GPU memory: n={res['size']} "
                       f"({res['operand_bytes'] / 1e9:.1f} GB of operands): "
                       f"{_seconds(res['seconds'])}, {res['tflops']:.2f} TFLOP/s, tile "
                       f"{res['tile']}, sampled error {res['max_rel_error_sampled']:.2g}")
        if not res["correct"]:
            ctx.exit(1)
        return

    def on_step(name, entry):
        click.echo(f"  {name:<24} {entry['tflops']:7.2f} TFLOP/s  "
                   f"({_seconds(entry['seconds'])})", err=True)

    res = gpu_benchmark(GPU_SIZE, memory_limit=GPU_MEMORY_LIMIT, repeat=GPU_REPEAT,
                        workdir=workdir, cases=_case_names(cases),
                        on_step=None if as_json else on_step)
    if as_json:
        echo_json(res)
    else:
        lines = [f"GPU benchmark: {GPU_SIZE}^3 {res['dtype']}, GPU memory limit "
                 f"{GPU_MEMORY_LIMIT}, "
                 f"tile {res['plan']['tile']} (grid {res['plan']['grid']})"]
        for name, entry in res["cases"].items():
            check = entry.get("correct")
            lines.append(f"  {name:<24} {entry['tflops']:7.2f} TFLOP/s  "
                         f"{_seconds(entry['seconds']):>9}"
                         + ("" if check is None else f"  sampled error "
                            f"{entry['max_rel_error_sampled']:.2g} {'ok' if check else 'FAILED'}"))
        for key in ("numpy_vs_incore", "numpy_vs_incore_sustained", "npy_vs_incore",
                    "numpy_vs_cublasxt"):
            if key in res:
                lines.append(f"  {key:<24} {res[key]:.3f}")
        click.echo("\n".join(lines))
    if any(entry.get("correct") is False for entry in res["cases"].values()):
        ctx.exit(1)


# ------------------------------------------------------------------------------------------
# small
# ------------------------------------------------------------------------------------------
@main.command()
@click.option("--sizes", default="1024,2048,4096", show_default=True,
              help="Comma-separated N: the operands are NxN float64.")
@click.option("--repeat", type=click.IntRange(min=1), default=7, show_default=True,
              help="Timed rounds of each case after one warm-up; medians are reported.")
@click.option("--device", default="cuda", show_default=True,
              help="'cuda' or 'cuda:N' (against CuPy), or 'cpu' (against numpy).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as JSON to this file.")
@click.pass_context
def small(ctx, sizes, repeat, device, json_path):
    """Small products from numpy operands: oocgemm.multiply's whole call (a new result, and
    out= a preallocated one) against CuPy's upload + matmul + download (numpy's matmul on
    the CPU), on a GPU the same moves through pinned memory one after another with nothing
    else (n = 1024's floor), and the process's first call, which pays for CUDA's start-up."""
    from oocgemm.info import describe_startup

    from .common import write_json
    from .small import small_benchmark

    ns = _sizes(sizes)
    click.echo(f"small: {', '.join(map(str, ns))} on {device}, {repeat} round(s)...", err=True)
    res = small_benchmark(ns, repeat, device, on_size=lambda e: click.echo(
        f"  n={e['n']}: oocgemm {_seconds(e['oocgemm']['median_seconds'])}, "
        f"baseline {_seconds(e['baseline']['median_seconds'])}", err=True))
    base = res["baseline"]
    lines = [f"small products, float64, {res['device']}, median of {repeat} "
             f"(ratio = oocgemm / {base}: under 1 is faster)",
             f"  {'n':>6}  {'oocgemm':>9}  {base:>9}  {'ratio':>6}  {'out=':>9}  "
             f"{base + ' out=':>11}  {'ratio':>6}  {'staged':>9}  {'ratio':>6}  in core  error"]
    for e in res["sizes"]:
        staged = ((_seconds(e['staged']['median_seconds']), f"{e['staged_ratio']:6.3f}")
                  if "staged" in e else ("-", "-"))
        lines.append(
            f"  {e['n']:>6}  {_seconds(e['oocgemm']['median_seconds']):>9}  "
            f"{_seconds(e['baseline']['median_seconds']):>9}  {e['ratio']:6.3f}  "
            f"{_seconds(e['oocgemm_out']['median_seconds']):>9}  "
            f"{_seconds(e['baseline_out']['median_seconds']):>11}  {e['ratio_out']:6.3f}  "
            f"{staged[0]:>9}  {staged[1]:>6}  "
            f"{'yes' if e['in_core'] else 'no':>7}  {e['max_rel_error']:.2g} "
            f"{'ok' if e['correct'] else 'FAILED'}")
    if any("staged" in e for e in res["sizes"]):
        lines.append("  staged: the moves through pinned memory one after another, nothing "
                     "else (benchmarks.small.Staged): n = 1024's floor; ratio staged / " + base)
    lines.append(f"  first call (n={ns[0]}): {_seconds(res['first_call_seconds'])}")
    if res["startup"] is not None:
        lines.append(f"  CUDA start-up: {describe_startup({'startup': res['startup']})}")
    click.echo("\n".join(lines))
    write_json(json_path, res)
    if not all(e["correct"] for e in res["sizes"]):
        click.echo("error: a result differs from numpy's beyond the tolerance", err=True)
        ctx.exit(1)


# ------------------------------------------------------------------------------------------
# kernels, power
# ------------------------------------------------------------------------------------------
KERNEL_REPEAT = 5
"""``kernels``' interleaved rounds; medians are reported."""


@main.command()
@click.option("--size", type=click.IntRange(min=1), default=None,
              help="One size N (default: 1024, 2048, 4096 and 8192).")
@click.option("--cases", default=None, help="Comma-separated kernels (default: all).")
@_common
def kernels(ctx, size, cases, as_json):
    """Each kernel of kernels/ against cuBLAS on N^3 float64 products (medians of 5
    interleaved rounds), the FMA peak of the CUDA cores, and each kernel's registers, shared
    and local memory (GPU)."""
    from .kernel_rates import kernel_benchmark

    def on_step(n, rates):
        click.echo(f"  {n}^3: " + ", ".join(f"{k} {e['gflops']:.0f}" for k, e in rates.items())
                   + " GFLOP/s", err=True)

    sizes = (size,) if size else (1024, 2048, 4096, 8192)
    res = kernel_benchmark(sizes, kernels=_case_names(cases), repeat=KERNEL_REPEAT,
                           on_step=None if as_json else on_step)
    if as_json:
        echo_json(res)
    else:
        names = list(res["sizes"][sizes[0]])
        peak = f"FMA peak of the CUDA cores {res['fma_peak_gflops']:.0f} GFLOP/s"
        if res["fma_nominal_gflops"]:
            peak += (f" ({res['fma_peak_gflops'] / res['fma_nominal_gflops']:.3f} of the nominal "
                     f"{res['fma_nominal_gflops']:.0f}: all FMA units busy at the top clock)")
        lines = [f"Kernel benchmark: {res['dtype']}, GFLOP/s (median of {KERNEL_REPEAT}); {peak}",
                 f"  {'kernel':<9}" + "".join(f"{n:>9}" for n in sizes)
                 + "   regs  shared  local"]
        for name in names:
            row = "".join(f"{res['sizes'][n][name]['gflops']:9.0f}" for n in sizes)
            flags = "" if all(res["sizes"][n][name]["correct"] for n in sizes) else "  WRONG"
            use = res["resources"].get(name)
            if use:
                row += (f"   {use['registers']:4d} {use['shared_bytes']:7d} "
                        f"{use['local_bytes']:6d}")
            lines.append(f"  {name:<9}{row}{flags}")
        for name, t in res["targets"].items():
            lines.append(f"  {name}: {t['ratio']:.3f} of {t['against']} at {max(sizes)}^3 "
                         f"(target >= {t['target']:.2f}: {'met' if t['met'] else 'NOT met'})")
        click.echo("\n".join(lines))
    if any(not e["correct"] for rates in res["sizes"].values() for e in rates.values()):
        ctx.exit(1)


POWER_SECONDS = 2.5
"""How long each case of ``power`` runs alone."""


@main.command()
@click.option("--size", type=click.IntRange(min=1), default=8192, show_default=True,
              help="N: each kernel runs N^3 products.")
@click.option("--cases", default=None,
              help="Comma-separated kernels (default: opt, regblock, dmma).")
@_common
def power(ctx, size, cases, as_json):
    """Each kernel alone for about 2.5 s while nvidia-smi samples SM clock and board power:
    energy per flop, and what opt and regblock reach when their operands cost less to move
    (GPU)."""
    from .kernel_rates import KERNEL_BOUNDS, THROUGHPUT_ROWS, kernel_power

    def on_entry(name, e):
        click.echo(f"  {name}: {e['tflops']:.2f} TFLOP/s", err=True)

    res = kernel_power(size, kernels=_case_names(cases), seconds=POWER_SECONDS,
                       on_entry=None if as_json else on_entry)
    if as_json:
        echo_json(res)
    else:
        idle = res["idle"]
        limit = next((e["limit_w"] for e in res["entries"].values() if e.get("limit_w")), None)
        lines = [f"Kernel power: {size}^3 {res['dtype']}, each run alone ~{res['seconds']:g} s; "
                 f"board power limit {limit if limit is not None else '?'} W; idle "
                 f"{idle.get('power_w', float('nan')):.0f} W at {idle.get('clock_mhz', 0):.0f} MHz",
                 f"  {'case':<15}{'TFLOP/s':>8}{'of FMA peak':>12}{'SM MHz':>8}{'board W':>9}"
                 f"{'pJ/flop':>9}{'capped':>8}"]
        for name, e in res["entries"].items():
            capped = e.get("power_capped")
            lines.append(
                f"  {name:<15}{e['tflops']:8.2f}{e['of_fma_peak']:12.3f}"
                f"{e.get('clock_mhz', float('nan')):8.0f}{e.get('power_w', float('nan')):9.1f}"
                f"{e.get('pj_per_flop', float('nan')):9.1f}"
                f"{'' if capped is None else f'{capped:8.0%}'}"
                + ("" if e.get("correct", True) else "  WRONG"))
        lines.append("  pJ/flop: board power above idle per flop. capped: share of samples with "
                     "the clock held down by the power cap.")
        for name, (_, what) in THROUGHPUT_ROWS.items():
            lines.append(f"  {name}: {what}")
        for tag, (_, _, what) in KERNEL_BOUNDS.items():
            lines.append(f"  <kernel>:{tag}: {what}; a measuring build, its product is wrong")
        click.echo("\n".join(lines))
    if any(not e.get("correct", True) for e in res["entries"].values()):
        ctx.exit(1)


# ------------------------------------------------------------------------------------------
# bandwidth
# ------------------------------------------------------------------------------------------
@main.command()
@_as_json
def bandwidth(as_json):
    """Host memcpy bandwidth (256 MiB copies), and each GPU's host<->device bandwidth (1 GiB)
    from pinned and pageable memory; the best and the median of 5 copies."""
    from .bandwidth import measure_bandwidth

    res = measure_bandwidth()
    if as_json:
        echo_json(res)
        return
    host = res["host_memcpy"]
    lines = [f"  {'host copy':<10} {host['best_gbps']:.3g} GB/s best, {host['median_gbps']:.3g} "
             f"GB/s median ({host['bytes'] / 2**20:.0f} MiB numpy.copyto, {host['repeat']} times)"]
    for dev in res["gpus"]:
        rates = ", ".join(f"{key[:-5].replace('_', ' ')} {value:.3g} GB/s"
                          for key, value in dev.items() if key.endswith("_gbps"))
        lines.append(f"  {dev['device']:<10} {rates}")
    if not res["gpus"]:
        lines.append(f"  {'gpus':<10} none found")
    click.echo("\n".join(["bandwidth", *lines]))


# ------------------------------------------------------------------------------------------
# planning
# ------------------------------------------------------------------------------------------
@main.command()
@click.option("--sizes", default="16384,32768,65536", show_default=True,
              help="Comma-separated N: NxN float64 operands in host memory (described, not "
                   "allocated).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Plans of each case; medians are reported.")
@_common
def planning(ctx, sizes, repeat, as_json):
    """The planner's choice of tile for large products (the CUDA model under 16 GB, and the
    CPU's), against the search that predicts every depth of every block."""
    from .planning import planning_benchmark

    res = planning_benchmark(_sizes(sizes), repeat=repeat)
    if as_json:
        echo_json(res)
        return
    lines = [f"  {'n':>6} {'device':<7} {'planning':>10} {'every depth':>12}  tile"]
    for row in res["rows"]:
        lines.append(f"  {row['n']:>6} {row['device']:<7} {_seconds(row['seconds']):>10} "
                     f"{_seconds(row['every_depth_seconds']):>12}  {tuple(row['tile'])}")
    click.echo("\n".join([f"planning (median of {repeat}), float64 in host memory",
                          *lines]))


# ------------------------------------------------------------------------------------------
# the benchmarks with command lines of their own
# ------------------------------------------------------------------------------------------
_OWN_MAINS = {
    "zarr-io": ("zarr_io", "Zarr reads: the file-system floor against each decoder."),
    "zarr-product": ("zarr_product", "oocgemm on Zarr stores against dask on the same."),
    "dask-matmul": ("dask_matmul", "oocgemm.dask.matmul against oocgemm.multiply and dask's own."),
    "gpu-decode": ("gpu_decode", "Decoding zstd chunks on the GPU (nvCOMP) against the CPU."),
    "gpu-decode-product": ("gpu_decode_product",
                           "Inputs decoded on the GPU into the panels, beside multiply."),
    "zarr-inputs": ("zarr_inputs", "Zarr inputs into a numpy output, per layout."),
    "gpu-encode": ("gpu_encode", "Compressing zstd chunks of C on the GPU (nvCOMP)."),
    "ozaki-gpu": ("ozaki_gpu", "Ozaki scheme II on the GPU against cuBLAS DGEMM."),
    "gram": ("gram", "The Gram product X^T X of a tall-skinny Zarr X against its floors."),
    "s3": ("s3", "A Zarr array read from an S3 server (moto's): oocgemm beside zarr-python."),
    "scaling": ("scaling", "One GPU, cuda:all and dask workers side by side, first and later "
                           "runs."),
    "dask-scaling": ("dask_scaling", "oocgemm.dask.matmul on LocalCluster CPU workers: "
                                     "decodes and balance."),
    "scaling-model": ("scaling_model", "docs/scaling.md's model of many machines."),
    "fresh": ("fresh", "A fresh process (the CLI) beside a warm one, warm and cold."),
    "gpu-small-blocks": ("gpu_small_blocks", "A small tile on the GPU into Zarr, beside the "
                                             "same into memory."),
    "small-blocks": ("small_blocks", "multiply with a small tile on the CPU beside numpy and "
                                     "the plain blocked loop, from numpy, Zarr and .npy."),
    "npy-product": ("npy_product", ".npy inputs into a .npy C beside its compute and the "
                                   "disk's rate of storing C."),
    "cold-reads": ("cold_reads", "Chunk files read cold by method, and a cold product by the "
                                 "disk queue's window."),
}


def _own_main(name: str, module: str, about: str) -> click.Command:
    @click.command(name=name, help=f"{about} (python -m benchmarks.{module}; --help for its "
                                   f"options)",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                     "help_option_names": []})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args):
        return importlib.import_module(f"benchmarks.{module}").main(list(args))

    return command


for _name, (_module, _about) in _OWN_MAINS.items():
    main.add_command(_own_main(_name, _module, _about))

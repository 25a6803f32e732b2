"""Many machines, on paper: the time and the bytes of one product on p machines of g GPUs each,
all reading their inputs from one shared storage (docs/scaling.md).

    python -m benchmarks.scaling_model            # the Markdown tables of docs/scaling.md

Pure arithmetic, no oocgemm import. The model (each term is a resource; the run takes the
longest of them, as if they all overlapped, plus a fill and a drain that nothing overlaps):

- **layout**: C cut into one contiguous rectangle per machine, a grid of ``pr x pc`` machines
  (the factorisation of p that reads least: SUMMA's 2-D grid where that beats row bands); a
  machine reads its A row band (M/pr x K) and its B column band (K x N/pc), each chunk once
  where the smaller band fits in its host memory (kept decoded, the other streamed past it),
  else the larger band once per part of the smaller that fits. Its g GPUs split the machine's
  rectangle and share its decoded chunks (one process per machine, ``device="cuda:all"``).
  A Gram product ``X^T X`` (X of N x d) is cut along K instead: each machine reads N/p rows
  of X once, its GPUs compute partial d x d sums (half of them: C is symmetric), and the
  partials are summed over the network.
- **compute**: the machine's flops over g GPUs at ``gpu_rate``.
- **storage**: the machine's stored bytes over its link, or all machines' over the storage's
  aggregate rate, whichever is slower (``storage`` when the aggregate binds, ``link`` when the
  machine's own link does).
- **decode**: the machine's decoded bytes over its cores at ``decode_rate`` each.
- **pcie**: each GPU's uploads (C blocks of ``gpu_memory / 4``, panels streamed past them).
- **write**: C's stored bytes: the machine's over its link, all over the aggregate write rate.
- **network**: the Gram partials' sum (a ring reduction, 2 (p-1)/p d² s bytes a machine).
- **fill / drain**: one chunk decoded by one core before the first GEMM; the last C block
  written after the last GEMM.

The I/O lower bound beside it (red-blue pebble game, Hong and Kung 1981; parallel form as in
COSMA, Kwasniewski et al., SC'19): a worker of S words of memory that does F = m n k of the
multiply-adds moves at least ``max(2F / sqrt(S), 3 F^(2/3))`` words (loads of A and B and
stores of C; the second term is Loomis-Whitney's, whatever the memory). For X^T X, where A and
B are the same data, the symmetric bound is used: ``F / sqrt(2 S)`` with F = N d² / 2.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

GB = 1e9
#: The resources of an estimate, in the tables' order.
RESOURCES = ("compute", "storage", "link", "decode", "pcie", "write", "network")


@dataclass(frozen=True)
class Machine:
    """One machine of the cluster: its GPUs, host and link to the shared storage."""

    gpus: int = 8
    """GPUs of the machine (one worker each, or one process with ``device="cuda:all"``)."""
    gpu_rate: float = 50e12
    """flop/s of one GPU out of core (oocgemm measured 49.2-49.7 TFLOP/s float64 on one H100 /
    H200 from host memory; cuBLAS sustains 52-55)."""
    gpu_memory: float = 128e9
    """Bytes of one GPU a run may use (an H200 has 141 GB; the measured runs used 16 GB)."""
    cores: int = 128
    """Host cores, all decoding (the lent 8-GPU machine has 128)."""
    decode_rate: float = 0.42e9
    """Decoded bytes per core-second of a run that decodes zstd chunks on the host (17.2 GB in
    40-41 core-seconds at n = 32768, performance.md's "Who decodes the inputs")."""
    host_memory: float = 420e9
    """Bytes of host memory that may hold decoded chunks (3/4 of the lent machine's 560 GB)."""
    link_read: float = 25e9
    """Bytes/s the machine reads from the shared storage (a 200 Gb/s storage network)."""
    link_write: float = 25e9
    """Bytes/s the machine writes to it."""
    network: float = 50e9
    """Bytes/s between machines (a 400 Gb/s interconnect), for sums of partial products."""
    pcie: float = 55e9
    """Host-to-device bytes/s of one GPU (measured 55.1 GB/s from pinned memory)."""


@dataclass(frozen=True)
class Storage:
    """The shared storage every machine reads its inputs from and writes C to."""

    name: str
    """What it stands for, for the tables."""
    read: float
    """Aggregate read bytes/s over all machines."""
    write: float
    """Aggregate write bytes/s."""
    ratio: float = 0.94
    """Stored bytes per decoded byte (random float64 under zstd: 8.06 GB for 8.6)."""
    chunk: int = 4096
    """Side of the inputs' square chunks (Gram: the rows of X's chunks)."""


#: A parallel file system of moderate size (assumed, not measured).
PFS = Storage("parallel file system", read=200 * GB, write=100 * GB)
#: An object store whose aggregate rate outruns the machines' links (assumed, not measured).
OBJECT = Storage("object store", read=2000 * GB, write=1000 * GB)
#: The lent two-H200 machine of issue 50 reading its local disk's files from the page cache.
LOCAL_WARM = Storage("local disk, warm page cache", read=20 * GB, write=2.9 * GB)
#: Operands in host memory (numpy): no decoding; read and written at memory speed.
HOST = Storage("host memory", read=50 * GB, write=50 * GB, ratio=1.0)
TWO_H200 = Machine(gpus=2, cores=32, gpu_memory=16e9, host_memory=192e9, link_read=20 * GB,
                   link_write=2.9 * GB)
"""The machine of issue 50's measurements: 2 H200s under a 16 GB limit, 32 cores, 256 GB;
warm reads at memory speed (decode binds first), C written at 2.9 GB/s (zarr's write of an
uncompressed 8.6 GB C took 3.0 s)."""


@dataclass(frozen=True)
class Estimate:
    """The model's answer for one product on p machines."""

    what: str
    """The product, e.g. ``n=32768`` or ``X 1e6 x 2048``."""
    machines: int
    """p."""
    gpus: int
    """p g."""
    grid: tuple[int, int]
    """Machines along C's rows and columns (``(1, 1)`` for a Gram product cut along K)."""
    seconds: dict
    """Each resource's seconds (compute, storage, link, decode, pcie, write, network); and
    ``fill`` (the first chunk decoded before the first GEMM), ``drain`` (the last C block
    written after the last GEMM) and ``first_block`` (the first C block computed before any
    of C can be written)."""
    read_machine: float
    """Decoded bytes each machine reads (the busiest)."""
    read_total: float
    """Decoded bytes all machines read together."""
    inputs: float
    """Decoded bytes of the inputs (A and B; X once for a Gram product)."""
    bound_machine: float
    """The I/O lower bound of one machine (bytes moved: reads and C's stores), S = its host
    memory."""
    moved_machine: float
    """What the layout moves per machine against that bound: reads and C's stores."""
    per_gpu_2d: float = 0.0
    """Bytes one GPU's worker reads where each GPU is a worker of its own on a
    ``pr x pc`` grid of p g workers (no chunk shared between workers)."""
    per_gpu_1d: float = 0.0
    """The same for p g row bands (A/(p g) + B each: today's default groups)."""

    def paths(self) -> dict[str, float]:
        """Each resource's seconds with what cannot overlap it: the fill, and the drain after
        it (the write: the first block's compute before it)."""
        s = self.seconds
        return {k: v + s["fill"] + (s["first_block"] if k == "write" else s["drain"])
                for k, v in s.items() if k in RESOURCES}

    @property
    def bound(self) -> str:
        """The resource that sets the time: 'compute, then write' where the write waits for
        the first C blocks to be computed longer than it writes; 'fill + drain' where what
        cannot overlap takes longer than the resource itself."""
        paths = self.paths()
        key = max(paths, key=paths.__getitem__)
        s = self.seconds
        if key == "write" and s["first_block"] > s["write"]:
            return "compute, then write"
        if key != "write" and s["fill"] + s["drain"] > s[key]:
            return "fill + drain"
        return key

    @property
    def time(self) -> float:
        """Predicted seconds: the slowest resource with its fill and drain."""
        return max(self.paths().values())


def factor_pairs(p: int) -> list[tuple[int, int]]:
    """Every ``(pr, pc)`` with ``pr * pc == p``."""
    return [(r, p // r) for r in range(1, p + 1) if p % r == 0]


def grid_for(p: int, m: int, n: int, k: int) -> tuple[int, int]:
    """The ``pr x pc`` grid of p workers whose bands read least: ``m k / pr + k n / pc``
    (rows first where two tie)."""
    return min(factor_pairs(p), key=lambda rc: (m * k / rc[0] + k * n / rc[1], -rc[0]))


def band_reads(m: float, n: float, k: float, memory_words: float) -> float:
    """Words one worker reads for its m x n rectangle of C (K = k): both bands once where the
    smaller (m k or k n) fits in ``memory_words``; else the larger once per part of the
    smaller that fits."""
    small, large = sorted((m * k, n * k))
    passes = max(1, math.ceil(small / max(memory_words, 1)))
    return small + passes * large


def pebble_bound(f: float, s_words: float) -> float:
    """Words a worker of ``s_words`` of memory moves (loads and stores) to do ``f``
    multiply-adds of a matrix product: ``max(2 f / sqrt(S), 3 f^(2/3))``."""
    return max(2 * f / math.sqrt(s_words), 3 * f ** (2 / 3))


def syrk_bound(f: float, s_words: float) -> float:
    """The same for a symmetric product ``X^T X`` (A and B one matrix) of ``f`` multiply-adds:
    ``f / sqrt(2 S)`` (every multiply-add of the half computed)."""
    return f / math.sqrt(2 * s_words)


def square(n: int, p: int, machine: Machine = Machine(), storage: Storage = PFS,
           itemsize: int = 8) -> Estimate:
    """``C = A @ B``, all n x n, on p machines: a 2-D grid of machines (see the module)."""
    return product(n, n, n, p, machine, storage, itemsize, what=f"n={n}")


def product(m: int, n: int, k: int, p: int, machine: Machine = Machine(),
            storage: Storage = PFS, itemsize: int = 8, what: str = "") -> Estimate:
    """``C = A @ B`` of m x k by k x n on p machines (see the module)."""
    s, g = itemsize, machine.gpus
    pr, pc = grid_for(p, m, n, k)
    rows, cols = math.ceil(m / pr), math.ceil(n / pc)
    words = band_reads(rows, cols, k, machine.host_memory / s)
    read = words * s
    flops = 2.0 * rows * cols * k
    c_bytes = rows * cols * s
    block = math.isqrt(int(machine.gpu_memory / 4 / s))  # a GPU's C block side
    block_elements = min(block * block, rows * cols / g)
    per_gpu = grid_for(p * g, m, n, k)
    seconds = {
        "compute": flops / (g * machine.gpu_rate),
        "link": read * storage.ratio / machine.link_read,
        "storage": p * read * storage.ratio / storage.read,
        "decode": read / (machine.cores * machine.decode_rate),
        "pcie": flops / g * s / min(block, rows, cols) / machine.pcie,
        "write": max(c_bytes * storage.ratio / machine.link_write,
                     m * n * s * storage.ratio / storage.write),
        "network": 0.0,
        "fill": storage.chunk ** 2 * s / machine.decode_rate,
        "drain": block_elements * s * storage.ratio / min(machine.link_write,
                                                          storage.write / p),
        "first_block": 2 * block_elements * k / machine.gpu_rate,
    }
    return Estimate(
        what=what or f"{m}x{n}x{k}", machines=p, gpus=p * g, grid=(pr, pc), seconds=seconds,
        read_machine=read, read_total=p * read, inputs=(m * k + k * n) * s,
        bound_machine=pebble_bound(rows * cols * k, machine.host_memory / s) * s,
        moved_machine=read + c_bytes,
        per_gpu_2d=band_reads(m / per_gpu[0], n / per_gpu[1], k,
                              machine.host_memory / g / s) * s,
        per_gpu_1d=band_reads(m / (p * g), n, k, machine.host_memory / g / s) * s)


def gram(rows: int, d: int, p: int, machine: Machine = Machine(), storage: Storage = PFS,
         itemsize: int = 8) -> Estimate:
    """``X^T X``, X of ``rows`` x d, on p machines: X cut along its rows (K), each machine
    reading its rows once, its GPUs computing half of partial d x d sums, the p partials summed
    over the network and C written once."""
    s, g = itemsize, machine.gpus
    mine = math.ceil(rows / p)
    read = mine * d * s
    flops = 1.0 * mine * d * d  # the half on and above the diagonal: N d² of 2 N d²
    c_bytes = d * d * s
    chunk_elements = 16384 * 2048  # 256 MiB chunks of X, as measured
    seconds = {
        "compute": flops / (g * machine.gpu_rate),
        "link": read * storage.ratio / machine.link_read,
        "storage": p * read * storage.ratio / storage.read,
        "decode": read / (machine.cores * machine.decode_rate),
        "pcie": read / g / machine.pcie,
        "write": max(c_bytes * storage.ratio / machine.link_write,
                     c_bytes * storage.ratio / storage.write),
        "network": 2 * (p - 1) / p * c_bytes / machine.network,
        "fill": chunk_elements * s / machine.decode_rate,
        "drain": c_bytes * storage.ratio / machine.link_write,
        "first_block": 0.0,  # C is written after the sum, counted in the drain
    }
    return Estimate(
        what=f"X {_sci(rows)} x {d}", machines=p, gpus=p * g, grid=(1, 1), seconds=seconds,
        read_machine=read, read_total=p * read, inputs=rows * d * s,
        bound_machine=syrk_bound(mine * d * d / 2, machine.host_memory / s) * s,
        moved_machine=read + c_bytes / p,
        per_gpu_2d=math.ceil(rows / (p * g)) * d * s, per_gpu_1d=math.ceil(rows / (p * g)) * d * s)


def group_reads(row_bounds: list[int], col_bounds: list[int], k: int, chunk: int,
                itemsize: int = 8) -> list[float]:
    """Decoded bytes of each group of C (``row_bounds`` x ``col_bounds``, row-major) that
    reads its A rows and B columns once, whole chunks of ``chunk`` x ``chunk`` (a band that
    cuts a chunk decodes all of it)."""
    def out(lo: int, hi: int, extent: int) -> int:
        return min(extent, -(-hi // chunk) * chunk) - lo // chunk * chunk

    m, n = row_bounds[-1], col_bounds[-1]
    return [float((out(r0, r1, m) * k + k * out(c0, c1, n)) * itemsize)
            for r0, r1 in zip(row_bounds, row_bounds[1:])
            for c0, c1 in zip(col_bounds, col_bounds[1:])]


# -- the tables ------------------------------------------------------------------------------

SIZES = (32768, 65536, 131072, 262144)
MACHINES = (1, 2, 8, 64)
GRAM_ROWS = (10 ** 6, 10 ** 7, 10 ** 8)
GRAM_COLS = (2048, 16384)


def _sci(x: float) -> str:
    e = int(math.log10(x))
    return f"1e{e}" if x == 10 ** e else f"{x:g}"


def _t(x: float) -> str:
    return f"{x:.3g} s" if x >= 0.01 else f"{x * 1e3:.2g} ms"


def _b(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} B"


def time_table(estimates: list[Estimate]) -> str:
    """Time per resource and the bound, one row per product and p."""
    keys = ("compute", "storage", "link", "decode", "write", "network")
    lines = ["| product | p | GPUs | grid | predicted | bound | " + " | ".join(keys) + " |",
             "| --- " * (6 + len(keys)) + "|"]
    for e in estimates:
        lines.append(f"| {e.what} | {e.machines} | {e.gpus} | {e.grid[0]}x{e.grid[1]} | "
                     f"{_t(e.time)} | {e.bound} | "
                     + " | ".join(_t(e.seconds[k]) if e.seconds[k] else "-" for k in keys)
                     + " |")
    return "\n".join(lines)


def bytes_table(estimates: list[Estimate]) -> str:
    """Bytes read per machine and in total, against the inputs and the pebble bound."""
    lines = ["| product | p | per machine | total | x inputs | per GPU worker, 2-D grid | "
             "per GPU worker, row bands | moved per machine / bound |",
             "| --- " * 8 + "|"]
    for e in estimates:
        lines.append(f"| {e.what} | {e.machines} | {_b(e.read_machine)} | {_b(e.read_total)} | "
                     f"{e.read_total / e.inputs:.2f} | {_b(e.per_gpu_2d)} | "
                     f"{_b(e.per_gpu_1d)} | {e.moved_machine / e.bound_machine:.3g} |")
    return "\n".join(lines)


def square_estimates(storage: Storage = PFS, machine: Machine = Machine()) -> list[Estimate]:
    return [square(n, p, machine, storage) for n in SIZES for p in MACHINES]


def gram_estimates(storage: Storage = PFS, machine: Machine = Machine()) -> list[Estimate]:
    return [gram(rows, d, p, machine, storage) for rows in GRAM_ROWS for d in GRAM_COLS
            for p in MACHINES]


def parameters(machine: Machine = Machine(), storages=(PFS, OBJECT)) -> str:
    """The assumed rates, as a table."""
    m = machine
    rows = [("GPUs per machine (g)", f"{m.gpus}"),
            ("GPU rate", f"{m.gpu_rate / 1e12:g} TFLOP/s"),
            ("GPU memory a run uses", _b(m.gpu_memory)),
            ("host cores", f"{m.cores}"),
            ("zstd decode on the host", f"{m.decode_rate / GB:g} GB/s per core"),
            ("host memory for decoded chunks", _b(m.host_memory)),
            ("a machine's link to storage, read / write",
             f"{m.link_read / GB:g} / {m.link_write / GB:g} GB/s"),
            ("network between machines", f"{m.network / GB:g} GB/s"),
            ("PCIe per GPU", f"{m.pcie / GB:g} GB/s")]
    rows += [(f"{st.name}: aggregate read / write",
              f"{st.read / GB:g} / {st.write / GB:g} GB/s") for st in storages]
    rows.append(("stored / decoded bytes (zstd, random float64)", f"{PFS.ratio:g}"))
    return "\n".join(["| parameter | value |", "| --- | --- |",
                      *(f"| {k} | {v} |" for k, v in rows)])


def tables() -> dict[str, str]:
    """Every table of docs/scaling.md, by the name of its marker there."""
    return {
        "parameters": parameters(),
        "square-time": time_table(square_estimates()),
        "square-bytes": bytes_table(square_estimates()),
        "object-time": time_table([square(n, p, storage=OBJECT) for n in SIZES
                                   for p in (8, 64)]),
        "gram-time": time_table(gram_estimates()),
        "gram-bytes": bytes_table(gram_estimates()),
        "fit": fit_table(),
    }


def fit_table() -> str:
    """The model on the machine of issue 50's measurements (p = 1; g = 1 or 2)."""
    one = replace(TWO_H200, gpus=1)
    host = replace(TWO_H200, decode_rate=math.inf, link_read=50 * GB, link_write=50 * GB)
    cases = [("n=49152 from host memory, 1 GPU", square(49152, 1, replace(host, gpus=1), HOST),
              "5.30 s"),
             ("n=49152 from host memory, cuda:all", square(49152, 1, host, HOST), "2.74 s"),
             ("n=32768 Zarr -> Zarr, 1 GPU", square(32768, 1, one, LOCAL_WARM), "3.57 s"),
             ("n=32768 Zarr -> Zarr, cuda:all", square(32768, 1, TWO_H200, LOCAL_WARM),
              "3.08 s"),
             ("X 1e6 x 2048 Gram, 1 GPU", gram(10 ** 6, 2048, 1, one, LOCAL_WARM), "1.48 s"),
             ("X 1e6 x 2048 Gram, cuda:all", gram(10 ** 6, 2048, 1, TWO_H200, LOCAL_WARM),
              "1.16 s")]
    lines = ["| case | measured | predicted | bound | compute | decode | write | fill + drain |",
             "| --- " * 8 + "|"]
    for name, e, measured in cases:
        s = e.seconds
        lines.append(f"| {name} | {measured} | {_t(e.time)} | {e.bound} | {_t(s['compute'])} "
                     f"| {_t(s['decode'])} | {_t(s['write'])} | {_t(s['fill'] + s['drain'])} |")
    return "\n".join(lines)


def markdown() -> str:
    """The tables, each under its marker as docs/scaling.md holds them."""
    return "\n\n".join(f"<!-- table: {name} -->\n{text}\n<!-- end -->"
                       for name, text in tables().items())


def main(argv=None) -> int:
    print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

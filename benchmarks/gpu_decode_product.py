"""GPU decoding as a design (issue 34): the inputs' zstd frames go up compressed and nvCOMP
decodes them into the K panels of an n x n product, pipelined with its GEMMs; beside it, in
the same process, oocgemm's run of the same product on the same stores (the host's decoders).

    python -m benchmarks.gpu_decode_product --n 32768 --layouts v3,v3-sharded --workdir DIR
        [--rows 16384] [--repeat 2]

The earlier GPU decoder (docs/lab-notes.md, issue 17) lost for three reasons, each fixed here
before judging: its batches were of about 7 frames (here a batch is every frame of an A panel
and a B panel: 12 frames of 4096² chunks or 768 of 512² inner chunks), one thread packed,
copied and decoded each batch in turn (here reader threads fill a ring of two pinned buffers
while the previous panels go up, are decoded and multiplied, on three streams), and each chunk
came back to host memory (here the compressed bytes go up once and the decoded frames are
placed into the panels on the GPU; nothing comes back but C).

The pipeline, for C in blocks of ``rows`` x n (each K panel one chunk or shard wide):

- reader threads read the panel pair's frames from their files into a pinned buffer;
- ``h2d``: the compressed bytes and the batch's tables go up;
- ``decode`` (the highest stream priority): one nvCOMP batch decodes every frame into a scratch
  buffer, then one copy puts the frames in place in the A and B panels;
- ``compute``: ``C += A @ B`` (cuBLAS DGEMM);
- after a block's last panel, C goes down to pinned host memory.

Each run is checked on sampled rows and columns against products of the stores read by zarr.
Prints the wall and CPU seconds of the GPU pipeline (with and without its GEMMs) and of
oocgemm's run into a numpy array, warm, the best of ``repeat``. Needs CuPy, zarr and
``nvidia-libnvcomp-cu12`` or ``-cu13``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from benchmarks.common import GB, BenchError
from benchmarks.gpu_decode import zstd_frames
from benchmarks.zarr_stores import describe_store, make_store
from oocgemm.cuda import nvcomp
from oocgemm.errors import OOCGemmError

_ALIGN = 256


def _nvcomp():
    lib = nvcomp.library()  # its decompressor typed there (nvcomp.DecodeOpts)
    if lib is None:
        raise BenchError("nvCOMP (nvidia-libnvcomp-cu12 or -cu13) is not installed")
    return lib


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class Region:
    """The frames of one rectangular region of a store, in row-major grid order: every frame
    the same shape (``tile``), together tiling the region exactly."""

    def __init__(self, by_start: dict, rows: tuple[int, int], cols: tuple[int, int],
                 tile: tuple[int, int]):
        th, tw = tile
        if (rows[1] - rows[0]) % th or (cols[1] - cols[0]) % tw:
            raise BenchError(f"region {rows}x{cols} is not whole frames of {th}x{tw}")
        self.grid = ((rows[1] - rows[0]) // th, (cols[1] - cols[0]) // tw)
        self.tile = tile
        self.frames = [by_start[(r, c)] for r in range(rows[0], rows[1], th)
                       for c in range(cols[0], cols[1], tw)]


class Store:
    """A zstd Zarr v3 store's frames, found by the start of their region."""

    def __init__(self, path: str):
        self.info = describe_store(path)
        frames = zstd_frames(self.info)
        self.by_start = {}
        for path_, off, nb, region in frames:
            if any(s.stop - s.start != t for s, t in zip(region, self.info.inner)):
                raise BenchError(f"{path}: edge frames are not handled (n a multiple of the "
                                 f"chunk side, please)")
            self.by_start[(region[0].start, region[1].start)] = (path_, off, nb)
        self.tile = tuple(self.info.inner)

    def region(self, rows, cols) -> Region:
        return Region(self.by_start, rows, cols, self.tile)


class Pipeline:
    """The GPU route for ``C = A @ B`` (module docstring), its buffers made once."""

    def __init__(self, a: Store, b: Store, rows: int, threads: int):
        import cupy as cp

        self.cp = cp
        n = a.info.shape[0]
        depth = a.info.unit[1]  # a K panel: one chunk (or shard) wide
        if n % rows or n % depth or b.info.unit[0] != depth:
            raise BenchError(f"n = {n} must be whole blocks of {rows} rows and panels of "
                             f"{depth}; A's and B's chunks must agree")
        self.n, self.rows, self.depth = n, rows, depth
        self.panels = [(i, q) for i in range(n // rows) for q in range(n // depth)]
        self.batches = [(a.region((i * rows, (i + 1) * rows), (q * depth, (q + 1) * depth)),
                         b.region((q * depth, (q + 1) * depth), (0, n)))
                        for i, q in self.panels]
        frames = max(len(x.frames) + len(y.frames) for x, y in self.batches)
        self.frame_bytes = max(math.prod(a.tile), math.prod(b.tile)) * 8
        packed = max(sum(_up(nb) for *_, nb in x.frames + y.frames) for x, y in self.batches)
        self.lib = _nvcomp()
        temp = ctypes.c_size_t()
        status = self.lib.nvcompBatchedZstdDecompressGetTempSize(
            frames, self.frame_bytes, nvcomp.DecodeOpts(), ctypes.byref(temp),
            frames * self.frame_bytes, None)
        if status:
            raise BenchError(f"nvCOMP GetTempSize failed ({status})")
        self.pool = ThreadPoolExecutor(threads)
        # (CUDA clamps a priority beyond its range to the highest it has.)
        self.streams = {"h2d": cp.cuda.Stream(non_blocking=True),
                        "decode": cp.cuda.Stream(non_blocking=True, priority=-1024),
                        "compute": cp.cuda.Stream(non_blocking=True),
                        "c": cp.cuda.Stream(non_blocking=True)}
        self.pinned = [cp.cuda.alloc_pinned_memory(packed + 5 * 8 * frames) for _ in range(2)]
        self.host = [np.frombuffer(m, np.uint8, packed + 5 * 8 * frames) for m in self.pinned]
        self.packed = [cp.empty(packed + 5 * 8 * frames, cp.uint8) for _ in range(2)]
        self.scratch = [cp.empty(frames * self.frame_bytes, cp.uint8) for _ in range(2)]
        self.temp = cp.empty(max(temp.value, 1), cp.uint8)
        self.a_slots = [cp.empty((rows, depth)) for _ in range(2)]
        self.b_slots = [cp.empty((depth, n)) for _ in range(2)]
        self.c = cp.empty((rows, n))
        self.statuses = cp.zeros((len(self.panels), frames), cp.int32)
        self.sizes = cp.zeros((len(self.panels), frames), cp.uint64)
        self.max_frames, self.table_at = frames, packed
        self.out_mem = cp.cuda.alloc_pinned_memory(n * n * 8)
        self.out = np.frombuffer(self.out_mem, np.float64, n * n).reshape(n, n)
        self.handle = cp.cuda.device.get_cublas_handle()

    # -- one panel pair -----------------------------------------------------------------
    def _read(self, p: int, after) -> None:
        """The frames of batch ``p`` into its pinned buffer, and its tables (pointers into
        the device copy), once ``after`` (the last H2D from that buffer) is done."""
        if after is not None:
            after.synchronize()
        a, b = self.batches[p]
        frames = a.frames + b.frames
        s = p % 2
        host, dev, scratch = self.host[s], self.packed[s], self.scratch[s]
        offsets = np.zeros(len(frames) + 1, np.int64)
        offsets[1:] = np.cumsum([_up(nb) for *_, nb in frames])

        def one(k: int) -> None:
            path, off, nb = frames[k]
            with open(path, "rb", buffering=0) as f:
                got = os.preadv(f.fileno(), [memoryview(host[offsets[k]:offsets[k] + nb])], off)
            if got != nb:
                raise BenchError(f"{path}: read {got} of {nb} bytes")

        list(self.pool.map(one, range(len(frames))))
        table = host[self.table_at:].view(np.uint64).reshape(5, self.max_frames)
        m = len(frames)
        table[0, :m] = dev.data.ptr + offsets[:-1]
        table[1, :m] = [nb for *_, nb in frames]
        table[2, :m] = [math.prod(x.tile) * 8 for x in (a, b) for _ in x.frames]
        a_bytes = len(a.frames) * math.prod(a.tile) * 8
        table[3, :m] = scratch.data.ptr + np.concatenate([
            np.arange(len(a.frames)) * math.prod(a.tile) * 8,
            a_bytes + np.arange(len(b.frames)) * math.prod(b.tile) * 8]).astype(np.uint64)

    def _place(self, p: int) -> None:
        """The decoded frames of batch ``p`` into its A and B panels (one copy each)."""
        cp = self.cp
        a, b = self.batches[p]
        s = p % 2
        scratch = self.scratch[s].view(cp.float64)
        a_elements = a.grid[0] * a.grid[1] * math.prod(a.tile)
        for region, slot, start in ((a, self.a_slots[s], 0), (b, self.b_slots[s], a_elements)):
            (gr, gc), (th, tw) = region.grid, region.tile
            tiles = scratch[start:start + gr * gc * th * tw].reshape(gr, gc, th, tw)
            cp.copyto(slot.reshape(gr, th, gc, tw), tiles.transpose(0, 2, 1, 3))

    def run(self, gemms: bool = True) -> float:
        """One product; returns its wall seconds (C in ``self.out``)."""
        from cupy_backends.cuda.libs import cublas

        cp, st = self.cp, self.streams
        n, rows, depth = self.n, self.rows, self.depth
        per_row = n // depth
        events = {name: [None] * len(self.panels) for name in ("h2d", "decode", "gemm")}
        down = None
        cublas.setStream(self.handle, st["compute"].ptr)
        scalars = np.array([1.0, 0.0, 1.0])
        self.statuses.fill(-1)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        reads = {0: self.pool.submit(self._read, 0, None)}
        for p, (i, q) in enumerate(self.panels):
            s = p % 2
            if p + 1 < len(self.panels):
                reads[p + 1] = self.pool.submit(self._read, p + 1, events["h2d"][p - 1]
                                                if p >= 1 else None)
            reads.pop(p).result()
            with st["h2d"]:
                if p >= 2:
                    st["h2d"].wait_event(events["decode"][p - 2])
                self.packed[s].set(self.host[s], stream=st["h2d"])
                events["h2d"][p] = st["h2d"].record()
            table = self.packed[s][self.table_at:].view(cp.uint64)
            m = len(self.batches[p][0].frames) + len(self.batches[p][1].frames)
            with st["decode"]:
                st["decode"].wait_event(events["h2d"][p])
                status = self.lib.nvcompBatchedZstdDecompressAsync(
                    table[0:].data.ptr, table[self.max_frames:].data.ptr,
                    table[2 * self.max_frames:].data.ptr, self.sizes[p].data.ptr, m,
                    self.temp.data.ptr, self.temp.nbytes,
                    table[3 * self.max_frames:].data.ptr, nvcomp.DecodeOpts(),
                    self.statuses[p].data.ptr, st["decode"].ptr)
                if status:
                    raise BenchError(f"nvCOMP decode of batch {p} failed ({status})")
                if p >= 2 and events["gemm"][p - 2] is not None:
                    st["decode"].wait_event(events["gemm"][p - 2])
                self._place(p)
                events["decode"][p] = st["decode"].record()
            first, last = q == 0, q == per_row - 1
            with st["compute"]:
                st["compute"].wait_event(events["decode"][p])
                if first and down is not None:
                    st["compute"].wait_event(down)
                if gemms:
                    cublas.dgemm(self.handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N,
                                 n, rows, depth, scalars[0:].ctypes.data,
                                 self.b_slots[s].data.ptr, n, self.a_slots[s].data.ptr, depth,
                                 scalars[(1 if first else 2):].ctypes.data, self.c.data.ptr, n)
                events["gemm"][p] = st["compute"].record()
            if last:
                with st["c"]:
                    st["c"].wait_event(events["gemm"][p])
                    self.c.get(stream=st["c"], out=self.out[i * rows:(i + 1) * rows])
                    down = st["c"].record()
        st["c"].synchronize()
        seconds = time.perf_counter() - t0
        cp.cuda.Device().synchronize()
        bad = cp.asnumpy(self.statuses)
        counts = [len(x.frames) + len(y.frames) for x, y in self.batches]
        for p, m in enumerate(counts):
            if (bad[p, :m] != 0).any():
                raise BenchError(f"nvCOMP refused frames of batch {p}: statuses "
                                 f"{sorted(set(bad[p, :m].tolist()))}")
        return seconds

    def close(self) -> None:
        self.pool.shutdown()


def _check(c: np.ndarray, a_path: str, b_path: str, seed: int = 5) -> float:
    """Max relative error of C on 8 sampled rows x 8 columns (in its first and last chunk
    rows and columns) against zarr's reads."""
    import zarr

    n = c.shape[0]
    rng = np.random.default_rng(seed)
    a, b = zarr.open_array(a_path, mode="r"), zarr.open_array(b_path, mode="r")
    # rows of A's first and last chunk rows, columns of B's first and last chunk columns
    rows = np.unique(np.concatenate([rng.integers(0, a.chunks[0], 4),
                                     rng.integers(n - a.chunks[0], n, 4)]))
    cols = np.unique(np.concatenate([rng.integers(0, b.chunks[1], 4),
                                     rng.integers(n - b.chunks[1], n, 4)]))
    want = (a.get_orthogonal_selection((rows, slice(None)))
            @ b.get_orthogonal_selection((slice(None), cols)))
    got = c[np.ix_(rows, cols)]
    return float(np.abs(got - want).max() / np.abs(want).max())


def _timed(f, repeat: int) -> tuple[float, float, object]:
    """(best wall seconds, its CPU seconds, its value) of ``repeat`` calls after a first:
    the whole call, planning and set-up included."""
    f()
    best = None
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        value = f()
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        if best is None or wall < best[0]:
            best = (wall, cpu, value)
    assert best is not None
    return best


def measure(layout: str, n: int, chunk: int, rows: int, workdir: str, repeat: int,
            threads: int, memory_limit: str) -> dict:
    import oocgemm

    paths = {}
    for name, seed in (("a", 1), ("b", 2)):
        path = os.path.join(workdir, f"{layout}-{n}-{chunk}-{name}.zarr")
        if not os.path.exists(os.path.join(path, "zarr.json")):
            make_store(path, n=n, chunk=chunk, layout=layout, seed=seed, threads=threads)
        paths[name] = path
    a, b = Store(paths["a"]), Store(paths["b"])
    row = {"layout": a.info.label, "n": n, "rows": rows,
           "stored_gb": (a.info.stored_bytes + b.info.stored_bytes) / GB}
    out = np.empty((n, n))
    out.fill(0)

    def ours():
        return oocgemm.multiply(paths["a"], paths["b"], out=out, memory_limit=memory_limit,
                                progress=False)

    wall, cpu, result = _timed(ours, repeat)
    gemm_end = max((e.end for e in result.events if e.kind == "gemm"), default=float("nan"))
    row["oocgemm"] = {"seconds": wall, "cpu_seconds": cpu, "tile": list(result.plan.tile),
                      "last_gemm_s": gemm_end, "error": _check(out, paths["a"], paths["b"])}
    pipe = Pipeline(a, b, rows, threads)
    try:
        row["frames_per_batch"] = pipe.max_frames
        for label, gemms in (("gpu_decode", True), ("gpu_decode_no_gemm", False)):
            wall, cpu, _ = _timed(lambda g=gemms: pipe.run(g), repeat)
            row[label] = {"seconds": wall, "cpu_seconds": cpu}
            if gemms:
                row[label]["error"] = _check(pipe.out, paths["a"], paths["b"])
    finally:
        pipe.close()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_decode_product",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--rows", type=int, default=None, help="rows of a C block (n/2)")
    p.add_argument("--layouts", default="v3,v3-sharded")
    p.add_argument("--workdir", required=True)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--memory-limit", default="16GB")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = args.rows or args.n // 2
    results = []
    try:
        for layout in args.layouts.split(","):
            results.append(measure(layout, args.n, args.chunk, rows, args.workdir, args.repeat,
                                   args.threads, args.memory_limit))
            r = results[-1]
            print(f"== {r['layout']} (n = {r['n']}, {r['stored_gb']:.1f} GB stored, "
                  f"{r['frames_per_batch']} frames a batch, C blocks of {rows} rows)")
            for key in ("oocgemm", "gpu_decode", "gpu_decode_no_gemm"):
                v = r[key]
                extra = "".join(f", {k} {v[k]:.3g}" for k in ("error", "last_gemm_s") if k in v)
                print(f"  {key:20s} {v['seconds']:7.3f} s  cpu {v['cpu_seconds']:6.1f} s{extra}",
                      flush=True)
    except (BenchError, OOCGemmError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What multiply() returns, and what importing oocgemm costs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest
from _helpers import assert_gemm, rand

import oocgemm
from oocgemm.diagnostics import Event

TRAFFIC_KEYS = {"read", "storage_write", "h2d", "d2h"}  # the operations' levels
BYTES_KEYS = TRAFFIC_KEYS | {"storage_read", "decoded"}  # and what came from storage


@pytest.mark.parametrize("m,n,k,tile", [(23, 17, 31, (5, 4, 6)), (8, 8, 8, None),
                                        (1, 30, 2, (1, 7, 1))])
def test_result_fields(rng, workdir, m, n, k, tile):
    a, b, c = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    np.save("a.npy", a)
    np.save("c.npy", c)
    r = oocgemm.multiply("a.npy", b, "out.npy", c="c.npy", beta=0.5, tile=tile, device="cpu")
    assert isinstance(r, oocgemm.Result)
    assert_gemm(r.out, a, b, c, beta=0.5)
    assert r.flops == 2 * m * n * k
    assert r.seconds > 0 and r.tflops > 0
    assert r.tflops == pytest.approx(r.flops / r.seconds / 1e12)
    assert set(r.bytes) == BYTES_KEYS
    assert r.bytes["h2d"] == r.bytes["d2h"] == 0  # no device on the CPU
    assert r.bytes["storage_write"] == m * n * 8  # the .npy output, exactly once
    # A (on disk) at least once and C exactly once; B is in memory and may be used in place
    assert r.bytes["read"] >= (m * k + m * n) * 8
    # what came from storage: A's and C's reads from their files (no chunk decoded)
    a_reads = sum(e.nbytes for e in r.events if e.kind == "read" and e.operand == "A")
    assert r.bytes["storage_read"] == a_reads + m * n * 8 and r.bytes["decoded"] == 0
    assert {k: r.bytes[k] for k in TRAFFIC_KEYS} == traffic_of(r.events)
    assert str(r.plan.device) == "cpu"


def traffic_of(events) -> dict:
    levels = {"read": "read", "write": "storage_write", "upload": "h2d", "download": "d2h"}
    total = dict.fromkeys(TRAFFIC_KEYS, 0)
    for e in events:
        if e.kind in levels:
            total[levels[e.kind]] += e.nbytes
    return total


def test_result_bytes_in_memory(rng):
    """In-memory operands may be used in place: bytes count what actually moved, no more
    than the schedule's traffic."""
    m, n, k = 20, 12, 9
    a, b, c = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
    r = oocgemm.multiply(a, b, c=c, beta=2.0, tile=(6, 5, 4), device="cpu")
    assert_gemm(r.out, a, b, c, beta=2.0)
    assert set(r.bytes) == BYTES_KEYS
    planned = r.plan.schedule.traffic()
    for key in TRAFFIC_KEYS:
        assert 0 <= r.bytes[key] <= planned[key]
    assert {k: r.bytes[k] for k in TRAFFIC_KEYS} == traffic_of(r.events)
    assert r.bytes["storage_read"] == r.bytes["decoded"] == 0


@pytest.mark.parametrize("on_disk", [True, False])
def test_events_match_the_schedule(rng, workdir, on_disk):
    a, b, c = rand(rng, (19, 14)), rand(rng, (14, 16)), rand(rng, (19, 16))
    size = c.size
    if on_disk:
        for name, x in (("a", a), ("b", b), ("c", c)):
            np.save(f"{name}.npy", x)
        a, b, c = "a.npy", "b.npy", "c.npy"
    r = oocgemm.multiply(a, b, "out.npy" if on_disk else None, c=c, beta=-1.0, tile=(4, 5, 3),
                         device="cpu")
    ops = r.plan.schedule.ops
    assert len(r.events) == len(ops)
    assert sorted(e.index for e in r.events) == list(range(len(ops)))
    for e in r.events:
        assert isinstance(e, Event)
        assert 0 <= e.start <= e.end
        op = ops[e.index]
        assert (e.kind, e.operand, e.key, e.q, e.flops) == (op.kind.value, op.operand, op.key,
                                                            op.q, op.flops)
        assert e.nbytes == op.nbytes if on_disk else 0 <= e.nbytes <= op.nbytes
        assert e.lane
    assert [e.start for e in r.events] == sorted(e.start for e in r.events)
    by_index = {e.index: e for e in r.events}
    for op in ops:  # an op never starts before its dependencies ended
        for d in op.deps:
            assert by_index[d].end <= by_index[op.index].start
    kinds = Counter(e.kind for e in r.events)
    p, q, nk = r.plan.grid
    # every (block, panel) computed; the run's last block leaves in the row stripes its
    # last panel ran in, each block before it whole
    assert len({(e.key, e.q) for e in r.events if e.kind == "gemm"}) == p * q * nk
    last = ops[-1].key
    assert kinds["write"] == p * q - 1 + sum(op.kind.value == "write" and op.key == last
                                             for op in ops)
    assert sum(e.planned for e in r.events if e.kind == "write") == size * 8
    assert sum(e.flops for e in r.events) == r.flops


def test_complex_flops_and_alpha_zero_flops(rng):
    a, b = rand(rng, (5, 4), "complex128"), rand(rng, (4, 3), "complex128")
    assert oocgemm.multiply(a, b, device="cpu").flops == 8 * 5 * 3 * 4
    r = oocgemm.multiply(a, b, alpha=0.0, c=rand(rng, (5, 3), "complex128"), beta=1.0,
                         device="cpu")
    assert r.flops == 0 and r.tflops == 0


def test_progress_callback_sees_every_event(rng):
    seen = []
    a, b = rand(rng, (12, 9)), rand(rng, (9, 10))
    r = oocgemm.multiply(a, b, tile=(4, 4, 4), device="cpu", progress=seen.append)
    assert sorted(e.index for e in seen) == sorted(e.index for e in r.events)


def test_progress_bar_false_and_true(rng, capsys):
    a, b = rand(rng, (12, 9)), rand(rng, (9, 10))
    oocgemm.multiply(a, b, tile=(4, 4, 4), device="cpu", progress=False)
    assert capsys.readouterr().err == ""
    r = oocgemm.multiply(a, b, tile=(4, 4, 4), device="cpu", progress=True)
    np.testing.assert_allclose(r.out, a @ b, rtol=1e-12, atol=1e-12)


def test_summary_and_str(rng):
    a, b = rand(rng, (12, 9)), rand(rng, (9, 10))
    r = oocgemm.multiply(a, b, tile=(4, 4, 4), device="cpu")
    s = r.summary()
    assert s["shape"] == {"m": 12, "n": 10, "k": 9} and s["tile"] == {"w": 4, "h": 4, "r": 4}
    assert s["flops"] == r.flops and s["operations"] == len(r.events)
    plan = r.plan.summary()  # one schema: the plan's fields, then the run's
    assert {k: s[k] for k in plan if k != "bytes"} == {k: v for k, v in plan.items()
                                                       if k != "bytes"}
    assert s["planned_bytes"] == plan["bytes"] and s["bytes"] == r.bytes
    assert "C[12x10]" in str(r) and "GFLOP/s" in str(r)


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_and_cpu_multiply_do_not_import_cupy():
    out = run_python("""
        import sys
        import numpy as np
        import oocgemm
        assert "cupy" not in sys.modules, "import oocgemm imported cupy"
        a = np.random.default_rng(5).standard_normal((20, 10))
        r = oocgemm.multiply(a, a.T, device="cpu", tile=(4, 4, 4))
        assert np.allclose(r.out, a @ a.T)
        oocgemm.plan(a, a.T, device="auto")
        print(sorted(m for m in sys.modules if m == "cupy" or m.startswith("cupy.")))
    """)
    assert out.strip() == "[]"


def test_a_cpu_product_in_memory_does_not_import_zarr():
    """Zarr is imported for a Zarr operand or output only (a quarter of a second of a first
    product on the 2-core VM)."""
    out = run_python("""
        import sys
        import numpy as np
        import oocgemm
        rng = np.random.default_rng(6)
        a, b = rng.standard_normal((30, 20)), rng.standard_normal((20, 25))
        r = oocgemm.multiply(a, b, device="cpu", tile=(8, 8, 8))
        assert np.allclose(r.out, a @ b)
        print(sorted(m for m in sys.modules if m in ("zarr", "numcodecs")))
    """)
    assert out.strip() == "[]"


def test_the_command_line_and_the_errors_load_no_planner():
    """``oocgemm --help`` and ``except oocgemm.OOCGemmError`` import neither the planner nor
    the engine (a fresh process's first cost); the API loads on first use."""
    out = run_python("""
        import sys
        import oocgemm
        from oocgemm import OOCGemmError, __version__
        from oocgemm.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        loaded = sorted(m for m in sys.modules if m.startswith(("oocgemm.planning",
                                                                  "oocgemm.product",
                                                                  "oocgemm.runtime")))
        print(loaded)
        assert callable(oocgemm.multiply) and "multiply" in dir(oocgemm)
        assert "oocgemm.product" in sys.modules
    """)
    assert out.strip().splitlines()[-1] == "[]"


def test_progress_bar_counts_blocks_and_storage_rates(rng, workdir):
    """The bar's figures: C blocks stored (each once all its writes are done) and the
    storage's read and write rates, from a real run's events."""
    import io

    import zarr

    from oocgemm.diagnostics.progress import ProgressBar

    a, b = rand(rng, (12, 9)), rand(rng, (9, 10))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype, chunks=(4, 4))[:] = a
    plan = oocgemm.plan("a.zarr", b, "c.zarr", tile=(4, 5, 3), device="cpu")
    stream = io.StringIO()
    bar = ProgressBar(plan, file=stream)
    seen = []
    r = oocgemm.multiply("a.zarr", b, "c.zarr", tile=(4, 5, 3), device="cpu",
                         progress=lambda e: (seen.append(e), bar(e)))
    bar.close()
    assert bar.bar.n == r.flops
    figures = bar.figures(r.seconds)
    assert figures.startswith(f"blocks {plan.n_blocks}/{plan.n_blocks}, read ")
    assert "write" in figures and "GB/s" in figures
    reads = sum(e.nbytes for e in seen if e.kind == "read")
    assert reads >= a.nbytes  # the zarr operand's reads were counted
    assert_gemm(r.out, a, b)


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_progress_bar_keeps_a_wide_bar_and_drops_figures_that_do_not_fit(rng, workdir,
                                                                         columns):
    """On an 80-column terminal the line fits, its bar is at least MIN_BAR wide, and the
    figures that do not fit are left out whole (the least important first), never cut."""
    import io

    from oocgemm.diagnostics.progress import MIN_BAR, ProgressBar

    np.save("a.npy", rand(rng, (300, 200)))
    np.save("b.npy", rand(rng, (200, 250)))
    plan = oocgemm.plan("a.npy", "b.npy", "c.npy", tile=(64, 64, 64), device="cpu")
    stream = io.StringIO()
    bar = ProgressBar(plan, file=stream, ncols=columns)
    oocgemm.multiply("a.npy", "b.npy", "c.npy", tile=(64, 64, 64), device="cpu", progress=bar)
    bar.bar.refresh()
    line = stream.getvalue().split("\r")[-1]
    bar.close()
    assert len(line) <= columns
    drawn = line.split("|")[1]
    assert len(drawn) >= MIN_BAR
    assert " left, " in line and "flop/s" in line
    assert "blocks 20/20" in line
    shown = line.split("flop/s")[1]
    assert shown == "" or all(part.endswith(("GB/s", "flop", "/20")) for part in
                              shown.lstrip(", ").split(", ")), line
    if columns >= 200:  # room for every figure
        assert "read " in line and "write " in line and "30.0M/30.0M flop" in line


def test_short_reprs(rng):
    a, b = rng.standard_normal((200, 150)), rng.standard_normal((150, 120))
    r = oocgemm.multiply(a, b, device="cpu", tile=(20, 20, 20))
    assert len(r.events) > 100
    assert len(repr(r)) < 200 and "C[200x120]" in repr(r) and "events" in repr(r)
    assert len(repr(r.timeline)) < 200 and repr(r.timeline).startswith("Timeline(")


def test_a_result_is_its_product_to_numpy(rng, workdir):
    """``np.asarray(result)`` is C, as a numpy user expects of ``c = multiply(a, b)``."""
    a, b = rand(rng, (70, 50)), rand(rng, (50, 60))
    result = oocgemm.multiply(a, b, device="cpu")
    assert np.asarray(result) is result.out  # the array itself, no copy
    assert np.allclose(result, a @ b) and np.asarray(result).shape == (70, 60)
    assert np.array(result, copy=True) is not result.out
    stored = oocgemm.multiply(a, b, "c.zarr", device="cpu")
    got = np.asarray(stored)
    assert isinstance(got, np.ndarray) and np.array_equal(got, stored.out[...])
    assert np.asarray(stored, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy"):
        np.asarray(stored, copy=False)

"""The scaling model of docs/scaling.md (benchmarks/scaling_model.py): the doc's tables are the
module's output, and the model keeps the properties the doc relies on (a 2-D grid reads no
more than row bands, nothing moves less than the I/O lower bound, a forced layout's bytes add
up)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from benchmarks import scaling_model as sm

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- table: (\S+) -->\n(.*?)\n<!-- end -->", re.S)


def test_the_docs_tables_are_the_modules_output():
    doc = dict(MARKER.findall((ROOT / "docs" / "scaling.md").read_text()))
    made = sm.tables()
    assert set(doc) == set(made)
    for name, text in made.items():
        assert doc[name] == text, f"docs/scaling.md's table {name!r} differs: run " \
                                  f"python -m benchmarks.scaling_model"


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8, 12, 64, 512])
@pytest.mark.parametrize("n", [4096, 32768, 262144])
def test_a_2d_grid_reads_no_more_than_row_bands(p, n):
    pr, pc = sm.grid_for(p, n, n, n)
    assert pr * pc == p
    two_d = n * n / pr + n * n / pc
    assert two_d <= n * n / p + n * n
    if p >= 4:
        assert two_d < n * n / p + n * n


def test_the_grid_follows_the_shape():
    assert sm.grid_for(8, 1000, 1000, 10) == (4, 2)  # a tie: more rows
    assert sm.grid_for(8, 10 ** 6, 1000, 1000) == (8, 1)  # tall C: row bands are the grid


@pytest.mark.parametrize("memory", [1e6, 1e8, 1e10])
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (4000, 500, 20000), (10 ** 5, 10 ** 5, 30),
                                   (300, 300, 10 ** 6)])
def test_no_worker_moves_less_than_the_pebble_bound(shape, memory):
    """Reads and C's stores of one worker's rectangle, whatever fits in its memory, against
    max(2F/sqrt(S), 3 F^(2/3)) for the same S."""
    m, n, k = shape
    for p in (1, 2, 4, 8, 16):
        pr, pc = sm.grid_for(p, m, n, k)
        rows, cols = m / pr, n / pc
        moved = sm.band_reads(rows, cols, k, memory) + rows * cols
        assert moved >= sm.pebble_bound(rows * cols * k, memory) * (1 - 1e-12)


def test_the_estimates_move_no_less_than_their_bound():
    for e in sm.square_estimates() + sm.gram_estimates() + sm.square_estimates(sm.OBJECT):
        assert e.moved_machine >= e.bound_machine * (1 - 1e-9)
        assert e.read_total >= e.inputs * (1 - 1e-12)  # every input byte read at least once
        assert e.per_gpu_2d <= e.per_gpu_1d * (1 + 1e-12)
        assert e.time >= max(e.seconds[k] for k in sm.RESOURCES)


def test_more_machines_never_compute_longer():
    for n in sm.SIZES:
        times = [sm.square(n, p).seconds["compute"] for p in sm.MACHINES]
        assert times == sorted(times, reverse=True)


def test_a_band_that_does_not_fit_is_read_again():
    assert sm.band_reads(10, 20, 100, 10 ** 6) == 10 * 100 + 20 * 100
    assert sm.band_reads(10, 20, 100, 500) == 1000 + 2 * 2000  # A's band in two parts


def test_group_reads_round_out_to_whole_chunks():
    # two row bands of a 4096 product in 512 chunks: half of A and all of B each
    assert sm.group_reads([0, 2048, 4096], [0, 4096], 4096, 512) == [
        (2048 + 4096) * 4096 * 8.0] * 2
    # a band that cuts a chunk decodes all of it
    got = sm.group_reads([0, 1000, 4096], [0, 4096], 4096, 512)
    assert got[0] == (1024 + 4096) * 4096 * 8 and got[1] == (3584 + 4096) * 4096 * 8
    # a 2 x 2 grid: each group half of each
    assert sm.group_reads([0, 2048, 4096], [0, 2048, 4096], 4096, 512) == [
        (2048 + 2048) * 4096 * 8.0] * 4


def test_the_model_prints_the_tables():
    text = sm.markdown()
    assert text.count("<!-- table:") == len(sm.tables())
    assert math.isfinite(sm.square(262144, 64).time)


def test_dask_scaling_measures_each_worker(tmp_path):
    """The CPU check end to end at a small size: per worker shares and decodes, the
    balance, and the model's bytes for the layout."""
    pytest.importorskip("distributed")
    from benchmarks import dask_scaling

    out = tmp_path / "s.json"
    assert dask_scaling.main(["--workdir", str(tmp_path / "w"), "--n", "512", "--chunk", "128",
                              "--workers", "2", "--groups", "2,2", "--json", str(out)]) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["groups"] == [2, 2] and case["group_tasks"] == 4
    assert case["max_rel_error"] < 1e-12
    assert len(case["per_worker"]) == 2
    assert sum(w["runs"] for w in case["per_worker"].values()) == 4
    assert sum(w["flops_share"] for w in case["per_worker"].values()) == pytest.approx(1)
    assert 0 < case["balance_flops"] <= 1
    assert case["model_total"] == 4 * (256 + 256) * 512 * 8
    # every chunk of each group's bands decoded at least once in some process
    assert case["decoded_bytes"] >= case["input_bytes"]
    assert case["decoded_bytes"] <= case["model_total"]

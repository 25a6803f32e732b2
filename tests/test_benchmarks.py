"""The benchmarks beside the library (benchmarks/, ``python -m benchmarks``) without a GPU: the
CPU benchmark end to end, the subcommands' errors, and the wall between them and the library
(no module of oocgemm imports benchmark code; kernels/ holds the GEMM sources only)."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import cli

from benchmarks import bandwidth, products
from benchmarks.cli import main
from benchmarks.kernel_rates import nominal_fma_rate
from oocgemm import cuda
from oocgemm import kernel_catalog as catalog

ROOT = Path(__file__).resolve().parents[1]


run, fails = cli(main)


def test_cpu_reports_a_ratio():
    result = run("cpu", "--size", "256", "--repeat", "1")
    assert "ratio" in result.stdout and "numpy" in result.stdout and "GFLOP/s" in result.stdout
    assert "ok" in result.stdout
    data = json.loads(run("cpu", "--size", "64", "--repeat", "2", "--json").stdout)
    assert data["ratio"] > 0 and data["correct"] and data["target_ratio"] == 0.8
    assert len(data["numpy"]["seconds"]) == len(data["oocgemm"]["seconds"]) == 2
    assert data["max_rel_error"] <= data["tolerance"]


def test_cpu_errors():
    assert "int8" in fails("cpu", "--size", "16", "--dtype", "int8")
    assert "--size" in fails("cpu", "--size", "0")
    assert "No such command" in fails("frobnicate")


def test_cpu_interrupted(monkeypatch):
    """python -m benchmarks has oocgemm's error wrapper: an interrupt is one line and 130."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(products, "cpu_benchmark", interrupt)
    assert run("cpu", "--size", "16", code=130).stderr.splitlines()[-1] == "interrupted"


def test_cpu_benchmark_function_returns_plain_data():
    res = products.cpu_benchmark(size=32, repeat=1, dtype="complex64", warmup=False)
    assert res["correct"] and res["dtype"] == "complex64" and res["flops"] == 8 * 32 ** 3
    json.dumps(res)


def test_gpu_unknown_case_is_a_clear_error():
    assert "unknown benchmark case(s) nope" in fails("gpu", "--cases", "numpy,nope")


def test_gpu_bad_workdir_fails_before_any_case(tmp_path):
    """A workdir that cannot be made is an error up front (exit 2), not a traceback after the
    first cases have run."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    output = fails("gpu", "--cases", "npy", "--workdir", blocker / "sub")
    assert "workdir" in output and "cannot be created" in output


@pytest.mark.skipif(cuda.device_count() > 0, reason="a GPU is present")
@pytest.mark.parametrize("command", ["kernels", "power"])
def test_kernel_benchmarks_without_a_gpu_are_a_clear_error(command):
    assert "needs a GPU" in fails(command)


def test_bandwidth(monkeypatch):
    real = bandwidth.host_memcpy_bandwidth
    monkeypatch.setattr(bandwidth, "host_memcpy_bandwidth",
                        lambda nbytes=None, repeat=5: real(4 << 20, 2))
    out = run("bandwidth").stdout
    assert "bandwidth" in out and "GB/s" in out
    data = json.loads(run("bandwidth", "--json").stdout)
    assert data["host_memcpy"]["best_gbps"] > 0


def test_nominal_fma_rate_counts_every_unit_at_the_top_clock():
    # H100 SXM: 132 SMs of 64 FP64 and 128 FP32 FMA units, 1980 MHz: NVIDIA's 33.5 and 66.9 TFLOP/s
    assert nominal_fma_rate(90, 132, 1_980_000) == pytest.approx(33.45e12, rel=1e-3)
    assert nominal_fma_rate(90, 132, 1_980_000, "float32") == pytest.approx(66.9e12, rel=1e-3)
    assert nominal_fma_rate(80, 108, 1_410_000) == pytest.approx(9.75e12, rel=1e-3)  # A100
    assert nominal_fma_rate(89, 128, 2_520_000) is None  # a consumer chip: FP64 units not listed


def test_python_dash_m_benchmarks_lists_its_subcommands():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("cpu", "gpu", "kernels", "power", "bandwidth", "zarr-io", "zarr-product",
                    "dask-matmul", "gpu-decode", "gram", "gpu-decode-product", "zarr-inputs",
                    "s3", "scaling", "dask-scaling", "scaling-model", "fresh",
                    "gpu-small-blocks", "small-blocks", "npy-product"):
        assert command in proc.stdout


def test_npy_product_measures_the_product_beside_its_floors(tmp_path):
    """``.npy`` -> ``.npy`` beside its compute and the disk's rate of storing C (on the CPU
    here): a correct C, each floor timed, and the inputs gone unless kept."""
    report = tmp_path / "npy.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "npy-product", "--workdir",
                           str(tmp_path / "w"), "--n", "384", "--device", "cpu", "--repeat",
                           "1", "--json", str(report)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(report.read_text())
    assert doc["max_relative_error"] < 1e-12
    assert doc["compute"] > 0 and doc["store_floor"]["seconds"] > 0
    assert set(doc["write_ways"]) == {"memmap", "pwrite"}
    assert doc["of_bound"] == pytest.approx(doc["npy_product"]["wall"] / max(
        doc["compute"], doc["store_floor"]["seconds"]))
    assert not list((tmp_path / "w").glob("*.npy"))


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_library_imports_no_benchmark_code():
    offenders = {str(path.relative_to(ROOT)): sorted(n for n in _imports(path)
                                                     if n.split(".")[0] == "benchmarks")
                 for path in (ROOT / "oocgemm").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_a_product_with_a_cuda_kernel_loads_no_benchmark_code():
    """The kernel loader's modules, imported as a kernel= product imports them (oocgemm.cuda.
    kernels itself needs CuPy, so its imports are read rather than run here)."""
    code = ("import sys, oocgemm, oocgemm.cli, oocgemm.kernel_catalog, "
            "oocgemm.runtime.cuda_executor; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests", env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert not {n for n in _imports(ROOT / "oocgemm" / "cuda" / "kernels.py")
                if "baselines" in n or "power" in n or n.startswith("benchmarks")}


def test_kernels_folder_holds_the_gemm_sources_only():
    """Every .cu of kernels/ is a kernel of the catalog or a step of a product's arithmetic;
    the rest are headers they include."""
    folder = ROOT / "kernels"
    sources = {p.name for p in folder.glob("*.cu")}
    assert sources == {spec.source for spec in catalog.KERNELS.values()} | set(catalog.STEPS)
    included = set()
    for spec in catalog.KERNELS.values():
        included |= set(catalog._INCLUDE.findall((folder / spec.source).read_text()))
    assert {p.name for p in folder.glob("*.cuh")} <= included
    assert {p.suffix for p in folder.iterdir()} <= {".cu", ".cuh", ".md"}


def test_scaling_runs_its_cases_on_cpu_executors(tmp_path):
    """The scaling benchmark's host and Zarr cases, on CPU executors standing for GPUs: every
    product checked, the efficiency against the one-device case, the storage floor beside."""
    from benchmarks import scaling

    out = tmp_path / "scaling.json"
    assert scaling.main(["--cpu", "--n", "384", "--gpus", "1,2", "--repeat", "1", "--zarr",
                         str(tmp_path / "z"), "--chunk", "128", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    cases = {(c["case"], c["gpus"]): c for c in doc["cases"]}
    assert set(cases) == {("multiply", 1), ("multiply", 2), ("zarr", 1), ("zarr", 2)}
    assert all(c["error"] < 1e-13 for c in cases.values())
    assert "efficiency" in cases[("zarr", 2)] and "efficiency" not in cases[("zarr", 1)]
    assert doc["floor"]["stored_bytes"] > 0 and cases[("zarr", 1)]["floor"] > 0
    assert not (tmp_path / "z" / "a.zarr").exists()  # the stores it made are gone


def test_gram_measures_x_t_x_beside_its_floors_and_baselines(tmp_path):
    """The Gram benchmark end to end on the CPU at a small size: every measurement, the
    product checked against numpy's, the ratios, the machine, and the store removed."""
    from benchmarks import gram

    out, folder = tmp_path / "gram.json", tmp_path / "stores"
    assert gram.main(["--rows", "3000", "--cols", "64", "--chunk-rows", "512", "--device", "cpu",
                      "--dir", str(folder), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    found = doc["measurements"]
    assert set(found) == {"decode", "memory", "oocgemm", "dask"}
    assert found["decode"]["correct"] and found["decode"]["chunks"] == 6
    assert all(found[name]["seconds"] > 0 for name in ("decode", "memory", "oocgemm"))
    ooc = found["oocgemm"]
    assert ooc["correct"] and ooc["error"] < 1e-10 and isinstance(ooc["symmetric"], bool)
    assert ooc["decodes"] >= 6 and ooc["run_seconds"] > 0
    assert "skipped" in found["dask"] or found["dask"]["error"] < 1e-10
    assert doc["ratios"]["oocgemm/decode"] > 0 and doc["ratios"]["oocgemm/max(decode,memory)"] > 0
    assert doc["machine"]["hostname"] and doc["machine"]["cores"] >= 1
    assert doc["stored_bytes"] > 0 and doc["write"]["codecs"] == ["zstd"]
    assert not list(folder.iterdir())  # the store it made is gone


def test_gram_transposed_side_square_mode_and_errors(tmp_path, monkeypatch):
    from benchmarks import gram

    result = run("gram", "--rows", "2000", "--cols", "48", "--chunk-rows", "512", "--device",
                 "cpu", "--transpose-side", "b", "--skip", "dask,decode", "--dir", tmp_path)
    assert "Y @ Y.T" in result.stdout and "rel. error" in result.stdout
    result = run("gram", "--square", "96", "--device", "cpu")
    assert "ratio gram / general" in result.stdout and "FAILED" not in result.stdout
    assert "unknown measurement(s) nope" in fails("gram", "--skip", "decode,nope")
    monkeypatch.setattr(gram, "DROP_CACHES", str(tmp_path / "missing" / "drop_caches"))
    assert "--cold" in fails("gram", "--rows", "100", "--cols", "8", "--device", "cpu", "--cold",
                             "--dir", tmp_path)


def test_zarr_io_makes_floors_and_decodes_its_stores(tmp_path, capsys):
    """python -m benchmarks.zarr_io end to end at small sizes: make writes a chunked and a
    sharded store, floor reads and writes beside them, and decode checks every case of the
    decoders here (each in its own interpreter) against make's regenerated data."""
    from benchmarks import zarr_io

    v3, sharded, out = tmp_path / "v3", tmp_path / "sharded", tmp_path / "decode.json"
    assert zarr_io.main(["make", "--n", "300", "--chunk", "128", "--layout", "v3", str(v3)]) == 0
    assert zarr_io.main(["make", "--n", "1024", "--chunk", "1024", "--layout", "v3-sharded",
                         str(sharded)]) == 0
    assert zarr_io.main(["floor", str(v3), str(sharded), "--threads", "1,2"]) == 0
    assert "warm read GB/s" in capsys.readouterr().out
    assert zarr_io.main(["decode", str(v3), str(sharded), "--threads", "2", "--repeat", "1",
                         "--decoders", "zarr,numcodecs", "--zarr-configs", "tuned",
                         "--json", str(out)]) == 0
    records = json.loads(out.read_text())["decode"]
    assert all(r.get("ok") for r in records), records
    cases = {(Path(r["path"]).name, r["decoder"], r["variant"]) for r in records}
    assert {("sharded", "numcodecs", "inner"), ("sharded", "numcodecs", "direct")} <= cases
    assert ("v3", "zarr", "bands") in cases and ("v3", "numcodecs", "direct") not in cases
    foreign = tmp_path / "foreign"
    import zarr

    zarr.create_array(str(foreign), shape=(8, 8), dtype="f8", chunks=(4, 4))
    assert zarr_io.main(["decode", str(foreign)]) == 2
    assert "not written by make" in capsys.readouterr().err


def test_zarr_inputs_runs_each_layout_and_checks_it(tmp_path, capsys):
    from benchmarks import zarr_inputs

    assert zarr_inputs.main(["--n", "1024", "--chunk", "512", "--workdir", str(tmp_path),
                             "--repeat", "1", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["v3", "v3-sharded"]
    assert all(float(line.rsplit("error", 1)[1]) < 1e-12 for line in lines)
    assert all("decoded on the device: -" in line for line in lines)
    # a tile that is not one: an error, no traceback
    assert zarr_inputs.main(["--n", "1024", "--chunk", "512", "--workdir", str(tmp_path),
                             "--repeat", "1", "--device", "cpu", "--tile", "1,2"]) == 2
    assert "tile" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        zarr_inputs.main(["--workdir", str(tmp_path), "--tile", "a,b,c"])
    assert exit_.value.code == 2


def test_small_products_against_numpy_on_the_cpu(tmp_path):
    """python -m benchmarks small, run small on the CPU: a table, every result checked, the
    JSON file."""
    path = tmp_path / "small.json"
    result = run("small", "--sizes", "32,100", "--repeat", "2", "--device", "cpu",
                 "--json", path)
    assert "ratio" in result.stdout and "first call" in result.stdout
    data = json.loads(path.read_text())
    assert data["baseline"] == "numpy" and data["startup"] is None
    assert [e["n"] for e in data["sizes"]] == [32, 100]
    for entry in data["sizes"]:
        assert entry["correct"] and len(entry["oocgemm_out"]["seconds"]) == 2
        assert entry["ratio"] > 0 and entry["ratio_out"] > 0
        assert "staged" not in entry  # the moves through pinned memory: a GPU's
    assert "--sizes" in fails("small", "--sizes", "a,b", "--device", "cpu")


def test_small_blocks_side_by_side(tmp_path):
    """python -m benchmarks small-blocks, run small: numpy, the blocked loop and multiply from
    each source, every result checked, the JSON on stdout and in the file."""
    path = tmp_path / "blocks.json"
    result = run("small-blocks", "--n", "96", "--zarr-n", "80", "--tile", "32", "--repeat",
                 "2", "--workdir", str(tmp_path), "--out", str(path))
    data = json.loads(result.stdout)
    assert data == json.loads(path.read_text())
    assert [e["source"] for e in data["sources"]] == ["numpy", "zarr", "npy"]
    for entry in data["sources"]:
        assert entry["correct"] and set(entry["cases"]) == {"numpy", "loop", "multiply"}
        assert all(len(case["seconds"]) == 2 for case in entry["cases"].values())
        assert entry["operations_run"] == entry["operations_planned"] > 0
        assert entry["multiply_vs_loop"] > 0 and entry["multiply_vs_loop_by_round"] > 0
        assert entry["n"] == (80 if entry["source"] == "zarr" else 96)
    assert data["sources"][1]["chunks"]  # zarr's default chunks, as written
    assert sorted(os.listdir(tmp_path)) == ["blocks.json"]  # the stores went with their folder
    assert "--sources" in fails("small-blocks", "--sources", "tape")


@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_small_products_against_cupy_beside_the_staged_moves(tmp_path):
    """On a GPU: the moves through pinned memory alone timed beside oocgemm and CuPy, their
    product checked too."""
    path = tmp_path / "small.json"
    result = run("small", "--sizes", "512,1024", "--repeat", "2", "--json", path)
    assert "staged" in result.stdout and "CUDA start-up" in result.stdout
    data = json.loads(path.read_text())
    assert data["baseline"] == "cupy" and data["startup"]["seconds"]["total"] > 0
    for entry in data["sizes"]:
        assert entry["correct"] and len(entry["staged"]["seconds"]) == 2
        assert entry["staged_ratio"] > 0


def test_planning_times_both_searches_and_they_agree(monkeypatch):
    """python -m benchmarks planning: the planner's search with its floors and with every
    depth predicted, timed, the same tile from both; a search that picked another tile is
    an error."""
    from benchmarks import planning
    from benchmarks.common import BenchError

    result = run("planning", "--sizes", "8192", "--repeat", "1")
    assert "every depth" in result.stdout and "cuda:0" in result.stdout
    for bad in ("a,b", "0", "8192,-1"):
        assert "--sizes" in fails("planning", "--sizes", bad)
    data = planning.planning_benchmark((8192,), repeat=1)
    assert [row["device"] for row in data["rows"]] == ["cuda:0", "cpu"]
    assert all(row["seconds"] > 0 and row["every_depth_seconds"] > 0 for row in data["rows"])
    best = (16384, 32768)  # the block both searches take for n = 32768 under 16 GB
    monkeypatch.setattr(planning.tiling, "_resource_floor",  # a floor that hides it
                        lambda problem, block, *args, **kwargs: math.inf if block == best
                        else 0.0)
    with pytest.raises(BenchError, match="every depth predicted"):
        planning.planning_benchmark((32768,), devices=("cuda:0",), repeat=1)  # out of core


def test_zarr_product_output_encoders():
    """--out-codecs 'zstd@last+gpuin': the codec, who compresses C (OOCGEMM_GPU_ENCODE) and
    who decodes the inputs (OOCGEMM_GPU_DECODE)."""
    from benchmarks.common import BenchError
    from benchmarks.zarr_product import split_codec
    from oocgemm import settings

    assert split_codec("zstd") == ("zstd", {}) and split_codec(None) == (None, {})
    modes = {suffix: split_codec(f"zstd@{suffix}")
             for suffix in ("gpu", "host", "last", "frames")}
    assert modes == {"gpu": ("zstd", {"OOCGEMM_GPU_ENCODE": "1"}),
                     "host": ("zstd", {"OOCGEMM_GPU_ENCODE": "0"}),
                     "last": ("zstd", {"OOCGEMM_GPU_ENCODE": "last"}),
                     "frames": ("zstd", {"OOCGEMM_GPU_ENCODE": "frames"})}
    assert [settings.parse("gpu_encode", env["OOCGEMM_GPU_ENCODE"])
            for _, env in modes.values()] == [True, False, "last", "frames"]
    assert split_codec("none+gpuin") == ("none", {"OOCGEMM_GPU_DECODE": "1"})
    assert split_codec("zstd@frames+gpuin") == (
        "zstd", {"OOCGEMM_GPU_ENCODE": "frames", "OOCGEMM_GPU_DECODE": "1"})
    with pytest.raises(BenchError, match="@gpu, @host, @last, @frames"):
        split_codec("zstd@cpu")


def test_s3_reads_from_its_own_moto_server(tmp_path, capsys):
    """python -m benchmarks.s3 at a small size: its server starts and stops, every read
    matches numpy, the JSON holds each case."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from benchmarks import s3

    out = tmp_path / "s3.json"
    assert s3.main(["--n", "96", "--chunk", "32", "--cols", "8", "--threads", "2",
                    "--repeat", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [c["case"] for c in doc["cases"]] == ["zarr", "decode/2", "multiply"]
    assert doc["cases"][-1]["decodes"] == 9 and "GB/s" in capsys.readouterr().out
    assert s3.main(["--threads", "0"]) == 2

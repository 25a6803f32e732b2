"""The command line, end to end in tmp_path: CliRunner for most, one real ``python -m oocgemm``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from _helpers import cli, leftovers
from click.testing import CliRunner

from oocgemm import random_matrices
from oocgemm.cli import main

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
run, fails = cli(main)


def load(path) -> np.ndarray:
    path = str(path)
    return np.load(path) if path.endswith(".npy") else zarr.open_array(path, mode="r")[:]


@pytest.fixture
def operands(tmp_path):
    """A (30x20, zarr, chunks 8x6), B (20x25, npy), C (30x25, zarr), written by the CLI."""
    a, b, c = tmp_path / "a.zarr", tmp_path / "b.npy", tmp_path / "c.zarr"
    run("random", a, "--shape", "30x20", "--chunks", "8x6", "--seed", "1")
    run("random", b, "--shape", "20x25", "--seed", "2")
    run("random", c, "--shape", "30x25", "--seed", "3", "-q")
    return a, b, c


# ------------------------------------------------------------------------------------------
# random
# ------------------------------------------------------------------------------------------
def test_random_zarr_honours_shape_dtype_chunks(tmp_path):
    path = tmp_path / "m.zarr"
    result = run("random", path, "--shape", "33x17", "--dtype", "float32", "--chunks", "8x5",
                 "--seed", "7")
    assert "seed 7" in result.stdout and "33x17" in result.stdout
    array = zarr.open_array(str(path), mode="r")
    assert array.shape == (33, 17) and array.dtype == np.float32 and array.chunks == (8, 5)
    assert array.metadata.zarr_format == 3
    assert not array.compressors
    data = array[:]
    assert np.isfinite(data).all() and data.std() > 0.5
    assert leftovers(tmp_path) == []


def test_random_zarr_default_chunks(tmp_path):
    path = tmp_path / "m.zarr"
    run("random", path, "--shape", "10x3000", "--seed", "1", "-q")
    array = zarr.open_array(str(path), mode="r")
    assert array.chunks == (10, 2048)


def test_random_npy_honours_shape_dtype(tmp_path):
    path = tmp_path / "m.npy"
    run("random", path, "--shape", "12x9", "--dtype", "complex64", "--seed", "5")
    data = np.load(path)
    assert data.shape == (12, 9) and data.dtype == np.complex64
    assert np.abs(data.imag).max() > 0
    assert leftovers(tmp_path) == []


def test_random_same_seed_same_data_whatever_chunks_format_and_bands(tmp_path):
    paths = [tmp_path / "a.zarr", tmp_path / "b.zarr", tmp_path / "c.npy"]
    run("random", paths[0], "--shape", "40x30", "--seed", "11", "--chunks", "7x4")
    run("random", paths[1], "--shape", "40x30", "--seed", "11")
    run("random", paths[2], "--shape", "40x30", "--seed", "11")
    first = load(paths[0])
    for p in paths[1:]:
        np.testing.assert_array_equal(load(p), first)
    # tiny blocks: bands of one chunk row cut into column pieces give the same values
    random_matrices.write_random(tmp_path / "d.zarr", (40, 30), chunks=(3, 4), seed=11,
                                 block_bytes=64, progress=False)
    np.testing.assert_array_equal(load(tmp_path / "d.zarr"), first)
    # a shorter matrix is a prefix of a taller one; float32 is the rounded float64
    run("random", tmp_path / "e.npy", "--shape", "9x30", "--seed", "11", "--dtype", "float32")
    np.testing.assert_array_equal(load(tmp_path / "e.npy"), first[:9].astype(np.float32))
    # another seed, other data
    run("random", tmp_path / "f.npy", "--shape", "40x30", "--seed", "12")
    assert not np.array_equal(load(tmp_path / "f.npy"), first)


def test_random_without_seed_prints_a_reusable_seed(tmp_path):
    out = run("random", tmp_path / "a.npy", "--shape", "5x6").stdout
    seed = out.split("seed ")[1].split(",")[0]
    run("random", tmp_path / "b.npy", "--shape", "5x6", "--seed", seed)
    np.testing.assert_array_equal(load(tmp_path / "a.npy"), load(tmp_path / "b.npy"))


def test_random_refuses_existing_path_unless_overwrite(tmp_path):
    for name in ("m.zarr", "m.npy"):
        path = tmp_path / name
        run("random", path, "--shape", "4x4", "--seed", "1")
        before = load(path)
        message = fails("random", path, "--shape", "4x4", "--seed", "2")
        assert "exists" in message and "--overwrite" in message
        np.testing.assert_array_equal(load(path), before)
        run("random", path, "--shape", "6x3", "--seed", "2", "--overwrite")
        assert load(path).shape == (6, 3)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("args, words", [
    (["--shape", "10"], ["--shape", "10"]),
    (["--shape", "10x0"], ["--shape"]),
    (["--shape", "axb"], ["--shape"]),
    (["--shape", "3x4x5"], ["--shape"]),
    (["--shape", "4x4", "--dtype", "int8"], ["int8", "float64"]),
    (["--shape", "4x4", "--dtype", "nonsense"], ["nonsense"]),
    (["--shape", "4x4", "--chunks", "0x2"], ["--chunks"]),
    (["--shape", "4x4", "--chunks", "2"], ["--chunks"]),
    (["--shape", "4x4", "--seed", "-1"], ["--seed"]),
    ([], ["--shape"]),
])
def test_random_bad_options(tmp_path, args, words):
    message = fails("random", tmp_path / "m.zarr", *args)
    for word in words:
        assert word in message
    assert not (tmp_path / "m.zarr").exists() and leftovers(tmp_path) == []


def test_random_bad_paths(tmp_path):
    assert ".zarr" in fails("random", tmp_path / "m.txt", "--shape", "4x4")
    assert "chunks" in fails("random", tmp_path / "m.npy", "--shape", "4x4", "--chunks", "2x2")
    assert "does not exist" in fails("random", tmp_path / "no" / "m.npy", "--shape", "4x4")


def test_random_interrupted_leaves_nothing(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(random_matrices.NormalStream, "block", interrupt)
    result = run("random", tmp_path / "m.zarr", "--shape", "4x4", code=130)
    assert "interrupted; no output was written" in result.stderr
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------
# multiply
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("out_name", ["out.zarr", "out.npy"])
def test_multiply_end_to_end(operands, tmp_path, out_name):
    a, b, _ = operands
    out = tmp_path / out_name
    result = run("multiply", a, b, "-o", out, "--device", "cpu")
    assert f"wrote {out}" in result.stdout and "FLOP/s" in result.stdout
    np.testing.assert_allclose(load(out), load(a) @ load(b), rtol=1e-12, atol=1e-12)
    assert leftovers(tmp_path) == []


def test_multiply_transpose_alpha_beta_c_and_tile(operands, tmp_path):
    a, _, _ = operands
    out = tmp_path / "out.npy"
    # op(a) = a.T is 20x30; a @ ... needs a 30xN: use a itself (30x20) as B -> 20x20, C 20x20
    run("random", tmp_path / "c2.npy", "--shape", "20x20", "--seed", "9")
    result = run("multiply", a, a, "-o", out, "--trans-a", "--alpha", "2", "--beta", "0.5",
                 "--c", tmp_path / "c2.npy", "--tile", "8,6,7", "--device", "cpu", "--json")
    summary = json.loads(result.stdout)
    assert summary["tile"] == {"w": 8, "h": 6, "r": 7}
    A = load(a)
    expected = 2 * A.T @ A + 0.5 * load(tmp_path / "c2.npy")
    np.testing.assert_allclose(load(out), expected, rtol=1e-12, atol=1e-12)
    # --trans-b, and C from a zarr
    out2 = tmp_path / "out2.zarr"
    assert "cc.zarr" in fails("multiply", a, a, "-o", out2, "--trans-b", "--beta", "-1",
                              "-c", tmp_path / "cc.zarr")  # no such C yet
    run("random", tmp_path / "cc.zarr", "--shape", "30x30", "--seed", "4", "-q")
    run("multiply", a, a, "-o", out2, "--trans-b", "--beta", "-1", "-c", tmp_path / "cc.zarr",
        "-q")
    np.testing.assert_allclose(load(out2), A @ A.T - load(tmp_path / "cc.zarr"), rtol=1e-12,
                               atol=1e-12)


def test_multiply_beta_updates_existing_output_in_place(operands, tmp_path):
    a, b, _ = operands
    out = tmp_path / "out.zarr"
    run("multiply", a, b, "-o", out, "-q")
    first = load(out)
    run("multiply", a, b, "-o", out, "--beta", "1", "-q")  # in place: no --overwrite needed
    np.testing.assert_allclose(load(out), 2 * first, rtol=1e-12, atol=1e-12)


def test_multiply_json_is_the_only_stdout(operands, tmp_path):
    a, b, _ = operands
    result = run("multiply", a, b, "-o", tmp_path / "out.zarr", "--json")
    summary = json.loads(result.stdout)
    assert summary["tflops"] > 0
    assert summary["shape"] == {"m": 30, "n": 25, "k": 20}
    assert summary["flops"] == 2 * 30 * 25 * 20
    assert summary["out"] == str(tmp_path / "out.zarr")
    assert set(summary["bytes"]) >= {"storage_read", "storage_write"}


def test_multiply_quiet_keeps_the_summary_and_no_bar_off_a_terminal(operands, tmp_path):
    a, b, _ = operands
    quiet = run("multiply", a, b, "-o", tmp_path / "out.npy", "--quiet")
    assert quiet.stdout.startswith("wrote ") and quiet.stdout.count("\n") == 1
    assert quiet.stderr == ""
    # Without --quiet, off a terminal (a pipe, a log file): no progress frames either.
    plain = run("multiply", a, b, "-o", tmp_path / "out2.npy")
    assert plain.stdout.startswith("wrote ") and "flop/s]" not in plain.stderr


def test_multiply_overwrite(operands, tmp_path):
    a, b, _ = operands
    out = tmp_path / "out.npy"
    out.write_bytes(b"not a matrix")
    message = fails("multiply", a, b, "-o", out)
    assert "exists" in message and "--overwrite" in message
    assert out.read_bytes() == b"not a matrix"
    run("multiply", a, b, "-o", out, "--overwrite", "-q")
    np.testing.assert_allclose(load(out), load(a) @ load(b), rtol=1e-12, atol=1e-12)


def test_multiply_interrupted_writes_nothing(operands, tmp_path, monkeypatch):
    from oocgemm.storage.zarr_store import ZarrSource

    def interrupt(self, *args):
        raise KeyboardInterrupt

    monkeypatch.setattr(ZarrSource, "read", interrupt)
    monkeypatch.setattr(ZarrSource, "read_chunk", interrupt)
    a, b, _ = operands
    result = run("multiply", a, b, "-o", tmp_path / "out.zarr", "-q", code=130)
    assert "interrupted; no output was written" in result.stderr
    assert not (tmp_path / "out.zarr").exists() and leftovers(tmp_path) == []


def test_warnings_are_one_line_each_without_pythons_file_and_category(operands, tmp_path,
                                                                      monkeypatch):
    from _helpers import interrupt_write

    from oocgemm.storage import npy

    a, b, _ = operands
    out = tmp_path / "out.npy"
    real = interrupt_write(monkeypatch, npy.NpySink, at=3)
    run("multiply", a, b, "-o", out, "--tile", "8,8,8", "-q", code=130)
    monkeypatch.setattr(npy.NpySink, "write", real)
    result = run("multiply", a, b, "-o", out, "--tile", "8,8,8", "-q")  # not --resume
    lines = result.stderr.splitlines()
    said = [line for line in lines if "interrupted run" in line]
    assert len(said) == 1 and said[0].startswith("warning: ") and "--resume" in said[0]
    assert "RuntimeWarning" not in result.stderr and ".py:" not in result.stderr
    assert all(line.startswith("warning: ") for line in lines)


def test_unexpected_exceptions_keep_their_traceback(operands, tmp_path, monkeypatch):
    import oocgemm.api

    def broken(*args, **kwargs):
        raise RuntimeError("a real bug")

    monkeypatch.setattr(oocgemm.api, "multiply", broken)
    a, b, _ = operands
    result = CliRunner().invoke(main, ["multiply", str(a), str(b), "-o", str(tmp_path / "x.npy")])
    assert isinstance(result.exception, RuntimeError)
    assert result.exit_code == 1


# ------------------------------------------------------------------------------------------
# errors (exit 2, 'error:', no traceback)
# ------------------------------------------------------------------------------------------
def test_error_missing_file(operands, tmp_path):
    a, _, _ = operands
    message = fails("multiply", a, tmp_path / "missing.zarr", "-o", tmp_path / "out.zarr")
    assert "missing.zarr" in message


def test_error_mismatched_inner_dimensions(operands, tmp_path):
    a, _, c = operands  # a is 30x20, c is 30x25
    message = fails("multiply", a, c, "-o", tmp_path / "out.zarr")
    assert "(30, 20)" in message and "(30, 25)" in message


@pytest.mark.parametrize("args, word", [
    (["--tile", "1,2"], "tile"),
    (["--tile", "a,b,c"], "tile"),
    (["--tile", "0,4,4"], "tile"),
    (["--device", "tpu"], "tpu"),
    (["--device", "cuda:x"], "cuda:x"),
    (["--memory-limit", "12QB"], "memory_limit"),
    (["--memory-limit", "-5"], "memory_limit"),
    (["--host-memory-limit", "lots"], "host_memory_limit"),
    (["--memory-limit", "10B"], "too small"),
    (["--memory-limit", "2KB", "--tile", "30,25,20"], "over memory_limit"),
    (["--alpha", "x"], "--alpha"),
    (["--beta", "1"], "beta"),  # beta != 0 needs C or an existing output
    (["--no-such-option"], "--no-such-option"),
])
def test_error_bad_options(operands, tmp_path, args, word):
    a, b, _ = operands
    for command in ("multiply", "plan"):
        assert word in fails(command, a, b, "-o", tmp_path / "out.zarr", *args)
    assert not (tmp_path / "out.zarr").exists() and leftovers(tmp_path) == []


def test_error_cuda_unavailable_or_named_index_checked(operands, tmp_path):
    from oocgemm import cuda

    if cuda.device_count() > 0:
        pytest.skip("a GPU is present")
    a, b, _ = operands
    assert "cpu" in fails("multiply", a, b, "-o", tmp_path / "out.zarr", "--device", "cuda")


def test_error_usage(operands, tmp_path):
    a, _, _ = operands
    assert "Missing argument" in fails("multiply", a)
    assert "Missing option" in fails("multiply", a, a)
    assert "No such command" in fails("frobnicate")


def test_no_arguments_shows_help():
    result = run(code=2)
    assert "multiply" in result.stderr and "Traceback" not in result.output


def test_version_and_help():
    from oocgemm import __version__

    assert __version__ in run("--version").stdout
    for command in ("multiply", "plan", "random", "info"):
        assert "Usage:" in run(command, "--help").stdout


# ------------------------------------------------------------------------------------------
# plan, info
# ------------------------------------------------------------------------------------------
def test_plan_mentions_the_tile(operands, tmp_path):
    a, b, _ = operands
    out = run("plan", a, b, "-o", tmp_path / "out.zarr").stdout
    assert "oocgemm plan" in out and "tile" in out and "w=" in out
    out = run("plan", a, b, "--tile", "8,5,4").stdout
    assert "w=8 h=5 r=4" in out
    data = json.loads(run("plan", a, b, "--tile", "8,5,4", "--json").stdout)
    assert data["tile"] == {"w": 8, "h": 5, "r": 4}
    assert data["shape"] == {"m": 30, "n": 25, "k": 20}
    assert not (tmp_path / "out.zarr").exists()


def test_plan_notes_an_existing_output(operands, tmp_path):
    a, b, c = operands
    result = run("plan", a, b, "-o", c)
    assert "--overwrite" in result.stderr


def test_info_runs():
    out = run("info").stdout
    for word in ("oocgemm", "numpy", "zarr", "dask", "cores", "memory", "blas", "gpus"):
        assert word in out
    data = json.loads(run("info", "--json").stdout)
    assert data["host"]["cores"] >= 1 and data["host"]["memory_total"] > 0
    assert data["versions"]["numpy"] == np.__version__


# ------------------------------------------------------------------------------------------
# a real process
# ------------------------------------------------------------------------------------------
def test_python_dash_m_end_to_end(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "oocgemm", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    for name, shape, seed in (("a.zarr", "24x16", 1), ("b.npy", "16x12", 2)):
        proc = cli("random", name, "--shape", shape, "--seed", seed)
        assert proc.returncode == 0, proc.stderr
    proc = cli("multiply", "a.zarr", "b.npy", "-o", "c.zarr", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tflops"] > 0
    np.testing.assert_allclose(load(tmp_path / "c.zarr"),
                               load(tmp_path / "a.zarr") @ load(tmp_path / "b.npy"),
                               rtol=1e-12, atol=1e-12)
    proc = cli("multiply", "a.zarr", "a.zarr", "-o", "d.zarr")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error:") and "(24, 16)" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    proc = cli("--help")
    assert proc.returncode == 0 and "Usage: oocgemm" in proc.stdout


@pytest.mark.parametrize("args,why", [
    (["--kernel", "bogus"], "unknown kernel 'bogus'"),
    (["--kernel", "regblock", "--device", "cpu"], "is a CUDA kernel"),
])
def test_kernel_option_errors(tmp_path, rng, args, why):
    from click.testing import CliRunner

    from oocgemm.cli import main

    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(a, rng.standard_normal((12, 8)))
    np.save(b, rng.standard_normal((8, 5)))
    for command in (["plan", str(a), str(b)],
                    ["multiply", str(a), str(b), "-o", str(tmp_path / "c.npy")]):
        result = CliRunner().invoke(main, command + args)
        assert result.exit_code == 2, result.output
        assert why in result.output and "Traceback" not in result.output
    assert not (tmp_path / "c.npy").exists()


def test_the_commands_process_ends_at_once_with_its_output_said_and_committed(workdir):
    """``oocgemm`` (``python -m oocgemm``) leaves without waiting on what the OS frees: its
    summary is printed whole, its output committed, its exit code kept, and an output it
    replaced is removed all the same."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((60, 40)), rng.standard_normal((40, 50))
    np.save("a.npy", a)
    np.save("b.npy", b)

    def oocgemm(*args):
        return subprocess.run([sys.executable, "-m", "oocgemm", *args], capture_output=True,
                              text=True, timeout=120)

    done = oocgemm("multiply", "a.npy", "b.npy", "-o", "c.zarr", "--device", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["out"] == "c.zarr"
    np.testing.assert_allclose(zarr.open_array("c.zarr")[...], a @ b, rtol=1e-12)
    again = oocgemm("multiply", "b.npy", "b.npy", "-o", "c.zarr", "--device", "cpu")
    assert again.returncode == 2 and again.stderr.startswith("error:")
    replaced = oocgemm("multiply", "a.npy", "b.npy", "-o", "c.zarr", "--device", "cpu",
                       "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    for _ in range(200):
        if not [name for name in os.listdir(".") if "partial" in name]:
            break
        time.sleep(0.05)
    assert sorted(os.listdir(".")) == ["a.npy", "b.npy", "c.zarr"]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["multiply", "--help"]])
def test_help_imports_neither_numpy_nor_zarr_nor_cupy(argv):
    """``oocgemm --help`` answers in a few tenths of a second: it loads the command's words,
    not the libraries a product needs (numpy alone took 0.13-0.35 s of it)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "oocgemm", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines()
              if line.startswith("import time:")}
    assert "click" in loaded and "oocgemm.cli" in loaded  # (what it measures is there)
    assert not {"numpy", "zarr", "cupy"} & loaded

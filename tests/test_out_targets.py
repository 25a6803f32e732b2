"""Output targets checked before any work (issue 18): oocgemm replaces only a Zarr array or a
.npy file, never a directory that holds other things or an input; bad values are
OOCGemmErrors."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, leftovers, rand
from click.testing import CliRunner

import oocgemm
from oocgemm.cli import main
from oocgemm.errors import DTypeError, InputError, OptionError, OutputError


@pytest.fixture
def inputs(rng, workdir):
    os.mkdir("in")
    a, b = rand(rng, (20, 15)), rand(rng, (15, 10))
    np.save("in/a.npy", a)
    np.save("in/b.npy", b)
    return a, b


def test_overwrite_never_deletes_the_folder_that_holds_the_inputs(inputs):
    result = CliRunner().invoke(main, ["multiply", "in/a.npy", "in/b.npy", "-o", "in",
                                       "--overwrite", "--device", "cpu"])
    assert result.exit_code == 2 and "shares storage with a" in result.output
    assert sorted(os.listdir("in")) == ["a.npy", "b.npy"]


@pytest.mark.parametrize("target, setup, message", [
    ("file.zarr", lambda: open("file.zarr", "w").write("notes"), "not a Zarr array"),
    ("folder.zarr", lambda: os.makedirs("folder.zarr/data"), "not a Zarr array"),
    (".", None, "shares storage with a"),
    ("c.npy/", None, "is a file"),
    ("", None, "empty path"),
    ("dir.npy", lambda: os.mkdir("dir.npy"), "not a file"),
])
def test_targets_that_are_not_ours_are_refused_before_any_work(inputs, target, setup,
                                                               message):
    if setup is not None:
        setup()
    before = sorted(os.listdir("."))
    with pytest.raises(OutputError, match=message):
        oocgemm.multiply("in/a.npy", "in/b.npy", target, device="cpu", overwrite=True)
    assert sorted(os.listdir(".")) == before and leftovers(".") == []
    if target == "file.zarr":
        assert open("file.zarr").read() == "notes"


def test_overwrite_replaces_a_zarr_array_and_a_npy_file(inputs):
    a, b = inputs
    zarr.create_array("c.zarr", shape=(2, 2), dtype="f8")
    np.save("c.npy", np.ones(3))
    for target in ("c.zarr", "c.npy"):
        r = oocgemm.multiply("in/a.npy", "in/b.npy", target, device="cpu", overwrite=True)
        assert_gemm(r.out[:], a, b)


def test_a_replaced_output_is_removed_behind_the_run_and_after_its_exit(inputs, workdir):
    """The old output of an overwrite is removed behind the call (it waits on its write-back
    otherwise), and by a process of its own where the caller exits first: never left."""
    import subprocess
    import sys
    import textwrap

    zarr.create_array("c.zarr", shape=(20, 10), chunks=(5, 5), dtype="f8")[...] = 1.0
    r = oocgemm.multiply("in/a.npy", "in/b.npy", "c.zarr", device="cpu", overwrite=True)
    assert_gemm(r.out[:], *inputs)
    assert leftovers(".") == []  # (after the removal behind the run has ended)
    script = textwrap.dedent("""
        import time, oocgemm
        from oocgemm.storage import files
        slow = files.remove
        files.remove = lambda path: (time.sleep(30), slow(path))  # still at it at exit
        oocgemm.multiply("in/a.npy", "in/b.npy", "c.zarr", device="cpu", overwrite=True)
        assert [p for p in __import__("os").listdir(".") if files.PARTIAL in p]
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    for _ in range(200):  # the detached process's turn
        if not leftovers("."):
            break
        time.sleep(0.05)
    assert leftovers(".") == []
    assert_gemm(zarr.open_array("c.zarr")[:], *inputs)


def test_read_only_folder_is_refused_before_any_work(inputs):
    os.mkdir("ro")
    os.chmod("ro", 0o555)
    try:
        if os.access("ro", os.W_OK):  # root ignores the mode bits
            pytest.skip("running as a user who can write anywhere")
        with pytest.raises(OutputError, match="not writable"):
            oocgemm.multiply("in/a.npy", "in/b.npy", "ro/c.zarr", device="cpu")
    finally:
        os.chmod("ro", 0o755)


def test_values_that_used_to_escape_the_hierarchy(inputs, workdir):
    with pytest.raises(OptionError, match="beyond the range"):
        oocgemm.multiply("in/a.npy", "in/b.npy", device="cpu", alpha=10**400)
    group = zarr.open_group("g.zarr", mode="w")
    with pytest.raises(InputError, match="not an array"):
        oocgemm.multiply(group, "in/b.npy", device="cpu")
    strings = np.array([["a"] * 15] * 20, dtype=np.dtypes.StringDType())
    with pytest.raises(DTypeError):
        oocgemm.multiply(strings, "in/b.npy", device="cpu")


def test_partial_outputs_are_never_inputs(rng, workdir, monkeypatch):
    """What an interrupted run leaves (a temporary file, or an array flagged incomplete) is
    refused as an input with a clear error."""
    a, b = rand(rng, (20, 15)), rand(rng, (15, 10))
    np.save("b.npy", b)
    np.save("c.npy.oocgemm-partial-123-abcd.npy", a)
    with pytest.raises(InputError, match="did not finish"):
        oocgemm.multiply("c.npy.oocgemm-partial-123-abcd.npy", "b.npy", device="cpu")
    from oocgemm.runtime.cpu import CpuExecutor

    def broken(self, op):
        raise OSError("disk on fire")

    z = zarr.create_array("c.zarr", shape=(20, 10), dtype="f8")
    with monkeypatch.context() as patched, pytest.raises(oocgemm.OOCGemmError):
        patched.setattr(CpuExecutor, "_gemm", broken)
        oocgemm.multiply(a, "b.npy", z, device="cpu")
    assert zarr.open_array("c.zarr").attrs["oocgemm"]["complete"] is False
    with pytest.raises(InputError, match="incomplete oocgemm output"):
        oocgemm.multiply("c.zarr", np.ones((10, 3)), device="cpu")


@pytest.mark.parametrize("target", ["c.npy", "c.zarr"])
def test_an_output_that_appears_during_the_run_is_not_replaced(rng, workdir, target):
    """Another process writes the same path meanwhile: without overwrite the commit leaves
    its output as it is and says so (it used to replace it silently)."""
    a, b = rand(rng, (40, 30)), rand(rng, (30, 20))
    theirs = np.full((40, 20), 7.0)

    def other_process(event):
        if event.kind == "gemm" and not os.path.lexists(target):
            if target.endswith(".npy"):
                np.save(target, theirs)
            else:
                zarr.create_array(target, shape=theirs.shape, dtype="f8")[:] = theirs

    with pytest.raises(OutputError, match="appeared while this run computed"):
        oocgemm.multiply(a, b, target, device="cpu", tile=(16, 16, 16), progress=other_process)
    kept = np.load(target) if target.endswith(".npy") else zarr.open_array(target)[:]
    np.testing.assert_array_equal(kept, theirs)
    assert leftovers(".") == []


def test_racing_writers_with_overwrite_leave_one_complete_output(rng, workdir):
    import threading

    a, b = rand(rng, (64, 48)), rand(rng, (48, 40))
    errors = []

    def run():
        try:
            oocgemm.multiply(a, b, "c.zarr", device="cpu", tile=(16, 16, 16), overwrite=True)
        except Exception as exc:  # only OOCGemmErrors may escape
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(e, oocgemm.OOCGemmError) for e in errors), errors
    assert len(errors) < 8
    out = zarr.open_array("c.zarr", mode="r")
    assert out.attrs["oocgemm"]["complete"] is True
    assert_gemm(out[:], a, b)
    assert leftovers(".") == []  # (once the outputs replaced are removed, behind the runs)
    assert sorted(os.listdir(".")) == ["c.zarr"]


def test_more_values_that_used_to_escape_the_hierarchy(rng, workdir, monkeypatch):
    import dask.array as da

    from oocgemm import machine

    b = rand(rng, (15, 10))
    x = da.from_array(rand(rng, (20, 15)), chunks=5)
    with pytest.raises(InputError, match="compute_chunk_sizes"):
        oocgemm.multiply(x[x[:, 0] > 0], b, device="cpu")
    monkeypatch.setattr(machine, "available_memory", lambda: 1000)
    with pytest.raises(OutputError, match="pass a .zarr or .npy path"):
        oocgemm.multiply(rand(rng, (20, 15)), b, device="cpu")


@pytest.mark.parametrize("edit", [
    lambda t: re.sub(r'"start_s": ?[-0-9.e]+', '"start_s": "soon"', t),  # was a ValueError
    lambda t: re.sub(r'"(start_s|end_s)": ?[-0-9.e]+', r'"\1": 0', t),  # nothing lasted
    lambda t: "[]",
])
def test_a_hand_edited_trace_is_an_input_error(rng, workdir, edit):
    a, b = rand(rng, (20, 15)), rand(rng, (15, 10))
    result = oocgemm.multiply(a, b, device="cpu", tile=(8, 8, 8))
    result.timeline.save("run.json")
    with open("run.json") as f:
        text = edit(f.read())
    with open("run.json", "w") as f:
        f.write(text)
    done = CliRunner().invoke(main, ["timeline", "run.json"])
    assert done.exit_code == 2 and "error:" in done.output, (done.exit_code, done.output)


@pytest.mark.parametrize("suffix", [".zarr", ".npy"])
@pytest.mark.parametrize("beta", [0.0, 1.0])  # overwrite through the link, update in place
def test_an_output_through_a_symlink_goes_where_the_link_points(inputs, suffix, beta):
    a, b = inputs
    old = rand(np.random.default_rng(5), (20, 10))
    os.mkdir("data")
    target = os.path.join("data", "c" + suffix)
    if suffix == ".npy":
        np.save(target, old)
    else:
        zarr.create_array(target, shape=old.shape, dtype="f8", chunks=(8, 8))[...] = old
    os.symlink(os.path.abspath(target), "link" + suffix)
    result = CliRunner().invoke(main, ["multiply", "in/a.npy", "in/b.npy", "-o", "link" + suffix,
                                       "--beta", str(beta), "--overwrite", "-q",
                                       "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert os.path.islink("link" + suffix)  # the link is left as it was...
    got = np.load(target) if suffix == ".npy" else zarr.open_array(target, mode="r")[...]
    assert_gemm(got, a, b, old, beta=beta)  # ...and what it points to holds the result
    assert leftovers(".") == [] and leftovers("data") == []


def test_a_symlink_to_an_input_is_refused_as_out(inputs):
    os.symlink(os.path.abspath("in/a.npy"), "link.npy")
    with pytest.raises(OutputError):
        oocgemm.multiply("in/a.npy", "in/b.npy", "link.npy", overwrite=True, device="cpu")
    assert np.load("in/a.npy").shape == (20, 15)


def test_output_names_are_zarr_npy_or_an_array_of_a_group(inputs):
    result = CliRunner().invoke(main, ["multiply", "in/a.npy", "in/b.npy", "-o", "c.txt",
                                       "--device", "cpu", "-q"])
    assert result.exit_code == 2 and "name a new output .zarr" in result.output
    assert not os.path.exists("c.txt")
    with open("notes.txt", "w") as f:  # a file of the user's, whatever its name, is kept
        f.write("mine")
    result = CliRunner().invoke(main, ["multiply", "in/a.npy", "in/b.npy", "-o", "notes.txt",
                                       "--overwrite", "--device", "cpu", "-q"])
    assert result.exit_code == 2 and "is not a .npy file" in result.output
    assert open("notes.txt").read() == "mine"
    zarr.create_group("g.zarr")  # inside a group any name is an array of the group
    a, b = inputs
    oocgemm.multiply("in/a.npy", "in/b.npy", "g.zarr/product", device="cpu")
    assert_gemm(zarr.open_group("g.zarr", mode="r")["product"][...], a, b)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc")
def test_a_folder_that_cannot_hold_files_is_an_output_error(inputs):
    """/proc says it is writable to root and holds no new file: an OutputError (the CLI's
    'error:', exit 2), not an OSError's traceback."""
    result = CliRunner().invoke(main, ["multiply", "in/a.npy", "in/b.npy", "-o",
                                       "/proc/c.zarr", "--device", "cpu"])
    assert result.exit_code == 2 and "cannot create it there" in result.output
    with pytest.raises(oocgemm.OutputError, match="cannot create it there"):
        oocgemm.multiply("in/a.npy", "in/b.npy", "/proc/c.npy", device="cpu")

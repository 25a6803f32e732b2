"""Resume after a crash (issue 18, item 2): kill -9, SIGTERM and Ctrl-C midway, then
``resume=True`` gives a result bitwise equal to an uninterrupted run, computing only the
blocks that were missing; changed inputs or options are refused; a live run is left alone."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zarr
from _helpers import interrupt_write, leftovers
from click.testing import CliRunner

import oocgemm
from oocgemm import cuda
from oocgemm.cli import main
from oocgemm.lifecycle import journal as journal_module
from oocgemm.planning.schedule import OpKind
from oocgemm.storage import npy
from oocgemm.storage.files import PARTIAL

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and flock")

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
TILE = (64, 48, 40)  # 5 x 5 = 25 C blocks of 320 x 240, 5 K panels of 200


def _inputs(rng, kind: str):
    a, b = rng.standard_normal((320, 200)), rng.standard_normal((200, 240))
    if kind == "npy":
        np.save("a.npy", a)
        np.save("b.npy", b)
        return "a.npy", "b.npy"
    for name, x in (("a.zarr", a), ("b.zarr", b)):
        zarr.create_array(name, shape=x.shape, dtype="f8", chunks=(64, 40))[...] = x
    return "a.zarr", "b.zarr"


def _load(path):
    return np.load(path) if path.endswith(".npy") else zarr.open_array(path, mode="r")[...]


def _journal_lines() -> int:
    found = [os.path.join(root, f) for root, _, files in os.walk(".") for f in files
             if f.endswith(journal_module.NAME)]
    if not found:
        return 0
    with open(found[0]) as f:
        return max(0, len(f.read().splitlines()) - 1)


def _gemm_blocks(result) -> int:
    return len({op.key for op in result.plan.schedule.ops if op.kind is OpKind.GEMM})


CASES = [pytest.param(kind, sig, "cpu", id=f"{kind}-{sig.name}")
         for kind in ("npy", "zarr") for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)]
CASES += [pytest.param("zarr", sig, "cuda", id=f"zarr-{sig.name}-cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU")])
    for sig in (signal.SIGKILL, signal.SIGINT)]


@pytest.mark.parametrize("kind,sig,device", CASES)
def test_interrupted_then_resumed_is_bitwise_the_uninterrupted_result(rng, workdir, kind, sig,
                                                                      device):
    a, b = _inputs(rng, kind)
    out = "c." + kind
    whole = oocgemm.multiply(a, b, "whole." + kind, tile=TILE, alpha=0.5, device=device)
    assert whole.resumed == 0
    # A run slowed down per block (a sleep in each write), stopped once a few blocks are done.
    # (faulthandler: a run that does not end after the signal shows where its threads are)
    code = ("import faulthandler, signal, time\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "from oocgemm.storage import npy, zarr_store\n"
            "from oocgemm.cli import main\n"
            "for sink in (npy.NpySink, zarr_store.ZarrSink):\n"
            "    def write(self, rows, cols, block, _write=sink.write):\n"
            "        _write(self, rows, cols, block)\n"
            "        time.sleep(0.2)\n"
            "    sink.write = write\n"
            f"main(['multiply', '{a}', '{b}', '-o', '{out}', '--alpha', '0.5', '--tile', "
            f"'{','.join(map(str, TILE))}', '--device', '{device}', '-q'])\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env=ENV)
    deadline = time.monotonic() + 60
    while _journal_lines() < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _journal_lines() >= 4, "the run never journaled a block"
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # hung: its threads' stacks, then the failure
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the run did not end within 60 s of {sig.name}; its threads:\n{err}")
    if sig != signal.SIGKILL:
        assert "C blocks are kept in" in err and "--resume" in err, err
    kept = leftovers(".")
    assert kept and not os.path.exists(out)  # nothing looks complete
    done_before = _journal_lines()

    r = oocgemm.multiply(a, b, out, tile=TILE, alpha=0.5, device=device, resume=True)
    assert r.resumed >= 4 and r.resumed == len(r.plan.work.done)
    assert _gemm_blocks(r) == 25 - r.resumed  # finished blocks were not computed again
    assert r.resumed <= done_before
    np.testing.assert_array_equal(_load(out), _load("whole." + kind))
    assert leftovers(".") == []


def test_resume_through_the_cli_after_ctrl_c(rng, workdir, monkeypatch):
    a, b = _inputs(rng, "npy")
    real = interrupt_write(monkeypatch, npy.NpySink, at=8)
    args = ["multiply", a, b, "-o", "c.npy", "--tile", "64,48,40", "--device", "cpu"]
    first = CliRunner().invoke(main, args + ["-q"])
    assert first.exit_code == 130
    kept = re.search(r"(\d+) of 25 C blocks are kept in", first.output)
    assert kept and "--resume" in first.output
    kept = int(kept.group(1))  # (7; 8 where the writer threads raced the interrupt)
    assert kept in (7, 8)
    monkeypatch.setattr(npy.NpySink, "write", real)
    second = CliRunner().invoke(main, args + ["--resume"])
    assert second.exit_code == 0, second.output
    assert f"resumed: {kept} of 25 C blocks were done before and kept" in second.output
    # the rate is that of the blocks computed here, the product's total beside it
    done = re.search(r"GFLOP/s \(([\d.]+) of 0.03072 GFLOP done here\)", second.output)
    assert done and 0 < float(done.group(1)) < 0.03072
    np.testing.assert_allclose(np.load("c.npy"), np.load(a) @ np.load(b), rtol=1e-12, atol=1e-12)
    assert leftovers(".") == []


def _interrupted(rng, kind="npy", **options):
    """Inputs, and a run of them into c.<kind> interrupted after 8 blocks."""
    a, b = _inputs(rng, kind)
    sink = npy.NpySink if kind == "npy" else __import__(
        "oocgemm.storage.zarr_store", fromlist=["ZarrSink"]).ZarrSink
    real, writes, lock = sink.write, {"n": 0}, threading.Lock()

    def write(self, rows, cols, block):
        with lock:  # the writers are threads: exactly 8 blocks get through
            writes["n"] += 1
            late = writes["n"] > 8
        if late:
            raise KeyboardInterrupt
        real(self, rows, cols, block)

    sink.write = write
    try:
        with pytest.raises(KeyboardInterrupt):
            oocgemm.multiply(a, b, "c." + kind, tile=TILE, device="cpu", **options)
    finally:
        sink.write = real
    return a, b


def test_a_resumed_runs_flops_and_rate_count_the_blocks_it_computed_only(rng, workdir):
    a, b = _interrupted(rng)
    r = oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    block = 2 * TILE[0] * TILE[1] * 200
    assert r.resumed == 8
    assert r.flops == (25 - 8) * block and r.total_flops == 2 * 320 * 240 * 200
    assert r.tflops == pytest.approx(r.flops / r.seconds / 1e12)
    assert r.summary()["flops_done"] == r.flops and r.summary()["flops"] == r.total_flops
    assert "(0.02089 of 0.03072 GFLOP done here)" in str(r)


def _rewrite_keeping_mtime(path: str, rng) -> None:
    """Write ``path`` again (a file with new numbers of the same size; in a Zarr folder, one
    chunk's file with its own bytes: a compressed chunk of new numbers has another size),
    with the modification time set back to what it was."""
    if path.endswith(".zarr"):
        chunk = sorted(os.path.join(root, f) for root, _, files in os.walk(path)
                       for f in files if "zarr" not in f)[0]
        before = os.stat(chunk)
        with open(chunk, "rb") as f:
            data = f.read()
        with open(chunk, "wb") as f:
            f.write(data)
    else:
        chunk, before = path, os.stat(path)
        x = np.load(path)
        np.save(path, x + 1.0)
    os.utime(chunk, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(chunk).st_mtime_ns == before.st_mtime_ns


@pytest.mark.parametrize("change", ["alpha", "input rewritten", "input content",
                                    "input replaced", "tile", "mtime restored",
                                    "zarr chunk, mtime restored"])
def test_resume_refuses_a_different_product(rng, workdir, change):
    a, b = _interrupted(rng, "zarr" if change.startswith("zarr") else "npy")
    kw = {"tile": TILE, "device": "cpu"}
    c = "c.zarr" if change.startswith("zarr") else "c.npy"
    if change.endswith("mtime restored"):  # the same size and mtime: the change time differs
        _rewrite_keeping_mtime(a, rng)
    elif change == "alpha":
        kw["alpha"] = 2.0
    elif change == "input rewritten":
        time.sleep(0.01)
        np.save(b, np.load(b))  # the same numbers, but written again: it may have changed
    elif change == "input content":
        x = np.load(a)
        x[3, 4] += 1e-9
        np.save(a, x)
    elif change == "input replaced":
        os.replace(a, "old.npy")
        np.save(a, np.load("old.npy"))
    else:
        kw["tile"] = (32, 48, 40)
    with pytest.raises(oocgemm.OutputError, match="cannot resume.*computed something else") as e:
        oocgemm.multiply(a, b, c, resume=True, **kw)
    said = {"alpha": "alpha was", "tile": "tile was (64, 48, 40), now (32, 48, 40)"}
    assert said.get(change, "changed") in str(e.value)
    assert leftovers(".")  # the interrupted output is left for the user to remove


def test_a_damaged_block_is_computed_again(rng, workdir):
    a, b = _interrupted(rng)
    partial = [p for p in leftovers(".") if not p.endswith(journal_module.NAME)][0]
    c = np.load(partial, mmap_mode="r+")
    c[0, 0] += 1.0  # block (0, 0) was written first: its checksum no longer holds
    c.flush()
    del c
    r = oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    assert r.resumed == 7 and (0, 0) not in r.plan.work.done
    np.testing.assert_allclose(np.load("c.npy"), np.load(a) @ np.load(b), rtol=1e-12,
                               atol=1e-12)


def test_without_a_tile_the_interrupted_runs_tile_is_kept(rng, workdir):
    """A resume that names no tile finishes with the interrupted run's, whatever the planner
    would pick now: bitwise the uninterrupted result."""
    a, b = _interrupted(rng)
    r = oocgemm.multiply(a, b, "c.npy", resume=True, device="cpu")
    assert r.plan.tile == TILE and r.resumed == 8
    whole = oocgemm.multiply(a, b, "whole.npy", tile=TILE, device="cpu")
    assert np.array_equal(np.load("c.npy"), np.load(whole.out.filename))


def test_a_truncated_chunk_of_the_partial_is_computed_again(rng, workdir):
    """A chunk file of the temporary output cut short (a full disk, a crash of the file
    system): its block fails its check and is computed again, not an error every resume."""
    a, b = _interrupted(rng, kind="zarr")
    partial = [p for p in leftovers(".") if os.path.isdir(p)][0]
    chunk = sorted(os.path.join(root, f) for root, _, files in os.walk(partial) for f in files
                   if f[0].isdigit() or root.split(os.sep)[-1].isdigit())[0]
    os.truncate(chunk, 10)
    r = oocgemm.multiply(a, b, "c.zarr", tile=TILE, device="cpu", resume=True)
    assert r.resumed < 8
    np.testing.assert_allclose(_load("c.zarr"), _load(a) @ _load(b), rtol=1e-12, atol=1e-12)


def test_bytes_that_are_not_text_in_the_journal_lose_only_their_line(rng, workdir):
    a, b = _interrupted(rng, kind="zarr")
    path = [os.path.join(root, f) for root, _, files in os.walk(".") for f in files
            if f == journal_module.NAME][0]
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[2] = lines[2][:5] + b"\xff\xfe\x00" + lines[2][8:]  # a block's line garbled
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    r = oocgemm.multiply(a, b, "c.zarr", tile=TILE, device="cpu", resume=True)
    assert r.resumed == 7
    np.testing.assert_allclose(_load("c.zarr"), _load(a) @ _load(b), rtol=1e-12, atol=1e-12)


def test_a_journal_cut_short_by_a_crash_loses_only_its_last_line(rng, workdir):
    a, b = _interrupted(rng, kind="zarr")
    path = [os.path.join(root, f) for root, _, files in os.walk(".") for f in files
            if f == journal_module.NAME][0]
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:-20])  # the last block's line half written
    r = oocgemm.multiply(a, b, "c.zarr", tile=TILE, device="cpu", resume=True)
    assert r.resumed == 7
    np.testing.assert_allclose(_load("c.zarr"), _load(a) @ _load(b), rtol=1e-12, atol=1e-12)


def test_a_run_still_writing_is_not_resumed(rng, workdir):
    a, b = _interrupted(rng)
    path = [p for p in leftovers(".") if p.endswith(journal_module.NAME)][0]
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the live run it belongs to would hold it
        with pytest.raises(oocgemm.OutputError, match="another process is writing"):
            oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    finally:
        os.close(fd)


def test_nothing_to_resume_is_a_fresh_run(rng, workdir):
    a, b = _inputs(rng, "npy")
    r = oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    assert r.resumed == 0 and _gemm_blocks(r) == 25
    assert leftovers(".") == []


def test_resuming_a_complete_output_says_it_is_complete(rng, workdir):
    a, b = _inputs(rng, "npy")
    oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu")
    before = np.load("c.npy")
    with pytest.raises(oocgemm.OutputError, match=r"^cannot resume: out 'c.npy' is complete .*"
                                                  r"nothing to resume"):
        oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    done = CliRunner().invoke(main, ["multiply", a, b, "-o", "c.npy", "--tile", "64,48,40",
                                     "--device", "cpu", "--resume"])
    assert done.exit_code == 2 and done.stderr.startswith("error: cannot resume: out 'c.npy'")
    assert "is complete" in done.stderr and "exists" not in done.stderr
    np.testing.assert_array_equal(np.load("c.npy"), before)
    assert leftovers(".") == []


def test_resume_needs_files(rng, workdir):
    with pytest.raises(oocgemm.OptionError, match="resume=True needs an output path"):
        oocgemm.multiply(rng.standard_normal((4, 4)), rng.standard_normal((4, 4)), "c.npy",
                         device="cpu", resume=True)
    with pytest.raises(oocgemm.OptionError, match="resume must be True or False"):
        oocgemm.multiply(rng.standard_normal((4, 4)), rng.standard_normal((4, 4)),
                         device="cpu", resume="yes")


def test_a_failed_run_leaves_no_journal(rng, workdir):
    a, b = _inputs(rng, "npy")
    real, writes = npy.NpySink.write, {"n": 0}

    def write(self, rows, cols, block):
        writes["n"] += 1
        if writes["n"] == 5:
            raise OSError("disk on fire")
        real(self, rows, cols, block)

    npy.NpySink.write = write
    try:
        with pytest.raises(oocgemm.OOCGemmError):
            oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu")
    finally:
        npy.NpySink.write = real
    assert leftovers(".") == []  # the journal went with the temporary output


def test_a_fresh_run_says_an_interrupted_one_can_be_resumed(rng, workdir):
    a, b = _interrupted(rng)
    with pytest.warns(RuntimeWarning, match="resume=True .* finishes it"):
        r = oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", overwrite=True)
    assert r.resumed == 0
    np.testing.assert_allclose(np.load("c.npy"), np.load(a) @ np.load(b), rtol=1e-12,
                               atol=1e-12)


def _as_made_by(pid: int) -> str:
    """Rename the interrupted output in the working folder (and the journal beside it) as
    if process ``pid`` had made it; its new name."""
    journal = [p for p in leftovers(".") if p.endswith(journal_module.NAME)][0]
    temporary = journal[:-len("." + journal_module.NAME)]
    head, _, tail = temporary.rpartition(PARTIAL)
    renamed = f"{head}{PARTIAL}{pid}-{tail.partition('-')[2]}"
    os.rename(temporary, renamed)
    os.rename(journal, journal_module.journal_path(renamed))
    return renamed


def test_a_run_of_the_same_output_under_way_is_not_called_interrupted(rng, workdir):
    a, b = _interrupted(rng)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        temporary = _as_made_by(other.pid)
        with pytest.warns(RuntimeWarning, match="another run of c.npy is under way") as said:
            oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu")
        assert not any("interrupted" in str(w.message) or "not needed" in str(w.message)
                       for w in said)  # a live run's output is not called left behind
        other.kill()
        other.wait()
        with pytest.warns(RuntimeWarning, match="not needed any more: remove it"):
            oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", overwrite=True)
        assert os.path.basename(temporary) in leftovers(".")  # named, never removed
    finally:
        other.kill()
        other.wait()


def test_what_a_resume_did_not_take_is_named_after_the_commit(rng, workdir):
    a, b = _interrupted(rng)
    first = _as_made_by(2 ** 22 + 1)  # above Linux's pid_max: a process that is gone
    os.remove(journal_module.journal_path(first))  # a partial without its journal
    _interrupted_again = _interrupted(rng)  # a second interrupted run of the same output
    del _interrupted_again
    with pytest.warns(RuntimeWarning, match=f"{first}.*not needed any more"):
        r = oocgemm.multiply(a, b, "c.npy", tile=TILE, device="cpu", resume=True)
    assert r.resumed == 8
    assert leftovers(".") == [os.path.basename(first)]


def _layout_texts(code: str, seeds=range(6)) -> set[str]:
    """What ``code`` prints in processes of different string hashes (set orders)."""
    return {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**ENV, "PYTHONHASHSEED": str(seed)}).stdout
            for seed in seeds}


def test_an_outputs_layout_is_journaled_alike_by_every_process():
    """A codec's repr may show a set (zarr's BloscCodec: its tunable attributes), whose order
    is the process's: the layout in a run's fingerprint is its codecs' configuration."""
    code = ("import numcodecs\n"
            "from zarr import codecs\n"
            "from oocgemm.lifecycle.resume import layout_text\n"
            "print(layout_text({'chunks': (64, 64), 'zarr_format': 3, 'compressors': "
            "codecs.BloscCodec(cname='lz4', clevel=5), 'shards': None, 'filters': "
            "[numcodecs.Blosc('lz4', 5)], 'tags': {'b', 'a', 'c'}}))\n")
    (text,) = _layout_texts(code)
    assert '"cname": "lz4"' in text and '"clevel": 5' in text


def test_a_blosc_output_resumes_in_a_process_of_other_hashes(rng, workdir):
    """Interrupted under one PYTHONHASHSEED, resumed under another: the same product."""
    a, b = _inputs(rng, "npy")
    args = ["multiply", a, b, "-o", "c.zarr", "--tile", ",".join(map(str, TILE)), "--device",
            "cpu", "-q", "--out-compressor", "blosc", "--out-chunks", "64x48"]
    code = ("import time\n"
            "from oocgemm.storage import zarr_store\n"
            "from oocgemm.cli import main\n"
            "def write(self, rows, cols, block, _write=zarr_store.ZarrSink.write):\n"
            "    _write(self, rows, cols, block)\n"
            "    time.sleep(0.2)\n"
            "zarr_store.ZarrSink.write = write\n"
            f"main({args!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env={**ENV, "PYTHONHASHSEED": "0"})
    deadline = time.monotonic() + 60
    while _journal_lines() < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert "--resume" in err, err
    resumed = [x for x in args if x != "-q"] + ["--resume"]
    done = subprocess.run([sys.executable, "-m", "oocgemm", *resumed], capture_output=True,
                          text=True, env={**ENV, "PYTHONHASHSEED": "2"})
    assert done.returncode == 0, done.stderr
    assert "resumed:" in done.stdout + done.stderr
    np.testing.assert_allclose(zarr.open_array("c.zarr", mode="r")[...], np.load(a) @ np.load(b),
                               rtol=1e-12, atol=1e-12 * 200)
    assert leftovers(".") == []

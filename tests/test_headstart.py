"""The first chunk files of a command's product asked of the disk as the command starts
(``oocgemm.headstart``): which files, in which order, how many; nothing for what it does not
know; and the product it starts the same."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import click
import numpy as np
import pytest
import zarr
from _helpers import assert_gemm, evicted, rand

from oocgemm import headstart
from oocgemm.cli import main as cli_main

LAYOUTS = {
    "v3": dict(zarr_format=3),
    "v3-dot": dict(zarr_format=3, chunk_key_encoding={"name": "default", "separator": "."}),
    "v2": dict(zarr_format=2),
    "v3-sharded": dict(zarr_format=3, shards=(40, 40)),
}


def store(path, x, chunks, layout):
    zarr.create_array(path, shape=x.shape, dtype=x.dtype, chunks=chunks,
                      **LAYOUTS[layout])[:] = x


def keys(files):
    """(array, chunk index) of each file, as the array's own key names it."""
    found = []
    for path in files:
        array = path.split(os.sep)[0]
        rest = os.path.relpath(path, array)
        parts = rest.replace(os.sep, ".").split(".")
        found.append((array, tuple(int(p) for p in parts if p.isdigit())))
    return found


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_first_blocks_files_in_the_order_its_panels_need_them(rng, workdir, layout):
    """A's first row of stored objects and B's first column, K panel by K panel, as the
    array's key encoding names them (format 2 and 3, '/' and '.', shards); every file named
    exists."""
    store("a.zarr", rand(rng, (70, 90)), (20, 20), layout)
    store("b.zarr", rand(rng, (90, 50)), (20, 20), layout)
    files = headstart.first_files(["multiply", "a.zarr", "b.zarr", "-o", "c.zarr"])
    assert all(os.path.isfile(f) for f in files)
    unit = 40 if layout == "v3-sharded" else 20
    panels = -(-90 // unit)
    want = []
    for q in range(panels):
        want += [("a.zarr", (0, q)), ("b.zarr", (q, 0))]
    assert keys(files) == want


def test_transposes_gram_and_options_with_values(rng, workdir):
    """--trans-a reads A's first column, --trans-b B's first row; a Gram product X's first
    column of chunks once (X^T X) or its first row (--outer); an option's value (-c, -o) is
    not taken for an input."""
    store("a.zarr", rand(rng, (60, 40)), (20, 20), "v3")
    store("b.zarr", rand(rng, (30, 60)), (20, 20), "v3")
    store("c.zarr", rand(rng, (40, 30)), (20, 20), "v3")
    files = headstart.first_files(["multiply", "--trans-a", "-c", "c.zarr", "a.zarr",
                                   "--beta", "2", "b.zarr", "--trans-b", "-o", "d.zarr"])
    assert keys(files) == [("a.zarr", (0, 0)), ("b.zarr", (0, 0)), ("a.zarr", (1, 0)),
                           ("b.zarr", (0, 1)), ("a.zarr", (2, 0)), ("b.zarr", (0, 2))]
    assert keys(headstart.first_files(["gram", "a.zarr", "-o", "g.zarr"])) == [
        ("a.zarr", (0, 0)), ("a.zarr", (1, 0)), ("a.zarr", (2, 0))]
    assert keys(headstart.first_files(["gram", "--outer", "a.zarr", "-o", "g.zarr"])) == [
        ("a.zarr", (0, 0)), ("a.zarr", (0, 1))]


def test_bounded_and_only_what_it_knows(rng, workdir, monkeypatch):
    """At most HEAD_START stored bytes an input (one file at least); chunks never written
    are left out; nothing for .npy inputs, paths that are not Zarr arrays, other commands,
    help, or words it cannot read; begin() never raises."""
    x = rand(rng, (100, 100))
    store("a.zarr", x, (10, 10), "v3")
    arr = zarr.create_array("p.zarr", shape=(100, 100), dtype="f8", chunks=(10, 10))
    arr[:, :50] = x[:, :50]  # B's first column of chunks written, its last five not
    size = os.path.getsize(os.path.join("a.zarr", "c", "0", "0"))
    monkeypatch.setattr(headstart, "HEAD_START", 3 * size)
    files = headstart.first_files(["multiply", "a.zarr", "a.zarr", "-o", "c.zarr"])
    assert len(files) == 5  # A(0, 0..2), B(0..2, 0); (0, 0) is both
    np.save("n.npy", x)
    for argv in (["multiply", "n.npy", "a.zarr", "-o", "c.npy"],
                 ["multiply", "a.zarr", "missing.zarr", "-o", "c.npy"],
                 ["multiply", "a.zarr"], ["plan", "a.zarr", "a.zarr", "-o", "c.zarr"],
                 ["multiply", "a.zarr", "a.zarr", "--help"], [], ["gram"],
                 ["multiply", "s3://bucket/a.zarr", "a.zarr", "-o", "c.zarr"]):
        assert headstart.first_files(argv) == [], argv
    monkeypatch.setattr(headstart, "HEAD_START", 1 << 30)
    rows = headstart.first_files(["multiply", "--trans-b", "a.zarr", "p.zarr", "-o", "c"])
    assert ("p.zarr", (0, 9)) not in keys(rows) and ("p.zarr", (0, 4)) in keys(rows)
    os.remove(os.path.join("a.zarr", "c", "0", "1"))
    os.mkfifo(os.path.join("a.zarr", "c", "0", "1"))  # not a plain file: never opened
    files = headstart.first_files(["multiply", "a.zarr", "a.zarr", "-o", "c.zarr"])
    assert os.path.join("a.zarr", "c", "0", "1") not in files and files
    thread = headstart.begin(["multiply", "a.zarr", "a.zarr", "-o", "c.zarr"])
    thread.join(10)
    assert not thread.is_alive()
    with open("bad.zarr", "w") as fh:  # not a folder
        fh.write("{")
    os.makedirs("broken.zarr")
    with open(os.path.join("broken.zarr", "zarr.json"), "w") as fh:
        fh.write("{not json")
    for argv in (["multiply", "bad.zarr", "a.zarr"], ["multiply", "broken.zarr", "a.zarr"]):
        thread = headstart.begin(argv)  # (all of it on its thread, which ends quietly)
        thread.join(10)
        assert not thread.is_alive()
    assert headstart.begin(["plan", "a.zarr", "a.zarr"]) is None
    assert headstart.begin([]) is None


def test_short_options_run_together_and_words_after_a_double_dash(rng, workdir):
    """``-qo OUT``: the last short option takes the next word; after ``--`` every word is an
    input."""
    store("a.zarr", rand(rng, (40, 40)), (20, 20), "v3")
    store("b.zarr", rand(rng, (40, 40)), (20, 20), "v3")
    store("out.zarr", rand(rng, (40, 40)), (20, 20), "v3")
    files = headstart.first_files(["multiply", "-qo", "out.zarr", "a.zarr", "b.zarr"])
    assert {name for name, _ in keys(files)} == {"a.zarr", "b.zarr"}
    files = headstart.first_files(["multiply", "-o", "out.zarr", "--", "a.zarr", "b.zarr"])
    assert {name for name, _ in keys(files)} == {"a.zarr", "b.zarr"}


def test_a_panel_of_millions_of_objects_is_not_walked_whole(workdir, monkeypatch):
    """An array of a million tiny chunks, none written: the head start looks at
    MOST_OBJECTS of a panel at most, and names none."""
    zarr.create_array("tall.zarr", shape=(1_000_000, 8), dtype="f8", chunks=(1, 8))
    monkeypatch.setattr(headstart, "MOST_OBJECTS", 100)
    looked = []
    stat = os.stat

    def counted(path, *args, **kwargs):
        looked.append(path)
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(headstart.os, "stat", counted)
    assert headstart.first_files(["multiply", "--trans-a", "tall.zarr", "tall.zarr"]) == []
    assert len(looked) <= 2 * 100 + 10  # (and the metadata's few)


def test_its_options_with_values_are_the_commands():
    """VALUE_OPTIONS is every option of ``multiply`` and ``gram`` that takes a value."""
    for name in ("multiply", "gram"):
        command = cli_main.commands[name]
        taking = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag
                  for o in p.opts}
        assert taking <= headstart.VALUE_OPTIONS, name
    every = {o for name in ("multiply", "gram") for p in cli_main.commands[name].params
             if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    assert not headstart.VALUE_OPTIONS - every  # (none the commands do not take)


def test_a_command_started_cold_computes_the_same_product(rng, workdir):
    """``oocgemm multiply`` of inputs dropped from the page cache, the head start asking
    for their first files: the product is right, and the hinted files are read (in the page
    cache, where the file system lets them leave it)."""
    a, b = rand(rng, (120, 90)), rand(rng, (90, 70))
    store("a.zarr", a, (30, 30), "v3")
    store("b.zarr", b, (30, 30), "v3")
    files = headstart.first_files(["multiply", "a.zarr", "b.zarr", "-o", "c.npy"])
    if evicted("a.zarr", "b.zarr"):
        thread = headstart.begin(["multiply", "a.zarr", "b.zarr", "-o", "c.npy"])
        thread.join(30)
        from oocgemm.storage.files import cached_fraction

        assert cached_fraction(files) > 0
    done = subprocess.run([sys.executable, "-m", "oocgemm", "multiply", "a.zarr", "b.zarr",
                           "-o", "c.npy", "--device", "cpu", "-q"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_gemm(np.load("c.npy"), a, b)


def test_a_hint_asks_for_the_whole_file(workdir):
    """A file larger than what one WILLNEED call reads (Linux stops at the device's
    readahead, 8 MiB on this machine's disk) is hinted whole: the page cache holds all of it
    soon after, where the file system lets it leave the cache first."""
    from oocgemm.storage.files import cached_fraction

    with open("big.bin", "wb") as f:
        for _ in range(6):
            f.write(os.urandom(8 << 20))
    if not evicted("big.bin"):
        pytest.skip("this file system keeps the file in the page cache")
    headstart.will_need("big.bin")
    held = 0.0
    for _ in range(200):  # the disk reads it behind the call: up to 10 s
        held = cached_fraction(["big.bin"]) or 0.0
        if held == 1.0:
            break
        time.sleep(0.05)
    assert held == 1.0


def test_a_hint_of_the_first_bytes_only(workdir):
    """``most`` bytes asked for: the page cache then holds that part of the file and not
    the rest (where the file system lets it leave the cache first)."""
    from oocgemm.storage.files import cached_fraction

    with open("big.bin", "wb") as f:
        for _ in range(6):
            f.write(os.urandom(8 << 20))
    if not evicted("big.bin"):
        pytest.skip("this file system keeps the file in the page cache")
    headstart.will_need("big.bin", most=16 << 20)
    held = 0.0
    for _ in range(200):  # the disk reads it behind the call
        held = cached_fraction(["big.bin"]) or 0.0
        if held >= 1 / 3:
            break
        time.sleep(0.05)
    time.sleep(0.2)  # (nothing more comes)
    assert 1 / 3 <= cached_fraction(["big.bin"]) < 0.5

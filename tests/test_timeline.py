"""The timeline: its figures against hand-made event lists, the Chrome trace format, save and
load, recording switched off, the plot, and the CLI."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand
from click.testing import CliRunner

import oocgemm
from oocgemm.cli import main
from oocgemm.diagnostics import Event, Timeline
from oocgemm.diagnostics.lanes import tracks
from oocgemm.diagnostics.timeline import intersection, measure, union
from oocgemm.diagnostics.trace import chrome_trace
from oocgemm.runtime.cpu import CpuExecutor
from oocgemm.storage import open_sink, open_source

try:
    import matplotlib  # noqa: F401

    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False

needs_matplotlib = pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="matplotlib is not installed")


def ev(index, kind, lane, start, end, *, operand=None, nbytes=0, flops=0, key=(0, 0), q=-1):
    """A hand-made event."""
    operand = operand or ("C" if kind in ("gemm", "fill", "download", "write") else "A")
    return Event(index=index, kind=kind, operand=operand, key=key, q=q, lane=lane, start=start,
                 end=end, nbytes=nbytes, flops=flops)


# A pipeline by hand, times in seconds (wall 0..13):
#   read-0   read A [0,2]        read A [6,9]
#   read-1   read B [1,3]
#   h2d      H2D A [2,4]   H2D B [5,6]
#   compute  gemm [4,7]  gemm [8,10]
#   c        D2H C [10,11]
#   write-0  write C [11,13]
PIPELINE = [
    ev(0, "read", "read-0", 0.0, 2.0, nbytes=400),
    ev(1, "read", "read-1", 1.0, 3.0, operand="B", nbytes=200),
    ev(2, "upload", "h2d", 2.0, 4.0, nbytes=400),
    ev(3, "gemm", "compute", 4.0, 7.0, flops=3000, q=0),
    ev(4, "upload", "h2d", 5.0, 6.0, operand="B", nbytes=200),
    ev(8, "read", "read-0", 6.0, 9.0, nbytes=400, key=(0, 1)),
    ev(5, "gemm", "compute", 8.0, 10.0, flops=2000, q=1),
    ev(6, "download", "c", 10.0, 11.0, nbytes=100),
    ev(7, "write", "write-0", 11.0, 13.0, nbytes=100),
]


# -- intervals -------------------------------------------------------------------------------------
def test_interval_helpers():
    u = union([(5, 6), (0, 2), (1, 3), (3, 4), (8, 8.5)])
    assert u == [(0, 4), (5, 6), (8, 8.5)]
    assert measure(u) == 5.5
    assert intersection(u, [(1, 5.5), (8.25, 10)]) == 3 + 0.5 + 0.25
    assert intersection(u, []) == 0


# -- figures against hand-made events --------------------------------------------------------------
def test_summary_of_a_hand_made_pipeline():
    t = Timeline.from_events(list(reversed(PIPELINE)), run_seconds=14.0)
    assert [e.index for e in t.events] == [0, 1, 2, 3, 4, 8, 5, 6, 7]  # start order
    assert (t.start, t.end, t.wall) == (0.0, 13.0, 13.0)
    # compute: [4,7] and [8,10]: busy 5, fill 4 (0..4), one stall of 1 (7..8), drain 3 (10..13)
    assert t.compute_busy == 5.0
    assert (t.fill, t.stalls, t.drain) == (4.0, 1.0, 3.0)
    assert (t.stall_count, t.longest_stall) == (1, 1.0)
    assert t.compute_idle == 8.0
    assert t.compute_fraction == pytest.approx(5 / 13)
    # copies: union [0,4] [5,9] [10,13] = 11; under compute [5,7] and [8,9] = 3; exposed 8
    assert t.copy_busy == 11.0
    assert t.exposed_copy == 8.0
    assert t.exposed_fraction == pytest.approx(8 / 13)
    assert t.overlap == pytest.approx(3 / 11)
    # lanes in display order, busy = union of each lane's events
    assert [x.name for x in t.lanes] == ["compute", "h2d", "c", "read-0", "read-1", "write-0"]
    assert {x.name: x.busy for x in t.lanes} == {"compute": 5.0, "h2d": 3.0, "c": 1.0,
                                                 "read-0": 5.0, "read-1": 2.0, "write-0": 2.0}
    assert {x.name: x.operations for x in t.lanes} == {"compute": 2, "h2d": 2, "c": 1,
                                                       "read-0": 2, "read-1": 1, "write-0": 1}
    assert t.lane("h2d").fraction == pytest.approx(3 / 13)
    # links: reads run on two threads: union [0,3] [6,9] = 6 s for 1000 bytes
    read = t.link("read")
    assert (read.operations, read.bytes, read.busy) == (3, 1000, 6.0)
    assert read.rate == pytest.approx(1000 / 6) and read.average == pytest.approx(1000 / 13)
    assert (t.link("h2d").bytes, t.link("h2d").busy) == (600, 3.0)
    assert (t.link("d2h").bytes, t.link("d2h").busy) == (100, 1.0)
    assert (t.link("storage_write").bytes, t.link("storage_write").busy) == (100, 2.0)
    assert t.link("storage write") == t.link("storage_write")  # spelled with a space too
    # rates and the bound: compute is busy 38%, reading is the busiest resource (6 s)
    assert t.flops == 5000
    assert t.tflops == pytest.approx(5000 / 13 / 1e12)
    assert t.compute_tflops == pytest.approx(5000 / 5 / 1e12)
    assert t.bound == "read"
    assert t.run_seconds == 14.0


def test_compute_bound_when_busy_95_percent_even_beside_a_busier_link():
    # compute busy 19.5 of 20 s (97.5%); two readers keep 'read' busy all 20 s
    events = [ev(0, "read", "read-0", 0.0, 10.0, nbytes=10),
              ev(1, "read", "read-1", 9.0, 20.0, nbytes=10),
              ev(2, "gemm", "compute", 0.5, 20.0, flops=7)]
    t = Timeline.from_events(events)
    assert t.link("read").busy == 20.0
    assert t.compute_busy == 19.5 and t.fill == 0.5 and t.drain == 0.0 and t.stalls == 0.0
    assert t.bound == "compute"
    # ...and below 95% the busier link bounds the run
    t = Timeline.from_events([dataclasses.replace(events[2], start=2.0)] + events[:2])
    assert t.compute_fraction == pytest.approx(0.9)
    assert t.bound == "read"


def test_fill_ops_compute_and_exposed_copy_counts_time_not_lanes():
    # two copies at once on two lanes, half of it under a FILL: exposed is measured once
    events = [ev(0, "read", "read-0", 0.0, 4.0), ev(1, "read", "read-1", 0.0, 4.0),
              ev(2, "fill", "compute", 2.0, 6.0)]
    t = Timeline.from_events(events)
    assert t.copy_busy == 4.0 and t.exposed_copy == 2.0 and t.overlap == 0.5
    assert t.compute_busy == 4.0 and t.fill == 2.0 and t.drain == 0.0
    assert t.flops == 0 and t.compute_tflops == 0.0


def test_no_events():
    t = Timeline.from_events([], meta={"operations": 12})
    assert t.wall == 0 and t.compute_fraction == 0 and t.bound == "none" and not t.lanes
    assert "no block operations recorded (0 of 12" in str(t)
    trace = chrome_trace(t)
    assert [e for e in trace["traceEvents"] if e["ph"] == "X"] == []


def test_a_timeline_of_instants_has_a_summary():
    """Events of no duration (a clock too coarse for them): the report says 0, it does not
    divide by the wall time."""
    events = [ev(0, "read", "read-0", 1.0, 1.0, operand="A", nbytes=8),
              ev(1, "gemm", "compute", 1.0, 1.0, flops=10),
              ev(2, "read", "cuda:1/read-0", 1.0, 1.0, operand="B", nbytes=8),
              ev(3, "gemm", "cuda:1/compute", 1.0, 1.0, flops=10)]
    for some in (events[:1], events[:2], events):
        t = Timeline.from_events(some)
        assert t.wall == 0
        text = str(t)
        assert "timeline" in text and "bound" in text


def test_summary_text_fits_one_screen():
    text = str(Timeline.from_events(PIPELINE, run_seconds=14.0))
    lines = text.splitlines()
    assert len(lines) <= 16 and max(len(line) for line in lines) <= 110
    assert "busy 38.5%" in text and "fill 4.00 s" in text
    assert "stalls 1.00 s in 1 gaps" in text and "drain 3.00 s" in text
    assert "exposed 8.00 s (61.5% of the wall)" in text
    assert "bound     read, the busiest (6.00 s of the wall; nothing is busy half" in text


# -- the Chrome trace ------------------------------------------------------------------------------
def check_trace(data) -> dict:
    """The format rules; returns {tid: [X events]}."""
    assert isinstance(data["traceEvents"], list)
    names, per_tid = {}, {}
    for item in data["traceEvents"]:
        assert item["ph"] in ("X", "M")
        assert isinstance(item["pid"], int) and isinstance(item["tid"], int)
        if item["ph"] == "M":
            if item["name"] == "thread_name":
                assert item["tid"] not in names
                names[item["tid"]] = item["args"]["name"]
            continue
        for field in ("ts", "dur"):
            assert isinstance(item[field], (int, float)) and item[field] >= 0
        for field in ("bytes", "flops", "block", "q", "index"):
            assert field in item["args"]
        per_tid.setdefault(item["tid"], []).append(item)
    assert set(per_tid) <= set(names), "a track without a thread_name"
    assert len(set(names.values())) == len(names), "two tracks with one name"
    for tid, items in per_tid.items():  # whole nanoseconds written in µs
        spans = sorted((round(x["ts"] * 1000), round((x["ts"] + x["dur"]) * 1000))
                       for x in items)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"overlap on track {names[tid]!r}"
    return per_tid


def test_trace_of_hand_made_events():
    data = json.loads(json.dumps(chrome_trace(Timeline.from_events(PIPELINE))))
    per_tid = check_trace(data)
    names = {e["tid"]: e["args"]["name"] for e in data["traceEvents"]
             if e.get("name") == "thread_name"}
    by_name = {names[tid]: items for tid, items in per_tid.items()}
    assert list(by_name) == ["compute", "h2d", "c", "read-0", "read-1", "write-0"]
    gemm = by_name["compute"][1]
    assert gemm["name"] == "gemm" and gemm["ts"] == 8e6 and gemm["dur"] == 2e6
    assert gemm["args"]["flops"] == 2000 and gemm["args"]["q"] == 1
    assert [x["name"] for x in by_name["h2d"]] == ["H2D A", "H2D B"]
    assert by_name["c"][0]["name"] == "D2H C" and by_name["c"][0]["args"]["bytes"] == 100


def test_overlapping_events_of_one_lane_go_to_sub_tracks():
    events = [ev(0, "read", "read-0", 0.0, 3.0), ev(1, "read", "read-0", 1.0, 2.0),
              ev(2, "read", "read-0", 2.5, 4.0), ev(3, "read", "read-0", 3.0, 5.0)]
    assert [(name, [e.index for e in evs]) for name, evs in tracks(events)] == [
        ("read-0", [0, 3]), ("read-0 #2", [1, 2])]
    check_trace(chrome_trace(Timeline.from_events(events)))


def cpu_run(rng, workdir, **kwargs):
    a, b = rand(rng, (37, 29)), rand(rng, (29, 41))
    np.save("a.npy", a)
    r = oocgemm.multiply("a.npy", b, "c.npy", tile=(8, 16, 8), device="cpu", overwrite=True,
                         **kwargs)
    return a, b, r


def test_trace_of_a_cpu_run_has_every_operation(rng, workdir):
    a, b, r = cpu_run(rng, workdir)
    assert_gemm(np.load("c.npy"), a, b)
    path = r.timeline.save("run.json")
    with open(path) as f:
        data = json.load(f)
    per_tid = check_trace(data)
    items = [x for xs in per_tid.values() for x in xs]
    ops = r.plan.schedule.ops
    assert sorted(x["args"]["index"] for x in items) == list(range(len(ops)))
    assert Counter(x["cat"] for x in items) == Counter(op.kind.value for op in ops)
    for x in items:
        op = ops[x["args"]["index"]]
        assert (x["cat"], x["args"]["operand"], tuple(x["args"]["block"]), x["args"]["q"]) == (
            op.kind.value, op.operand, op.key, op.q)
        assert x["args"]["flops"] == op.flops
    assert sum(x["args"]["bytes"] for x in items if x["cat"] == "write") == 37 * 41 * 8
    meta = [e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"]
    assert meta[0] == "compute" and any(n.startswith("read-") for n in meta)


def test_staged_cpu_replay_records_copies_and_the_trace_holds(rng):
    """A CUDA-shaped (staged) plan replayed on the CPU: uploads and downloads on the copy
    thread, every operation in the trace, and recording off moves the same bytes."""
    a, b = rand(rng, (30, 22)), rand(rng, (22, 26))
    plan = oocgemm.plan(a, b, device="cpu", tile=(8, 8, 8))
    plan = dataclasses.replace(plan, staged=True, stripe=24,
                               staging=dataclasses.replace(plan.staging, n_stage=3, n_out=2))
    traffic = []
    for record in (True, False):
        out = poisoned((30, 26))
        log = CpuExecutor(plan, {"A": open_source(a, "a"), "B": open_source(b, "b")},
                          open_sink(out, shape=out.shape, dtype=out.dtype), record=record).run()
        assert_gemm(out, a, b)
        traffic.append(log.traffic())
        if record:
            t = Timeline.from_events(log.events())
            assert len(t.events) == len(plan.schedule.ops)
            assert {x.name for x in t.links} == set(log.traffic())  # result.bytes' names
            assert t.link("h2d").bytes == plan.schedule.traffic()["h2d"]
            assert "copy-0" in {x.name for x in t.lanes}
            per_tid = check_trace(json.loads(json.dumps(chrome_trace(t))))
            assert sum(len(x) for x in per_tid.values()) == len(plan.schedule.ops)
        else:
            assert log.events() == []
    assert traffic[0] == traffic[1] == plan.schedule.traffic()


def test_save_and_load_give_the_same_timeline(rng, workdir):
    _, _, r = cpu_run(rng, workdir, c=rand(rng, (37, 41)), beta=0.5)
    r.timeline.save("run.json")
    loaded = Timeline.load("run.json")
    assert loaded == r.timeline  # every figure, event, prediction, to the last bit
    assert str(loaded) == str(r.timeline)
    assert loaded.predicted["bound"] == r.plan.prediction.bound
    assert loaded.meta["shape"] == [37, 41, 29] and loaded.run_seconds == r.seconds


def test_load_refuses_what_is_not_an_oocgemm_trace(workdir):
    with pytest.raises(oocgemm.InputError, match="does not exist"):
        Timeline.load("missing.json")
    workdir.joinpath("bad.json").write_text("{not json")
    with pytest.raises(oocgemm.InputError, match="not a JSON trace"):
        Timeline.load("bad.json")
    workdir.joinpath("list.json").write_text("[]")
    with pytest.raises(oocgemm.InputError, match="no traceEvents"):
        Timeline.load("list.json")
    workdir.joinpath("foreign.json").write_text('{"traceEvents": []}')
    with pytest.raises(oocgemm.InputError, match="did not write"):
        Timeline.load("foreign.json")


# -- recording off ---------------------------------------------------------------------------------
def test_events_off_records_nothing_but_counts_bytes(rng, workdir):
    _, _, on = cpu_run(rng, workdir)
    a, b, off = cpu_run(rng, workdir, events=False)  # fresh operands, same shapes
    assert_gemm(np.load("c.npy"), a, b)
    assert off.events == []
    assert off.bytes == on.bytes
    assert off.bytes["storage_write"] == 37 * 41 * 8
    assert off.summary()["operations"] == len(off.plan.schedule.ops)
    assert len(off.timeline.events) == 0


def test_events_off_with_in_memory_operands(rng):
    """Operands used in place move no bytes: counted as such with recording off too."""
    a, b, c = rand(rng, (20, 12)), rand(rng, (12, 9)), rand(rng, (20, 9))
    on = oocgemm.multiply(a, b, c=c, beta=2.0, tile=(6, 5, 4), device="cpu")
    off = oocgemm.multiply(a, b, c=c, beta=2.0, tile=(6, 5, 4), device="cpu", events=False)
    assert_gemm(off.out, a, b, c, beta=2.0)
    assert off.events == [] and off.bytes == on.bytes
    assert off.bytes["read"] < off.plan.schedule.traffic()["read"]
    assert off.bytes["storage_read"] == off.bytes["decoded"] == 0  # nothing from storage


def test_events_off_keeps_progress_callbacks(rng):
    a, b = rand(rng, (20, 12)), rand(rng, (12, 9))
    seen = []
    r = oocgemm.multiply(a, b, tile=(6, 5, 4), device="cpu", events=False, progress=seen.append)
    assert r.events == []
    assert sorted(e.index for e in seen) == list(range(len(r.plan.schedule.ops)))
    assert sum(e.flops for e in seen if e.kind == "gemm") == r.flops


def test_events_must_be_a_bool(rng):
    with pytest.raises(oocgemm.OptionError, match="events must be True or False"):
        oocgemm.multiply(rand(rng, (2, 2)), rand(rng, (2, 2)), device="cpu", events="no")


# -- the plot --------------------------------------------------------------------------------------
@needs_matplotlib
def test_plot_writes_a_png(rng, workdir):
    _, _, r = cpu_run(rng, workdir)
    fig = r.timeline.plot("run.png")
    with open("run.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    ax = fig.axes[0]
    rows = [label.get_text() for label in ax.get_yticklabels()]
    assert rows == [name for name, _ in tracks(r.events)]
    assert "compute busy" in ax.get_title(loc="left")


def test_plot_without_matplotlib_says_what_to_install(rng, workdir, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    t = Timeline.from_events(PIPELINE)
    with pytest.raises(oocgemm.DependencyError, match=r"pip install 'oocgemm\[plot\]'"):
        t.plot("run.png")


# -- the command line ------------------------------------------------------------------------------
@pytest.fixture
def operands(rng, workdir):
    a, b = rand(rng, (40, 24)), rand(rng, (24, 36))
    np.save("a.npy", a)
    np.save("b.npy", b)
    return a, b


def test_cli_multiply_saves_the_timeline_and_prints_its_summary(operands):
    a, b = operands
    args = ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device", "cpu", "--tile", "8,8,8",
            "--timeline", "run.json"] + (["--plot", "run.png"] if HAVE_MATPLOTLIB else [])
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    assert_gemm(np.load("c.npy"), a, b)
    assert "compute   busy" in done.stdout and "exposed" in done.stdout
    assert "timeline saved to run.json" in done.stdout
    with open("run.json") as f:
        per_tid = check_trace(json.load(f))
    plan = oocgemm.plan("a.npy", "b.npy", device="cpu", tile=(8, 8, 8))
    assert sum(len(x) for x in per_tid.values()) == len(plan.schedule.ops)
    if HAVE_MATPLOTLIB:
        with open("run.png", "rb") as f:
            assert f.read(4) == b"\x89PNG"

    again = CliRunner().invoke(main, ["timeline", "run.json", "--json"])
    assert again.exit_code == 0, again.output
    figures = json.loads(again.stdout)
    assert figures["operations"] == len(plan.schedule.ops)
    assert figures["meta"]["shape"] == [40, 36, 24]
    summary = CliRunner().invoke(main, ["timeline", "run.json"])
    assert summary.exit_code == 0 and summary.stdout.startswith("timeline  C[40x36]")


def test_cli_multiply_json_carries_the_timeline(operands):
    done = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device",
                                     "cpu", "--json", "--timeline", "run.json"])
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["timeline"]["operations"] == out["operations"]
    assert 0 <= out["timeline"]["compute"]["fraction"] <= 1


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    ("{oops", "not a JSON trace"),
    ('{"traceEvents": [], "otherData": {}}', "did not write"),
])
def test_cli_timeline_errors_exit_2(workdir, content, message):
    if content is not None:
        workdir.joinpath("run.json").write_text(content)
    done = CliRunner().invoke(main, ["timeline", "run.json"])
    assert done.exit_code == 2
    assert done.stderr.startswith("error: ") and message in done.stderr
    assert "Traceback" not in done.output


@pytest.mark.parametrize("option", ["--timeline", "--plot"])
def test_cli_unwritable_timeline_path_exits_2_before_the_run(operands, workdir, option):
    done = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device",
                                     "cpu", option, "no/such/dir/run.out"])
    assert done.exit_code == 2
    assert done.stderr.startswith("error: cannot write the ")
    assert "no/such/dir/run.out" in done.stderr
    assert not workdir.joinpath("c.npy").exists()


@needs_matplotlib
def test_cli_plot_of_an_unknown_format_exits_2_before_the_run(operands, workdir):
    done = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device",
                                     "cpu", "--plot", "out.xyz"])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: cannot write the plot to 'out.xyz'")
    assert "'xyz'" in done.stderr and ".png" in done.stderr
    assert not workdir.joinpath("c.npy").exists() and not workdir.joinpath("out.xyz").exists()


@pytest.mark.parametrize("option, path, named", [
    ("--timeline", "a.npy", "A of the product"),
    ("--timeline", "c.npy", "OUT of the product"),
    ("--timeline", ".", "a directory"),
])
def test_cli_timeline_onto_a_matrix_or_a_folder_exits_2_before_the_run(operands, workdir,
                                                                        option, path, named):
    before = workdir.joinpath("a.npy").read_bytes()
    done = CliRunner().invoke(main, ["multiply", "a.npy", "b.npy", "-o", "c.npy", "--device",
                                     "cpu", option, path])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: cannot write the timeline") and named in done.stderr
    assert workdir.joinpath("a.npy").read_bytes() == before
    assert not workdir.joinpath("c.npy").exists()


def test_timeline_save_to_a_missing_directory_is_an_output_error(workdir):
    with pytest.raises(oocgemm.OutputError, match="cannot write the timeline"):
        Timeline.from_events(PIPELINE).save(workdir / "no" / "run.json")


def test_links_are_those_that_moved_bytes(rng, tmp_path):
    """Operands in memory are used in place on the CPU: their reads move nothing, and no
    'read' link is listed (link('read') is a KeyError); from .npy files, the reads move their
    bytes."""
    a, b = rand(rng, (40, 30)), rand(rng, (30, 20))
    t = oocgemm.multiply(a, b, device="cpu", tile=(16, 16, 16)).timeline
    assert all(x.bytes > 0 for x in t.links)
    assert "read" not in {x.name for x in t.links}
    with pytest.raises(KeyError, match="no link 'read' moved anything"):
        t.link("read")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    t = oocgemm.multiply(str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), device="cpu",
                         tile=(16, 16, 16)).timeline
    assert t.link("read").bytes > 0 and t.link("read").rate > 0

"""What storage is behind an operand (oocgemm.storage.identity): every spelling of one matrix
is the same matrix, close neighbours are not, and outputs that share an input's bytes are
seen to overlap it."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import uuid

import dask.array as da
import numpy as np
import pytest
import zarr

import oocgemm.storage.identity as identity_module
from oocgemm.errors import InputError, OOCGemmError
from oocgemm.storage import open_sink, open_source
from oocgemm.storage.identity import Identity, identity, overlaps, same_matrix

#: The Zarr layouts every store test runs on: v2, v3, and v3 sharded.
LAYOUTS = {
    "v2": {"zarr_format": 2, "chunks": (8, 8)},
    "v3": {"zarr_format": 3, "chunks": (8, 8)},
    "v3-sharded": {"zarr_format": 3, "chunks": (4, 4), "shards": (8, 8)},
}


def ident(obj, source=None) -> Identity:
    return identity(obj, source)


def same(x, y) -> bool:
    """same_matrix of two operands, checked to be symmetric and to imply overlaps."""
    ix, iy = ident(x), ident(y)
    answer = same_matrix(ix, iy)
    assert same_matrix(iy, ix) == answer
    if answer:
        assert overlaps(ix, iy) and overlaps(iy, ix)
    return answer


def overlap(x, y) -> bool:
    """overlaps of two operands, checked to be symmetric."""
    ix, iy = ident(x), ident(y)
    answer = overlaps(ix, iy)
    assert overlaps(iy, ix) == answer
    return answer


@pytest.fixture(params=sorted(LAYOUTS))
def stored(request, rng, workdir):
    """A 20x12 Zarr array 'a.zarr' in the current directory, in each layout, and its data."""
    data = rng.standard_normal((20, 12))
    array = zarr.create_array("a.zarr", shape=data.shape, dtype=data.dtype,
                              **LAYOUTS[request.param])
    array[:] = data
    return array, data


@pytest.fixture
def npy(rng, workdir):
    """A 6x5 float64 'a.npy' in the current directory, and its data."""
    data = rng.standard_normal((6, 5))
    np.save("a.npy", data)
    return data


# --- paths and URLs ------------------------------------------------------------------------
def test_a_zarr_folder_by_every_name_is_one_matrix(stored, workdir):
    here = os.fspath(workdir)
    os.symlink("a.zarr", "link.zarr")
    names = ["a.zarr", "a.zarr/", "./a.zarr", os.path.join(here, "a.zarr"),
             pathlib.Path("a.zarr"), "link.zarr", f"file://{here}/a.zarr",
             f"file://localhost{here}/a.zarr/", f"local://{here}/a.zarr"]
    for name in names:
        assert same("a.zarr", name), name


def test_a_copy_of_a_zarr_folder_is_another_matrix(stored):
    shutil.copytree("a.zarr", "copy.zarr")
    assert not same("a.zarr", "copy.zarr")
    assert not overlap("a.zarr", "copy.zarr")


def test_a_npy_file_by_path_symlink_hard_link_and_url(npy, workdir):
    os.symlink("a.npy", "soft.npy")
    os.mkdir("elsewhere")
    os.link("a.npy", "elsewhere/hard.npy")
    for name in ("soft.npy", "elsewhere/hard.npy", f"file://{workdir}/a.npy",
                 pathlib.Path(workdir, "a.npy")):
        assert same("a.npy", name), name


def test_a_copy_of_a_npy_file_is_another_matrix(npy):
    shutil.copyfile("a.npy", "copy.npy")
    assert not same("a.npy", "copy.npy")
    assert not overlap("a.npy", "copy.npy")
    assert not overlap(np.load("a.npy", mmap_mode="r"), np.load("copy.npy", mmap_mode="r"))


def test_a_path_is_identified_by_inode_not_by_name(npy):
    before = ident("a.npy")
    os.replace("a.npy", "moved.npy")  # the same file under another name...
    np.save("a.npy", npy)  # ...and another file under the old one
    assert same_matrix(before, ident("moved.npy"))
    assert not same_matrix(before, ident("a.npy"))


def test_a_file_url_of_another_host_is_an_input_error():
    with pytest.raises(InputError, match="file://"):
        identity("file://elsewhere/tmp/a.zarr")
    assert issubclass(InputError, OOCGemmError)


def test_a_path_not_written_yet_is_known_by_its_resolved_name(workdir):
    assert same("new.zarr", f"{workdir}/new.zarr/")
    assert not same("new.zarr", "other.zarr")
    assert ident("new.zarr").kind == "file"


# --- zarr arrays ---------------------------------------------------------------------------
def test_zarr_arrays_opened_on_one_array_are_one_matrix(stored, workdir):
    array, _ = stored
    again = zarr.open_array("a.zarr", mode="r")
    by_url = zarr.open_array(f"file://{workdir}/a.zarr", mode="r")  # an fsspec store
    for x in (array, again, by_url):
        assert same(x, array)
        assert same(x, "a.zarr")
        assert same(x, f"file://{workdir}/a.zarr")


def test_two_arrays_of_one_group_are_different_matrices(rng, workdir):
    group = zarr.open_group("g.zarr", mode="w")
    for name in ("x", "y", "sub/z"):
        group.create_array(name, shape=(4, 4), dtype="f8")[:] = rng.standard_normal((4, 4))
    x, y, z = group["x"], group["y"], group["sub/z"]
    assert same(x, "g.zarr/x") and same(zarr.open_array("g.zarr/x", mode="r"), x)
    assert same(z, "g.zarr/sub/z")
    for a, b in ((x, y), (x, z), ("g.zarr/x", "g.zarr/y"), (y, "g.zarr/sub/z")):
        assert not same(a, b)
        assert not overlap(a, b)
    # the group's folder holds its arrays: replacing it would remove them
    for inner in (x, z, "g.zarr/y", "g.zarr/sub"):
        assert overlap("g.zarr", inner)
        assert not same("g.zarr", inner)
    assert overlap("g.zarr/sub", z) and not overlap("g.zarr/sub", x)


def test_an_output_opened_r_plus_overlaps_the_input_it_rewrites(stored, workdir):
    out = zarr.open_array("a.zarr", mode="r+")
    for name in ("a.zarr", f"file://{workdir}/a.zarr"):
        assert overlap(out, name)
    zarr.create_array("b.zarr", shape=(20, 12), dtype="f8", chunks=(8, 8))
    assert not overlap(zarr.open_array("b.zarr", mode="r+"), "a.zarr")


def test_zarr_memory_stores_are_known_by_their_dictionary():
    store = zarr.storage.MemoryStore()
    array = zarr.create_array(store, shape=(4, 3), dtype="f4")
    again = zarr.open_array(store, mode="r")  # zarr makes a read-only store over the dict
    assert same(array, again)
    other = zarr.create_array(zarr.storage.MemoryStore(), shape=(4, 3), dtype="f4")
    assert not same(array, other) and not overlap(array, other)
    group = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    x, y = group.create_array("x", shape=(2, 2), dtype="f8"), group.create_array(
        "y", shape=(2, 2), dtype="f8")
    assert not same(x, y) and not overlap(x, y)
    assert overlap(group, x) and ident(x).kind == "store"


def test_fsspec_urls_and_their_arrays_agree():
    root = f"memory://oocgemm-identity-{uuid.uuid4().hex[:8]}"
    try:
        array = zarr.create_array(f"{root}/a.zarr", shape=(5, 5), dtype="f8")
        zarr.create_array(f"{root}/b.zarr", shape=(5, 5), dtype="f8")
        assert same(array, f"{root}/a.zarr")
        assert same(f"{root}/a.zarr/", f"{root}//a.zarr")
        assert same(zarr.open_array(f"{root}/a.zarr", mode="r"), array)
        assert not same(array, f"{root}/b.zarr") and not overlap(array, f"{root}/b.zarr")
        assert overlap(root, array)
    finally:
        import fsspec

        fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)


# --- numpy arrays and memmaps --------------------------------------------------------------
def test_numpy_views_of_one_range_are_one_matrix(rng):
    x = rng.standard_normal((8, 6))
    assert same(x, x) and same(x, x[:]) and same(x, x[:, :]) and same(x, x.view())
    assert same(x[2:5], x[2:5])
    assert not same(x, x.copy()) and not overlap(x, x.copy())


def test_empty_views_share_no_bytes_and_have_no_strides(rng):
    x = rng.standard_normal((8, 6))
    assert not overlap(x[2:2], x) and not overlap(x[:, 3:3], x)
    transposed = np.lib.stride_tricks.as_strided(x[2:2], shape=(0, 6), strides=(8, 48))
    # no element: nothing for the strides to say (and no byte shared: same() would check one)
    assert same_matrix(ident(x[2:2]), ident(transposed))


def test_arrays_that_say_where_they_lie_by_the_array_interface(rng):
    x = rng.standard_normal((8, 6))

    class Host:
        def __init__(self, array):
            self.__array_interface__ = array.__array_interface__

    assert same(Host(x), x) and same(Host(x[1:]), x[1:]) and not same(Host(x.T), x)
    assert overlap(Host(x[1:]), x) and not overlap(Host(x[:2]), x[2:])


def test_numpy_views_that_differ_overlap_but_are_other_matrices(rng):
    x = rng.standard_normal((8, 6))
    for other in (x.T, x[:, ::2], x[1:], x[:-1], x.view(np.int64), x[::-1]):
        assert not same(x, other)
        assert overlap(x, other)
    assert overlap(x[1:], x)  # a slice overlaps its base
    assert overlap(x[::-1], x[:1]) and not overlap(x[:4][::-1], x[4:])
    assert not overlap(x[:4], x[4:])  # disjoint rows of one buffer
    assert not same(x[:4], x[4:])


def test_memmaps_of_one_file_are_one_matrix_with_the_path(npy):
    a = np.load("a.npy", mmap_mode="r")
    b = np.load("a.npy", mmap_mode="r")
    assert a.__array_interface__["data"][0] != b.__array_interface__["data"][0]  # two maps
    assert same(a, b) and same(a, "a.npy") and same(np.asarray(a), "a.npy")
    offset = int(a.offset)
    by_hand = np.memmap("a.npy", dtype=np.float64, mode="r", offset=offset, shape=(6, 5))
    assert same(by_hand, a)


def test_memmaps_at_another_offset_or_order_are_other_matrices(npy):
    a = np.load("a.npy", mmap_mode="r")
    offset = int(a.offset)
    shifted = np.memmap("a.npy", dtype=np.float64, mode="r", offset=offset + 8, shape=(5, 5))
    fortran = np.memmap("a.npy", dtype=np.float64, mode="r", offset=offset, shape=(6, 5),
                        order="F")
    reshaped = np.memmap("a.npy", dtype=np.float64, mode="r", offset=offset, shape=(5, 6))
    for other in (shifted, fortran, reshaped, a[1:], a[:, 1:], a.T):
        assert not same(other, a) and not same(other, "a.npy")
        assert overlap(other, a) and overlap(other, "a.npy")
    # a view of a memmap lies where its address says, not at the offset numpy copies to it
    assert same(a[1:], np.memmap("a.npy", dtype=np.float64, mode="r", offset=offset + 40,
                                 shape=(5, 5)))
    assert not overlap(a[:3], a[3:])


def test_strides_along_an_axis_of_one_element_do_not_matter(rng, workdir):
    """A column is C and Fortran ordered at once: numpy gives it other strides in each."""
    np.save("col.npy", rng.standard_normal((6, 1)))
    offset = int(np.load("col.npy", mmap_mode="r").offset)
    c, f = (np.memmap("col.npy", dtype=np.float64, mode="r", offset=offset, shape=(6, 1),
                      order=order) for order in "CF")
    assert c.strides != f.strides
    assert same(c, f) and same(f, "col.npy")


def test_a_fortran_npy_file_has_the_layout_of_its_memmap(rng, workdir):
    np.save("f.npy", np.asfortranarray(rng.standard_normal((7, 3))))
    assert same("f.npy", np.load("f.npy", mmap_mode="r"))
    assert not same("f.npy", np.load("f.npy", mmap_mode="r").T)


def test_an_output_memmap_of_the_input_file_overlaps_it(npy):
    out = np.load("a.npy", mmap_mode="r+")
    assert overlap(out, "a.npy")
    np.save("b.npy", npy)
    assert not overlap(out, "b.npy")


def test_a_memmap_is_not_memory_and_memory_is_not_a_file(npy):
    a = np.load("a.npy", mmap_mode="r")
    loaded = np.load("a.npy")
    assert ident(a).kind == "file" and ident(loaded).kind == "memory"
    assert not overlap(a, loaded) and not same(a, loaded)


def test_arrays_that_say_where_they_lie_on_a_device(rng):
    """CuPy arrays are known by __cuda_array_interface__, without importing CuPy."""

    class Device:
        def __init__(self, ptr, shape, strides=None, typestr="<f4"):
            self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                             "typestr": typestr, "strides": strides,
                                             "version": 3}

    base = 1 << 40
    x = Device(base, (4, 8))
    assert same(x, Device(base, (4, 8), strides=(32, 4)))  # None: C-contiguous
    assert not same(x, Device(base, (8, 4), strides=(4, 32)))
    assert overlap(x, Device(base + 64, (2, 8)))
    assert not overlap(x, Device(base + 128, (2, 8)))
    assert ident(x).kind == "memory"
    if "cupy" not in sys.modules:
        ident(rng.standard_normal((2, 2)))
        assert "cupy" not in sys.modules


# --- dask arrays ---------------------------------------------------------------------------
def test_dask_arrays_from_zarr_are_the_stored_array(stored, workdir):
    array, _ = stored
    for lazy in (da.from_zarr("a.zarr"), da.from_zarr(array), da.from_array(array, chunks=4),
                 da.from_zarr(f"file://{workdir}/a.zarr")):
        assert same(lazy, "a.zarr") and same(lazy, array)
    assert same(da.from_zarr("a.zarr"), da.from_zarr("a.zarr"))


def test_dask_arrays_are_known_by_name(rng):
    x = da.from_array(rng.standard_normal((9, 9)), chunks=3)
    y = x + 1
    assert same(y, y) and same(y, x + 1)  # one graph, one name
    assert not same(y, x * 2) and not same(x, y)
    assert ident(y).kind == "dask"


def test_dask_arrays_computed_from_storage_overlap_it(stored, npy):
    array, _ = stored
    group = zarr.open_group("g.zarr", mode="w")
    other = group.create_array("x", shape=(20, 12), dtype="f8")
    for lazy in (da.from_zarr("a.zarr").T, da.from_zarr(array) * 2,
                 da.from_zarr("a.zarr", inline_array=True)):
        assert not same(lazy, "a.zarr")
        assert overlap(lazy, "a.zarr") and overlap(lazy, zarr.open_array("a.zarr", mode="r+"))
        assert not overlap(lazy, other) and not overlap(lazy, "a.npy")


def test_a_dask_graph_that_holds_memmap_views_overlaps_their_file(npy):
    mapped = np.load("a.npy", mmap_mode="r")
    graph = {("m", 0, 0): mapped[:3], ("m", 1, 0): mapped[3:]}
    lazy = da.Array(graph, "m", chunks=((3, 3), (5,)), dtype=mapped.dtype)
    assert overlap(lazy, np.load("a.npy", mmap_mode="r+")) and overlap(lazy + 1, "a.npy")
    assert not same(lazy, "a.npy") and not same(lazy, mapped)
    found = ident(lazy)
    assert len(found.reads) == 1 and found.reads[0].span == ident(mapped).span  # one range
    np.save("b.npy", npy)
    assert not overlap(lazy, "b.npy")
    task_spec = pytest.importorskip("dask._task_spec")  # graphs whose values are wrapped
    wrapped = da.Array({("w", 0, 0): task_spec.DataNode(("w", 0, 0), mapped[:3])}, "w",
                       chunks=((3,), (5,)), dtype=mapped.dtype)
    assert overlap(wrapped, "a.npy") and not overlap(wrapped, "b.npy")
    apart = da.Array({("n", 0, 0): mapped[:2], ("n", 1, 0): mapped[4:]}, "n",
                     chunks=((2, 2), (5,)), dtype=mapped.dtype)
    assert len(ident(apart).reads) == 2  # rows 2:4 are not read
    assert not overlap(apart, mapped[2:4]) and overlap(apart, mapped[1:3])


def test_two_from_zarr_of_different_arrays_are_different(rng, workdir):
    group = zarr.open_group("g.zarr", mode="w")
    for name in ("x", "y"):
        group.create_array(name, shape=(6, 6), dtype="f8")[:] = rng.standard_normal((6, 6))
    assert not same(da.from_zarr("g.zarr", component="x"), da.from_zarr("g.zarr",
                                                                         component="y"))
    assert same(da.from_zarr("g.zarr", component="x"), "g.zarr/x")


def test_dask_arrays_of_numpy_arrays_are_known_by_name(rng, npy):
    """dask copies what from_array is given: its arrays are their own, one by their name."""
    x = rng.standard_normal((12, 12))
    assert not same(da.from_array(x, chunks=4), x)
    assert same(da.from_array(x, chunks=4), da.from_array(x, chunks=4))
    assert not same(da.from_array(x, chunks=4), da.from_array(x, chunks=3))
    mapped = np.load("a.npy", mmap_mode="r")
    assert same(da.from_array(mapped, chunks=2), da.from_array(mapped, chunks=2))
    # a file where dask maps the file itself (older versions), but never the copy's memory
    assert ident(da.from_array(mapped, chunks=2)).kind in ("dask", "file")


# --- what else ----------------------------------------------------------------------------
def test_xarray_data_arrays_are_their_data(stored):
    xr = pytest.importorskip("xarray")
    array, _ = stored
    assert same(xr.DataArray(da.from_zarr(array), dims=("r", "c")), "a.zarr")


def test_unknown_objects_are_the_same_only_as_themselves():
    thing, other = object(), object()
    assert ident(thing).kind == "unknown"
    assert same(thing, thing) and overlap(thing, thing)
    assert not same(thing, other) and not overlap(thing, other)


def test_an_opened_source_says_what_an_unknown_object_is(npy):
    source = open_source("a.npy", "a")
    assert same_matrix(identity(object(), source), ident("a.npy"))
    assert same_matrix(identity(source), ident("a.npy"))
    # a .npy path with its source: the layout of the memmap, the span of the whole file
    with_source = identity("a.npy", source)
    assert with_source == ident("a.npy")
    assert with_source.span is None and with_source.layout is not None


def test_opened_sources_and_sinks_are_what_they_read_and_write(stored, npy):
    array, _ = stored
    assert same_matrix(identity(open_source(da.from_zarr("a.zarr"), "a")), ident("a.zarr"))
    sink = open_sink(np.load("a.npy", mmap_mode="r+"), shape=(6, 5), dtype=np.float64)
    assert overlaps(identity(sink), ident("a.npy"))
    assert not overlaps(identity(sink), ident("a.zarr"))


def test_a_npy_path_with_its_source_is_not_read_again(npy, monkeypatch):
    source = open_source("a.npy", "a")
    expected = ident("a.npy")
    monkeypatch.setattr(identity_module, "_npy_layout", lambda path: pytest.fail("read"))
    assert identity("a.npy", source) == expected


def test_without_a_layout_the_span_says_which_bytes():
    x, y = (Identity("memory", "space", span=span) for span in ((0, 8), (8, 16)))
    assert not overlaps(Identity("memory", "space", span=(4, 4)), Identity("memory", "space"))
    assert not same_matrix(x, y) and not overlaps(x, y)
    assert same_matrix(x, Identity("memory", "space", span=(0, 8)))
    assert overlaps(x, Identity("memory", "space", span=(4, 12)))
    assert not overlaps(x, Identity("memory", "space", span=(4, 4)))  # empty
    assert overlaps(x, Identity("memory", "space")) and overlaps(Identity("memory", "space"), x)


def test_identities_are_frozen_and_hashable(npy):
    found = ident("a.npy")
    with pytest.raises(AttributeError):
        found.kind = "memory"  # type: ignore[misc]
    assert {found: 1}[ident("a.npy")] == 1


def test_a_part_of_a_stored_matrix_is_another_matrix_on_the_same_bytes(stored):
    """What reads a part of a matrix (a dask task's region, one executor's part of K) is
    not the whole matrix, nor another part of it, for the one-read question; it overlaps
    both, for the aliasing question."""
    from oocgemm.dask import Region
    from oocgemm.storage.part import Part

    array, _ = stored
    whole = open_source(array, "x")
    parts = [Region(open_source(array, "x"), (0, 8), (0, 8)),
             Region(open_source(array, "x"), (8, 16), (0, 8)),
             Part(whole, 0, 0, 8)]
    ids = [identity(p) for p in parts]
    assert not same_matrix(identity(whole), ids[0])
    assert not same_matrix(ids[0], ids[1])
    assert same_matrix(ids[0], identity(Region(open_source(array, "x"), (0, 8), (0, 8))))
    assert all(overlaps(identity(whole), x) for x in ids)


def test_one_calls_identities_are_remembered_by_the_objects_asked_about(rng, npy, monkeypatch):
    """remembered(): each (object, source) pair is looked at once in one call's checks (they
    ask about each operand twice), and each answer is identity's own."""
    from oocgemm.storage.identity import remembered

    asked = []
    real = identity_module.identity
    monkeypatch.setattr(identity_module, "identity",
                        lambda obj, source=None: asked.append(obj) or real(obj, source))
    x = rng.standard_normal((4, 4))
    source = open_source("a.npy", "a")
    identify = remembered()
    found = [identify(x), identify("a.npy", source), identify(x[1:]), identify(x),
             identify("a.npy", source)]
    assert found == [real(x), real("a.npy", source), real(x[1:]), real(x), real("a.npy", source)]
    assert found[3] is found[0] and found[4] is found[1]
    assert len(asked) == 3  # x, the path with its source, the view: once each
    assert identify("a.npy") == real("a.npy") and len(asked) == 4  # without the source: again


def test_an_output_of_one_call_is_checked_against_each_input_once(rng, monkeypatch):
    """open_run: a and b are looked at once each (one_matrix and the output's check share
    the answers), and an output that views an input is still refused."""
    from oocgemm.errors import OutputError
    from oocgemm.lifecycle.run import open_run

    calls = []
    real = identity_module.identity
    monkeypatch.setattr(identity_module, "identity",
                        lambda obj, source=None: calls.append(obj) or real(obj, source))
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 6))
    with open_run(a, b, np.empty((6, 6))):
        pass
    assert len(calls) == 3  # a, b, out
    held = rng.standard_normal((6, 10))
    square = held[:5, :5]
    with pytest.raises(OutputError, match="is the same matrix as a"):
        open_run(a, square, a)
    with pytest.raises(OutputError, match="shares storage with b"):
        open_run(a, square, held[:, 2:7])

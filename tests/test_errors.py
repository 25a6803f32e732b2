"""Bad inputs and options: each raises the right OOCGemmError subclass, naming the problem."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import zarr
from _helpers import leftovers, rand

import oocgemm
from oocgemm import cuda
from oocgemm.planning.tiling import SLOW_FLOOR


def test_error_hierarchy():
    for cls in (oocgemm.InputError, oocgemm.ShapeError, oocgemm.DTypeError, oocgemm.OutputError,
                oocgemm.BudgetError, oocgemm.OptionError, oocgemm.DeviceError,
                oocgemm.ExecutionError, oocgemm.KernelError, oocgemm.DependencyError,
                oocgemm.MemoryPressureError):
        assert issubclass(cls, oocgemm.OOCGemmError)
    assert issubclass(oocgemm.OOCGemmError, ValueError)


@pytest.mark.parametrize("name", ["missing.npy", "missing.zarr", "missing"])
@pytest.mark.parametrize("role", ["a", "b", "c"])
def test_missing_path(rng, workdir, name, role):
    args = {"a": rand(rng, (3, 4)), "b": rand(rng, (4, 2)), "c": rand(rng, (3, 2))}
    args[role] = name
    with pytest.raises(oocgemm.InputError, match=rf"{role}: no such file.*{name}"):
        oocgemm.multiply(args["a"], args["b"], c=args["c"], beta=1.0, device="cpu")


def test_a_folder_named_like_a_npy_file_is_called_a_folder(rng, workdir):
    os.mkdir("x.npy")
    with pytest.raises(oocgemm.InputError, match="a: 'x.npy' is a directory, not a .npy file"):
        oocgemm.multiply("x.npy", rand(rng, (4, 2)), device="cpu")


@pytest.mark.parametrize("shape,ndim", [((5,), 1), ((2, 3, 4), 3), ((), 0)])
@pytest.mark.parametrize("role", ["a", "b", "c"])
def test_not_a_matrix(rng, shape, ndim, role):
    args = {"a": rand(rng, (3, 4)), "b": rand(rng, (4, 2)), "c": rand(rng, (3, 2))}
    args[role] = rand(rng, shape)
    with pytest.raises(oocgemm.InputError, match=rf"{role} .*not a matrix.*{ndim} dimension"):
        oocgemm.multiply(args["a"], args["b"], c=args["c"], beta=1.0, device="cpu")


@pytest.mark.parametrize("kind, named", [
    ("numpy", "b (numpy array)"), ("dask", "b (dask array)"),
    ("xarray", "b (xarray DataArray)"), ("zarr array", "b (zarr array)"),
    ("dask from zarr", "b (dask array from Zarr)"), ("path", "b (b.zarr)"),
])
def test_messages_name_each_operand_once(rng, workdir, kind, named):
    import dask.array as da

    x = rand(rng, (4, 2, 2))
    stored = zarr.create_array("b.zarr", shape=x.shape, dtype=x.dtype, chunks=(2, 2, 2))
    stored[...] = x
    given = {"numpy": lambda: x, "dask": lambda: da.from_array(x, chunks=2),
             "xarray": lambda: pytest.importorskip("xarray").DataArray(x),
             "zarr array": lambda: stored, "dask from zarr": lambda: da.from_zarr("b.zarr"),
             "path": lambda: "b.zarr"}[kind]()
    with pytest.raises(oocgemm.InputError) as caught:
        oocgemm.multiply(rand(rng, (3, 4)), given, device="cpu")
    assert str(caught.value).startswith(f"{named} is not a matrix: shape (4, 2, 2)")


def test_output_messages_name_each_operand_once(rng):
    a = rand(rng, (4, 4))
    with pytest.raises(oocgemm.OutputError, match=r"same matrix as a \(numpy array\): "):
        oocgemm.multiply(a, rand(rng, (4, 4)), a, device="cpu")
    frozen = np.zeros((4, 4))
    frozen.flags.writeable = False
    with pytest.raises(oocgemm.OutputError, match=r"^out \(numpy array\) is read-only$"):
        oocgemm.multiply(a, a, frozen, device="cpu")


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_not_a_matrix_on_disk(rng, workdir, kind):
    x = rand(rng, (2, 3, 4))
    if kind == "npy":
        np.save("a.npy", x)
    else:
        zarr.create_array("a.zarr", shape=x.shape, dtype=x.dtype)[...] = x
    with pytest.raises(oocgemm.InputError, match="not a matrix.*3 dimension"):
        oocgemm.multiply(f"a.{kind}", rand(rng, (4, 2)), device="cpu")


@pytest.mark.parametrize("trans_a,trans_b,sa,sb", [
    (False, False, (5, 7), (6, 4)),
    (True, False, (5, 7), (7, 4)),   # op(a) is 7x5: 5 columns against 7 rows
    (False, True, (5, 7), (4, 6)),
])
def test_inner_dimension_mismatch(rng, trans_a, trans_b, sa, sb):
    a, b = rand(rng, sa), rand(rng, sb)
    ka = sa[0] if trans_a else sa[1]
    kb = sb[1] if trans_b else sb[0]
    if ka == kb:  # make sure the case really mismatches
        pytest.fail("test case does not mismatch")
    with pytest.raises(oocgemm.ShapeError) as info:
        oocgemm.multiply(a, b, trans_a=trans_a, trans_b=trans_b, device="cpu")
    msg = str(info.value)
    assert "inner dimensions differ" in msg
    assert str(sa) in msg and str(sb) in msg
    assert f"{ka} columns" in msg and f"{kb} rows" in msg
    if trans_a:
        assert "transposed" in msg


def test_inner_dimension_mismatch_is_raised_by_plan_too(rng):
    with pytest.raises(oocgemm.ShapeError, match=r"\(5, 7\).*\(6, 4\)"):
        oocgemm.plan(rand(rng, (5, 7)), rand(rng, (6, 4)), device="cpu")


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_c_of_wrong_shape(rng, beta):
    """C's shape is checked whenever it is given, read or not."""
    with pytest.raises(oocgemm.ShapeError, match=r"c has shape \(4, 3\), expected \(3, 4\)"):
        oocgemm.multiply(rand(rng, (3, 5)), rand(rng, (5, 4)), c=rand(rng, (4, 3)), beta=beta,
                         device="cpu")


def test_out_array_of_wrong_shape(rng):
    with pytest.raises(oocgemm.ShapeError, match=r"out has shape \(3, 5\), expected \(3, 4\)"):
        oocgemm.multiply(rand(rng, (3, 5)), rand(rng, (5, 4)), np.zeros((3, 5)), device="cpu")
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=(4, 4), dtype="f8")
    with pytest.raises(oocgemm.ShapeError, match=r"out has shape \(4, 4\)"):
        oocgemm.multiply(rand(rng, (3, 5)), rand(rng, (5, 4)), z, device="cpu")


def test_out_not_an_array(rng):
    with pytest.raises(oocgemm.OutputError, match="list"):
        oocgemm.multiply(rand(rng, (3, 5)), rand(rng, (5, 4)), [[0.0] * 4] * 3, device="cpu")


def test_input_of_unknown_type(rng):
    with pytest.raises(oocgemm.InputError, match="a: expected a path.*list"):
        oocgemm.multiply([[1.0, 2.0]], rand(rng, (2, 2)), device="cpu")


@pytest.mark.parametrize("kind", ["npy", "zarr"])
@pytest.mark.parametrize("role", ["a", "b"])
def test_out_path_equal_to_an_input(rng, workdir, kind, role):
    a, b = rand(rng, (4, 4)), rand(rng, (4, 4))
    path = f"{role}.{kind}"
    x = a if role == "a" else b
    if kind == "npy":
        np.save(path, x)
    else:
        zarr.create_array(path, shape=x.shape, dtype=x.dtype)[...] = x
    args = {"a": a, "b": b, role: path}
    for spelling in (path, os.path.abspath(path), "./" + path):
        with pytest.raises(oocgemm.OutputError, match=f"same matrix as {role}"):
            oocgemm.multiply(args["a"], args["b"], spelling, overwrite=True, device="cpu")
    after = np.load(path) if kind == "npy" else zarr.open_array(path, mode="r")[:]
    np.testing.assert_array_equal(after, x)


def test_out_path_of_a_zarr_array_input(rng, workdir):
    """A zarr.Array object that lives at the output path is that path too."""
    a = rand(rng, (4, 4))
    zarr.create_array("a.zarr", shape=a.shape, dtype=a.dtype)[...] = a
    with pytest.raises(oocgemm.OutputError, match="same matrix as a"):
        oocgemm.multiply(zarr.open_array("a.zarr", mode="r"), rand(rng, (4, 4)), "a.zarr",
                         overwrite=True, device="cpu")
    np.testing.assert_array_equal(zarr.open_array("a.zarr", mode="r")[:], a)


def test_out_memmap_file_of_an_input(rng, workdir):
    a = rand(rng, (4, 4))
    np.save("a.npy", a)
    mm = np.load("a.npy", mmap_mode="r")
    with pytest.raises(oocgemm.OutputError, match="same matrix as a"):
        oocgemm.multiply(mm, rand(rng, (4, 4)), "a.npy", overwrite=True, device="cpu")


@pytest.mark.parametrize("role", ["a", "b", "c"])
def test_out_same_numpy_array_as_an_input(rng, role):
    args = {"a": rand(rng, (4, 4)), "b": rand(rng, (4, 4)), "c": rand(rng, (4, 4))}
    before = args[role].copy()
    if role == "c":  # beta == 0: C is not read, so out may be c
        oocgemm.multiply(args["a"], args["b"], args["c"], c=args["c"], beta=0.0, device="cpu")
        np.testing.assert_allclose(args["c"], args["a"] @ args["b"], rtol=1e-12)
        return
    with pytest.raises(oocgemm.OutputError, match=f"same matrix as {role}"):
        oocgemm.multiply(args["a"], args["b"], args[role], c=args["c"], beta=0.0, device="cpu")
    np.testing.assert_array_equal(args[role], before)


def test_out_overlapping_an_input_view(rng):
    big = rand(rng, (8, 4))
    with pytest.raises(oocgemm.OutputError, match="shares storage with b"):
        oocgemm.multiply(rand(rng, (4, 4)), big[:4], big[2:6], device="cpu")
    with pytest.raises(oocgemm.OutputError, match="same matrix as a"):
        oocgemm.multiply(big[:4], rand(rng, (4, 4)), big[:4], device="cpu")


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_existing_out_needs_overwrite(rng, workdir, kind):
    a, b = rand(rng, (5, 3)), rand(rng, (3, 4))
    path = f"c.{kind}"
    old = rand(rng, (7, 2))  # even of another shape: it is replaced, not updated
    if kind == "npy":
        np.save(path, old)
    else:
        zarr.create_array(path, shape=old.shape, dtype=old.dtype)[...] = old
    with pytest.raises(oocgemm.OutputError, match=r"exists.*overwrite=True"):
        oocgemm.multiply(a, b, path, device="cpu")
    r = oocgemm.multiply(a, b, path, overwrite=True, device="cpu")
    got = np.load(path) if kind == "npy" else zarr.open_array(path, mode="r")[:]
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    assert r.out.shape == (5, 4)
    assert leftovers(workdir) == []


def test_out_in_a_missing_directory(rng, workdir):
    with pytest.raises(oocgemm.OutputError, match="does not exist"):
        oocgemm.multiply(rand(rng, (2, 2)), rand(rng, (2, 2)), "nowhere/c.zarr", device="cpu")


@pytest.mark.parametrize("limit", [1, 50, "40B"])  # w=h=r=1 needs 56 bytes (float64)
def test_memory_limit_too_small_for_any_tile(rng, limit):
    a, b = rand(rng, (50, 50)), rand(rng, (50, 50))
    with pytest.raises(oocgemm.BudgetError, match="memory_limit=.*too small for any tile"):
        oocgemm.multiply(a, b, memory_limit=limit, device="cpu")


@pytest.mark.parametrize("limit", [64, "64", "1KB"])
def test_budget_that_leaves_only_useless_tiles_is_refused_at_once(rng, limit):
    # 300x250x200: w=h=r=1 fits 64 bytes, and would be 45 million operations
    a, b = rand(rng, (300, 200)), rand(rng, (200, 250))
    with pytest.raises(oocgemm.BudgetError) as info:
        oocgemm.plan(a, b, memory_limit=limit, device="cpu")
    message = str(info.value)
    assert "leaves only tiles" in message and "operations, predicted" in message
    assert ("did you mean '64MB'" in message) == (limit != "1KB")
    # the budget it names as enough is enough (it plans a run of at most SLOW_FLOOR seconds)
    need = re.search(r"it takes (\S+ \S+) or more", message).group(1).replace(" ", "")
    p = oocgemm.plan(a, b, memory_limit=need, device="cpu")
    assert p.device_bytes <= p.memory_limit and p.prediction.total <= SLOW_FLOOR


def test_requested_tile_over_the_budget(rng):
    a, b = rand(rng, (50, 50)), rand(rng, (50, 50))
    with pytest.raises(oocgemm.BudgetError, match=r"tile \(w=50, h=50, r=50\).*memory_limit"):
        oocgemm.plan(a, b, tile=(50, 50, 50), memory_limit="20KB", device="cpu")


@pytest.mark.parametrize("limit, said", [("20KB", "'20KB' (19.5 KiB)"),
                                         ("20 KiB", "'20 KiB' (20 KiB)"),
                                         (20000, "20000 (19.5 KiB)")])
def test_a_budget_is_said_back_in_the_users_own_spelling(rng, workdir, limit, said):
    a, b = rand(rng, (50, 50)), rand(rng, (50, 50))
    with pytest.raises(oocgemm.BudgetError) as caught:
        oocgemm.plan(a, b, tile=(50, 50, 50), memory_limit=limit, device="cpu")
    assert str(caught.value).endswith(f"over memory_limit={said}")
    x = rand(rng, (64, 64))
    zarr.create_array("a.zarr", shape=x.shape, dtype=x.dtype, chunks=(64, 64))[...] = x
    with pytest.raises(oocgemm.BudgetError) as caught:
        oocgemm.plan("a.zarr", x, host_memory_limit=limit, device="cpu")
    assert str(caught.value).startswith(f"host_memory_limit={said} is too small for any tile")


def test_host_memory_limit_too_small(rng, workdir):
    x = rand(rng, (64, 64))
    zarr.create_array("a.zarr", shape=x.shape, dtype=x.dtype, chunks=(64, 64))[...] = x
    with pytest.raises(oocgemm.BudgetError, match="host_memory_limit"):
        oocgemm.plan("a.zarr", x, host_memory_limit="10KB", device="cpu")


@pytest.mark.parametrize("tile", [0, -1, (0, 2, 2), (2, -3, 2), (2, 3), (1, 2, 3, 4), "abc",
                                  "2x3", "2x3xq", (1.5, 2, 2), ("a", "b", "c"), 3.0])
def test_bad_tile(rng, tile):
    with pytest.raises(oocgemm.OptionError, match="tile"):
        oocgemm.multiply(rand(rng, (5, 5)), rand(rng, (5, 5)), tile=tile, device="cpu")


@pytest.mark.parametrize("tile", ["2x3x4", "2,3,4", (2, 3, 4), [2, 3, 4], (2.0, 3, 4),
                                  (np.int64(2), 3, 4)])
def test_good_tile_spellings(rng, tile):
    a, b = rand(rng, (7, 5)), rand(rng, (5, 9))
    r = oocgemm.multiply(a, b, tile=tile, device="cpu")
    assert r.plan.tile == (2, 3, 4) and r.plan.chosen_by == "tile"
    np.testing.assert_allclose(r.out, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:-1", "gpu", "", 0, None])
def test_unknown_device(rng, device):
    with pytest.raises(oocgemm.DeviceError, match="device"):
        oocgemm.multiply(rand(rng, (2, 2)), rand(rng, (2, 2)), device=device)


@pytest.mark.skipif(cuda.device_count() > 0, reason="a GPU is present")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu(rng, device):
    with pytest.raises(oocgemm.DeviceError, match="device=|device '|cpu"):
        oocgemm.multiply(rand(rng, (2, 2)), rand(rng, (2, 2)), device=device)


@pytest.mark.skipif(cuda.device_count() > 0, reason="a GPU is present")
def test_auto_device_without_gpu_is_cpu(rng):
    r = oocgemm.multiply(rand(rng, (3, 2)), rand(rng, (2, 3)), device="auto")
    assert str(r.plan.device) == "cpu"


@pytest.mark.parametrize("how", ["data", "header", "magic", "empty"])
def test_truncated_npy(rng, workdir, how):
    np.save("a.npy", rand(rng, (20, 30)))
    data = open("a.npy", "rb").read()
    cut = {"data": len(data) - 100, "header": 40, "magic": 4, "empty": 0}[how]
    with open("a.npy", "wb") as fh:
        fh.write(data[:cut])
    with pytest.raises(oocgemm.InputError, match=r"a: 'a.npy' is not a readable .npy file"):
        oocgemm.multiply("a.npy", rand(rng, (30, 4)), device="cpu")
    with pytest.raises(oocgemm.InputError, match="a.npy"):
        oocgemm.plan("a.npy", rand(rng, (30, 4)), device="cpu")


def test_npy_that_is_not_npy(rng, workdir):
    with open("a.npy", "w") as fh:
        fh.write("just some text, long enough to hold a header...\n" * 4)
    with pytest.raises(oocgemm.InputError, match="a.npy"):
        oocgemm.multiply("a.npy", rand(rng, (3, 3)), device="cpu")


@pytest.mark.parametrize("name", ["ab.npz", "ab"])  # by its suffix, or by what it holds
def test_npz_input_names_its_arrays_and_says_how_to_pass_one(rng, workdir, name):
    with open(name, "wb") as fh:
        np.savez(fh, first=rand(rng, (3, 4)), second=rand(rng, (4, 2)))
    with pytest.raises(oocgemm.InputError) as caught:
        oocgemm.multiply(name, rand(rng, (4, 2)), device="cpu")
    message = str(caught.value)
    assert message.startswith(f"a: {name!r} is a .npz archive")
    assert "'first', 'second'" in message and f"np.load({name!r})['first']" in message
    assert ".npy" in message


def test_zip_output_is_refused_before_any_work(rng, workdir):
    with pytest.raises(oocgemm.OutputError, match=r"out 'c.zip'.*zip.*\.zarr"):
        oocgemm.multiply(rand(rng, (3, 4)), rand(rng, (4, 2)), "c.zip", device="cpu")
    assert os.listdir(".") == []


def test_zip_that_holds_a_zarr_group_or_nothing_zarr_is_refused(rng, workdir):
    with zarr.storage.ZipStore("g.zip", mode="w") as store:
        zarr.create_group(store).create_array("x", shape=(4, 2), dtype="f8")
    with pytest.raises(oocgemm.InputError, match="b: the zip file 'g.zip' holds a Zarr group"):
        oocgemm.multiply(rand(rng, (3, 4)), "g.zip", device="cpu")
    with open("t.zip", "wb") as fh:
        fh.write(b"not a zip file at all")
    with pytest.raises(oocgemm.InputError, match="b: 't.zip' is not a readable zip file"):
        oocgemm.multiply(rand(rng, (3, 4)), "t.zip", device="cpu")


@pytest.mark.parametrize("fmt", [2, 3])
@pytest.mark.parametrize("how", ["delete", "garble"])
def test_corrupt_zarr_metadata(rng, workdir, fmt, how):
    x = rand(rng, (6, 5))
    zarr.create_array("b.zarr", shape=x.shape, dtype=x.dtype, chunks=(3, 3),
                      zarr_format=fmt)[...] = x
    meta = os.path.join("b.zarr", "zarr.json" if fmt == 3 else ".zarray")
    if how == "delete":
        os.remove(meta)
    else:
        with open(meta, "w") as fh:
            fh.write('{"zarr_format": 3, "node_type": "arr')
    with pytest.raises(oocgemm.InputError, match=r"b: .*'b.zarr'"):
        oocgemm.multiply(rand(rng, (4, 6)), "b.zarr", device="cpu")


def test_zarr_group_is_not_an_array(rng, workdir):
    zarr.create_group("g.zarr")
    with pytest.raises(oocgemm.InputError, match="group"):
        oocgemm.multiply("g.zarr", rand(rng, (3, 3)), device="cpu")


@pytest.mark.parametrize("how", ["garble", "truncate"])
@pytest.mark.parametrize("out", ["c.zarr", "c.npy", None])
def test_corrupt_zarr_chunk_fails_at_run_time(rng, workdir, how, out):
    x = rand(rng, (12, 10))
    zarr.create_array("a.zarr", shape=x.shape, dtype=x.dtype, chunks=(4, 5))[...] = x
    chunk = os.path.join("a.zarr", "c", "1", "1")
    data = open(chunk, "rb").read()
    with open(chunk, "wb") as fh:
        fh.write(data[: len(data) // 3] if how == "truncate" else bytes(reversed(data)))
    b = rand(rng, (10, 6))
    oocgemm.plan("a.zarr", b, out, tile=(4, 3, 5), device="cpu")  # planning reads no chunk
    with pytest.raises(oocgemm.OOCGemmError) as info:
        oocgemm.multiply("a.zarr", b, out, tile=(4, 3, 5), device="cpu")
    assert isinstance(info.value, (oocgemm.InputError, oocgemm.ExecutionError))
    assert "a.zarr" in str(info.value) and "corrupt or truncated chunk" in str(info.value)
    if out is not None:
        assert not os.path.exists(out)
    assert leftovers(workdir) == []
    assert sorted(os.listdir(workdir)) == ["a.zarr"]


@pytest.mark.parametrize("name", ["memory_limit", "host_memory_limit"])
@pytest.mark.parametrize("value", ["8XB", "-1", "150%", "0%", "0", "", "lots", -5, 0, True,
                                   float("nan"), [1], float("inf"), "1e400", 0.5])
def test_bad_memory_strings(rng, name, value):
    with pytest.raises(oocgemm.OptionError, match=name):
        oocgemm.plan(rand(rng, (3, 3)), rand(rng, (3, 3)), device="cpu", **{name: value})


@pytest.mark.parametrize("value,expect", [("8GB", 8 * 10**9), ("512MiB", 512 << 20),
                                          ("1.5e6", 1_500_000), (12345, 12345), ("2 kb", 2000)])
def test_good_memory_strings(rng, value, expect):
    p = oocgemm.plan(rand(rng, (3, 3)), rand(rng, (3, 3)), device="cpu", memory_limit=value)
    assert p.memory_limit == expect


def test_memory_percentage(rng):
    from oocgemm import machine

    p = oocgemm.plan(rand(rng, (3, 3)), rand(rng, (3, 3)), device="cpu", memory_limit="10%")
    assert p.memory_limit == int(machine.total_memory() * 0.1)


@pytest.mark.parametrize("kw", [{"alpha": "2"}, {"alpha": float("nan")}, {"beta": None},
                                {"beta": True}, {"trans_a": "yes"}, {"trans_b": 1},
                                {"overwrite": "yes"}])
def test_bad_scalars_and_flags(rng, kw):
    name = next(iter(kw))
    with pytest.raises(oocgemm.OptionError, match=name):
        oocgemm.multiply(rand(rng, (3, 3)), rand(rng, (3, 3)), device="cpu", **kw)


def test_plan_refuses_misspelled_keywords_and_takes_multiplys(rng):
    a = rand(rng, (6, 6))
    for call in (oocgemm.plan, oocgemm.multiply):  # an OOCGemmError, as any user error
        with pytest.raises(oocgemm.OptionError, match="memory_limt"):
            call(a, a, memory_limt="1GB", device="cpu")
    p = oocgemm.plan(a, a, device="cpu", overwrite=True, progress=False, verify=True)
    assert p.summary()["kernel"] is None  # no CUDA kernel on the CPU

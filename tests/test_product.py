"""oocgemm.Product: one product made, planned, executed and closed; the plan it returns is
the plan it runs; the options it takes are defined once (oocgemm.options.Options), and
multiply's keywords and the command line's flags are made from that definition."""

from __future__ import annotations

import dataclasses
import inspect
import os

import numpy as np
import pytest
from _helpers import assert_gemm, poisoned, rand

import oocgemm
from oocgemm.options import PLANS, RUN_ONLY, Options, on_the_command_line
from oocgemm.storage.base import MatrixSource


def test_plan_then_execute_runs_that_plan_into_a_poisoned_output(rng):
    m, n, k = 37, 29, 23  # ragged against the tile: every edge block is partial
    a, b, c = rand(rng, (k, m)), rand(rng, (n, k)), rand(rng, (m, n))
    out = poisoned((m, n))
    with oocgemm.Product(a, b, out, c=c, alpha=-1.5, beta=0.5, trans_a=True, trans_b=True,
                         device="cpu", tile=(8, 8, 8)) as product:
        planned = product.plan()
        assert product.plan() is planned  # planned once
        assert planned.tile == (8, 8, 8) and planned.n_blocks == 5 * 4
        result = product.execute()
    assert result.plan is planned  # exactly the plan it returned
    assert result.out is out
    assert_gemm(out, a, b, c, alpha=-1.5, beta=0.5, trans_a=True, trans_b=True)
    assert product.closed


def test_a_printed_plan_of_stored_inputs_is_the_one_that_runs(rng, workdir):
    a, b = rand(rng, (61, 45)), rand(rng, (45, 50))
    np.save("a.npy", a)
    np.save("b.npy", b)
    product = oocgemm.Product("a.npy", "b.npy", "c.npy", options={"device": "cpu"},
                              memory_limit="64KiB")
    planned = product.plan()
    assert planned.n_blocks > 1
    assert str(planned) == str(oocgemm.plan("a.npy", "b.npy", "c.npy", device="cpu",
                                            memory_limit="64KiB"))
    result = product.execute()
    assert result.plan is planned
    assert_gemm(np.load("c.npy"), a, b)
    assert sorted(os.listdir(".")) == ["a.npy", "b.npy", "c.npy"]


@pytest.mark.parametrize("how", ["rewritten", "replaced", "removed"])
def test_an_input_file_changed_between_plan_and_execute_is_refused_by_name(rng, workdir, how):
    a, b = rand(rng, (12, 8)), rand(rng, (8, 6))
    np.save("a.npy", a)
    np.save("b.npy", b)
    product = oocgemm.Product("a.npy", "b.npy", "c.npy", device="cpu")
    product.plan()
    other = rand(rng, (6, 8))  # another shape and other values: read with b's header...
    if how == "rewritten":
        np.save("b.npy", other)  # the same file, truncated and written again
    elif how == "replaced":
        np.save("new.npy", other)
        os.replace("new.npy", "b.npy")
    else:
        os.remove("b.npy")
    with pytest.raises(oocgemm.InputError, match=r"^b: 'b.npy' was (rewritten or replaced|"
                                                 r"removed) after it was opened"):
        product.execute()
    assert product.closed and not os.path.exists("c.npy")
    assert sorted(os.listdir(".")) == ["a.npy"] + (["b.npy"] if how != "removed" else [])


def test_a_zarr_input_rewritten_between_plan_and_execute_is_refused(rng, workdir):
    import zarr

    zarr.create_array("a.zarr", shape=(12, 8), dtype="f8", chunks=(5, 5))[...] = rand(
        rng, (12, 8))
    product = oocgemm.Product("a.zarr", rand(rng, (8, 6)), device="cpu")
    product.plan()
    zarr.create_array("a.zarr", shape=(12, 8), dtype="f8", chunks=(4, 4),
                      overwrite=True)[...] = rand(rng, (12, 8))
    with pytest.raises(oocgemm.InputError, match=r"^a: 'a.zarr' was rewritten or replaced"):
        product.execute()


def test_close_releases_what_it_opened_and_ends_the_product(rng, workdir, monkeypatch):
    closed = []
    original = MatrixSource.close

    def close(self):
        closed.append(self.name)
        original(self)

    monkeypatch.setattr(MatrixSource, "close", close)
    np.save("a.npy", rand(rng, (12, 7)))
    product = oocgemm.Product("a.npy", "a.npy", "c.npy", trans_b=True, device="cpu")
    product.plan()
    opened = len(closed)  # what the checks opened and closed before
    assert not product.closed
    product.close()
    assert len(closed) > opened and product.closed
    product.close()  # twice is harmless
    with pytest.raises(oocgemm.OptionError, match="closed"):
        product.execute()
    with pytest.raises(oocgemm.OptionError, match="closed"):
        product.plan()
    assert os.listdir(".") == ["a.npy"]  # no output was begun


def test_a_product_runs_once_and_a_failed_step_releases(rng):
    a = rand(rng, (6, 5))
    product = oocgemm.Product(a, a.T, device="cpu")
    product.execute()
    with pytest.raises(oocgemm.OptionError, match="closed"):
        product.execute()
    cuda_kernel = oocgemm.Product(a, a.T, device="cpu", kernel="dmma")
    with pytest.raises(oocgemm.OptionError, match="CUDA kernel"):
        cuda_kernel.plan()
    assert cuda_kernel.closed


def test_options_come_as_an_object_a_dict_or_keywords(rng):
    a, b = rand(rng, (20, 10)), rand(rng, (10, 30))
    given = Options.of("here", device="cpu", tile=(8, 8, 8))
    for product in (oocgemm.Product(a, b, options=given),
                    oocgemm.Product(a, b, options={"device": "cpu", "tile": "8x8x8"}),
                    oocgemm.Product(a, b, device="cpu", tile=[8, 8, 8]),
                    oocgemm.Product(a, b, options=given, tile=(8, 8, 4))):
        with product:
            assert product.options.device == "cpu" and product.plan().tile[:2] == (8, 8)
    with pytest.raises(oocgemm.OptionError, match=r"unknown options \['tiles'\]"):
        oocgemm.Product(a, b, tiles=(8, 8, 8))


def test_multiply_takes_each_option_of_the_one_definition():
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    for func in (oocgemm.multiply, oocgemm.plan):
        params = inspect.signature(func).parameters
        keywords = {name: p.default for name, p in params.items() if p.kind == p.KEYWORD_ONLY}
        assert keywords == {"c": None, "alpha": 1.0, "beta": 0.0, "trans_a": False,
                            "trans_b": False, **fields}
    assert set(PLANS) | set(RUN_ONLY) == set(fields) and not set(PLANS) & set(RUN_ONLY)


def test_the_command_line_flags_come_from_the_one_definition():
    from oocgemm import cli

    defined = {name: spec for name, _, spec in on_the_command_line()}
    terms = {"a", "b", "out", "alpha", "beta", "c", "trans_a", "trans_b"}
    layout = {"out_chunks", "out_shards", "out_compressor", "zarr_format"}  # out_options
    reporting = {"quiet", "as_json", "timeline_path", "plot_path"}
    for command, options, own in ((cli.multiply, PLANS + RUN_ONLY, reporting),
                                  (cli.plan, PLANS, {"overwrite", "quiet", "as_json"})):
        params = {p.name: p for p in command.params}
        flagged = {name for name in defined if name in options}
        assert set(params) == terms | layout | own | flagged, command.name
        for name in flagged - own:
            assert tuple(params[name].opts) == defined[name]["flags"]
            assert params[name].help == defined[name]["help"]


def test_small_products_of_one_shape_plan_once_and_each_runs_on_its_own_data(rng):
    """A loop of small products: the second of the same shape, scalars and budgets gets the
    first's plan (the same object: its schedule is built once); each result is its own."""
    m, n, k = 67, 41, 53
    plans = []
    for beta in (0.0, 0.0, 0.5, 0.5):
        a, b, c = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n))
        out = poisoned((m, n))
        result = oocgemm.multiply(a, b, out, c=c, alpha=-2.0, beta=beta, device="cpu",
                                  progress=False)
        assert_gemm(out, a, b, c, alpha=-2.0, beta=beta)
        plans.append(result.plan)
    assert plans[0].n_blocks == 1
    assert plans[1] is plans[0] and plans[3] is plans[2]
    assert plans[2] is not plans[0] and plans[2].problem.beta == 0.5  # beta: another plan
    other = oocgemm.plan(rand(rng, (m + 1, k)), rand(rng, (k, n)), device="cpu")
    assert other is not plans[0] and other.problem.m == m + 1


def test_plans_of_many_blocks_are_made_each_time(rng):
    """Only plans of one C block and one K panel are kept: the others are made anew."""
    a, b = rand(rng, (90, 70)), rand(rng, (70, 80))
    first, second = (oocgemm.plan(a, b, device="cpu", tile=(32, 32, 32)) for _ in range(2))
    assert first.n_blocks > 1
    assert first == second and first is not second


def test_the_plan_cache_keeps_the_last_few():
    from oocgemm.planning.planner import PlanCache

    cache = PlanCache(size=2)
    plans = [object(), object(), object()]
    for key, plan in zip("xyz", plans):
        cache.put(key, plan)
        cache.get("x")  # used again: kept, while y is the oldest unused
    assert cache.get("x") is plans[0] and cache.get("y") is None and cache.get("z") is plans[2]
    assert cache.get(None) is None

"""The process's settings (oocgemm.settings, in the manner of zarr.config): the environment is
their default, code sets them for good or for a block, values are checked by name; the options
gpu_decode= and gpu_encode= take them as their defaults and reach the plan."""

from __future__ import annotations

import dataclasses
import importlib
import json

import numpy as np
import pytest
from _helpers import cli, rand

import oocgemm
from oocgemm import settings
from oocgemm.options import Options

VARIABLES = {name: s.env for name, s in settings.SETTINGS.items()}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No OOCGEMM_* setting in the environment, none set in code (before and after)."""
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    settings.reset()
    yield
    settings.reset()


def test_the_defaults():
    assert {name: settings.get(name) for name in settings.SETTINGS} == {
        "gpu_decode": "auto", "gpu_encode": True, "kernels": None, "nvcomp": None}
    assert oocgemm.settings is importlib.import_module("oocgemm.settings")


@pytest.mark.parametrize("name, raw, value", [
    ("gpu_decode", "0", False), ("gpu_decode", "1", True), ("gpu_decode", "auto", "auto"),
    ("gpu_decode", "OFF", False), ("gpu_decode", " on ", True), ("gpu_decode", "", "auto"),
    ("gpu_encode", "0", False), ("gpu_encode", "1", True), ("gpu_encode", "last", "last"),
    ("gpu_encode", "frames", "frames"), ("gpu_encode", "off", False), ("gpu_encode", "", True),
    ("kernels", "/some/folder", "/some/folder"), ("nvcomp", "/lib/libnvcomp.so.5",
                                                  "/lib/libnvcomp.so.5"),
])
def test_the_environment_is_the_default(monkeypatch, name, raw, value):
    """Read at each get: a variable set after import counts; an empty one is unset."""
    monkeypatch.setenv(VARIABLES[name], raw)
    assert settings.get(name) == value


@pytest.mark.parametrize("name, raw", [
    ("gpu_decode", "yes"), ("gpu_decode", "last"), ("gpu_encode", "auto"),
    ("gpu_encode", "2"),
])
def test_a_variable_the_setting_does_not_take_is_refused_by_name(monkeypatch, name, raw):
    monkeypatch.setenv(VARIABLES[name], raw)
    with pytest.raises(oocgemm.OptionError) as caught:
        settings.get(name)
    message = str(caught.value)
    assert message.startswith(f"{VARIABLES[name]}={raw!r}: {name} takes ")
    assert ("'auto', True ('on', '1') or False ('off', '0')" if name == "gpu_decode"
            else "True ('on', '1'), False ('off', '0'), 'last' or 'frames'") in message


def test_set_replaces_the_environment_for_good_or_for_a_block(monkeypatch):
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "0")
    assert settings.get("gpu_encode") is False
    with settings.set(gpu_encode="last", gpu_decode=np.bool_(False)):
        assert settings.get("gpu_encode") == "last" and settings.get("gpu_decode") is False
        with settings.set(gpu_encode=True):
            assert settings.get("gpu_encode") is True
        assert settings.get("gpu_encode") == "last"
    assert settings.get("gpu_encode") is False and settings.get("gpu_decode") == "auto"
    settings.set(gpu_decode="on")  # for good
    assert settings.get("gpu_decode") is True
    settings.set(gpu_decode=None)  # unset: the environment's, or the default, again
    assert settings.get("gpu_decode") == "auto"


@pytest.mark.parametrize("values, match", [
    ({"gpu_decode": "yes"}, r"gpu_decode='yes': gpu_decode takes 'auto', True"),
    ({"gpu_encode": 1}, r"gpu_encode=1: gpu_encode takes True \('on', '1'\)"),
    ({"kernels": 3}, "kernels=3: kernels takes a folder"),
    ({"gpu_decoding": True}, "unknown setting 'gpu_decoding'; the settings are gpu_decode, "
                             "gpu_encode, kernels, nvcomp"),
])
def test_set_refuses_what_a_setting_does_not_take(values, match):
    with pytest.raises(oocgemm.OptionError, match=match):
        settings.set(**values)
    assert settings.get("gpu_decode") == "auto"  # nothing was set


# -- the options ------------------------------------------------------------------------------
def test_the_options_are_normalised():
    o = Options.of("here", gpu_decode="off", gpu_encode="on")
    assert (o.gpu_decode, o.gpu_encode) == (False, True)
    assert Options.of("here", gpu_decode="auto", gpu_encode="frames").keywords() == {
        "gpu_decode": "auto", "gpu_encode": "frames"}
    assert Options.of("here", gpu_decode=np.bool_(True)).gpu_decode is True
    assert Options.of("here").keywords() == {}  # None: the setting's, when the plan is made


@pytest.mark.parametrize("bad, match", [
    ({"gpu_decode": "yes"}, r"gpu_decode='yes': gpu_decode takes 'auto', True \('on', '1'\) "
                            r"or False \('off', '0'\) \(default 'auto'\)"),
    ({"gpu_decode": 1}, "gpu_decode=1: gpu_decode takes"),
    ({"gpu_encode": "auto"}, r"gpu_encode='auto': gpu_encode takes True \('on', '1'\), False "
                             r"\('off', '0'\), 'last' or 'frames' \(default True\)"),
])
def test_bad_values_are_refused_by_every_entry_point(rng, bad, match):
    a = rand(rng, (8, 6))
    with pytest.raises(oocgemm.OptionError, match=match):
        Options.of("here", **bad)
    with pytest.raises(oocgemm.OptionError, match=match):
        oocgemm.multiply(a, a.T, device="cpu", **bad)
    with pytest.raises(oocgemm.OptionError, match=match):
        oocgemm.Engine(device="cpu", **bad)


def cuda_options(**given):
    """The options of a CUDA plan after gpu_coding (who decodes and encodes), made here."""
    from oocgemm.product import gpu_coding

    options, notes = gpu_coding(Options.of("here", **given), gpu=True)
    assert notes == ()
    return options.gpu_decode, options.gpu_encode


def test_an_option_given_replaces_its_setting(monkeypatch):
    """A GPU run's plan takes the option where given, else the setting (the environment's,
    else the default)."""
    assert cuda_options() == ("auto", True)
    monkeypatch.setenv("OOCGEMM_GPU_DECODE", "0")
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "last")
    assert cuda_options() == (False, "last")
    assert cuda_options(gpu_decode="auto", gpu_encode=False) == ("auto", False)
    with settings.set(gpu_encode="frames"):
        assert cuda_options() == (False, "frames")
        assert cuda_options(gpu_encode="on") == (False, True)


def test_a_cuda_plan_carries_who_encodes_and_plans_apart(rng, workdir, monkeypatch):
    """The plan of a GPU run (made here without one) says who encodes C, which the CUDA
    executor reads (not the environment); the kept plans of small products are told apart
    by it."""
    from oocgemm.backends import backend_of
    from oocgemm.devices import Device
    from oocgemm.lifecycle.run import open_run
    from oocgemm.planning import Problem, cuda_model
    from oocgemm.planning.planner import Facts, _plan_key, plan_product
    from oocgemm.product import gpu_coding

    a, b = rand(rng, (64, 48)), rand(rng, (48, 32))
    with open_run(a, b, None) as io:
        m, n, k = io.shape
        op_a, op_b, op_c, op_out = io.operands()
    problem = Problem(m=m, n=n, k=k, itemsize=8, dtype="float64", a=op_a, b=op_b, c=op_c,
                      out=op_out, alpha=1.0, beta=0.0)
    model = cuda_model()
    staging = backend_of("cuda").staging(problem, model, "cublas")

    def planned(**given):
        coding, _ = gpu_coding(Options.of("here", **given), gpu=True)
        facts = Facts(device=Device("cuda", 0), kernel="cublas", model=model, memory_limit=1 << 30,
                      host_memory_limit=1 << 30, staging=staging, gpu_encode=coding.gpu_encode)
        return plan_product(problem, facts), _plan_key(problem, facts)

    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "0")
    (unset, _), (gpu, key_gpu), (host, key_host) = (
        planned(), planned(gpu_encode=True), planned(gpu_encode=False))
    assert (unset.io.gpu_encode, gpu.io.gpu_encode, host.io.gpu_encode) == (False, True, False)
    assert gpu.summary()["gpu_encode"] is True and key_gpu != key_host
    json.dumps(gpu.summary())


def test_on_the_cpu_the_host_decodes_and_encodes_and_the_plan_notes_a_gpu_asked_for(
        rng, workdir, monkeypatch):
    """On the CPU, gpu_decode=True and gpu_encode='on' are no error (a script's device='auto'
    may land on either): the host decodes and encodes, and the plan says so. The
    environment's default asks for nothing: no note."""
    a, b = rand(rng, (30, 20)), rand(rng, (20, 10))
    plan = oocgemm.plan(a, b, device="cpu", gpu_decode=True, gpu_encode="on")
    assert plan.io.gpu_encode is False and plan.io.gpu_decode == ()
    assert plan.notes[-1] == ("gpu_decode=True and gpu_encode=True ask for a GPU; on the CPU "
                              "the host decodes the inputs and encodes C")
    assert "ask for a GPU" in str(plan)
    assert "gpu_encode='last' asks for a GPU" in oocgemm.plan(
        a, b, device="cpu", gpu_encode="last").notes[-1]
    result = oocgemm.multiply(a, b, "c.zarr", device="cpu", gpu_decode=True, gpu_encode=True,
                              out_options={"compressors": "zstd"})
    np.testing.assert_allclose(np.asarray(result), a @ b, rtol=1e-12)
    assert result.out_encoder is None
    monkeypatch.setenv("OOCGEMM_GPU_DECODE", "1")
    monkeypatch.setenv("OOCGEMM_GPU_ENCODE", "1")
    for quiet in (oocgemm.plan(a, b, device="cpu"),
                  oocgemm.plan(a, b, device="cpu", gpu_decode="auto", gpu_encode=False)):
        assert not any("GPU" in note for note in quiet.notes) and quiet.io.gpu_encode is False


def test_the_flags_reach_the_plan(rng, workdir):
    from oocgemm.cli import main

    run, fails = cli(main)
    np.save("a.npy", rand(rng, (30, 20)))
    np.save("b.npy", rand(rng, (20, 10)))
    got = json.loads(run("plan", "a.npy", "b.npy", "--device", "cpu", "--gpu-decode", "on",
                         "--gpu-encode", "frames", "--json").stdout)
    assert got["gpu_encode"] is False and got["gpu_decode"] == []
    assert got["notes"][-1].startswith("gpu_decode=True and gpu_encode='frames' ask for a GPU")
    got = json.loads(run("plan", "a.npy", "b.npy", "--device", "cpu", "--gpu-decode", "off",
                         "--gpu-encode", "off", "--json").stdout)
    assert not any("GPU" in note for note in got["notes"])
    assert "'maybe' is not one of 'auto', 'on', 'off'" in fails(
        "plan", "a.npy", "b.npy", "--gpu-decode", "maybe")
    assert "'auto' is not one of 'on', 'off', 'last', 'frames'" in fails(
        "multiply", "a.npy", "b.npy", "-o", "c.npy", "--gpu-encode", "auto")


def test_who_decodes_and_encodes_does_not_hold_a_resume_back(rng):
    """C's values do not depend on who decodes the inputs or encodes C (the journal's
    checksums are of the values; a chunk stored from frames is checked by decoding it): a
    run resumed with other gpu_decode or gpu_encode finishes the interrupted one. The
    fingerprint and the schedule's key leave them out."""
    from oocgemm.lifecycle.resume import differences, fingerprint, schedule_key

    a, b = rand(rng, (30, 20)), rand(rng, (20, 10))
    plan = oocgemm.plan(a, b, device="cpu", tile=(16, 8, 8))
    other = dataclasses.replace(plan, io=dataclasses.replace(plan.io, gpu_encode="last"))
    assert not differences(schedule_key(plan), schedule_key(other))
    assert not differences(fingerprint(plan, {}, "c.zarr", False, {}),
                           fingerprint(other, {}, "c.zarr", False, {}))

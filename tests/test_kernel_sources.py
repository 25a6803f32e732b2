"""The kernels of kernels/ without a GPU: every instance compiles with nvcc for sm_80 and sm_90,
the plain instances do not spill, and dmma's machine code holds FP64 tensor-core instructions.
Skipped where nvcc is not on the PATH. The GPU tests run them (tests/test_gpu_kernels.py).

A build that several tests need (the plain build of a kernel: its own test, the measuring
builds' comparison, the dmma SASS test) is compiled once per test run, by whichever test gets
there first, and shared through the ``builds`` folder (all pytest-xdist workers of the run see
it); each build is named by a hash of everything that goes into it, source and command line."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from oocgemm import kernel_catalog as catalog
from oocgemm.errors import OptionError

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
ARCHS = ("sm_80", "sm_90")


def _instances(spec: catalog.KernelSpec) -> list[tuple[str, str]]:
    """(template expression, explicit instantiation) for every dtype x transposes x VEC."""
    out = []
    for dtype, ta, tb, vec in itertools.product(spec.dtypes, (False, True), (False, True),
                                                (False, True)):
        expr = spec.expression(dtype, ta, tb, vec)
        t = {"float64": "double", "float32": "float"}[dtype]
        out.append((expr, f"template __global__ void {expr}(int, int, int, {t}, const {t}*, int, "
                          f"const {t}*, int, {t}, {t}*, int);"))
    return out


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> Path:
    """A folder of this test run's nvcc builds, shared by its pytest-xdist workers (the
    parent of each worker's base folder is the run's)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "nvcc-builds"
    folder.mkdir(exist_ok=True)
    return folder


def _compile(spec, arch: str, tmp_path: Path, builds: Path, defines=()) -> tuple[Path, str]:
    """Compile the source with all its instances to a cubin; returns it (in ``tmp_path``) and
    ptxas's report. A build already made in this run with the same source, nvcc and options
    (in ``builds``) is copied instead of compiled again."""
    tag = "".join(f"_{k}{v}" for k, v in defines)
    src = tmp_path / f"{spec.name}_{arch}{tag}.cu"
    src.write_text(catalog.source_text(spec) + "\n"
                   + "\n".join(inst for _, inst in _instances(spec)) + "\n")
    cubin = tmp_path / f"{spec.name}_{arch}{tag}.cubin"
    options = ["-std=c++17", f"-arch={arch}", "-cubin", "-Xptxas", "-v",
               *(f"-D{k}={v}" for k, v in defines)]
    key = hashlib.sha256("\0".join([os.path.realpath(NVCC), *options, src.read_text()])
                         .encode()).hexdigest()[:32]
    done, report = builds / f"{key}.cubin", builds / f"{key}.ptxas"
    if report.exists():  # written last: the cubin beside it is whole
        shutil.copyfile(done, cubin)
        return cubin, report.read_text()
    proc = subprocess.run([NVCC, *options, "-o", str(cubin), str(src)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    for path, write in ((done, lambda p: shutil.copyfile(cubin, p)),
                        (report, lambda p: p.write_text(proc.stderr))):
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        write(partial)
        os.replace(partial, path)  # atomic: another worker may publish the same build
    return cubin, proc.stderr


def _cubin(src: Path, arch: str, folder: Path) -> dict[str, dict]:
    """``src`` built alone for ``arch``: its ptxas figures per function (:func:`_report`)."""
    proc = subprocess.run([NVCC, "-std=c++17", f"-arch={arch}", "-cubin", "-Xptxas", "-v",
                           "-o", str(folder / (src.stem + ".cubin")), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return _report(proc.stderr)


def _report(ptxas: str) -> dict[str, dict]:
    """ptxas -v figures per mangled function name."""
    out: dict[str, dict] = {}
    current = None
    for line in ptxas.splitlines():
        m = re.search(r"Function properties for (\S+)", line) or re.search(
            r"Compiling entry function '(\S+)'", line)
        if m:
            current = out.setdefault(m.group(1), {})
        elif current is not None:
            if (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)):
                current["stack"], current["spills"] = int(m.group(1)), int(m.group(2))
            if (m := re.search(r"Used (\d+) registers", line)):
                current["registers"] = int(m.group(1))
    return out


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(catalog.KERNELS))
def test_every_instance_compiles(name, arch, tmp_path, builds):
    spec = catalog.KERNELS[name]
    _, ptxas = _compile(spec, arch, tmp_path, builds)
    report = _report(ptxas)
    assert len(report) == len(_instances(spec)), ptxas
    # The instance the pipeline runs most (double, no transposes, 16-byte access) must keep
    # everything in registers.
    plain = [v for k, v in report.items() if "Lb0ELb0ELb1E" in k and "IdL" in k]
    assert plain and all(v["spills"] == 0 and v["stack"] == 0 for v in plain), report


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_throughput_kernels_compile(arch, tmp_path):
    """benchmarks/kernels/fma_peak.cu (the FMA peak and fma_outer, in both precisions)
    compiles, keeps everything in registers, and holds each kernel that benchmarks.fma
    launches (it imports CuPy, so the path is spelled out here)."""
    report = _cubin(Path(__file__).resolve().parents[1] / "benchmarks" / "kernels" /
                    "fma_peak.cu", arch, tmp_path)
    assert set(report) == {"fma_peak_f64", "fma_peak_f32", "fma_peak_chains", "fma_outer_f64",
                           "fma_outer_f32", "fma_outer_shape"}, report
    assert all(v["spills"] == 0 and v["stack"] == 0 for v in report.values()), report


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_ozaki_kernels_compile(arch, tmp_path):
    """kernels/ozaki.cu (the elementwise steps of Ozaki scheme II, not a kernel= choice of the
    catalog) compiles with the kernels oocgemm.cuda.ozaki launches, everything in registers.
    tests/test_ozaki.py runs its element functions on the CPU."""
    from oocgemm.kernel_catalog import kernels_dir

    report = _cubin(Path(str(kernels_dir())) / "ozaki.cu", arch, tmp_path)
    finish = {f"ozaki_finish{n}" for n in (16, 24, 32, 36)}  # oocgemm.cuda.ozaki.FINISH
    assert set(report) == {"ozaki_stats_rows", "ozaki_stats_cols", "ozaki_residues"} | finish, \
        report
    assert all(v["spills"] == 0 and v["stack"] == 0 for v in report.values()), report


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_symmetric_kernels_compile(arch, tmp_path):
    """kernels/symmetric.cu: the MIRROR of a symmetric product, one kernel per element size
    (oocgemm.cuda.context.mirror_kernel launches mirror_lower_<itemsize>)."""
    from oocgemm.kernel_catalog import kernels_dir

    report = _cubin(Path(str(kernels_dir())) / "symmetric.cu", arch, tmp_path)
    assert set(report) == {"mirror_lower_4", "mirror_lower_8", "mirror_lower_16"}, report
    assert all(v["spills"] == 0 and v["stack"] == 0 for v in report.values()), report


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_frames_kernel_compiles(arch, tmp_path):
    """kernels/frames.cu: the packing of a stripe's compressed frames that
    oocgemm.cuda.nvcomp.StripeEncoder launches (pack_frames), everything in registers."""
    from oocgemm.kernel_catalog import kernels_dir

    report = _cubin(Path(str(kernels_dir())) / "frames.cu", arch, tmp_path)
    assert set(report) == {"pack_frames"}, report
    assert all(v["spills"] == 0 and v["stack"] == 0 for v in report.values()), report


@needs_nvcc
@pytest.mark.parametrize("tag", ["l1", "loop"])
@pytest.mark.parametrize("name", ["opt", "regblock"])
def test_measuring_builds_compile(name, tag, tmp_path, builds):
    """The builds of `python -m benchmarks power` compile for every instance, and differ from
    the product's build (the define reaches the code)."""
    from benchmarks.kernel_rates import BOUNDED_KERNELS, KERNEL_BOUNDS

    assert name in BOUNDED_KERNELS
    macro, value, _ = KERNEL_BOUNDS[tag]
    spec = catalog.KERNELS[name]
    cubin, ptxas = _compile(spec, "sm_90", tmp_path, builds, ((macro, value),))
    assert len(_report(ptxas)) == len(_instances(spec)), ptxas
    plain, _ = _compile(spec, "sm_90", tmp_path, builds)
    assert cubin.read_bytes() != plain.read_bytes()


def _sass_tool() -> str | None:
    """cuobjdump, from the PATH or the nvidia-cuda-cuobjdump wheel (with nvdisasm beside it)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        for cand in Path(root).glob("cu*/bin/cuobjdump"):
            if (cand.parent / "nvdisasm").exists():
                return str(cand)
    return None


@needs_nvcc
def test_dmma_runs_on_fp64_tensor_cores(tmp_path, builds):
    tool = _sass_tool()
    if tool is None:
        pytest.skip("cuobjdump/nvdisasm not installed (the test extra brings them)")
    for arch, instruction in (("sm_80", "DMMA.884"), ("sm_90", "DMMA.16x8x8")):
        cubin, _ = _compile(catalog.KERNELS["dmma"], arch, tmp_path, builds)
        env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True,
                              env=env, check=True).stdout
        assert instruction in sass, f"no {instruction} in the {arch} SASS of dmma"


@pytest.mark.parametrize("name", list(catalog.KERNELS))
def test_catalog_matches_the_launch_comment(name):
    """The launch shape in the catalog is the one the source documents."""
    spec = catalog.KERNELS[name]
    text = catalog.source_text(spec)
    assert re.search(rf"\b{spec.function}\s*\(", text)
    launch = text[text.index("// launch:"):][:400]
    assert f"block = ({spec.threads[0]}, {spec.threads[1]}, 1)" in launch
    assert f"{spec.tile[0]} x {spec.tile[1]}" in launch


@pytest.mark.parametrize("kernel,dtype,why", [
    ("bogus", "float64", "unknown kernel"),
    ("dmma", "float32", "multiplies float64"),
    ("regblock", "complex128", "not complex128"),
    (3, "float64", "unknown kernel"),
])
def test_check_kernel_errors(kernel, dtype, why):
    with pytest.raises(OptionError, match=why):
        catalog.check_kernel(kernel, np.dtype(dtype))


def test_check_kernel_normalises():
    assert catalog.check_kernel(None, np.dtype("float64")) == "cublas"
    assert catalog.check_kernel(" DMMA ", np.dtype("float64")) == "dmma"


def test_cuda_kernel_on_the_cpu_is_an_error(rng):
    import oocgemm

    a, b = rng.standard_normal((20, 10)), rng.standard_normal((10, 5))
    with pytest.raises(OptionError, match="CUDA kernel"):
        oocgemm.multiply(a, b, device="cpu", kernel="regblock")

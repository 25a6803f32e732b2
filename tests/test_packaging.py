"""The wheel, built from a clean copy of this checkout: it carries the CUDA sources of kernels/
and py.typed, and once installed the package finds its kernels inside itself. On a GPU, a
product with kernel="dmma" runs from the installed wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from oocgemm import cuda

ROOT = Path(__file__).resolve().parents[1]
#: What a clean copy leaves out: version control, build outputs, caches, test data. The
#: caches matter under pytest-xdist too: another worker may be rewriting one (mypy's, in
#: tests/test_tooling.py) while this copy is made.
IGNORED = shutil.ignore_patterns(".git", ".whl", ".venv", "build", "dist", "*.egg-info",
                                 "__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache",
                                 ".mypy_cache", ".benchmarks", "*.zarr", "*.npy")


def _setuptools_can_build() -> bool:
    """The installed setuptools meets pyproject's build requirement (and builds wheels itself),
    so the wheel is built offline; else pip builds it in an isolated environment."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a clean copy of the checkout, installed in a folder of its own;
    returns that folder (the wheel lies beside it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, target = tmp / "src", tmp / "dist", tmp / "site"
    shutil.copytree(ROOT, src, ignore=IGNORED)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
               "--disable-pip-version-check", "-w", str(dist), str(src)]
    if _setuptools_can_build():
        command.insert(4, "--no-build-isolation")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = dist.glob("oocgemm-*.whl")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _python(site: Path, code: str, cwd: Path) -> str:
    """Run ``code`` with the installed package first on the path (not this checkout's) and
    return its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(site)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    env.pop("OOCGEMM_KERNELS", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_wheel_carries_the_kernel_sources_and_py_typed(installed):
    (wheel,) = installed.parent.glob("dist/oocgemm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in (ROOT / "kernels").iterdir() if p.suffix in (".cu", ".cuh"))
    assert sources and "dmma.cu" in sources and "pairs.cuh" in sources
    assert {f"oocgemm/_kernels/{name}" for name in sources} <= names, sorted(names)
    assert "oocgemm/py.typed" in names
    assert not any(n.startswith(("benchmarks/", "tests/", "kernels/")) for n in names)
    assert not any(n.endswith("fma_peak.cu") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names)


@pytest.mark.slow
def test_installed_package_loads_its_kernels_from_itself(installed, tmp_path):
    out = _python(installed, """
        import json, oocgemm
        from oocgemm import kernel_catalog as catalog
        folder = catalog.kernels_dir()
        text = catalog.source_text(catalog.KERNELS["dmma"])
        print(json.dumps({"package": oocgemm.__file__, "folder": str(folder),
                          "spliced": "pairs.cuh" in text and "#include" not in text}))
        """, cwd=tmp_path)
    got = json.loads(out)
    package = Path(got["package"]).parent
    assert package == installed / "oocgemm"
    assert Path(got["folder"]) == package / "_kernels"
    assert got["spliced"]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)")
def test_installed_wheel_runs_a_dmma_product(installed, tmp_path):
    out = _python(installed, """
        import json
        import numpy as np
        import oocgemm
        from oocgemm import kernel_catalog as catalog
        rng = np.random.default_rng(7)
        a, b = rng.standard_normal((300, 200)), rng.standard_normal((200, 250))
        r = oocgemm.multiply(a, b, device="cuda", kernel="dmma", tile=(128, 128, 64))
        error = float(np.abs(r.out - a @ b).max() / np.abs(a @ b).max())
        print(json.dumps({"package": oocgemm.__file__, "folder": str(catalog.kernels_dir()),
                          "kernel": r.plan.kernel, "blocks": r.plan.n_blocks,
                          "error": error}))
        """, cwd=tmp_path)
    got = json.loads(out)
    assert Path(got["package"]).parent == installed / "oocgemm"
    assert Path(got["folder"]) == installed / "oocgemm" / "_kernels"
    assert got["kernel"] == "dmma" and got["blocks"] > 1
    assert got["error"] < 1e-12


@pytest.mark.parametrize("cuda", ["12", "13"])
def test_each_cuda_extra_installs_nvcomp_for_its_cuda(cuda):
    """The default zstd output is compressed on the GPU only with nvCOMP: ``pip install
    'oocgemm[cuda13]'`` brings the libnvcomp wheel of that CUDA (oocgemm/cuda/nvcomp.py)."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    names = [req.split(">")[0].split("=")[0].split(";")[0].strip()
             for req in extras[f"cuda{cuda}"]]
    assert f"nvidia-libnvcomp-cu{cuda}" in names and f"cupy-cuda{cuda}x" in names


def test_ci_installs_no_cuda_extra():
    """CI's machine has no GPU: .ci/run installs the test extras only, never a CUDA one."""
    script = (ROOT / ".ci" / "run").read_text()
    installs = [line for line in script.splitlines() if "pip install" in line or "'.[" in line]
    assert installs and all("cuda" not in line for line in installs)

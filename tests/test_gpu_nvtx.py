"""The NVTX ranges of a GPU product reach a profiler: CUPTI, injected as the NVTX handler (the
way Nsight Systems is, NVTX_INJECTION64_PATH), records one range per block operation, in the
``oocgemm`` domain, named by kind, nested per thread, as many as ``result.events``.

Runs tests/nvtx_cupti_probe.py (its docstring says how) in subprocesses: NVTX reads the
injection path once per process, at its first call. Skipped without a CUDA GPU, without
cupti-python (``pip install cupti-python``, which needs the ``nvidia-cuda-cupti`` wheel of the
same CUDA major version), or where cupti-python cannot load libcupti."""

from __future__ import annotations

import importlib.util

import pytest
from nvtx_cupti_probe import probe

from oocgemm import cuda

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(cuda.device_count() == 0, reason="no CUDA GPU (or no CuPy)"),
    pytest.mark.skipif(importlib.util.find_spec("cupti") is None,
                       reason="cupti-python is not installed"),
]


# '': the backend oocgemm picks by itself (the nvtx package where it is installed); 'lib': the
# NVTX C library through ctypes, what it falls back on.
@pytest.mark.parametrize("backend", ["", "lib"])
def test_every_block_operation_is_an_nvtx_range_under_cupti(backend):
    # 2048 x 2048 float64 in 1024-tiles: 2 x 2 C blocks of 2 K panels, a few dozen operations
    result = probe(size=2048, tile=1024, backend=backend)
    if result["status"] == "missing":
        pytest.skip(f"no CUPTI to be had: {result['problems'][0]}")
    if result["status"] == "unavailable":
        pytest.skip(f"backend {backend!r} cannot be had here: {result['data']['reason']}")
    print(result["summary"])
    assert result["problems"] == [], result["summary"]
    data = result["data"]
    assert data["same_cupti"] and data["backend"] in ("nvtx", "lib")
    assert len(data["events"]) == data["plan"]["ops"] > 0

"""Ozaki scheme II on the GPU: float64 products from int8 tensor-core GEMMs (issue 21).

The steps of :mod:`oocgemm.ozaki` (the CPU reference), run by the kernels of
``kernels/ozaki.cu`` and cuBLAS's int8 GEMM, so that a block's product has the CPU
reference's bits:

1. ``ozaki_stats_rows`` / ``ozaki_stats_cols``: each row of an A panel (column of a B panel),
   its largest exponent, and the panel's exponent spread and whether it holds infinities or
   NaN (read back: the host decides the bits and moduli, or native DGEMM);
2. ``ozaki_residues``: the panel scaled to integers and reduced modulo each modulus, int8,
   laid out K-contiguous (A as rows x K, B as columns x K) with K padded to 16, which is
   the layout cuBLAS's fastest int8 kernels take (``T``, ``N``);
3. one batched cuBLAS ``GemmStridedBatchedEx`` (int8 x int8 -> int32), a product per
   modulus, for a chunk of C's rows;
4. ``ozaki_finish``: per element of C, Garner's digits from the int32 products, the one
   rounding, and ``alpha``/``beta`` applied as the CPU executor applies them.

Converted panels are kept per device slot while the slot holds the same panel, so an A or B
panel is converted once for every GEMM that reads it (:class:`Emulator`).
"""

from __future__ import annotations

import numpy as np
from cupy_backends.cuda.libs import cublas

#: cudaDataType and cublasComputeType_t values of the int8 GEMM.
CUDA_R_8I, CUDA_R_32I = 3, 10
COMPUTE_32I = 72
GEMM_DEFAULT = -1

#: K of the residues is padded to this many elements (zeros), and C's columns in the int32
#: products to a multiple of 4: 16-byte rows, what cuBLAS's int8 tensor-core kernels want.
K_ALIGN = 16
N_ALIGN = 4

_ONE, _ZERO = np.ones(1, np.int32), np.zeros(1, np.int32)


def padded(n: int, align: int) -> int:
    return -(-n // align) * align


def int8_gemm(handle: int, a_ptr: int, b_ptr: int, c_ptr: int, rows: int, cols: int, depth: int,
              *, lda: int, ldb: int, ldc: int, stride_a: int, stride_b: int, stride_c: int,
              batch: int) -> None:
    """``batch`` exact products ``C[l] = A[l] @ B[l]^T`` in int32, on the handle's stream.

    Row-major int8 ``A[l]`` is ``rows x depth`` (leading dimension ``lda``), ``B[l]`` is
    stored ``cols x depth`` (its K contiguous, ``ldb``), and int32 ``C[l]`` is ``rows x cols``
    (``ldc``); ``stride_*`` are elements between consecutive ``l``. Column-major, cuBLAS sees
    ``C^T = B A^T``: its ``T, N`` form, with B first.
    """
    cublas.gemmStridedBatchedEx(
        handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, cols, rows, depth,
        _ONE.ctypes.data, b_ptr, CUDA_R_8I, ldb, stride_b,
        a_ptr, CUDA_R_8I, lda, stride_a,
        _ZERO.ctypes.data, c_ptr, CUDA_R_32I, ldc, stride_c, batch, COMPUTE_32I, GEMM_DEFAULT)

// naive_gemm: the reference kernel. One thread computes one element of C by walking
// the whole K dimension through global memory: C = alpha * op(A) @ op(B) + beta * C.
//
// launch: block = (16, 16, 1) threads; one block per 16 x 16 tile of C; grid = (ceil(N / 16), ceil(M / 16), 1); dynamic shared memory = 0 bytes
//
// Row-major operands (numpy order):
//   C(i, j) = C[i * ldc + j]                                  (M x N)
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]         (M x K)
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]         (K x N)
// When beta == 0, C is only written, never read (it may hold NaN).
// VEC is accepted for the common interface and ignored: every access is a scalar one.
//
// Self-contained on purpose: it is compiled at run time by NVRTC, which has no headers.

constexpr int NAIVE_BX = 16;  // threads along N (columns of C)
constexpr int NAIVE_BY = 16;  // threads along M (rows of C)
constexpr int NAIVE_THREADS = NAIVE_BX * NAIVE_BY;

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(NAIVE_THREADS) naive_gemm(int M, int N, int K, T alpha,
    const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
    T beta, T* __restrict__ C, int ldc)
{
    const int i = blockIdx.y * NAIVE_BY + threadIdx.y;  // row of C
    const int j = blockIdx.x * NAIVE_BX + threadIdx.x;  // column of C
    if (i >= M || j >= N) return;

    // Step between consecutive k along row i of op(A) and column j of op(B).
    const long long a_step = TA ? lda : 1;
    const long long b_step = TB ? 1 : ldb;
    const T* a = A + (TA ? (long long)i : (long long)i * lda);
    const T* b = B + (TB ? (long long)j * ldb : (long long)j);

    T sum = T(0);
    for (int k = 0; k < K; ++k) {
        sum += a[0] * b[0];
        a += a_step;
        b += b_step;
    }

    T* c = C + (long long)i * ldc + j;
    if (beta == T(0)) {
        *c = alpha * sum;
    } else {
        *c = alpha * sum + beta * *c;
    }
}

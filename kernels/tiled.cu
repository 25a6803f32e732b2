// tiled_gemm: the classic shared-memory tiling of the CUDA programming guide, the seed
// documents' "normal" kernel. A block of 32 x 32 threads owns a 32 x 32 tile of C, one
// element per thread. For each step of 32 along K, the block stages a 32 x 32 tile of
// op(A) and one of op(B) in shared memory, synchronises, and every thread accumulates
// its dot product from shared memory; each global element is then read once per block
// instead of once per thread. C = alpha * op(A) @ op(B) + beta * C.
//
// launch: block = (32, 32, 1) threads; one block per 32 x 32 tile of C; grid = (ceil(N / 32), ceil(M / 32), 1); dynamic shared memory = 0 bytes
//
// Row-major operands (numpy order):
//   C(i, j) = C[i * ldc + j]                                  (M x N)
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]         (M x K)
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]         (K x N)
// When beta == 0, C is only written, never read (it may hold NaN).
// VEC is accepted for the common interface and ignored: every access is a scalar one.
//
// Global loads are coalesced for either storage order: threadIdx.x always walks the
// contiguous dimension in memory, and a transposed operand is written transposed into
// its shared tile. Each shared row is padded by one element so that these column-wise
// stores (and the column reads of As in the product) do not pile into one bank.
// Elements outside op(A) or op(B) (ragged M, N or K) are staged as zeros.
//
// Self-contained on purpose: it is compiled at run time by NVRTC, which has no headers.

constexpr int TILE = 32;
constexpr int TILED_THREADS = TILE * TILE;

// S[a][b] = op(X)(r0 + a, c0 + b) for one thread's (a, b) of the tile, where op(X) is R x CN,
// stored X[r * ld + c], or X[c * ld + r] when TRANS; zero outside op(X). Thread (tx, ty)
// reads the element whose contiguous index is tx, so a warp reads 32 consecutive elements.
template <typename T, bool TRANS>
__device__ __forceinline__ void stage_tile(T (*S)[TILE + 1], const T* __restrict__ X, int ld,
                                           int r0, int c0, int R, int CN)
{
    const int a = TRANS ? threadIdx.x : threadIdx.y;
    const int b = TRANS ? threadIdx.y : threadIdx.x;
    const int r = r0 + a, c = c0 + b;
    const long long at = TRANS ? (long long)c * ld + r : (long long)r * ld + c;
    S[a][b] = (r < R && c < CN) ? X[at] : T(0);
}

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(TILED_THREADS) tiled_gemm(int M, int N, int K, T alpha,
    const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
    T beta, T* __restrict__ C, int ldc)
{
    __shared__ T As[TILE][TILE + 1];  // As[i][k] = op(A)(m0 + i, k0 + k)
    __shared__ T Bs[TILE][TILE + 1];  // Bs[k][j] = op(B)(k0 + k, n0 + j)

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int m0 = blockIdx.y * TILE;
    const int n0 = blockIdx.x * TILE;
    const int i = m0 + ty;  // this thread's element of C
    const int j = n0 + tx;

    T sum = T(0);
    for (int k0 = 0; k0 < K; k0 += TILE) {
        stage_tile<T, TA>(As, A, lda, m0, k0, M, K);  // op(A)(m0 .. m0+31, k0 .. k0+31)
        stage_tile<T, TB>(Bs, B, ldb, k0, n0, K, N);  // op(B)(k0 .. k0+31, n0 .. n0+31)
        __syncthreads();  // the tiles are complete

#pragma unroll
        for (int k = 0; k < TILE; ++k) {
            sum += As[ty][k] * Bs[k][tx];
        }
        __syncthreads();  // everyone is done reading before the next tiles overwrite them
    }

    if (i < M && j < N) {
        T* c = C + (long long)i * ldc + j;
        if (beta == T(0)) {
            *c = alpha * sum;
        } else {
            *c = alpha * sum + beta * *c;
        }
    }
}

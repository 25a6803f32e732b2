// opt_gemm: the seed paper's optimised mapping (section 3.2, figure 2), retuned for an
// H100 in double. C = alpha * op(A) @ op(B) + beta * C.
//
// launch: block = (128, 1, 1) threads; one block per 32 x 256 tile of C; grid = (ceil(N / 256), ceil(M / 32), 1); dynamic shared memory = 0 bytes
//
// Row-major operands (numpy order):
//   C(i, j) = C[i * ldc + j]                                  (M x N)
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]         (M x K)
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]         (K x N)
// When beta == 0, C is only written, never read (it may hold NaN).
// VEC == true promises 16-byte aligned A, B, C and lda, ldb, ldc multiples of 16 / sizeof(T):
// pairs of elements are then moved with one 2-element vector access (16 bytes in double).
//
// The seed's mapping. A block computes a w x h sub-block of C (w = OPT_W = 32 rows,
// h = 256 columns). A thread owns whole columns of that sub-block: the paper gives it one,
// here it owns OPT_COLS = 2 adjacent ones, j and j + 1, and keeps its w x 2 strip of C in
// registers. The columns of B that a thread needs are needed by no other thread of the
// block, so B never goes through shared memory: each thread streams B(k, j), B(k, j + 1)
// from global memory straight into registers. Only the w x r sub-block of A
// (r = OPT_R = 16), which every thread needs, is staged in shared memory; the loop walks
// K in steps of r:
//
//   for each r-step of K:  As = A(rows of the block, k .. k + r)      (shared memory)
//     for each k of the step:  b = B(k, j .. j + 1)                   (registers)
//       for each row i:        C(i, j .. j + 1) += As(i, k) * b       (registers)
//
// Retuning for the H100 in double:
// - Every thread reads the same As(i, k) at the same time, so each shared-memory load is
//   a warp-wide broadcast; As is stored k-major (As[k][i]) so that As(i, k) and
//   As(i + 1, k) come in one 16-byte load. With 2 columns per thread, one such load feeds
//   4 FMAs: w / 2 = 16 loads per 64 FMAs and per k.
// - B is prefetched OPT_D = 4 k-steps ahead into a small rotating register queue, so its
//   global latency hides behind the FMAs of the steps in between (the paper's 2008 GPU
//   relied on many resident threads instead).
// - As is double-buffered: the next r-step's A sub-block is loaded into registers before
//   the FMAs of the current one and written to the other buffer after them, so one
//   __syncthreads per r-step both publishes the new buffer and retires reads of the old.
//   Sub-blocks wholly inside op(A) (all but the edges) are loaded without guards.
// - 128 threads (h = 256) and at most 255 registers a thread let two blocks share an SM;
//   __launch_bounds__ says so (its second argument, 2), which also keeps ptxas from
//   spilling in the float instantiations.
// - The limit of this mapping on the H100: a broadcast LDS.128 still costs 2 shared-memory
//   wavefronts (sharing a fetch works only inside a quad of lanes), so the A operand
//   alone keeps the shared-memory pipe as busy as the FP64 pipe when a value feeds only
//   2 FMAs, and more columns per thread (more reuse of A) cost B traffic or registers.
//   Measured: about half the FP64 peak, against about 78% for regblock_gemm, which reads
//   both operands from shared memory in a 2-D register tile.
// - Edges: elements outside op(A) or op(B) are read as zeros (so ragged K adds nothing)
//   and stores outside C are skipped. A vector access is used only when both of its
//   elements are inside; a pair that straddles a row's end is read element by element.
// - TB == true reads each thread's columns as scalars from two memory rows, one k at a
//   time (uncoalesced across lanes; L1 serves the rest of each line): slower than TB false.
//
// Compiled at run time by NVRTC; the shared pair helpers are in pairs.cuh.

constexpr int OPT_W = 32;          // rows of the C sub-block (= C elements per thread column)
constexpr int OPT_R = 16;          // K per shared-memory step
constexpr int OPT_THREADS = 128;   // one thread per 2 columns
constexpr int OPT_COLS = 2;        // columns of C per thread
constexpr int OPT_H = OPT_THREADS * OPT_COLS;  // columns of the C sub-block
constexpr int OPT_D = 4;           // B prefetch distance in k-steps

constexpr int OPT_PATCHES = OPT_W * OPT_R / 4;  // 2 x 2 patches of the A sub-block
constexpr int OPT_PATCHES_PER_THREAD = (OPT_PATCHES + OPT_THREADS - 1) / OPT_THREADS;

static_assert(OPT_W % 2 == 0 && OPT_R % 2 == 0, "A is staged in 2 x 2 patches");
static_assert(OPT_COLS % 2 == 0, "columns are moved in pairs");

#include "pairs.cuh"


// The thread's OPT_COLS columns of op(B), read one k at a time: B(k, j .. j + OPT_COLS - 1).
template <typename T, bool TB, bool VEC>
struct opt_b_cols {
    const T* p;        // B(k, j) of the next k to read
    long long kstep;   // address step along k
    int ldb;
    int n_avail;       // columns of op(B) inside from j on
    int k;             // next k to read

    __device__ __forceinline__ void init(const T* B, int ldb_, int j, int N)
    {
        ldb = ldb_;
        n_avail = N - j;
        k = 0;
        p = B + (TB ? (long long)j * ldb_ : (long long)j);
        kstep = TB ? 1 : (long long)ldb_;
    }

    // Reads B(k, j + c) for c < OPT_COLS (zeros outside op(B)) and moves on to k + 1.
    __device__ __forceinline__ void next(int K, T b[OPT_COLS])
    {
        const bool k_ok = k < K;
        if (!TB) {  // adjacent in memory row k
            if (k_ok && n_avail >= OPT_COLS) {  // all inside: no per-column guard
#pragma unroll
                for (int c = 0; c < OPT_COLS; c += 2) {
                    if (VEC) {
                        const pair2<T> v = load_pair(p + c);
                        b[c] = v.x;
                        b[c + 1] = v.y;
                    } else {
                        b[c] = p[c];
                        b[c + 1] = p[c + 1];
                    }
                }
            } else {
#pragma unroll
                for (int c = 0; c < OPT_COLS; c += 2)
                    load_two<T, VEC>(p + c, k_ok, n_avail - c, b[c], b[c + 1]);
            }
        } else {    // one per memory row j + c
#pragma unroll
            for (int c = 0; c < OPT_COLS; ++c) {
                b[c] = T(0);
                if (k_ok && n_avail > c) b[c] = p[(long long)c * ldb];
            }
        }
        p += kstep;
        ++k;
    }
};

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(OPT_THREADS, 2) opt_gemm(int M, int N, int K, T alpha,
    const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
    T beta, T* __restrict__ C, int ldc)
{
    // Rows padded by 16 bytes, so that the stores of a patch row spread over the banks
    // (unpadded, the 8 k rows a quarter warp writes were 8-way conflicts; now 2-way).
    constexpr int PAD = 16 / sizeof(T);
    __shared__ alignas(16) T As[2][OPT_R][OPT_W + PAD];  // As[s][k][i] = op(A)(m0 + i, k0 + k)

    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * OPT_W;
    const int j = blockIdx.x * OPT_H + OPT_COLS * tid;  // this thread's columns j, j + 1

    PatchStager<T, OPT_W, OPT_R, !TA, VEC> pa[OPT_PATCHES_PER_THREAD];
#pragma unroll
    for (int q = 0; q < OPT_PATCHES_PER_THREAD; ++q) {
        const int patch = tid + q * OPT_THREADS;
        pa[q].init(A, lda, m0, M, patch < OPT_PATCHES ? patch : 0);
    }
    opt_b_cols<T, TB, VEC> bc;
    bc.init(B, ldb, j, N);

    T acc[OPT_W][OPT_COLS];
#pragma unroll
    for (int i = 0; i < OPT_W; ++i)
#pragma unroll
        for (int c = 0; c < OPT_COLS; ++c) acc[i][c] = T(0);

    // B queue: bq[d][c] = B(k + d, j + c) for the current k.
    T bq[OPT_D][OPT_COLS];
#pragma unroll
    for (int d = 0; d < OPT_D; ++d) bc.next(K, bq[d]);

    // Whole sub-blocks of A along M; along K, every r-step but the last.
    const bool a_rows_inside = m0 + OPT_W <= M;

    T ra[OPT_PATCHES_PER_THREAD][1][4];
#pragma unroll
    for (int q = 0; q < OPT_PATCHES_PER_THREAD; ++q) {
        if (tid + q * OPT_THREADS < OPT_PATCHES) {
            pa[q].load(0, K, a_rows_inside && OPT_R <= K, ra[q]);
            pa[q].store(As[0], ra[q]);
        }
    }
    __syncthreads();

    const int steps = (K + OPT_R - 1) / OPT_R;
    for (int st = 0; st < steps; ++st) {
        const int s = st & 1;
        const bool more = st + 1 < steps;
        if (more) {  // next A sub-block: global -> registers, in flight during the FMAs
            const int k0 = (st + 1) * OPT_R;
            const bool inside = a_rows_inside && k0 + OPT_R <= K;
#pragma unroll
            for (int q = 0; q < OPT_PATCHES_PER_THREAD; ++q) {
                if (tid + q * OPT_THREADS < OPT_PATCHES) {
                    pa[q].advance();
                    pa[q].load(k0, K, inside, ra[q]);
                }
            }
        }

#pragma unroll 2  // (full unrolling makes the compiler hoist loads until registers spill)
        for (int kk = 0; kk < OPT_R; ++kk) {
            T b[OPT_COLS];  // B(k, j .. j + OPT_COLS - 1)
#pragma unroll
            for (int c = 0; c < OPT_COLS; ++c) b[c] = bq[0][c];
#pragma unroll
            for (int d = 0; d + 1 < OPT_D; ++d)
#pragma unroll
                for (int c = 0; c < OPT_COLS; ++c) bq[d][c] = bq[d + 1][c];
            bc.next(K, bq[OPT_D - 1]);  // B(k + OPT_D, .)
#pragma unroll
            for (int i = 0; i < OPT_W; i += 2) {
                const pair2<T> a = load_pair(&As[s][kk][i]);  // broadcast
#pragma unroll
                for (int c = 0; c < OPT_COLS; ++c) {
                    acc[i][c] += a.x * b[c];
                    acc[i + 1][c] += a.y * b[c];
                }
            }
        }

        if (more) {  // buffer s ^ 1 was last read in the previous r-step, before the barrier
#pragma unroll
            for (int q = 0; q < OPT_PATCHES_PER_THREAD; ++q)
                if (tid + q * OPT_THREADS < OPT_PATCHES) pa[q].store(As[s ^ 1], ra[q]);
        }
        __syncthreads();
    }

    // Epilogue: acc[i][c] is C(m0 + i, j + c).
    const bool read_c = beta != T(0);
#pragma unroll
    for (int i = 0; i < OPT_W; ++i) {
        const int row = m0 + i;
        if (row >= M) break;
        T* crow = C + (long long)row * ldc + j;
#pragma unroll
        for (int c = 0; c < OPT_COLS; c += 2) {
            update_c_pair<T, VEC>(crow + c, N - (j + c), alpha * acc[i][c],
                                  alpha * acc[i][c + 1], beta, read_c);
        }
    }
}

// opt_gemm: the seed paper's optimised mapping (section 3.2, figure 2), retuned for an
// H100 in double. C = alpha * op(A) @ op(B) + beta * C.
//
// launch: block = (128, 1, 1) threads; one block per 32 x 128 tile of C; grid = (ceil(N / 128), ceil(M / 32), 1); dynamic shared memory = 0 bytes
//
// Row-major operands (numpy order):
//   C(i, j) = C[i * ldc + j]                                  (M x N)
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]         (M x K)
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]         (K x N)
// When beta == 0, C is only written, never read (it may hold NaN).
// VEC == true promises 16-byte aligned A, B, C and lda, ldb, ldc multiples of 16 / sizeof(T):
// pairs of elements are then moved with one 2-element vector access (16 bytes in double).
//
// The seed's mapping. A block computes a w x h sub-block of C (w = OPT_BM = 32 rows,
// h = OPT_BN = 128 columns) and walks K in steps of r = OPT_R = 16. Only the w x r sub-block
// of A is staged in shared memory. B never goes through shared memory: every thread
// streams the elements of B it needs from global memory straight into registers, and
// keeps its strip of C in registers:
//
//   for each r-step of K:  As = A(rows of the block, k .. k + r)      (shared memory)
//     for each k of the step:  b = B(k, the thread's columns)         (registers)
//       for each row i of the thread:  C(i, its columns) += As(i, k) * b   (registers)
//
// Retuning for the H100 in double. The paper's thread owns one column of the sub-block,
// all w rows, and every thread of the block reads each A element in one broadcast. Done
// that way on the H100 (two columns a thread, 32 rows), it stopped at 0.47 of the FP64
// FMA peak as measured until session 10 (0.43 of the true one): a broadcast 16-byte
// shared load still costs two shared-memory wavefronts (lanes share a fetch only inside
// a quad of consecutive lanes), so with an A pair
// feeding only 4 FMAs, A alone kept the shared-memory pipe as busy as the FP64 pipe.
// Here, 0.67 of the FMA peak (docs/performance.md; ratios below before session 10 are of the
// old, 8% low peak):
// - A thread owns OPT_TC = 4 columns (2 pairs) over OPT_TW = 8 rows (4 pairs) of C. Each A
//   pair it reads feeds 8 FMAs, each B value 8.
// - The 4 lanes of a quad share their rows (one fetch serves the quad) and own different
//   columns; a warp's 8 quads are 2 row strips x 4 column groups, a 16 x 64 piece of C.
//   Its A loads cost the minimum 2 wavefronts, and each of its B loads is two whole
//   128-byte lines (16 column pairs of one row). Measured against 4 row strips x 2 column
//   groups (64 x 64 blocks): 0.70 against 0.63-0.64 of the FMA peak, in two runs.
// - Rows of a thread: 2 s + 4 g + {0, 1} (s: its row strip, g < 4), so the 2 strips of a
//   load read 2 adjacent pairs (different banks). Columns: 2 c + 32 h + {0, 1} (c: its
//   column position, h < 2).
// - FMA order: per k, each row of the thread's strip is walked along and the next one back,
//   so consecutive FMAs share an operand (the row's A value, or b[c] at each turn), which
//   the compiler takes from the operand reuse cache instead of the register file. Measured on
//   the H100 (session 10) against two rows in step: 27.3 pJ a flop against 28.2 at the 700 W
//   limit, 2% faster there.
// - 4 warps as 2 (M) x 2 (N); the two warps that share columns read the same B lines, and
//   the second finds them in L1. Blocks are rasterised in groups of 8 tile rows, so the
//   blocks resident at one time share B in L2.
// - B is read OPT_D = 2 k-steps ahead into a small register queue, so its latency hides
//   behind the FMAs of the steps in between. r-steps whose columns and queue refills all
//   lie inside B (all but the edges) take an unguarded body, with no per-load branches:
//   that alone took an earlier layout of this kind from 0.60 to 0.64.
// - As is double-buffered: the next r-step's A sub-block is loaded into registers before
//   the FMAs of the current one and written to the other buffer after them, so one
//   __syncthreads per r-step both publishes the new buffer and retires reads of the old.
// - 128 threads and at most 168 registers a thread: three blocks an SM
//   (__launch_bounds__). An 8 x 8 thread tile (two blocks an SM) measured no faster and
//   spilled in some builds.
// - Edges: elements outside op(A) or op(B) are read as zeros (so ragged K adds nothing)
//   and stores outside C are skipped. A vector access is used only when both of its
//   elements are inside.
// - TB == true reads each thread's columns as scalars from 4 memory rows, one k at a
//   time (uncoalesced across lanes; L1 serves the rest of each line): slower than TB false.
//
// Bounds (`python -m benchmarks power`): built with -DOOCGEMM_STAGING=1, each r-step reads
// B from the same r rows and stages A again from the first r-step (the loads hit in L1: no L2
// or HBM traffic, while the operands still change from k to k as real data does; B read from
// one row only would toggle less and draw less power); with 2, B as with 1 and nothing staged
// after the first A sub-block. Both give wrong products; they measure what the operand
// traffic costs at the GPU's power limit.
//
// Compiled at run time by NVRTC; the shared pair helpers are in pairs.cuh.

constexpr int OPT_TW = 8;          // rows of C a thread
constexpr int OPT_TC = 4;          // columns of C a thread
constexpr int OPT_STRIPS = 2;      // row strips a warp (a quad's lanes share theirs)
constexpr int OPT_CPOS = 32 / OPT_STRIPS;  // column positions a warp
constexpr int OPT_WARPS_M = 2;     // warps along M
constexpr int OPT_WARPS_N = 2;     // warps along N
constexpr int OPT_BLOCKS = 3;      // blocks an SM holds at once
constexpr int OPT_THREADS = 32 * OPT_WARPS_M * OPT_WARPS_N;
constexpr int OPT_WM = OPT_STRIPS * OPT_TW;   // rows of a warp's tile
constexpr int OPT_WN = OPT_CPOS * OPT_TC;     // columns of a warp's tile
constexpr int OPT_BM = OPT_WARPS_M * OPT_WM;
constexpr int OPT_BN = OPT_WARPS_N * OPT_WN;
constexpr int OPT_R = 16;                     // K per shared-memory step
constexpr int OPT_D = 2;                      // B queue depth in k-steps
constexpr int OPT_GROUP = 8;                  // rasterisation group (tile rows)
constexpr int OPT_PA = OPT_BM * OPT_R / (4 * OPT_THREADS);  // 2 x 2 patches of A a thread stages

static_assert(OPT_PA * 4 * OPT_THREADS == OPT_BM * OPT_R, "whole 2 x 2 patches a thread");
static_assert(OPT_TW % 2 == 0 && OPT_TC % 2 == 0, "pairs");

#include "pairs.cuh"


// The thread's OPT_TC columns of op(B), one k at a time: b[2 h + c] = B(k, j + 2 CPOS h + c).
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

    // Reads the next k (zeros outside op(B)). FAST: the caller knows that k < K and that
    // every column is inside.
    template <bool FAST>
    __device__ __forceinline__ void next(int K, T (&b)[OPT_TC])
    {
        const bool k_ok = FAST || k < K;
#pragma unroll
        for (int h = 0; h < OPT_TC / 2; ++h) {
            const int c0 = 2 * OPT_CPOS * h;
            if (!TB) {      // the pair is adjacent in memory row k
                const T* q = p + c0;
                if (FAST) {
                    if (VEC) {
                        const pair2<T> v = load_pair(q);
                        b[2 * h] = v.x;
                        b[2 * h + 1] = v.y;
                    } else {
                        b[2 * h] = q[0];
                        b[2 * h + 1] = q[1];
                    }
                } else {
                    load_two<T, VEC>(q, k_ok, n_avail - c0, b[2 * h], b[2 * h + 1]);
                }
            } else {        // one memory row per column
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const T* q = p + (long long)(c0 + c) * ldb;
                    b[2 * h + c] = (FAST || (k_ok && n_avail > c0 + c)) ? *q : T(0);
                }
            }
        }
        p += kstep;
        ++k;
    }
};

// One r-step: the FMAs of As (OPT_R k-steps) with B from the queue, refilled OPT_D ahead.
template <bool FAST, int W, typename T, bool TB, bool VEC>
__device__ __forceinline__ void opt_rstep(const T (*As)[W], int row0,
    opt_b_cols<T, TB, VEC>& bc, int K, T (&bq)[OPT_D][OPT_TC], T (&acc)[OPT_TW][OPT_TC])
{
#pragma unroll
    for (int kk = 0; kk < OPT_R; ++kk) {
        T b[OPT_TC];
#pragma unroll
        for (int c = 0; c < OPT_TC; ++c) b[c] = bq[0][c];
#pragma unroll
        for (int d = 0; d + 1 < OPT_D; ++d)
#pragma unroll
            for (int c = 0; c < OPT_TC; ++c) bq[d][c] = bq[d + 1][c];
        bc.template next<FAST>(K, bq[OPT_D - 1]);
#pragma unroll
        for (int g = 0; g < OPT_TW / 2; ++g) {
            const pair2<T> a = load_pair(&As[kk][row0 + 2 * OPT_STRIPS * g]);  // quad broadcast
            // Along row 2g and back along row 2g + 1 (see the header).
#pragma unroll
            for (int c = 0; c < OPT_TC; ++c) acc[2 * g][c] += a.x * b[c];
#pragma unroll
            for (int c = OPT_TC - 1; c >= 0; --c) acc[2 * g + 1][c] += a.y * b[c];
        }
    }
}

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(OPT_THREADS, OPT_BLOCKS) opt_gemm(int M, int N, int K, T alpha,
    const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
    T beta, T* __restrict__ C, int ldc)
{
    // Rows padded by 16 bytes, so that the stores of a patch row spread over the banks.
    constexpr int PAD = 16 / sizeof(T);
    __shared__ alignas(16) T As[2][OPT_R][OPT_BM + PAD];  // As[s][k][i] = op(A)(m0 + i, k0 + k)

    const int tid = threadIdx.x;
    const int2 tile = grouped_tile(OPT_GROUP);   // rasterised in groups of OPT_GROUP tile rows
    const int m0 = tile.x * OPT_BM, n0 = tile.y * OPT_BN;

    const int warp = tid / 32, lane = tid % 32;
    const int strip = (lane / 4) % OPT_STRIPS;                        // a quad's rows
    const int cpos = (lane / (4 * OPT_STRIPS)) * 4 + lane % 4;        // a lane's columns
    const int row0 = (warp / OPT_WARPS_N) * OPT_WM + 2 * strip;       // rows row0 + 2 S g + {0, 1}
    const int col0 = n0 + (warp % OPT_WARPS_N) * OPT_WN + 2 * cpos;   // cols col0 + 2 P h + {0, 1}

    PatchStager<T, OPT_BM, OPT_R, !TA, VEC, OPT_PA, OPT_THREADS> sa;
    sa.init(A, lda, m0, M, tid);
    opt_b_cols<T, TB, VEC> bc;
    bc.init(B, ldb, col0, N);

    T acc[OPT_TW][OPT_TC];
#pragma unroll
    for (int i = 0; i < OPT_TW; ++i)
#pragma unroll
        for (int c = 0; c < OPT_TC; ++c) acc[i][c] = T(0);

    T bq[OPT_D][OPT_TC];  // bq[d] = B(k + d, the thread's columns) for the current k
#pragma unroll
    for (int d = 0; d < OPT_D; ++d) bc.template next<false>(K, bq[d]);

    const bool a_rows_inside = m0 + OPT_BM <= M;
    // Every column of the block inside B: the unguarded body serves r-steps whose queue
    // refills stay below K.
    const bool b_cols_inside = n0 + OPT_BN <= N;

    T ra[OPT_PA][4];
    sa.load(0, K, a_rows_inside && OPT_R <= K, ra);
    sa.store(As[0], ra);
    __syncthreads();

    const int steps = (K + OPT_R - 1) / OPT_R;
    for (int st = 0; st < steps; ++st) {
        const int s = st & 1;
        const bool more = st + 1 < steps;
        const bool stage = more && OOCGEMM_STAGING < 2;
        if (stage) {  // next A sub-block: global -> registers, in flight during the FMAs
            const int k0 = (st + 1) * OPT_R;
            if (OOCGEMM_STAGING == 0) sa.advance();
            sa.load(k0, K, a_rows_inside && k0 + OPT_R <= K, ra);
        }

        // This step refills the queue with k = st * r + OPT_D .. (st + 1) * r + OPT_D - 1.
        if (b_cols_inside && (st + 1) * OPT_R + OPT_D <= K)
            opt_rstep<true>(As[s], row0, bc, K, bq, acc);
        else
            opt_rstep<false>(As[s], row0, bc, K, bq, acc);

        if (OOCGEMM_STAGING != 0) bc.p -= OPT_R * bc.kstep;  // a measuring build: the same r rows
        if (stage) sa.store(As[s ^ 1], ra);  // last read in the previous r-step, before the barrier
        __syncthreads();
    }

    // Epilogue: acc[2g + r][2h + c] is C(m0 + row0 + 2 S g + r, col0 + 2 P h + c).
    store_c_tile<T, VEC, 2 * OPT_STRIPS, 2 * OPT_CPOS>(C, ldc, M, N, m0 + row0, col0, acc, alpha, beta);
}

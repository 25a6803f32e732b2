// regblock_gemm: two-level blocking with an 8 x 8 register tile per thread (the seed 003
// family). C = alpha * op(A) @ op(B) + beta * C.
//
// launch: block = (128, 1, 1) threads; one block per 64 x 128 tile of C; grid = (ceil(N / 128), ceil(M / 64), 1); dynamic shared memory = 0 bytes
//
// Row-major operands (numpy order):
//   C(i, j) = C[i * ldc + j]                                  (M x N)
//   op(A)(i, k) = TA ? A[k * lda + i] : A[i * lda + k]         (M x K)
//   op(B)(k, j) = TB ? B[j * ldb + k] : B[k * ldb + j]         (K x N)
// When beta == 0, C is only written, never read (it may hold NaN).
// VEC == true promises 16-byte aligned A, B, C and lda, ldb, ldc multiples of 16 / sizeof(T):
// pairs of elements are then moved with one 2-element vector access (16 bytes in double).
//
// Design
// - Block: 64 x 128 tile of C, 128 threads, K walked in steps of BK = 8. Two blocks share
//   an SM (at most 255 registers a thread; __launch_bounds__ says so), so that while one
//   waits at its barrier the other's warps keep the FP64 units busy: with one block of 256
//   threads (128 x 128) an SM, every barrier idled all of them (8-12% slower on the H100).
// - Blocks are rasterised in groups of RB_GROUP tile rows, so the blocks resident at one
//   time share panels of A and B in L2.
// - Shared memory: As[stage][k][i] holds op(A) transposed (k-major), Bs[stage][k][j] holds
//   op(B); both are k-major so that the values one thread needs at one k are contiguous.
//   Two stages: while the block multiplies the tile in stage s, each thread already has
//   the next K-tile's global loads in flight into registers (a 2 x 2 patch of A and two
//   of B); after its FMAs it writes them to stage s ^ 1, and ONE
//   __syncthreads per K-tile both publishes stage s ^ 1 and retires the reads of stage s.
//   Tiles wholly inside the operands (all but the edges) are loaded without guards.
// - Thread -> C mapping ("warp tile"): 4 warps as 2 (M) x 2 (N), each warp a 32 x 64 tile;
//   its 32 lanes as 4 (M) x 8 (N), every quad of consecutive lanes a 2 x 2 square. A thread
//   owns rows wm*32 + lm*2 + 8*g + {0,1}, g < 4, and columns wn*64 + ln*2 + 16*h + {0,1},
//   h < 4: an 8 x 8 tile made of 4 x 4 pairs. Per k it reads its 8 A and 8 B values from
//   shared memory with 8 two-element vector loads (8 LDS.128 per 64 DFMA in double).
//   Why quads: measured on the H100, lanes reading the same shared address share the
//   fetch only inside a quad of consecutive lanes; a warp-wide LDS.128 costs the sum over
//   its 8 quads of their distinct bytes, in 128-byte wavefronts, and at least 2. With
//   2 x 2 quads each load touches 2 distinct pairs per quad: the minimum, 2 wavefronts.
// - FMA order: per k, the 64 FMAs walk the tile column by column, down the even columns and
//   up the odd ones, so consecutive FMAs share an operand (b[j] along a column, a[i] at each
//   turn) that the compiler then takes from the operand reuse cache instead of the register
//   file. Measured on the H100 (session 10) against row by row (i outer, j inner): 0.71-0.72
//   of the FMA peak against 0.67, and 24.7 pJ a flop against 25.4 at the 700 W limit.
// - Global loads: a thread stages 2 x 2 patches (2 rows/columns of the tile x 2 k): one of
//   A, two of B. Lanes are laid out along the operand's contiguous dimension in memory, so
//   both storage orders are read coalesced; the patch is stored into shared memory as
//   two 2-element vectors (transposing on the fly where the operand is k-contiguous): one
//   16-byte store per lane in double, each warp store filling whole 128-byte bank rows,
//   so it costs the minimum 4 wavefronts.
// - Edges: elements outside op(A) or op(B) are staged as zeros (so ragged K adds nothing)
//   and stores outside C are skipped. A vector access is used only when both of its
//   elements are inside; a pair that straddles the end of a row (e.g. K = 1001 with
//   lda = 1002) is read element by element, the outside one as zero.
//
// Bounds (`python -m benchmarks power`): built with -DOOCGEMM_STAGING=1, every K-tile is
// staged again from the first one (its loads hit in L1: no L2 or HBM traffic); with 2, nothing
// is staged after the first tile (the multiply loop alone, barriers kept). Both give wrong
// products; they measure what the operand traffic costs at the GPU's power limit.
//
// Compiled at run time by NVRTC; the shared pair helpers are in pairs.cuh.

constexpr int RB_WARPS_M = 2;   // warps along M
constexpr int RB_WARPS_N = 2;   // warps along N
constexpr int RB_BM = 32 * RB_WARPS_M;  // rows of C per block
constexpr int RB_BN = 64 * RB_WARPS_N;  // columns of C per block
constexpr int RB_BK = 8;        // K per shared-memory stage
constexpr int RB_TM = 8;        // rows of C per thread
constexpr int RB_TN = 8;        // columns of C per thread
constexpr int RB_THREADS = 32 * RB_WARPS_M * RB_WARPS_N;
constexpr int RB_BLOCKS = 2;    // blocks an SM holds at once
constexpr int RB_GROUP = 8;     // rasterisation group (tile rows)
constexpr int RB_PA = RB_BM * RB_BK / (4 * RB_THREADS);  // 2 x 2 patches of A a thread stages
constexpr int RB_PB = RB_BN * RB_BK / (4 * RB_THREADS);  // ... and of B

static_assert(RB_BM * RB_BN == RB_THREADS * RB_TM * RB_TN, "one 8 x 8 tile per thread");
static_assert(RB_PA * 4 * RB_THREADS == RB_BM * RB_BK && RB_PB * 4 * RB_THREADS == RB_BN * RB_BK,
              "whole 2 x 2 patches of each operand per thread and stage");

#include "pairs.cuh"


template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(RB_THREADS, RB_BLOCKS) regblock_gemm(int M, int N, int K, T alpha,
    const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
    T beta, T* __restrict__ C, int ldc)
{
    // Rows padded by 16 bytes: the stores of one patch row (k, k + 2, k + 4, k + 6 across a
    // quarter warp) then fall in different banks; unpadded, they were 4-way conflicts.
    constexpr int PAD = 16 / sizeof(T);
    __shared__ alignas(16) T As[2][RB_BK][RB_BM + PAD];  // As[s][k][i] = op(A)(m0 + i, k0 + k)
    __shared__ alignas(16) T Bs[2][RB_BK][RB_BN + PAD];  // Bs[s][k][j] = op(B)(k0 + k, n0 + j)

    const int tid = threadIdx.x;
    const int2 tile = grouped_tile(RB_GROUP);   // rasterised in groups of RB_GROUP tile rows
    const int m0 = tile.x * RB_BM, n0 = tile.y * RB_BN;

    // op(A) is k-contiguous when stored untransposed; op(B) when stored transposed.
    PatchStager<T, RB_BM, RB_BK, !TA, VEC, RB_PA, RB_THREADS> sa;
    PatchStager<T, RB_BN, RB_BK, TB, VEC, RB_PB, RB_THREADS> sb;
    sa.init(A, lda, m0, M, tid);
    sb.init(B, ldb, n0, N, tid);

    // Warp tile mapping (see the header): warp (wm, wn) in 2 x 2, lane (lm, ln) in 4 x 8,
    // each quad of consecutive lanes a 2 x 2 square of (lm, ln).
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int quad = lane / 4;
    const int lm = (quad / 4) * 2 + (lane % 4) / 2;     // 0 .. 3
    const int ln = (quad % 4) * 2 + (lane % 2);         // 0 .. 7
    const int row0 = (warp / RB_WARPS_N) * 32 + lm * 2;  // rows row0 + 8 g + {0, 1}
    const int col0 = (warp % RB_WARPS_N) * 64 + ln * 2;  // cols col0 + 16 h + {0, 1}

    T acc[RB_TM][RB_TN];
#pragma unroll
    for (int i = 0; i < RB_TM; ++i)
#pragma unroll
        for (int j = 0; j < RB_TN; ++j) acc[i][j] = T(0);

    // Whole tiles along M (for A) and N (for B); along K, every tile but the last.
    const bool a_rows_inside = m0 + RB_BM <= M;
    const bool b_cols_inside = n0 + RB_BN <= N;

    T ra[RB_PA][4], rb[RB_PB][4];
    sa.load(0, K, a_rows_inside && RB_BK <= K, ra);
    sb.load(0, K, b_cols_inside && RB_BK <= K, rb);
    sa.store(As[0], ra);
    sb.store(Bs[0], rb);
    __syncthreads();

    const int ktiles = (K + RB_BK - 1) / RB_BK;
    for (int kt = 0; kt < ktiles; ++kt) {
        const int s = kt & 1;
        const bool more = kt + 1 < ktiles;
        const bool stage = more && OOCGEMM_STAGING < 2;
        if (stage) {  // next K-tile: global -> registers, in flight during the FMAs below
            const int k0 = (kt + 1) * RB_BK;
            const bool k_inside = k0 + RB_BK <= K;
            if (OOCGEMM_STAGING == 0) {
                sa.advance();
                sb.advance();
            }
            sa.load(k0, K, a_rows_inside && k_inside, ra);
            sb.load(k0, K, b_cols_inside && k_inside, rb);
        }

#pragma unroll
        for (int k = 0; k < RB_BK; ++k) {
            T a[RB_TM], b[RB_TN];
#pragma unroll
            for (int g = 0; g < RB_TM / 2; ++g) {
                const pair2<T> v = load_pair(&As[s][k][row0 + 8 * g]);
                a[2 * g] = v.x;
                a[2 * g + 1] = v.y;
            }
#pragma unroll
            for (int h = 0; h < RB_TN / 2; ++h) {
                const pair2<T> v = load_pair(&Bs[s][k][col0 + 16 * h]);
                b[2 * h] = v.x;
                b[2 * h + 1] = v.y;
            }
            // Column by column, down the even columns and up the odd ones (see the header).
#pragma unroll
            for (int j = 0; j < RB_TN; ++j)
#pragma unroll
                for (int ii = 0; ii < RB_TM; ++ii) {
                    const int i = (j & 1) ? RB_TM - 1 - ii : ii;
                    acc[i][j] += a[i] * b[j];
                }
        }

        if (stage) {  // stage s ^ 1 was last read in the previous K-tile, before the barrier
            sa.store(As[s ^ 1], ra);
            sb.store(Bs[s ^ 1], rb);
        }
        __syncthreads();
    }

    // Epilogue: acc[2g + r][2h + c] is C(m0 + row0 + 8g + r, n0 + col0 + 16h + c).
    store_c_tile<T, VEC, 8, 16>(C, ldc, M, N, m0 + row0, n0 + col0, acc, alpha, beta);
}

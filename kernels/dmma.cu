// dmma: double-precision GEMM on the FP64 tensor cores (mma.sync with f64 operands), fed by a
// multi-stage cp.async pipeline. The modern form of the seed paper's "optimised DGEMM kernel".
//
// launch: block = (256, 1, 1) threads; one block per BM x BN = 128 x 128 tile of C;
//         grid = (ceil(N / 128), ceil(M / 128), 1); dynamic shared memory = DMMA_SMEM_BYTES
//         (163840 bytes: 4 stages of a 128x16 A tile and a 16x128 B tile, padded; the loader
//         raises the function's dynamic shared-memory limit to that).
//
// Data mapping
//   - A block of 256 threads (8 warps, 2 along M x 4 along N) owns a 128 x 128 tile of C; each
//     warp owns a 64 x 32 sub-tile, held in registers as tensor-core accumulator fragments
//     (64 doubles a thread).
//   - K advances in steps of BK = 16. Each step's A tile (128 x 16) and B tile (16 x 128) are
//     copied global -> shared with cp.async (16-byte copies when VEC, 8-byte otherwise; the
//     copy's source size zero-fills the ragged edges), STAGES = 4 steps ahead, so the copies of
//     tiles k+1..k+3 are in flight while the tensor cores work on tile k. One __syncthreads a
//     step: the stage written next is the one every warp finished in the previous step.
//   - Shared tiles keep each operand's stored layout: "K-major" (rows along M or N, contiguous
//     along K: A, or a transposed B) or "MN-major" (rows along K: B, or a transposed A), each row
//     padded by 4 doubles so that the fragment loads of a half-warp hit 16 distinct 8-byte banks.
//   - Tensor-core shape: m16n8k16 on sm_90 (Hopper's f64 shapes; m16n8k8 with
//     OOCGEMM_DMMA_K8), m8n8k4 on sm_80 (or with OOCGEMM_DMMA_884). Fragment layouts are those
//     of the PTX ISA for f64 mma: fewer, larger instructions read fewer registers per FMA.
//   - Each thread's tile copies share one base pointer and stride; interior tiles copy without
//     bounds checks (the checks cost ~7% when every copy made them).
//   - Thread blocks are rasterised in groups of 8 tile rows, so the blocks resident at one time
//     share A and B panels in L2.
//
// Semantics: row-major C (M x N, ldc) = alpha * op(A) @ op(B) + beta * C; op(A) = A (M x K, lda)
// or, when TA, A stored K x M; op(B) = B (K x N, ldb) or, when TB, B stored N x K. beta == 0:
// C is not read. VEC promises 16-byte aligned A, B, C and even lda, ldb, ldc.

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && !defined(OOCGEMM_DMMA_884)
#define OOCGEMM_DMMA_16x8x8 1
#ifndef OOCGEMM_DMMA_K8
#define OOCGEMM_DMMA_K16 1   // m16n8k16: 48.1 TFLOP/s at 8192^3 on the H100, m16n8k8 46.0, m8n8k4 26
#endif
#endif
// Tuning knobs (defaults measured best on the H100; the loader's shared-memory size assumes
// them): K step, pipeline depth, warps along M (of 8).
#ifndef OOCGEMM_DMMA_BK
#define OOCGEMM_DMMA_BK 16
#endif
#ifndef OOCGEMM_DMMA_STAGES
#define OOCGEMM_DMMA_STAGES 4
#endif
#ifndef OOCGEMM_DMMA_WARPS
#define OOCGEMM_DMMA_WARPS 8
#endif
#ifndef OOCGEMM_DMMA_WARPS_M
#define OOCGEMM_DMMA_WARPS_M 2
#endif
#ifndef OOCGEMM_DMMA_GROUP_M
#define OOCGEMM_DMMA_GROUP_M 8
#endif

#include "pairs.cuh"

namespace dmma_detail {

constexpr int BM = 128, BN = 128, THREADS = 32 * OOCGEMM_DMMA_WARPS;
constexpr int BK = OOCGEMM_DMMA_BK, STAGES = OOCGEMM_DMMA_STAGES;
constexpr int WARPS_M = OOCGEMM_DMMA_WARPS_M, WARPS_N = OOCGEMM_DMMA_WARPS / WARPS_M;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;   // 64 x 32 per warp
constexpr int KPAD = BK + 4;                           // row stride of a K-major tile (doubles)
constexpr int MNPAD = BM + 4;                          // row stride of an MN-major tile
constexpr int TILE = (BM * KPAD > BK * MNPAD) ? BM * KPAD : BK * MNPAD;
constexpr int GROUP_M = OOCGEMM_DMMA_GROUP_M;          // rasterisation group (tile rows)
static_assert(BM == BN, "one tile size serves A and B");

#if defined(OOCGEMM_DMMA_16x8x8) && defined(OOCGEMM_DMMA_K16)
constexpr int MM = 16, MN = 8, MK = 16, AR = 8, BR = 4, CR = 4;
__device__ __forceinline__ void mma(double (&c)[CR], const double (&a)[AR], const double (&b)[BR]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
          "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}
#elif defined(OOCGEMM_DMMA_16x8x8)
constexpr int MM = 16, MN = 8, MK = 8, AR = 4, BR = 2, CR = 4;
__device__ __forceinline__ void mma(double (&c)[CR], const double (&a)[AR], const double (&b)[BR]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
}
#else
constexpr int MM = 8, MN = 8, MK = 4, AR = 1, BR = 1, CR = 2;
__device__ __forceinline__ void mma(double (&c)[CR], const double (&a)[AR], const double (&b)[BR]) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
        : "+d"(c[0]), "+d"(c[1])
        : "d"(a[0]), "d"(b[0]));
}
#endif
// Fragment coordinates of value i for lane (g = lane / 4, t = lane % 4), the PTX ISA's f64
// layouts. One set serves every shape: m16n8k16 and m16n8k8 differ only in how many values
// a thread holds, and with m8n8k4's single A and B value and two C values (i = 0, 1) they
// reduce to its (g, t), (t, g) and (g, 2t + i). B value i sits in column g.
__device__ __forceinline__ int a_row(int i, int g) { return g + 8 * (i & 1); }
__device__ __forceinline__ int a_col(int i, int t) { return t + 4 * (i >> 1); }
__device__ __forceinline__ int b_row(int i, int t) { return t + 4 * i; }
__device__ __forceinline__ int c_row(int i, int g) { return g + 8 * (i >> 1); }
__device__ __forceinline__ int c_col(int i, int t) { return 2 * t + (i & 1); }

constexpr int FM = WM / MM, FN = WN / MN;   // fragments a warp holds along M and N

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
    return addr;
}

// Copy `bytes` (0, 8 or 16; the rest of the 16 or 8 zero-filled) from global to shared memory.
template <int SIZE>
__device__ __forceinline__ void cp_async(double* dst, const double* src, int bytes) {
    if (SIZE == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(smem_addr(dst)), "l"(src), "r"(bytes));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n"
                     :: "r"(smem_addr(dst)), "l"(src), "r"(bytes));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// One thread's share of the copies of one operand's tiles, global -> shared.
//   KMAJOR: a tile is 128 rows (outer: M or N) x BK, contiguous along K in global memory;
//   else:   BK rows x 128 (outer), contiguous along the outer dimension.
// Copy i of a thread sits ROWS_PER_PASS tile rows below copy i - 1: one base pointer and one
// stride serve them all, and interior tiles (the common case) copy without any bounds check.
template <bool KMAJOR, bool VEC>
struct TileLoader {
    static constexpr int W = VEC ? 2 : 1;                         // doubles a copy
    static constexpr int PER_ROW = (KMAJOR ? BK : BM) / W;        // copies along a tile row
    static constexpr int ROWS_PER_PASS = THREADS / PER_ROW;
    static constexpr int COPIES = BM * BK / W / THREADS;
    static constexpr int SROW = KMAJOR ? KPAD : MNPAD;            // shared row stride
    static_assert(THREADS % PER_ROW == 0 && COPIES * ROWS_PER_PASS * PER_ROW * W == BM * BK, "");

    const double* base;   // global address of copy 0 at K step 0
    long long pass;       // global elements between copies i and i + 1
    long long step_size;  // global elements per K step
    int dst;              // shared offset of copy 0
    int row, col;         // tile coordinates of copy 0: row along the tile's rows, col along them
    int outer0, outer_n, K;

    __device__ __forceinline__ TileLoader(const double* g, int ld, int outer0_, int outer_n_,
                                          int K_, int tid)
        : outer0(outer0_), outer_n(outer_n_), K(K_) {
        row = tid / PER_ROW;
        col = (tid % PER_ROW) * W;
        dst = row * SROW + col;
        pass = (long long)ROWS_PER_PASS * ld;
        // KMAJOR: rows are M/N (outer), cols are K; else rows are K, cols are outer.
        base = KMAJOR ? g + (long long)(outer0 + row) * ld + col
                      : g + (long long)row * ld + outer0 + col;
        step_size = KMAJOR ? BK : (long long)BK * ld;
    }

    __device__ __forceinline__ void load(double* s, int step) const {
        const double* src = base + step * step_size;
        const int k0 = step * BK;
        const bool interior = outer0 + BM <= outer_n && k0 + BK <= K;
        if (interior) {
            #pragma unroll
            for (int i = 0; i < COPIES; ++i)
                cp_async<W * 8>(s + dst + i * ROWS_PER_PASS * SROW, src + i * pass, W * 8);
            return;
        }
        #pragma unroll
        for (int i = 0; i < COPIES; ++i) {
            const int r = row + i * ROWS_PER_PASS;
            const int go = KMAJOR ? outer0 + r : outer0 + col;    // along M or N
            const int gk = KMAJOR ? k0 + col : k0 + r;            // along K
            int valid = 0;                                        // elements inside the matrix
            if (go < outer_n && gk < K) {
                const int room = KMAJOR ? K - gk : outer_n - go;
                valid = room < W ? room : W;
            }
            cp_async<W * 8>(s + dst + i * ROWS_PER_PASS * SROW, valid ? src + i * pass : base,
                            valid * 8);
        }
    }
};

}  // namespace dmma_detail

#define DMMA_SMEM_BYTES (dmma_detail::STAGES * 2 * dmma_detail::TILE * 8)

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(dmma_detail::THREADS, 1)
dmma_gemm(int M, int N, int K, T alpha, const T* __restrict__ A, int lda,
          const T* __restrict__ B, int ldb, T beta, T* __restrict__ C, int ldc) {
    using namespace dmma_detail;
    static_assert(sizeof(T) == 8, "dmma multiplies float64 only");
    extern __shared__ __align__(16) double smem[];

    // Grouped rasterisation: consecutive blocks walk GROUP_M tile rows, then move right.
    const int tiles_n = gridDim.x, tiles_m = gridDim.y;
    const int pid = blockIdx.y * tiles_n + blockIdx.x;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * GROUP_M;
    const int group_m = (tiles_m - first_m) < GROUP_M ? (tiles_m - first_m) : GROUP_M;
    const int m0 = (first_m + (pid % per_group) % group_m) * BM;
    const int n0 = ((pid % per_group) / group_m) * BN;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;

    double acc[FM][FN][CR];
    #pragma unroll
    for (int i = 0; i < FM; ++i)
        #pragma unroll
        for (int j = 0; j < FN; ++j)
            #pragma unroll
            for (int v = 0; v < CR; ++v) acc[i][j][v] = 0.0;

    const int steps = (K + BK - 1) / BK;
    const TileLoader<!TA, VEC> load_a(A, lda, m0, M, K, tid);
    const TileLoader<TB, VEC> load_b(B, ldb, n0, N, K, tid);
    auto load_stage = [&](int step) {
        double* sa = smem + (step % STAGES) * 2 * TILE;
        load_a.load(sa, step);
        load_b.load(sa + TILE, step);
    };

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load_stage(s);
        cp_async_commit();   // empty groups keep the count of groups in flight fixed
    }

    for (int step = 0; step < steps; ++step) {
        cp_async_wait<STAGES - 2>();   // this step's tiles have landed (this thread's copies)
        __syncthreads();               // ... every thread's; and the stage refilled next is free
        if (step + STAGES - 1 < steps) load_stage(step + STAGES - 1);
        cp_async_commit();

        const double* sa = smem + (step % STAGES) * 2 * TILE;
        const double* sb = sa + TILE;
        #pragma unroll
        for (int kk = 0; kk < BK; kk += MK) {
            double af[FM][AR], bf[FN][BR];
            #pragma unroll
            for (int i = 0; i < FM; ++i)
                #pragma unroll
                for (int v = 0; v < AR; ++v) {
                    const int r = wm + i * MM + a_row(v, g), k = kk + a_col(v, t);
                    af[i][v] = TA ? sa[k * MNPAD + r] : sa[r * KPAD + k];
                }
            #pragma unroll
            for (int j = 0; j < FN; ++j)
                #pragma unroll
                for (int v = 0; v < BR; ++v) {
                    const int k = kk + b_row(v, t), n = wn + j * MN + g;
                    bf[j][v] = TB ? sb[n * KPAD + k] : sb[k * MNPAD + n];
                }
            #pragma unroll
            for (int i = 0; i < FM; ++i)
                #pragma unroll
                for (int j = 0; j < FN; ++j) mma(acc[i][j], af[i], bf[j]);
        }
    }
    cp_async_wait<0>();

    // Epilogue: each value pair (v, v + 1) is two adjacent columns of one row.
    #pragma unroll
    for (int i = 0; i < FM; ++i)
        #pragma unroll
        for (int j = 0; j < FN; ++j)
            #pragma unroll
            for (int v = 0; v < CR; v += 2) {
                const int r = m0 + wm + i * MM + c_row(v, g);
                const int c = n0 + wn + j * MN + c_col(v, t);
                if (r >= M) continue;
                update_c_pair<T, VEC>(C + (size_t)r * ldc + c, N - c, alpha * acc[i][j][v],
                                      alpha * acc[i][j][v + 1], beta, beta != 0.0);
            }
}

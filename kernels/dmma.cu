// dmma: double-precision GEMM on the FP64 tensor cores (mma.sync with f64 operands), fed by a
// multi-stage cp.async pipeline. The modern form of the seed paper's "optimised DGEMM kernel".
//
// launch: block = (128, 1, 1) threads; one block per BM x BN = 128 x 64 tile of C;
//         grid = (ceil(N / 64), ceil(M / 128), 1); dynamic shared memory = DMMA_SMEM_BYTES
//         (92160 bytes: 3 stages of a 128x16 A tile and a 16x64 B tile, padded; the loader
//         raises the function's dynamic shared-memory limit to that). Two blocks share an SM.
//
// Data mapping
//   - A block of 128 threads (4 warps, 2 along M x 2 along N) owns a 128 x 64 tile of C; each
//     warp owns a 64 x 32 sub-tile, held in registers as tensor-core accumulator fragments
//     (64 doubles a thread). Two blocks per SM (about 250 registers, 90 KB of shared memory each),
//     so that one block's barrier leaves the other's warps feeding the tensor cores.
//   - K advances in steps of BK = 16. Each step's A tile (128 x 16) and B tile (16 x 64) are
//     copied global -> shared with cp.async (16-byte copies when VEC, 8-byte otherwise; the
//     copy's source size zero-fills the ragged edges), STAGES - 1 = 2 steps ahead.
//   - Fragments are read from shared memory well ahead of the tensor cores, and not into the
//     registers the mmas just issued read: each A fragment two rows of mmas ahead (four
//     buffers in turn), the next k slice's B fragments into a second set during the slice's
//     second row. The one __syncthreads a step (the next stage has landed; the stage refilled
//     next is read out) comes after the step's first row of mmas is issued. So the tensor
//     cores never wait for a whole step's shared-memory reads (that wait cost 6-8% at 8192^3).
//     Reading A one row ahead into two buffers and B in place, right after its last mma of
//     the slice, ran 2-3% slower.
//   - Shared tiles keep each operand's stored layout: "K-major" (rows along M or N, contiguous
//     along K: A, or a transposed B) or "MN-major" (rows along K: B, or a transposed A), each row
//     padded by 4 doubles so that the fragment loads of a half-warp hit 16 distinct 8-byte banks.
//   - Tensor-core shape: m16n8k8 on sm_90 (one of Hopper's f64 shapes, the one cuBLAS uses
//     here; m16n8k16 needs twice the fragment registers, which the buffers above cannot spare),
//     m8n8k4 on sm_80 (or with OOCGEMM_DMMA_884). Fragment layouts are those of the PTX ISA.
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
#endif
// Tuning knobs (defaults measured best on the H100; the loader's launch shape and shared-memory
// size assume them): K step, pipeline depth, warps, warps along M, tile columns, raster group.
// 128 x 128 tiles of 8 warps and 4 stages ran 3-4% slower than these 128 x 64 tiles of 4.
#ifndef OOCGEMM_DMMA_BK
#define OOCGEMM_DMMA_BK 16
#endif
#ifndef OOCGEMM_DMMA_STAGES
#define OOCGEMM_DMMA_STAGES 3
#endif
#ifndef OOCGEMM_DMMA_WARPS
#define OOCGEMM_DMMA_WARPS 4
#endif
#ifndef OOCGEMM_DMMA_WARPS_M
#define OOCGEMM_DMMA_WARPS_M 2
#endif
#ifndef OOCGEMM_DMMA_BN
#define OOCGEMM_DMMA_BN 64
#endif
#ifndef OOCGEMM_DMMA_GROUP_M
#define OOCGEMM_DMMA_GROUP_M 8
#endif

#include "pairs.cuh"

namespace dmma_detail {

constexpr int BM = 128, BN = OOCGEMM_DMMA_BN, THREADS = 32 * OOCGEMM_DMMA_WARPS;
constexpr int MIN_BLOCKS = THREADS >= 256 ? 1 : 256 / THREADS;   // blocks an SM holds at once
constexpr int BK = OOCGEMM_DMMA_BK, STAGES = OOCGEMM_DMMA_STAGES;
constexpr int WARPS_M = OOCGEMM_DMMA_WARPS_M, WARPS_N = OOCGEMM_DMMA_WARPS / WARPS_M;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;   // 64 x 32 per warp
constexpr int KPAD = BK + 4;                           // row stride of a K-major tile (doubles)
// Row stride of an MN-major tile OUTER wide, and the doubles a tile of either layout takes.
__host__ __device__ constexpr int mn_pad(int outer) { return outer + 4; }
__host__ __device__ constexpr int tile_size(int outer) {
    return outer * KPAD > BK * mn_pad(outer) ? outer * KPAD : BK * mn_pad(outer);
}
constexpr int TILE_A = tile_size(BM), TILE = TILE_A + tile_size(BN);   // one stage: A, then B
constexpr int GROUP_M = OOCGEMM_DMMA_GROUP_M;          // rasterisation group (tile rows)

#if defined(OOCGEMM_DMMA_16x8x8)
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
// layouts. One set serves both shapes: with m8n8k4's single A and B value and two C values
// (i = 0, 1) they reduce to its (g, t), (t, g) and (g, 2t + i). B value i sits in column g.
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
//   KMAJOR: a tile is OUTER rows (along M or N: BM for A, BN for B) x BK, contiguous along K
//           in global memory;
//   else:   BK rows x OUTER, contiguous along the outer dimension.
// Copy i of a thread sits ROWS_PER_PASS tile rows below copy i - 1: one base pointer and one
// stride serve them all, and interior tiles (the common case) copy without any bounds check.
template <int OUTER, bool KMAJOR, bool VEC>
struct TileLoader {
    static constexpr int W = VEC ? 2 : 1;                         // doubles a copy
    static constexpr int PER_ROW = (KMAJOR ? BK : OUTER) / W;     // copies along a tile row
    static constexpr int ROWS_PER_PASS = THREADS / PER_ROW;
    static constexpr int COPIES = OUTER * BK / W / THREADS;
    static constexpr int SROW = KMAJOR ? KPAD : mn_pad(OUTER);    // shared row stride
    static_assert(THREADS % PER_ROW == 0 && COPIES * ROWS_PER_PASS * PER_ROW * W == OUTER * BK,
                  "");

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
        const bool interior = outer0 + OUTER <= outer_n && k0 + BK <= K;
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

#define DMMA_SMEM_BYTES (dmma_detail::STAGES * dmma_detail::TILE * 8)

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(dmma_detail::THREADS, dmma_detail::MIN_BLOCKS)
dmma_gemm(int M, int N, int K, T alpha, const T* __restrict__ A, int lda,
          const T* __restrict__ B, int ldb, T beta, T* __restrict__ C, int ldc) {
    using namespace dmma_detail;
    static_assert(sizeof(T) == 8, "dmma multiplies float64 only");
    extern __shared__ __align__(16) double smem[];

    const int2 tile = grouped_tile(GROUP_M);   // rasterised in groups of GROUP_M tile rows
    const int m0 = tile.x * BM, n0 = tile.y * BN;

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
    const TileLoader<BM, !TA, VEC> load_a(A, lda, m0, M, K, tid);
    const TileLoader<BN, TB, VEC> load_b(B, ldb, n0, N, K, tid);
    auto stage = [&](int step) { return smem + (step % STAGES) * TILE; };
    auto load_stage = [&](int step) {
        double* sa = stage(step);
        load_a.load(sa, step);
        load_b.load(sa + TILE_A, step);
    };
    // Fragment i (along M) of A and j (along N) of B, k slice kk, from one stage's tiles.
    auto a_frag = [&](const double* sa, int kk, int i, double (&f)[AR]) {
        #pragma unroll
        for (int v = 0; v < AR; ++v) {
            const int r = wm + i * MM + a_row(v, g), k = kk + a_col(v, t);
            f[v] = TA ? sa[k * mn_pad(BM) + r] : sa[r * KPAD + k];
        }
    };
    auto b_frag = [&](const double* sb, int kk, int j, double (&f)[BR]) {
        #pragma unroll
        for (int v = 0; v < BR; ++v) {
            const int k = kk + b_row(v, t), n = wn + j * MN + g;
            f[v] = TB ? sb[n * KPAD + k] : sb[k * mn_pad(BN) + n];
        }
    };

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < steps) load_stage(s);
        cp_async_commit();   // empty groups keep the count of groups in flight fixed
    }

    // Fragments are read from shared memory ahead of the tensor cores, and not into the
    // registers the last mmas read: each A fragment LOOK rows of mmas ahead (ABUF buffers used
    // in turn), and the B fragments of the next k slice into the second of two sets, during
    // the slice's row BROW. So the tensor cores find a step's operands in registers when they
    // reach them, instead of waiting at every step for the block's shared-memory reads.
    constexpr int ROWS = BK / MK * FM, SLICES = BK / MK;   // rows of mmas (and slices) a step
    constexpr int ABUF = 4, LOOK = 2, BROW = 1;
    static_assert(STAGES >= 3, "the fragments of step + 1 are read during step");
    static_assert(ROWS % ABUF == 0 && SLICES % 2 == 0 && LOOK < ABUF && BROW < FM,
                  "a step starts on A buffer 0 and B set 0, and the unrolled rows need no copies");
    static_assert(ROWS - LOOK > 0 && (SLICES - 1) * FM + BROW > 0,
                  "the next stage is first read after the step's barrier (row 0)");
    double af[ABUF][AR], bf[2][FN][BR];
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // stage 0 has landed
    #pragma unroll
    for (int r = 0; r < LOOK; ++r) a_frag(stage(0), (r / FM) * MK, r % FM, af[r]);
    #pragma unroll
    for (int j = 0; j < FN; ++j) b_frag(stage(0) + TILE_A, 0, j, bf[0][j]);

    for (int step = 0; step < steps; ++step) {
        const double* sa = stage(step);
        const double* na = stage(step + 1);
        // One row of mmas (A fragment i of slice q against the warp's B fragments) at a time.
        #pragma unroll
        for (int row = 0; row < ROWS; ++row) {
            const int q = row / FM, i = row % FM;
            // Where a slice lies (this stage or the next) is spelled out for A and for B: one
            // shared helper for both changed the code NVRTC emits and ran 3% slower.
            const int ra = row + LOOK;   // the row whose A fragment is read now
            if (ra < ROWS) a_frag(sa, (ra / FM) * MK, ra % FM, af[ra % ABUF]);
            else a_frag(na, ((ra - ROWS) / FM) * MK, (ra - ROWS) % FM, af[ra % ABUF]);
            if (i == BROW) {   // the next slice: further along this stage or the next one's first
                const double* xb = (q + 1 < SLICES ? sa : na) + TILE_A;
                const int xk = q + 1 < SLICES ? (q + 1) * MK : 0;
                #pragma unroll
                for (int j = 0; j < FN; ++j) b_frag(xb, xk, j, bf[(q + 1) % 2][j]);
            }
            #pragma unroll
            for (int j = 0; j < FN; ++j) mma(acc[i][j], af[row % ABUF], bf[q % 2][j]);
            if (row == 0) {
                // With the first mmas of the step queued on the tensor cores: wait for the
                // next stage, and refill the one the previous step read. No fragment of the
                // next stage is read before this point (rows >= FM + BROW and ROWS - LOOK).
                cp_async_wait<STAGES - 3>();   // step + 1's tiles have landed (own copies)
                __syncthreads();               // ... every thread's; stage step - 1 is free
                if (step + STAGES - 1 < steps) load_stage(step + STAGES - 1);
                cp_async_commit();
            }
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

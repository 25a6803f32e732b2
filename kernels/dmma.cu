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
//   - Tensor-core shape: m16n8k8 on sm_90 (Hopper's f64 shapes), m8n8k4 on sm_80 (or when
//     OOCGEMM_DMMA_884 is defined). Fragment layouts are those of the PTX ISA for f64 mma.
//   - Thread blocks are rasterised in groups of 8 tile rows, so the blocks resident at one time
//     share A and B panels in L2.
//
// Semantics: row-major C (M x N, ldc) = alpha * op(A) @ op(B) + beta * C; op(A) = A (M x K, lda)
// or, when TA, A stored K x M; op(B) = B (K x N, ldb) or, when TB, B stored N x K. beta == 0:
// C is not read. VEC promises 16-byte aligned A, B, C and even lda, ldb, ldc.

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && !defined(OOCGEMM_DMMA_884)
#define OOCGEMM_DMMA_16x8x8 1
#endif

namespace dmma_detail {

constexpr int BM = 128, BN = 128, BK = 16, STAGES = 4, THREADS = 256;
constexpr int WARPS_M = 2, WARPS_N = 4;
constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;   // 64 x 32 per warp
constexpr int KPAD = BK + 4;                           // row stride of a K-major tile (doubles)
constexpr int MNPAD = BM + 4;                          // row stride of an MN-major tile
constexpr int TILE = (BM * KPAD > BK * MNPAD) ? BM * KPAD : BK * MNPAD;
constexpr int GROUP_M = 8;                             // rasterisation group (tile rows)
static_assert(BM == BN, "one tile size serves A and B");

#ifdef OOCGEMM_DMMA_16x8x8
constexpr int MM = 16, MN = 8, MK = 8, AR = 4, BR = 2, CR = 4;
// Fragment coordinates of value i for lane (g = lane / 4, t = lane % 4).
__device__ __forceinline__ int a_row(int i, int g) { return g + 8 * (i & 1); }
__device__ __forceinline__ int a_col(int i, int t) { return t + 4 * (i >> 1); }
__device__ __forceinline__ int b_row(int i, int t) { return t + 4 * i; }
__device__ __forceinline__ int c_row(int i, int g) { return g + 8 * (i >> 1); }
__device__ __forceinline__ void mma(double (&c)[CR], const double (&a)[AR], const double (&b)[BR]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+d"(c[0]), "+d"(c[1]), "+d"(c[2]), "+d"(c[3])
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
}
#else
constexpr int MM = 8, MN = 8, MK = 4, AR = 1, BR = 1, CR = 2;
__device__ __forceinline__ int a_row(int, int g) { return g; }
__device__ __forceinline__ int a_col(int, int t) { return t; }
__device__ __forceinline__ int b_row(int, int t) { return t; }
__device__ __forceinline__ int c_row(int, int g) { return g; }
__device__ __forceinline__ void mma(double (&c)[CR], const double (&a)[AR], const double (&b)[BR]) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
        : "+d"(c[0]), "+d"(c[1])
        : "d"(a[0]), "d"(b[0]));
}
#endif
// Both shapes: B value i sits in column g; C value i in column 2t + (i & 1).
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

// Load one operand's tile for K step k0 into shared memory `s`.
//   KMAJOR: tile is 128 rows (outer: M or N) x BK, stored contiguous along K in global memory.
//   else:   tile is BK rows x 128 (outer), contiguous along the outer dimension.
// `outer0`/`outer_n`: first row/column of the tile along M or N and the matrix extent there.
template <bool KMAJOR, bool VEC>
__device__ __forceinline__ void load_tile(double* s, const double* __restrict__ g, int ld,
                                          int outer0, int outer_n, int k0, int K, int tid) {
    constexpr int W = VEC ? 2 : 1;                       // doubles a copy
    constexpr int COPIES = BM * BK / W / THREADS;        // copies a thread
    #pragma unroll
    for (int i = 0; i < COPIES; ++i) {
        const int c = tid + i * THREADS;
        int o, k;                                        // tile coordinates of the copy's first element
        if (KMAJOR) { o = c / (BK / W); k = (c % (BK / W)) * W; }
        else        { k = c / (BM / W); o = (c % (BM / W)) * W; }
        const int go = outer0 + o, gk = k0 + k;
        int valid = 0;                                   // elements inside the matrix
        if (go < outer_n && gk < K) {
            const int room = KMAJOR ? K - gk : outer_n - go;
            valid = room < W ? room : W;
        }
        const double* src = valid ? g + (KMAJOR ? (size_t)go * ld + gk : (size_t)gk * ld + go) : g;
        double* dst = KMAJOR ? s + o * KPAD + k : s + k * MNPAD + o;
        cp_async<W * 8>(dst, src, valid * 8);
    }
}

}  // namespace dmma_detail

#define DMMA_SMEM_BYTES (dmma_detail::STAGES * 2 * dmma_detail::TILE * 8)

template <typename T, bool TA, bool TB, bool VEC>
__global__ void __launch_bounds__(256, 1)
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
    auto load_stage = [&](int step) {
        double* sa = smem + (step % STAGES) * 2 * TILE;
        load_tile<!TA, VEC>(sa, A, lda, m0, M, step * BK, K, tid);
        load_tile<TB, VEC>(sa + TILE, B, ldb, n0, N, step * BK, K, tid);
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
                T* out = C + (size_t)r * ldc + c;
                const double x0 = alpha * acc[i][j][v], x1 = alpha * acc[i][j][v + 1];
                if (VEC && c + 1 < N) {
                    double2 y = make_double2(x0, x1);
                    if (beta != 0.0) {
                        const double2 old = *reinterpret_cast<const double2*>(out);
                        y.x += beta * old.x;
                        y.y += beta * old.y;
                    }
                    *reinterpret_cast<double2*>(out) = y;
                } else {
                    if (c < N) out[0] = beta != 0.0 ? x0 + beta * out[0] : x0;
                    if (c + 1 < N) out[1] = beta != 0.0 ? x1 + beta * out[1] : x1;
                }
            }
}

// pairs.cuh: grouped rasterisation (dmma.cu, regblock.cu, opt.cu), element pairs moved as one
// vector access, the C-pair and pair-tile epilogues, and the 2 x 2 patch stager that opt.cu and
// regblock.cu use to copy operand tiles global -> registers -> shared memory in either
// storage order. The loader splices this file into the sources that include it
// (so NVRTC and CuPy's kernel cache see one text); nvcc finds it beside them.

#pragma once

// Measuring builds of opt.cu and regblock.cu (`python -m benchmarks power`; their headers
// say what 1 and 2 stage). 0, the default, is the product; 1 and 2 give wrong products.
#ifndef OOCGEMM_STAGING
#define OOCGEMM_STAGING 0
#endif

// Grouped rasterisation: the tile (row, column) of C this block computes, in tiles, when
// consecutive blocks walk GROUP tile rows and then move right, so that the blocks resident
// at one time share panels of A and B in L2. The grid is (tiles along N, tiles along M).
__device__ __forceinline__ int2 grouped_tile(int group)
{
    const int tiles_n = gridDim.x, tiles_m = gridDim.y;
    const int pid = blockIdx.y * tiles_n + blockIdx.x;
    const int per_group = group * tiles_n;
    const int first_m = (pid / per_group) * group;
    const int group_m = (tiles_m - first_m) < group ? (tiles_m - first_m) : group;
    return make_int2(first_m + (pid % per_group) % group_m, (pid % per_group) / group_m);
}

// Two consecutive elements, moved as one vector access (16 bytes for double).
template <typename T>
struct alignas(2 * sizeof(T)) pair2 {
    T x, y;
};

template <typename T>
__device__ __forceinline__ pair2<T> load_pair(const T* p)
{
    return *reinterpret_cast<const pair2<T>*>(p);
}

template <typename T>
__device__ __forceinline__ void store_pair(T* p, T x, T y)
{
    pair2<T> v;
    v.x = x;
    v.y = y;
    *reinterpret_cast<pair2<T>*>(p) = v;
}

// Reads p[0] and p[1] of one memory row; `avail` elements of the row are inside the
// operand from p on (<= 0: none), and row_ok says whether the row itself is inside.
template <typename T, bool VEC>
__device__ __forceinline__ void load_two(const T* p, bool row_ok, int avail, T& x, T& y)
{
    if (VEC && row_ok && avail >= 2) {
        const pair2<T> v = load_pair(p);
        x = v.x;
        y = v.y;
    } else {
        x = T(0);
        y = T(0);
        if (row_ok && avail >= 1) x = p[0];
        if (row_ok && avail >= 2) y = p[1];
    }
}

// The epilogue of a pair of adjacent C elements: p[0], p[1] = v0, v1 (+ beta * old when
// read_c), `avail` columns of the row inside C from p on. With beta == 0 the caller passes
// read_c = false and C is never read.
template <typename T, bool VEC>
__device__ __forceinline__ void update_c_pair(T* p, int avail, T v0, T v1, T beta, bool read_c)
{
    if (VEC && avail >= 2) {
        if (read_c) {
            const pair2<T> old = load_pair(p);
            v0 += beta * old.x;
            v1 += beta * old.y;
        }
        store_pair(p, v0, v1);
        return;
    }
    if (avail >= 1) p[0] = read_c ? v0 + beta * p[0] : v0;
    if (avail >= 2) p[1] = read_c ? v1 + beta * p[1] : v1;
}

// The epilogue of a thread's TM x TN register tile made of 2 x 2 pairs (opt, regblock):
// acc[2g + r][2h + c] is C(row0 + RSTEP g + r, col0 + CSTEP h + c). Rows outside C are
// skipped, columns checked a pair at a time; with beta == 0, C is never read.
template <typename T, bool VEC, int RSTEP, int CSTEP, int TM, int TN>
__device__ __forceinline__ void store_c_tile(T* C, int ldc, int M, int N, int row0, int col0,
                                             const T (&acc)[TM][TN], T alpha, T beta)
{
    const bool read_c = beta != T(0);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = row0 + RSTEP * (i / 2) + (i % 2);
        if (row >= M) continue;
        T* crow = C + (long long)row * ldc;
#pragma unroll
        for (int h = 0; h < TN / 2; ++h) {
            const int col = col0 + CSTEP * h;
            update_c_pair<T, VEC>(crow + col, N - col, alpha * acc[i][2 * h],
                                  alpha * acc[i][2 * h + 1], beta, read_c);
        }
    }
}

// One thread's share of staging a TILE_MN x BK tile of an operand: NP 2 x 2 patches, patch
// q being the one numbered index + q * STRIDE (STRIDE: the threads that stage the tile).
// The operand element (mn, k) (mn along M for A, along N for B) lives at
// X[mn * ld + k] when KCONTIG, at X[k * ld + mn] otherwise. The shared tile is S[k][mn].
// The NP patches of a thread lie a fixed distance apart, so they share one pointer.
template <typename T, int TILE_MN, int BK, bool KCONTIG, bool VEC, int NP = 1, int STRIDE = 0>
struct PatchStager {
    static constexpr int KPAIRS = BK / 2;
    static constexpr int MNPAIRS = TILE_MN / 2;
    // From patch q to q + 1: further along mn (KCONTIG) or along k (otherwise).
    static constexpr int DMN = NP > 1 && KCONTIG ? 2 * (STRIDE / KPAIRS) : 0;
    static constexpr int DK = NP > 1 && !KCONTIG ? 2 * (STRIDE / MNPAIRS) : 0;
    static_assert(NP == 1 || STRIDE % (KCONTIG ? KPAIRS : MNPAIRS) == 0,
                  "the patches of a thread lie in the same place of their rows");

    const T* p;      // element (patch mn, patch k) of patch 0 in the current K-tile
    long long step;  // address advance from one K-tile to the next
    int ld;
    int mn;          // patch 0's origin inside the tile (even)
    int kk;
    int mn_avail;    // operand rows/columns inside, counted from patch 0's origin

    // `index`: which patch of the tile patch 0 is (a thread number when one patch a thread).
    __device__ __forceinline__ void init(const T* X, int ld_, int mn_base, int MN, int index)
    {
        // Consecutive lanes walk the dimension that is contiguous in memory.
        const int kp = KCONTIG ? index % KPAIRS : index / MNPAIRS;
        const int mp = KCONTIG ? index / KPAIRS : index % MNPAIRS;
        mn = 2 * mp;
        kk = 2 * kp;
        ld = ld_;
        mn_avail = MN - (mn_base + mn);
        const long long g = mn_base + mn;
        p = X + (KCONTIG ? g * ld_ + kk : (long long)kk * ld_ + g);
        step = KCONTIG ? (long long)BK : (long long)BK * ld_;
    }

    // r[q] = { (mn, k), (mn, k+1), (mn+1, k), (mn+1, k+1) } of patch q of the tile starting
    // at k0, zeros outside the operand. `inside` says that the whole TILE_MN x BK tile lies
    // inside the operand (true for every tile but the edges): then no guard is needed.
    __device__ __forceinline__ void load(int k0, int K, bool inside, T (&r)[NP][4]) const
    {
#pragma unroll
        for (int q = 0; q < NP; ++q) {
            const T* pq = p + (long long)q * (DMN + DK) * ld;   // one of DMN, DK is 0
            if (inside) {
                if (VEC) {
                    const pair2<T> v0 = load_pair(pq);
                    const pair2<T> v1 = load_pair(pq + ld);
                    r[q][0] = v0.x;
                    r[q][KCONTIG ? 1 : 2] = v0.y;
                    r[q][KCONTIG ? 2 : 1] = v1.x;
                    r[q][3] = v1.y;
                } else {
                    r[q][0] = pq[0];
                    r[q][KCONTIG ? 1 : 2] = pq[1];
                    r[q][KCONTIG ? 2 : 1] = pq[ld];
                    r[q][3] = pq[ld + 1];
                }
                continue;
            }
            const int k_avail = K - (k0 + kk + q * DK);
            const int mn_left = mn_avail - q * DMN;
            if (KCONTIG) {  // memory rows are mn, k contiguous
                load_two<T, VEC>(pq, mn_left >= 1, k_avail, r[q][0], r[q][1]);
                load_two<T, VEC>(pq + ld, mn_left >= 2, k_avail, r[q][2], r[q][3]);
            } else {        // memory rows are k, mn contiguous
                load_two<T, VEC>(pq, k_avail >= 1, mn_left, r[q][0], r[q][2]);
                load_two<T, VEC>(pq + ld, k_avail >= 2, mn_left, r[q][1], r[q][3]);
            }
        }
    }

    // S: the shared tile, rows of W >= TILE_MN elements (padded rows spread the stores of
    // different k rows over the banks).
    template <int W>
    __device__ __forceinline__ void store(T (*S)[W], const T (&r)[NP][4]) const
    {
#pragma unroll
        for (int q = 0; q < NP; ++q) {
            store_pair(&S[kk + q * DK][mn + q * DMN], r[q][0], r[q][2]);
            store_pair(&S[kk + q * DK + 1][mn + q * DMN], r[q][1], r[q][3]);
        }
    }

    __device__ __forceinline__ void advance() { p += step; }
};

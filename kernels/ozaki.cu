// ozaki: the steps of Ozaki scheme II on the GPU (issue 21), float64 products from int8 GEMMs.
// Each kernel runs functions of oocgemm/ozaki.py step for step, so that the GPU gives the CPU
// reference's bits (docs/design.md, "Ozaki scheme II"); cuBLAS's int8 x int8 -> int32 GEMM runs
// between them (oocgemm/cuda/ozaki.py drives the lot).
//
//   ozaki_stats_rows   ozaki.analyse    a panel's rows (K contiguous: a warp a row), or columns
//   ozaki_stats_cols                    (K strided: a thread a column): each one's largest
//                                       exponent; over the panel, the largest exponent spread
//                                       of a row and whether it holds infinities or NaN
//   ozaki_residues     ozaki.residues   rint(x 2^(bits - emax)) mod each modulus, balanced,
//                                       int8, K contiguous and padded with zeros to depth_pad
//   ozaki_finishN      ozaki.digit,     per element of C: Garner's digits from the N int32
//                      ozaki.rounded    products, the one rounding, then alpha and beta as the
//                                       CPU executor applies them (N: 16, 24, 32 or 36, the
//                                       most moduli the instance takes; its registers grow
//                                       with it)
//
// Launch: ozaki_residues with block (32, 8) and grid (ceil(depth_pad / 32), ceil(outer / 32));
// ozaki_stats_cols with block (32, 8) and any grid (a grid-stride loop over 32 columns a
// block); the others with 256 threads a block and any grid: a grid-stride loop over their
// elements (rows a warp each for ozaki_stats_rows). No dynamic shared memory. ozaki_residues
// converts `outer` rows of a panel whose moduli planes are `plane` elements apart (a chunk of
// its rows: x, emax and out point at the chunk's first row).
//
// Exactness: every step but ozaki_finishN's last operations is integer arithmetic or an exact
// floating-point operation (max, frexp, ldexp by a power of two without underflow, rint, a
// float64 integer to int64), so any correct order gives the same numbers. The rounding is one
// float64 multiply by 2^52 (exact) and one add, as __dmul_rn / __dadd_rn (never contracted
// into an FMA), then ldexp; alpha and beta are applied by __dmul_rn / __dadd_rn as numpy applies
// them: C = beta C + alpha P with each operation rounded, C unread when beta == 0.
//
// Layouts are row-major. A panel is read as `outer` rows (rows of A, columns of B) of `depth`
// elements: element (o, k) at x[o * so + k * sk]. Its residues are moduli planes of outer x
// depth_pad int8. The int32 products are planes of rows x cols (leading dimension ldp); C has
// leading dimension ldc.
//
// The moduli and Garner's constants are computed at compile time (ozaki_make_tables, the
// greedy choice of ozaki._coprime_moduli) into constant memory. The element functions
// (ozaki_*) are host-device, and plain C++ where __CUDACC__ is not defined: tests/test_ozaki.py
// compiles them for the CPU and compares them with numpy bit for bit. Self-contained (NVRTC
// has no headers); the C++ compile includes <math.h> first.

#ifdef __CUDACC__
#define OZAKI_HD __host__ __device__ __forceinline__
#else
#define OZAKI_HD inline
#endif

constexpr int OZAKI_MAX_MODULI = 40;  // len(ozaki.MODULI)
constexpr int OZAKI_LIMB = 26;        // ozaki.LIMB

constexpr int OZAKI_MAX_SHIFT = 64;   // 2^e mod m for e < this (e <= ozaki.MAX_BITS - 53)

struct OzakiTables {
    int moduli[OZAKI_MAX_MODULI];                     // ozaki.MODULI
    int weights[OZAKI_MAX_MODULI][OZAKI_MAX_MODULI];  // [k][j] = P_j mod m_k, j < k
    int inverses[OZAKI_MAX_MODULI];                   // P_k^-1 mod m_k
    int pow2[OZAKI_MAX_MODULI][OZAKI_MAX_SHIFT];      // [k][e] = 2^e mod m_k
    double reciprocals[OZAKI_MAX_MODULI];             // 1 / m_k, rounded
    unsigned long long fastmod[OZAKI_MAX_MODULI];     // 2^64 / m_k rounded up (ozaki_mod32)
    unsigned int offsets[OZAKI_MAX_MODULI];           // the least multiple of m_k >= 2^31
};

constexpr int ozaki_gcd(int a, int b)
{
    while (b != 0) {
        const int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// The moduli (pairwise coprime, from 256 down) and Garner's constants for them, where
// P_k = m_0 ... m_(k-1): ozaki._coprime_moduli and ozaki._garner.
constexpr OzakiTables ozaki_make_tables()
{
    OzakiTables t{};
    int count = 0;
    for (int m = 256; count < OZAKI_MAX_MODULI && m > 1; --m) {
        bool coprime = true;
        for (int i = 0; i < count; ++i) coprime = coprime && ozaki_gcd(m, t.moduli[i]) == 1;
        if (coprime) t.moduli[count++] = m;
    }
    for (int k = 0; k < OZAKI_MAX_MODULI; ++k) {
        const int m = t.moduli[k];
        int p = 1 % m;  // P_j mod m, j = 0 .. k
        for (int j = 0; j < k; ++j) {
            t.weights[k][j] = p;
            p = p * (t.moduli[j] % m) % m;
        }
        for (int x = 1; x <= m; ++x) {
            if (p * x % m == 1 % m) {
                t.inverses[k] = x % m;
                break;
            }
        }
        int power = 1 % m;
        for (int e = 0; e < OZAKI_MAX_SHIFT; ++e) {
            t.pow2[k][e] = power;
            power = power * 2 % m;
        }
        t.reciprocals[k] = 1.0 / m;
        t.fastmod[k] = ~0ULL / m + 1;
        t.offsets[k] = (unsigned int)m * ((0x80000000u + m - 1) / m);
    }
    return t;
}

#ifdef __CUDACC__
__constant__ OzakiTables ozaki_device_tables = ozaki_make_tables();
#endif
#ifndef __CUDA_ARCH__
constexpr OzakiTables ozaki_host_tables = ozaki_make_tables();
#endif

OZAKI_HD const OzakiTables& ozaki_tables()
{
#ifdef __CUDA_ARCH__
    return ozaki_device_tables;
#else
    return ozaki_host_tables;
#endif
}

OZAKI_HD double ozaki_mul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

OZAKI_HD double ozaki_add(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

// 1.5 2^52: added to a float64 of magnitude below 2^51, it rounds it to an integer, and the
// low 32 bits of the sum are that integer (two's complement) where it is below 2^31.
constexpr double OZAKI_MAGIC = 0x1.8p52;

OZAKI_HD int ozaki_low_word(double x)
{
#ifdef __CUDA_ARCH__
    return __double2loint(x);
#else
    long long bits;
    __builtin_memcpy(&bits, &x, sizeof bits);
    return (int)(unsigned int)bits;
#endif
}

// x mod m_k in [-(m/2), (m+1)/2) for an integer-valued float64 x with |x| <= 2^53, in floating
// point: x * (1/m) errs from x/m by under |x/m| 2^-52 <= 2^-5 (every modulus is at least 64),
// so q, it rounded to an integer, is the nearest integer to x/m or next to it, and x - q m, an
// integer within 0.6 m, is exact through one FMA; then at most one step of m into the range.
// Any exact method gives the same residue (ozaki._balanced_mod).
OZAKI_HD int ozaki_balanced_mod_f64(double x, int k)
{
    const OzakiTables& t = ozaki_tables();
    const int m = t.moduli[k];
    const double q = ozaki_add(ozaki_add(ozaki_mul(x, t.reciprocals[k]), OZAKI_MAGIC),
                               -OZAKI_MAGIC);
    int r = ozaki_low_word(ozaki_add(fma(-q, (double)m, x), OZAKI_MAGIC));
    if (r < -(m / 2)) r += m;
    else if (r >= (m + 1) / 2) r -= m;
    return r;
}

OZAKI_HD unsigned long long ozaki_mulhi64(unsigned long long a, unsigned long long b)
{
#ifdef __CUDA_ARCH__
    return __umul64hi(a, b);
#else
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
#endif
}

// u mod m_k for any 32-bit u, in integers (Lemire's fastmod: the low 64 bits of M u, times
// m, high half; M = 2^64 / m rounded up; exact for every 32-bit u and m).
OZAKI_HD int ozaki_mod32(unsigned int u, int k)
{
    const OzakiTables& t = ozaki_tables();
    return (int)ozaki_mulhi64(t.fastmod[k] * u, (unsigned long long)t.moduli[k]);
}

// x mod m_k in [-(m/2), (m+1)/2) for |x| < 2^31 - 2^9: x plus a multiple of m of at least
// 2^31 is a nonnegative 32-bit integer of x's class (ozaki._balanced_mod).
OZAKI_HD int ozaki_balanced_mod32(int x, int k)
{
    const OzakiTables& t = ozaki_tables();
    const int m = t.moduli[k];
    const int r = ozaki_mod32((unsigned int)x + t.offsets[k], k);
    return r >= (m + 1) / 2 ? r - m : r;
}

// -- 1. stats: ozaki.analyse --------------------------------------------------------------------

// What a row (or column) holds: its largest and smallest nonzero magnitudes (0: none), and
// whether it holds an infinity or NaN. max and min are exact: any order gives the same.
struct OzakiStats {
    double largest = 0.0, smallest = 0.0;
    bool nonfinite = false;
};

OZAKI_HD void ozaki_stats_add(OzakiStats& s, double x)
{
    const double a = fabs(x);
    if (!(a <= 0x1.fffffffffffffp+1023)) {  // an infinity, or NaN (no comparison holds)
        s.nonfinite = true;
    } else if (a > 0) {
        s.largest = fmax(s.largest, a);
        s.smallest = s.smallest == 0 ? a : fmin(s.smallest, a);
    }
}

OZAKI_HD void ozaki_stats_merge(OzakiStats& s, const OzakiStats& o)
{
    s.largest = fmax(s.largest, o.largest);
    if (o.smallest != 0) s.smallest = s.smallest == 0 ? o.smallest : fmin(s.smallest, o.smallest);
    s.nonfinite = s.nonfinite || o.nonfinite;
}

// The row's largest exponent (frexp; 0 for a zero row) into *emax, and its spread (largest
// less smallest nonzero exponent) and non-finiteness folded into summary[0], summary[1].
OZAKI_HD void ozaki_stats_store(const OzakiStats& s, int* emax, int* summary)
{
    int hi = 0, lo = 0;
    frexp(s.largest, &hi);
    *emax = hi;
    const int spread = s.smallest > 0 ? (frexp(s.smallest, &lo), hi - lo) : 0;
#ifdef __CUDA_ARCH__
    if (spread > 0) atomicMax(&summary[0], spread);
    if (s.nonfinite) atomicMax(&summary[1], 1);
#else
    if (spread > summary[0]) summary[0] = spread;
    if (s.nonfinite) summary[1] = 1;
#endif
}

// -- 2. residues: ozaki.residues ----------------------------------------------------------------

// The residues of x 2^shift rounded to an integer, modulo moduli[first .. first + n), into
// at[l * plane] for each such l; zeros where the element is padding (!inside). rint(x 2^shift)
// = s 2^e with s an integer below 2^53 and e >= 0 (y has 53 significant bits at most); where
// e > 0, s mod m times 2^e mod m (below 2^15) is reduced again.
OZAKI_HD void ozaki_residues_at(double x, bool inside, int shift, int first, int n,
                                signed char* at, long long plane)
{
    const OzakiTables& t = ozaki_tables();
    if (!inside) {
        for (int l = first; l < first + n; ++l) at[l * plane] = 0;
        return;
    }
    const double y = rint(ldexp(x, shift));
    int top;
    frexp(y, &top);
    const int e = top > 53 ? top - 53 : 0;
    const double s = ldexp(y, -e);  // exact: y's low e bits are zeros
    for (int l = first; l < first + n; ++l) {
        int r = ozaki_balanced_mod_f64(s, l);
        if (e > 0) r = ozaki_balanced_mod_f64((double)(r * t.pow2[l][e]), l);
        at[l * plane] = (signed char)r;
    }
}

// -- 3. the digits and the rounding: ozaki.digit, ozaki.rounded ---------------------------------

// Garner's balanced digits v_0 .. v_(n-1) of the product from its int32 residues c[k * plane]
// (any int32 of each class; |c| <= MAX_DEPTH 2^14 < 2^31 - 2^14): c reduced mod m_k, less
// t = sum_j v_j (P_j mod m_k) (below 2^21), times P_k^-1 (below 2^8) stays below 2^29; the
// digit is its balanced class. Integer arithmetic, full rate.
template <int MAXN>
OZAKI_HD void ozaki_digits(const int* c, long long plane, int n, int (&v)[MAXN])
{
    const OzakiTables& t = ozaki_tables();
#pragma unroll
    for (int k = 0; k < MAXN; ++k) {
        v[k] = 0;
        if (k < n) {
            int sum = 0;
#pragma unroll
            for (int j = 0; j < k; ++j) sum += v[j] * t.weights[k][j];
            const int reduced = ozaki_balanced_mod32(c[k * plane], k);
            v[k] = ozaki_balanced_mod32((reduced - sum) * t.inverses[k], k);
        }
    }
}

// (sum_k v_k P_k) 2^exp correctly rounded (ozaki.rounded). Loops run to the compile-time
// maxima (guarded), so the groups and limbs stay in registers.
template <int MAXN>
OZAKI_HD double ozaki_round_digits(const int (&v)[MAXN], int n, int exp)
{
    constexpr int GROUPS = (MAXN + 2) / 3;             // digits three at a time
    constexpr int LIMBS = 24 * GROUPS / OZAKI_LIMB + 1;  // each radix < 2^24
    const OzakiTables& t = ozaki_tables();
    const int n_groups = (n + 2) / 3;

    // 1. The digits three at a time (D_g, R_g: |D_g| < R_g / 2 < 2^23), and the sign of the
    // top nonzero group.
    int group[GROUPS], radix[GROUPS];
    int sign = 0;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
        int value = 0, r = 1;
#pragma unroll
        for (int d = 2; d >= 0; --d) {
            const int k = 3 * g + d;
            if (k < n) {
                value = value * t.moduli[k] + v[k];
                r *= t.moduli[k];
            }
        }
        group[g] = value;
        radix[g] = r;
        if (value != 0) sign = value > 0 ? 1 : -1;
    }

    // 2. |A'B'| by Horner's rule from the top group, in limbs of 26 bits, low first. After a
    // group the value is below 2^bits, so limbs past bits / 26 stay zero and are skipped (numpy
    // bounds them by the exact product of the radices; the limbs it skips beyond are zero too).
    unsigned int limb[LIMBS];  // 26 bits each: a limb times a radix fits 50
#pragma unroll
    for (int l = 0; l < LIMBS; ++l) limb[l] = 0;
    int bits = 0;
#pragma unroll
    for (int g = GROUPS - 1; g >= 0; --g) {
        if (g >= n_groups) continue;
        bits += 24;
        long long carry = sign * group[g];
#pragma unroll
        for (int l = 0; l < LIMBS; ++l) {
            if (l <= bits / OZAKI_LIMB) {
                const long long x = (long long)limb[l] * radix[g] + carry;
                limb[l] = (unsigned int)x & ((1u << OZAKI_LIMB) - 1);
                carry = x >> OZAKI_LIMB;  // arithmetic: a borrow of a negative group
            }
        }
    }

    // 3. The top nonzero limb and the three below it (zeros below limb 0): a and b; the limbs
    // further down only as a sticky bit in b's last.
    long long a = 0, b = 0;
    int taken = 0, top = 0;
    bool sticky = false;
#pragma unroll
    for (int l = LIMBS - 1; l >= -3; --l) {
        const long long x = l >= 0 ? limb[l] : 0;
        if (taken == 0 && x != 0) top = l;
        if (taken > 0 || x != 0) {
            if (taken < 2) a = a << OZAKI_LIMB | x;
            else if (taken < 4) b = b << OZAKI_LIMB | x;
            else sticky = sticky || x != 0;
            ++taken;
        }
    }
    b |= sticky;

    // 4. The one rounding, the sign, and the scale.
    const double value = ozaki_add(ozaki_mul((double)a, 0x1p52), (double)b);
    return ldexp(sign * value, OZAKI_LIMB * (top - 3) + exp);
}

// One element of C: the product from its int32 residues (c[k * plane]), scaled by 2^exp, then
// beta * C + alpha * P with each operation rounded (alpha * P alone, C unread, when beta == 0).
template <int MAXN>
OZAKI_HD double ozaki_finish_at(const int* c, long long plane, int n, int exp, double alpha,
                                double beta, const double* out)
{
    int v[MAXN];
    ozaki_digits<MAXN>(c, plane, n, v);
    const double p = ozaki_round_digits<MAXN>(v, n, exp);
    return beta == 0 ? ozaki_mul(p, alpha) : ozaki_add(ozaki_mul(*out, beta), ozaki_mul(p, alpha));
}

#ifdef __CUDACC__

extern "C" __global__ void ozaki_stats_rows(int outer, int depth, const double* __restrict__ x,
                                            long long so, int* __restrict__ emax,
                                            int* __restrict__ summary)
{
    const int lane = threadIdx.x % 32;
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long o = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; o < outer;
         o += warps) {
        OzakiStats s;
        for (int k = lane; k < depth; k += 32) ozaki_stats_add(s, x[o * so + k]);
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) {
            OzakiStats other;
            other.largest = __shfl_xor_sync(0xffffffffu, s.largest, offset);
            other.smallest = __shfl_xor_sync(0xffffffffu, s.smallest, offset);
            other.nonfinite = __shfl_xor_sync(0xffffffffu, (int)s.nonfinite, offset) != 0;
            ozaki_stats_merge(s, other);
        }
        if (lane == 0) ozaki_stats_store(s, &emax[o], summary);
    }
}

#define OZAKI_ELEMENTS(count)                                                                    \
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < (count);     \
         idx += (long long)gridDim.x * blockDim.x)

// 32 columns a block (block (32, 8)): each of its 8 rows of threads reads every 8th K
// (32 consecutive columns a warp), then the 8 partial stats of a column are merged.
extern "C" __global__ void ozaki_stats_cols(int outer, int depth, const double* __restrict__ x,
                                            long long sk, int* __restrict__ emax,
                                            int* __restrict__ summary)
{
    __shared__ double largest[8][32], smallest[8][32];
    __shared__ bool nonfinite[8][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (long long o0 = 32LL * blockIdx.x; o0 < outer; o0 += 32LL * gridDim.x) {
        const long long o = o0 + tx;
        OzakiStats s;
        if (o < outer)
            for (int k = ty; k < depth; k += blockDim.y) ozaki_stats_add(s, x[o + k * sk]);
        largest[ty][tx] = s.largest;
        smallest[ty][tx] = s.smallest;
        nonfinite[ty][tx] = s.nonfinite;
        __syncthreads();
        if (ty == 0 && o < outer) {
            for (int y = 1; y < blockDim.y; ++y) {
                OzakiStats other;
                other.largest = largest[y][tx];
                other.smallest = smallest[y][tx];
                other.nonfinite = nonfinite[y][tx];
                ozaki_stats_merge(s, other);
            }
            ozaki_stats_store(s, &emax[o], summary);
        }
        __syncthreads();
    }
}

// A 32 x 32 tile of (o, k) a block: read along whichever index x holds contiguous, written
// K contiguous, through shared memory.
extern "C" __global__ void ozaki_residues(int outer, int depth, int depth_pad,
                                          const double* __restrict__ x, long long so,
                                          long long sk, const int* __restrict__ emax, int bits,
                                          int first, int n, signed char* __restrict__ out,
                                          long long plane)
{
    __shared__ double tile[32][33];
    const int o0 = blockIdx.y * 32, k0 = blockIdx.x * 32, tx = threadIdx.x;
    for (int p = threadIdx.y; p < 32; p += blockDim.y) {
        const bool k_contiguous = sk == 1;
        const int o = o0 + (k_contiguous ? p : tx), k = k0 + (k_contiguous ? tx : p);
        const double value = o < outer && k < depth ? x[o * so + k * sk] : 0.0;
        if (k_contiguous) tile[p][tx] = value;
        else tile[tx][p] = value;
    }
    __syncthreads();
    for (int p = threadIdx.y; p < 32; p += blockDim.y) {
        const int o = o0 + p, k = k0 + tx;
        if (o < outer && k < depth_pad)
            ozaki_residues_at(tile[p][tx], k < depth, bits - emax[o], first, n,
                              out + (long long)o * depth_pad + k, plane);
    }
}

// exp of element (i, j): (emax_a[i] - bits_a) + (emax_b[j] - bits_b) = -(shift_a + shift_b).
#define OZAKI_FINISH(N)                                                                          \
    extern "C" __global__ void ozaki_finish##N(                                                  \
        int rows, int cols, const int* __restrict__ prod, long long ldp, long long plane, int n, \
        const int* __restrict__ emax_a, int bits_a, const int* __restrict__ emax_b, int bits_b,  \
        double alpha, double beta, double* __restrict__ c, long long ldc)                        \
    {                                                                                            \
        OZAKI_ELEMENTS((long long)rows * cols) {                                                 \
            const long long i = idx / cols, j = idx % cols;                                      \
            double* out = c + i * ldc + j;                                                       \
            *out = ozaki_finish_at<N>(prod + i * ldp + j, plane, n,                              \
                                      emax_a[i] - bits_a + emax_b[j] - bits_b, alpha, beta,    \
                                      out);                                                      \
        }                                                                                        \
    }

OZAKI_FINISH(16)
OZAKI_FINISH(24)
OZAKI_FINISH(32)
OZAKI_FINISH(36)

#endif

// ozaki: the elementwise steps of Ozaki scheme II (issue 21), float64 GEMM from int8 GEMMs.
// Each kernel is one function of oocgemm/ozaki.py, step for step, so that the GPU gives the
// CPU reference's bits (docs/design.md, "Ozaki scheme II"). The int8 x int8 -> int32 GEMMs
// between them are cuBLAS's (or a kernel's); nothing here is wired into the CUDA executor yet.
//
//   ozaki_shifts     ozaki.shifts     the shift of each row of A or column of B
//   ozaki_residues   ozaki.residues   rint(x 2^shift) mod each modulus, balanced, int8
//   ozaki_fold       ozaki._product   a deep block's int32 sum so far reduced mod m, plus the
//                                     next slice's (between slices of MAX_DEPTH)
//   ozaki_digit      ozaki.digit      Garner's k-th balanced digit of the product, int8
//   ozaki_round      ozaki.rounded    the digits to float64: limbs, one rounding, ldexp
//
// launch: block = (256, 1, 1) threads; grid = (ceil(count / 256), 1, 1) or fewer blocks: every
// kernel runs a grid-stride loop over its `count` elements (rows or columns for ozaki_shifts);
// dynamic shared memory = 0 bytes.
//
// Exactness: all but ozaki_round's last two operations are integer arithmetic or exact
// floating-point operations (max, frexp, ldexp by a power of two without underflow, rint, a
// float64 integer to int64), so any correct order gives the same numbers. The rounding is one
// float64 multiply by 2^52 (exact) and one add, as __dmul_rn / __dadd_rn (never contracted into
// an FMA), then ldexp, correctly rounded in CUDA and C alike.
//
// Layouts are row-major and dense, as numpy's: residues (moduli x rows x cols), products and
// digits (moduli x rows x cols of C); x and the output have leading dimensions.
//
// The element functions (ozaki_*_at) are host-device, and plain C++ where __CUDACC__ is not
// defined: tests/test_ozaki.py compiles them for the CPU and compares them with numpy bit for
// bit. Self-contained (NVRTC has no headers); the C++ compile includes <math.h> first.

#ifdef __CUDACC__
#define OZAKI_HD __host__ __device__ __forceinline__
#else
#define OZAKI_HD inline
#endif

constexpr int OZAKI_MAX_MODULI = 40;                                  // len(ozaki.MODULI)
constexpr int OZAKI_LIMB = 26;                                        // ozaki.LIMB
constexpr int OZAKI_MAX_GROUPS = (OZAKI_MAX_MODULI + 2) / 3;          // digits three at a time
constexpr int OZAKI_MAX_LIMBS = 24 * OZAKI_MAX_GROUPS / OZAKI_LIMB + 1;  // each radix < 2^24

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

// x mod m in [-(m/2), (m+1)/2): the floor modulo of x + m/2, less m/2 (ozaki._balanced_mod).
OZAKI_HD long long ozaki_balanced_mod(long long x, int m)
{
    const long long y = x + m / 2;
    long long r = y % m;  // the sign of y
    if (r < 0) r += m;
    return r - m / 2;
}

// 2^e mod m by squaring (numpy looks it up in a table of the same numbers).
OZAKI_HD int ozaki_pow2_mod(int e, int m)
{
    int result = 1 % m, base = 2 % m;
    for (; e > 0; e >>= 1) {
        if (e & 1) result = result * base % m;
        base = base * base % m;
    }
    return result;
}

// shift[t] = bits - frexp exponent of max_k |x[t * step + k * stride]| (0 for a zero row).
OZAKI_HD void ozaki_shift_at(long long t, int length, const double* x, long long step,
                             long long stride, int bits, int* shift)
{
    double largest = 0.0;
    for (int k = 0; k < length; ++k) largest = fmax(largest, fabs(x[t * step + k * stride]));
    int e;
    frexp(largest, &e);
    shift[t] = bits - e;
}

// The residues of element idx of x (rows x cols, leading dimension ld), scaled by the shift of
// its row (per_row: A) or column (B): rint(x 2^shift) = s 2^e with |s| < 2^53, e >= 0, and
// s (2^e mod m) < 2^61 reduced.
OZAKI_HD void ozaki_residues_at(long long idx, int rows, int cols, const double* x, long long ld,
                                const int* shift, int per_row, int n_moduli, const int* moduli,
                                signed char* out)
{
    const long long i = idx / cols, j = idx % cols, count = (long long)rows * cols;
    const double y = rint(ldexp(x[i * ld + j], shift[per_row ? i : j]));
    int top;
    frexp(y, &top);
    const int e = top > 53 ? top - 53 : 0;
    const long long s = (long long)ldexp(y, -e);
    for (int l = 0; l < n_moduli; ++l) {
        const int m = moduli[l];
        out[l * count + idx] = (signed char)ozaki_balanced_mod(s * ozaki_pow2_mod(e, m), m);
    }
}

// c = (c mod m, floor) + part: stays an int32 when |part| <= MAX_DEPTH 2^14.
OZAKI_HD void ozaki_fold_at(long long idx, int* c, const int* part, int m)
{
    int r = c[idx] % m;
    if (r < 0) r += m;
    c[idx] = r + part[idx];
}

// Garner's digit k: t = sum_j v_j (P_j mod m_k) (|t| < 2^21), then (c - t) P_k^-1 (< 2^40)
// reduced. weights[j] = P_j mod m_k for j < k; digits holds v_0 .. v_(k-1), count apart.
OZAKI_HD void ozaki_digit_at(long long idx, const int* c, const signed char* digits,
                             long long count, int k, const int* weights, int inverse, int m,
                             signed char* out)
{
    int t = 0;
    for (int j = 0; j < k; ++j) t += digits[j * count + idx] * weights[j];
    out[idx] = (signed char)ozaki_balanced_mod(((long long)c[idx] - t) * inverse, m);
}

// The product sum_k v_k P_k at element idx of C (rows x cols) times 2^-(shift_a[i] +
// shift_b[j]), correctly rounded, into out (leading dimension ldc). Loops run to the compile-time
// maxima (guarded), so the groups and limbs stay in registers.
OZAKI_HD void ozaki_round_at(long long idx, int rows, int cols, const signed char* digits,
                             int n_moduli, const int* moduli, const int* shift_a,
                             const int* shift_b, double* out, long long ldc)
{
    const long long i = idx / cols, j = idx % cols, count = (long long)rows * cols;
    const int n_groups = (n_moduli + 2) / 3;

    // 1. The digits three at a time (D_g, R_g), and the sign of the top nonzero group.
    long long group[OZAKI_MAX_GROUPS], radix[OZAKI_MAX_GROUPS];
    int sign = 0;
#pragma unroll
    for (int g = 0; g < OZAKI_MAX_GROUPS; ++g) {
        long long value = 0, r = 1;
#pragma unroll
        for (int d = 2; d >= 0; --d) {
            const int k = 3 * g + d;
            if (k < n_moduli) {
                value = value * moduli[k] + digits[k * count + idx];
                r *= moduli[k];
            }
        }
        group[g] = value;
        radix[g] = r;
        if (value != 0) sign = value > 0 ? 1 : -1;
    }

    // 2. |A'B'| by Horner's rule from the top group, in limbs of 26 bits, low first. After a
    // group the value is below 2^bits, so limbs past bits / 26 stay zero and are skipped (numpy
    // bounds them by the exact product of the radices; the limbs it skips beyond are zero too).
    long long limb[OZAKI_MAX_LIMBS];
#pragma unroll
    for (int l = 0; l < OZAKI_MAX_LIMBS; ++l) limb[l] = 0;
    int bits = 0;
#pragma unroll
    for (int g = OZAKI_MAX_GROUPS - 1; g >= 0; --g) {
        if (g >= n_groups) continue;
        bits += 24;
        long long carry = sign * group[g];
#pragma unroll
        for (int l = 0; l < OZAKI_MAX_LIMBS; ++l) {
            if (l <= bits / OZAKI_LIMB) {
                const long long x = limb[l] * radix[g] + carry;
                limb[l] = x & ((1LL << OZAKI_LIMB) - 1);
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
    for (int l = OZAKI_MAX_LIMBS - 1; l >= -3; --l) {
        const long long v = l >= 0 ? limb[l] : 0;
        if (taken == 0 && v != 0) top = l;
        if (taken > 0 || v != 0) {
            if (taken < 2) a = a << OZAKI_LIMB | v;
            else if (taken < 4) b = b << OZAKI_LIMB | v;
            else sticky = sticky || v != 0;
            ++taken;
        }
    }
    b |= sticky;

    // 4. The one rounding, the sign, and the scale.
    const double value = ozaki_add(ozaki_mul((double)a, 0x1p52), (double)b);
    out[i * ldc + j] = ldexp(sign * value, OZAKI_LIMB * (top - 3) - (shift_a[i] + shift_b[j]));
}

#ifdef __CUDACC__

#define OZAKI_ELEMENTS(count)                                                                    \
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < (count);     \
         idx += (long long)gridDim.x * blockDim.x)

extern "C" __global__ void ozaki_shifts(int count, int length, const double* __restrict__ x,
                                        long long step, long long stride, int bits,
                                        int* __restrict__ shift)
{
    OZAKI_ELEMENTS(count) ozaki_shift_at(idx, length, x, step, stride, bits, shift);
}

extern "C" __global__ void ozaki_residues(int rows, int cols, const double* __restrict__ x,
                                          long long ld, const int* __restrict__ shift,
                                          int per_row, int n_moduli,
                                          const int* __restrict__ moduli,
                                          signed char* __restrict__ out)
{
    OZAKI_ELEMENTS((long long)rows * cols)
        ozaki_residues_at(idx, rows, cols, x, ld, shift, per_row, n_moduli, moduli, out);
}

extern "C" __global__ void ozaki_fold(long long count, int* __restrict__ c,
                                      const int* __restrict__ part, int m)
{
    OZAKI_ELEMENTS(count) ozaki_fold_at(idx, c, part, m);
}

extern "C" __global__ void ozaki_digit(long long count, const int* __restrict__ c,
                                       const signed char* __restrict__ digits, int k,
                                       const int* __restrict__ weights, int inverse, int m,
                                       signed char* __restrict__ out)
{
    OZAKI_ELEMENTS(count) ozaki_digit_at(idx, c, digits, count, k, weights, inverse, m, out);
}

extern "C" __global__ void ozaki_round(int rows, int cols, const signed char* __restrict__ digits,
                                       int n_moduli, const int* __restrict__ moduli,
                                       const int* __restrict__ shift_a,
                                       const int* __restrict__ shift_b, double* __restrict__ out,
                                       long long ldc)
{
    OZAKI_ELEMENTS((long long)rows * cols)
        ozaki_round_at(idx, rows, cols, digits, n_moduli, moduli, shift_a, shift_b, out, ldc);
}

#endif

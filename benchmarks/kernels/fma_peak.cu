// fma_peak: throughput kernels for the non-tensor FMA peak (FP64 and FP32 pipes), and
// fma_outer: the same pipes fed as a GEMM feeds them.
//
// fma_peak: CHAINS = 16
// flops = 2 * CHAINS * iters per thread (each iteration is one FMA on each chain)
//
// launch: any 1-D grid; block = (256, 1, 1) threads is a good choice; fill the GPU with
// several blocks per SM (e.g. 8 * SM count blocks). out holds one element per thread of
// the grid; fma_peak_chains(out) writes CHAINS to out[0], so a caller reads the count
// from the kernel rather than from this comment.
//
// Each thread runs CHAINS independent FMA chains a = a * a + c, enough independent work per
// thread to cover the FMA latency, with a and c derived from threadIdx so that the compiler
// cannot fold them; the loop count is a run-time argument, and the sum of the chains is
// stored so that nothing is dead code. Each chain starts below 0.6 and converges to the
// small root of a = a * a + c (about c = 1e-3), so no value overflows or goes subnormal
// however long it runs.
// Why a * a + c: each FMA then reads one register pair besides the c that every FMA shares.
// Measured on the H100 (session 10), this form issues 0.98-0.99 of 64 FP64 FMAs per clock
// per SM at 1980 MHz, as do FMAs whose b and c are immediates; a = a * b + c with b and c in
// registers issued only 0.91 of it, whatever the number of chains (8 to 32) or warps, so a
// peak measured that way was 8% low.

// fma_outer: the same FMAs as a GEMM's inner loop issues them, kept in registers: each thread
// holds OUTER_ROWS a values, OUTER_ROWS b values (two sets of OUTER_ROWS / 2, used in turn) and an
// (OUTER_ROWS / 2) x (OUTER_ROWS / 2) block of accumulators (8 x 8, regblock's thread tile; a 4 x 4
// block issues its FMAs 5% slower on the H100), read from src, and adds outer products
// of its a and b sets into the accumulators, with no loads inside the loop:
//
//   for it < iters:  for h in {0, 1}:  acc[i][j] += a[h * R + i] * b[h * R + j]   (R = OUTER_ROWS / 2)
//
// in regblock.cu's order: column by column, down the even columns and up the odd ones.
//
// flops = 2 * 2 * R * R * iters per thread; src holds OUTER_VALUES values a thread (a, b, then acc
// row-major), out one sum of the accumulators a thread. With random src the FMAs' operands change
// from one instruction to the next as a GEMM's do; with constant src they do not, so the two
// measure what data costs in power (`python -m benchmarks power`). Each accumulator grows by a
// fixed amount an iteration, so it stays far from overflow for any run that fits in hours.
//
// Self-contained on purpose: it is compiled at run time by NVRTC, which has no headers.

constexpr int FMA_CHAINS = 16;

template <typename T>
__device__ __forceinline__ T fma_peak_fma(T a, T b, T c);

template <>
__device__ __forceinline__ double fma_peak_fma<double>(double a, double b, double c)
{
    return __fma_rn(a, b, c);
}

template <>
__device__ __forceinline__ float fma_peak_fma<float>(float a, float b, float c)
{
    return __fmaf_rn(a, b, c);
}

template <typename T>
__device__ __forceinline__ void fma_peak_body(T* out, int iters)
{
    const unsigned t = threadIdx.x;
    const T c = T(1e-3) + T(t & 31) * T(1e-7);
    T a[FMA_CHAINS];
#pragma unroll
    for (int i = 0; i < FMA_CHAINS; ++i) a[i] = T(t & 255) * T(1e-3) + T(i) * T(0.02);  // < 0.6

#pragma unroll 4
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < FMA_CHAINS; ++i) a[i] = fma_peak_fma(a[i], a[i], c);
    }

    T sum = T(0);
#pragma unroll
    for (int i = 0; i < FMA_CHAINS; ++i) sum += a[i];
    out[(long long)blockIdx.x * blockDim.x + t] = sum;
}

extern "C" __global__ void fma_peak_f64(double* out, int iters)
{
    fma_peak_body<double>(out, iters);
}

extern "C" __global__ void fma_peak_f32(float* out, int iters)
{
    fma_peak_body<float>(out, iters);
}

constexpr int OUTER_ROWS = 16;
constexpr int OUTER_R = OUTER_ROWS / 2;
constexpr int OUTER_VALUES = 2 * OUTER_ROWS + OUTER_R * OUTER_R;

template <typename T>
__device__ __forceinline__ void fma_outer_body(const T* __restrict__ src, T* out, int iters)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const T* s = src + OUTER_VALUES * t;
    T a[OUTER_ROWS], b[OUTER_ROWS], acc[OUTER_R][OUTER_R];
#pragma unroll
    for (int i = 0; i < OUTER_ROWS; ++i) {
        a[i] = s[i];
        b[i] = s[OUTER_ROWS + i];
    }
#pragma unroll
    for (int i = 0; i < OUTER_R; ++i)
#pragma unroll
        for (int j = 0; j < OUTER_R; ++j) acc[i][j] = s[2 * OUTER_ROWS + OUTER_R * i + j];

#pragma unroll 2
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < OUTER_R; ++j)
#pragma unroll
                for (int ii = 0; ii < OUTER_R; ++ii) {
                    const int i = (j & 1) ? OUTER_R - 1 - ii : ii;  // regblock.cu's order
                    acc[i][j] = fma_peak_fma(a[OUTER_R * h + i], b[OUTER_R * h + j], acc[i][j]);
                }
    }

    T sum = T(0);
#pragma unroll
    for (int i = 0; i < OUTER_R; ++i)
#pragma unroll
        for (int j = 0; j < OUTER_R; ++j) sum += acc[i][j];
    out[t] = sum;
}

extern "C" __global__ void fma_outer_f64(const double* src, double* out, int iters)
{
    fma_outer_body<double>(src, out, iters);
}

extern "C" __global__ void fma_outer_f32(const float* src, float* out, int iters)
{
    fma_outer_body<float>(src, out, iters);
}

extern "C" __global__ void fma_outer_shape(int* out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = OUTER_ROWS;
        out[1] = OUTER_VALUES;
    }
}

extern "C" __global__ void fma_peak_chains(int* out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = FMA_CHAINS;
}

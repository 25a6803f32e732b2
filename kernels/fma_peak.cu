// fma_peak: throughput kernels for the non-tensor FMA peak (FP64 and FP32 pipes).
//
// fma_peak: CHAINS = 16
// flops = 2 * CHAINS * iters per thread (each iteration is one FMA on each chain)
//
// launch: any 1-D grid; block = (256, 1, 1) threads is a good choice; fill the GPU with
// several blocks per SM (e.g. 8 * SM count blocks). out holds one element per thread of
// the grid; fma_peak_chains(out) writes CHAINS to out[0], so a caller reads the count
// from the kernel rather than from this comment.
//
// Each thread runs CHAINS independent FMA chains a = a * b + c, enough independent work
// per thread to cover the FMA latency, with a, b and c derived from threadIdx so that the
// compiler cannot fold them; the loop count is a run-time argument, and the sum of the
// chains is stored so that nothing is dead code. b < 1 keeps every chain bounded (each
// converges to c / (1 - b)), so no value overflows or goes subnormal however long it runs.
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
    const T b = T(0.999) - T(t & 7) * T(1e-6);  // in (0, 1)
    const T c = T(1e-3) + T(t & 31) * T(1e-7);
    T a[FMA_CHAINS];
#pragma unroll
    for (int i = 0; i < FMA_CHAINS; ++i) a[i] = T(t & 255) * T(1e-3) + T(i);

#pragma unroll 4
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int i = 0; i < FMA_CHAINS; ++i) a[i] = fma_peak_fma(a[i], b, c);
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

extern "C" __global__ void fma_peak_chains(int* out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = FMA_CHAINS;
}

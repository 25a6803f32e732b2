// Frames of one nvCOMP batch packed back to back (oocgemm/cuda/nvcomp.py, StripeEncoder).
//
// nvCOMP writes each frame of a batch into a slot of the largest size a frame may take
// (`capacity` bytes apart) and its size into `sizes`. This copies them into `packed` in
// batch order, so that the host takes each chunk piece's frames as one span of the pinned
// ring buffer (one copy, no per-frame work under Python's lock).
//
// One block per frame, 256 threads: the block sums the sizes before its frame (its offset),
// then copies the frame byte by byte (the offsets are not aligned).

extern "C" __global__ void pack_frames(const unsigned char* __restrict__ slots,
                                       unsigned long long capacity,
                                       const unsigned long long* __restrict__ sizes,
                                       unsigned char* __restrict__ packed)
{
    __shared__ unsigned long long partial[256];
    const unsigned int frame = blockIdx.x;
    unsigned long long sum = 0;
    for (unsigned int g = threadIdx.x; g < frame; g += blockDim.x) sum += sizes[g];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    const unsigned long long at = partial[0];
    const unsigned long long size = sizes[frame];
    const unsigned char* src = slots + frame * capacity;
    for (unsigned long long i = threadIdx.x; i < size; i += blockDim.x) packed[at + i] = src[i];
}

// The elementwise step of a symmetric product (X^T X, X X^T): a diagonal block of C has its
// upper triangle computed (SYRK and GEMMs), and its lower triangle is made an exact copy of it,
// row stripe by row stripe, as the stripes become final (oocgemm/planning/schedule.py, MIRROR).
// A copy moves bytes, so one kernel serves every dtype of an element's size.

template <typename T>
__device__ void mirror(T* c, long long h, long long x0, long long x1) {
    // Rows [x0, x1) of a row-major square block whose rows are h elements apart: every element
    // below the diagonal takes the one across it. A thread a column of a row: the reads go
    // down a column (strided), the writes along the row (coalesced).
    const long long rows = x1 - x0;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long at = blockIdx.x * (long long)blockDim.x + threadIdx.x; at < rows * x1;
         at += step) {
        const long long row = x0 + at / x1, col = at % x1;
        if (col < row) c[row * h + col] = c[col * h + row];
    }
}

extern "C" __global__ void mirror_lower_4(float* c, long long h, long long x0, long long x1) {
    mirror(c, h, x0, x1);
}

extern "C" __global__ void mirror_lower_8(double* c, long long h, long long x0, long long x1) {
    mirror(c, h, x0, x1);
}

extern "C" __global__ void mirror_lower_16(double2* c, long long h, long long x0, long long x1) {
    mirror(c, h, x0, x1);
}

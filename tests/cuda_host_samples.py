"""CUDA samples for the host path and the compile check: name -> (source, entry, block).

Each has a NumPy oracle in tests/unit/test_cuda_host.py. `block_sum` is a block reduction in
shared memory with __syncthreads and one atomicAdd per block; `scale_dynamic` uses
dynamic shared memory (extern __shared__).
"""

BLOCK_SUM = r"""
extern "C" __global__ void block_sum(const unsigned* x, unsigned long long* total,
                                     unsigned long long n_bytes) {
    __shared__ unsigned long long partial[256];
    unsigned long long n = n_bytes / 4, sum = 0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)blockDim.x * gridDim.x) {
        sum += x[i];
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(total, partial[0]);
}
"""

SCALE_DYNAMIC = r"""
extern "C" __global__ void scale_dynamic(const float* x, float* y, float a,
                                         unsigned long long n_bytes) {
    extern __shared__ float tile[];
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long n = n_bytes / sizeof(float);
    // Reversed within the block through shared memory: wrong without the barrier.
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    unsigned long long j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
    if (j < n) y[j] = a * tile[threadIdx.x];
}
"""

SAMPLES = {
    "block_sum": (BLOCK_SUM, "block_sum", 256),
    "scale_dynamic": (SCALE_DYNAMIC, "scale_dynamic", 64),
}

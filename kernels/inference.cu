// mlp_forward in CUDA: a batch of rows through a 16-32-4 MLP (ReLU hidden layer). The
// weights are not shipped: each block derives them from the `seed` argument with an integer
// hash into shared memory, then each thread runs whole rows (grid-stride). Every weight is a
// multiple of 2^-26 in [-1/8, 1/8), exact in float, so inference.py's reference has the very
// same weights. A trailing partial row of the input is ignored.
#define N_IN 16
#define N_HIDDEN 32
#define N_OUT 4
#define W1 0
#define B1 (W1 + N_HIDDEN * N_IN)
#define W2 (B1 + N_HIDDEN)
#define B2 (W2 + N_OUT * N_HIDDEN)
#define N_WEIGHTS (B2 + N_OUT)

// lowbias32 (Chris Wellons' integer hash) of the weight's index mixed with the seed.
__device__ __forceinline__ float weight(unsigned seed, unsigned i) {
  unsigned x = seed ^ (i * 0x9E3779B9u);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return ((float)(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.25f;
}

extern "C" __global__ void mlp_forward(const float* x, float* y, unsigned seed,
                                       unsigned long long in_bytes) {
  __shared__ float w[N_WEIGHTS];
  for (unsigned i = threadIdx.x; i < N_WEIGHTS; i += blockDim.x) w[i] = weight(seed, i);
  __syncthreads();  // every row reads every weight
  const unsigned long long rows = in_bytes / (N_IN * sizeof(float));
  for (unsigned long long r = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; r < rows;
       r += (unsigned long long)blockDim.x * gridDim.x) {
    float h[N_HIDDEN];
    for (int j = 0; j < N_HIDDEN; ++j) {
      float acc = w[B1 + j];
      for (int k = 0; k < N_IN; ++k) acc += w[W1 + j * N_IN + k] * x[r * N_IN + k];
      h[j] = acc > 0.0f ? acc : 0.0f;
    }
    for (int o = 0; o < N_OUT; ++o) {
      float acc = w[B2 + o];
      for (int j = 0; j < N_HIDDEN; ++j) acc += w[W2 + o * N_HIDDEN + j] * h[j];
      y[r * N_OUT + o] = acc;
    }
  }
}

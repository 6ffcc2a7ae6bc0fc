// rastrigin_fitness in CUDA: the Rastrigin function of each individual of a population chunk
// (N_GENES float32 genes each, one thread per individual, at most BLOCK of them), computed in
// double and written as float32 to out[1 + i]. out[0] is the chunk's best (smallest) fitness,
// a min-reduction in shared memory: what TopK ranks chunks by. An empty chunk's best is +inf.
#define N_GENES 16
#define BLOCK 256  // the launch's block size: the reduction assumes this power of two
#define TWO_PI 6.283185307179586

extern "C" __global__ void rastrigin_fitness(const float* genes, float* out,
                                             unsigned long long in_bytes) {
  __shared__ float best[BLOCK];
  const unsigned i = threadIdx.x;
  const unsigned long long n = in_bytes / (N_GENES * sizeof(float));
  float fitness = __int_as_float(0x7f800000);  // +inf: never the best
  if (i < n && n <= BLOCK) {
    double sum = 10.0 * N_GENES;
    for (int g = 0; g < N_GENES; ++g) {
      const double x = genes[i * N_GENES + g];
      sum += x * x - 10.0 * cos(TWO_PI * x);
    }
    fitness = (float)sum;
    out[1 + i] = fitness;
  }
  best[i] = fitness;
  __syncthreads();
  for (unsigned stride = BLOCK / 2; stride > 0; stride /= 2) {
    if (i < stride) best[i] = fminf(best[i], best[i + stride]);
    __syncthreads();
  }
  if (i == 0) out[0] = best[0];
}

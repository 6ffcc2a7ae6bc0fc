// mandelbrot_tile in CUDA: one TILE x TILE tile of the Mandelbrot set, one thread per pixel,
// each writing its escape count (0..max_iter) as a uint32. The chunk's input is the tile's
// column and row (`<II`); the view (x0, y0, step) and max_iter are kernel args.
// Every double operation is rounded on its own (no FMA contraction, which a GPU compiler
// would do by default): so the counts equal tiles.py's NumPy reference bit for bit.
#define TILE 32
#ifdef __CUDACC__
#define MUL(a, b) __dmul_rn(a, b)
#define ADD(a, b) __dadd_rn(a, b)
#define SUB(a, b) __dsub_rn(a, b)
#else  // the host path: g++ -std=c++17 on x86-64 contracts nothing
#define MUL(a, b) ((a) * (b))
#define ADD(a, b) ((a) + (b))
#define SUB(a, b) ((a) - (b))
#endif

extern "C" __global__ void mandelbrot_tile(const unsigned* in, unsigned* out, double x0,
                                           double y0, double step, unsigned max_iter,
                                           unsigned long long in_bytes) {
  if (in_bytes != 8 || blockDim.x != TILE || blockDim.y != TILE) return;
  const unsigned px = in[0] * TILE + threadIdx.x, py = in[1] * TILE + threadIdx.y;
  const double cr = ADD(x0, MUL((double)px, step)), ci = ADD(y0, MUL((double)py, step));
  double zr = 0.0, zi = 0.0;
  unsigned n = 0;
  for (; n < max_iter; ++n) {
    const double zr2 = MUL(zr, zr), zi2 = MUL(zi, zi);
    if (ADD(zr2, zi2) > 4.0) break;
    zi = ADD(MUL(MUL(2.0, zr), zi), ci);
    zr = ADD(SUB(zr2, zi2), cr);
  }
  out[threadIdx.y * TILE + threadIdx.x] = n;
}

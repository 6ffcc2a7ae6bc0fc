"""CUDA kernels written for the hostile host path's tests, each with its NumPy reference.

GOOD kernels are correct CUDA in the styles users write (a usage comment with <<<...>>>,
file-scope `extern __shared__`, unsigned and double atomics, a template by its mangled name,
fast-math intrinsics, `__half`, warp shuffles, votes and reductions, printf); each
`Sample` holds its launch and a reference. BAD kernels are wrong in one way each, with the
message the host path must give. Every kernel here compiles with NVRTC for sm_90
(tests/unit/test_nvrtc_check.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from vramfabric.kernels import CudaKernel


@attrs.frozen
class Sample:
    """A kernel, its launch, an input maker and its reference (or the fault it must raise)."""

    source: str
    entry: str
    args: tuple[Any, ...]
    grid: int
    block: int
    out_bytes: int
    make_input: Callable[[np.random.Generator], bytes]
    reference: Callable[[bytes], np.ndarray] | None = None
    dtype: str = "float32"
    shared_mem_bytes: int = 0
    rtol: float = 0.0
    fault: str = ""  # a regex the fault's message must match

    def kernel(self, name: str = "") -> CudaKernel:
        """The CudaKernel of this sample."""
        return CudaKernel(
            name=name or self.entry,
            entry=self.entry,
            source=self.source,
            args=self.args,
            grid=(self.grid,),
            block=(self.block,),
            max_output_bytes=self.out_bytes,
            output_dtype=self.dtype,
            shared_mem_bytes=self.shared_mem_bytes,
        )


def floats(n: int) -> Callable[[np.random.Generator], bytes]:
    """An input maker: n standard-normal float32s."""
    return lambda rng: rng.standard_normal(n).astype(np.float32).tobytes()


def f32(data: bytes) -> np.ndarray:
    """The input's float32s."""
    return np.frombuffer(data, np.float32)


USAGE_COMMENT = r"""
// Launch: scale<<<4, 64>>>(x, y, 2.0f, n_bytes); "<<<" in a string is no launch either.
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned long long n) {
  const char* note = "scale<<<1, 1>>>";
  unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / 4 && note[0] == 's') y[i] = a * x[i];
}
"""

FILE_SCOPE_DYNAMIC = r"""
extern __shared__ float tile[];  // the samples' style: dynamic shared memory at file scope

extern "C" __global__ void reverse_blocks(const float* x, float* y) {
  unsigned t = threadIdx.x, base = blockIdx.x * blockDim.x;
  tile[t] = x[base + t];
  __syncthreads();
  y[base + t] = tile[blockDim.x - 1 - t];
}
"""

UNSIGNED_ATOMICS = r"""
extern "C" __global__ void histogram(const unsigned char* x, unsigned* bins,
                                     unsigned long long n) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += blockDim.x * gridDim.x) {
    atomicAdd(&bins[x[i]], 1);  // an int 1 to an unsigned*: CUDA's overload takes it
    atomicMax(&bins[256], (unsigned)x[i]);
    atomicInc(&bins[257], 0xffffffffu);
  }
}
"""

DOUBLE_CAS_ADD = r"""
// The Programming Guide's atomicAdd for double, through atomicCAS and bit casts.
__device__ double add_double(double* address, double val) {
  unsigned long long* bits = (unsigned long long*)address;
  unsigned long long old = *bits, assumed;
  do {
    assumed = old;
    old = atomicCAS(bits, assumed,
                    __double_as_longlong(val + __longlong_as_double(assumed)));
  } while (assumed != old);
  return __longlong_as_double(old);
}
extern "C" __global__ void sum_doubles(const double* x, double* out, unsigned long long n) {
  unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / 8) add_double(out, x[i]);
}
"""

TEMPLATE = r"""
template <typename T>
__global__ void square(const T* x, T* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / sizeof(T)) y[i] = x[i] * x[i];
}
template __global__ void square<float>(const float*, float*, unsigned long long);
"""
TEMPLATE_ENTRY = "_Z6squareIfEvPKT_PS0_y"

FAST_MATH = r"""
extern "C" __global__ void fast_math(const float* x, float* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n / 4) return;
  float s, c, v = x[i];
  __sincosf(v, &s, &c);
  y[3 * i] = s * s + c * c;
  y[3 * i + 1] = __log2f(fabsf(v) + 1.0f);
  y[3 * i + 2] = __expf(v * 0.5f);
}
"""

HALF = r"""
#include <cuda_fp16.h>
extern "C" __global__ void half_twice(const float* x, __half* y, unsigned long long n) {
  unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / 4) y[i] = __hmul(__float2half(x[i]), __float2half(2.0f));
}
"""

WARPS = r"""
// Per warp: the sum (shuffle down), the max (butterfly), positives (ballot), and the
// unsigned sum of rounded values (__reduce_add_sync). Three warps per block.
extern "C" __global__ void warp_stats(const float* x, float* out) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x & 31;
  unsigned warp = i / 32;
  float v = x[i], sum = v, top = v;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
  for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  unsigned positive = __popc(__ballot_sync(0xffffffffu, v > 0.0f));
  unsigned total = __reduce_add_sync(0xffffffffu, (unsigned)(fabsf(v) * 100.0f));
  int all_small = __all_sync(0xffffffffu, fabsf(v) < 100.0f);
  if (lane == 0) {
    out[4 * warp] = sum;
    out[4 * warp + 1] = top;
    out[4 * warp + 2] = (float)positive + (all_small ? 0.5f : 0.0f);
    out[4 * warp + 3] = (float)total;
  }
}
"""

SHARED_STYLES = r"""
extern "C" __global__ void shared_styles(const float* x, float* out) {
  static __shared__ __align__(16) float a[64], b[64];
  volatile __shared__ int flag;
  unsigned t = threadIdx.x;
  a[t] = x[t];
  b[t] = 2.0f * x[t];
  if (t == 0) flag = 1;
  __syncthreads();
  out[t] = a[63 - t] + b[t] + (float)flag;
}
"""

PRINTF = r"""
extern "C" __global__ void hello(float* out) {
  if (threadIdx.x == 0) {
    printf("hello from block %d\n", (int)blockIdx.x);
    out[blockIdx.x] = 1.0f;
  }
}
"""


def _warp_reference(data: bytes) -> np.ndarray:
    x = f32(data).reshape(-1, 32)
    out = np.zeros((x.shape[0], 4), np.float32)
    sums = x.copy()
    for o in (16, 8, 4, 2, 1):  # the shuffle-down tree, lane 0's sum
        shifted = np.zeros_like(sums)
        shifted[:, : 32 - o] = sums[:, o:]
        shifted[:, 32 - o :] = sums[:, 32 - o :]
        sums = sums + shifted
    out[:, 0] = sums[:, 0]
    out[:, 1] = x.max(axis=1)
    small = (np.abs(x) < 100).all(axis=1)
    out[:, 2] = (x > 0).sum(axis=1) + np.where(small, 0.5, 0.0)
    out[:, 3] = (np.abs(x) * np.float32(100)).astype(np.uint32).sum(axis=1, dtype=np.uint32)
    return out.ravel()


def _histogram(data: bytes) -> np.ndarray:
    x = np.frombuffer(data, np.uint8)
    out = np.zeros(258, np.uint32)
    out[:256] = np.bincount(x, minlength=256)
    out[256], out[257] = x.max(), x.size
    return out


def _half(data: bytes) -> np.ndarray:
    return (f32(data).astype(np.float16) * np.float16(2)).astype(np.float16)


def _fast_math(data: bytes) -> np.ndarray:
    x = f32(data).astype(np.float64)
    return np.stack([np.ones_like(x), np.log2(np.abs(x) + 1), np.exp(x * 0.5)], 1).ravel()


GOOD: dict[str, Sample] = {
    "usage_comment": Sample(
        USAGE_COMMENT, "scale", ("in", "out", ("f32", 2.0), "in_bytes"), 4, 64, 1024,
        floats(256), lambda d: f32(d) * np.float32(2.0),
    ),
    "file_scope_extern_shared": Sample(
        FILE_SCOPE_DYNAMIC, "reverse_blocks", ("in", "out"), 4, 64, 1024, floats(256),
        lambda d: f32(d).reshape(4, 64)[:, ::-1].ravel(), shared_mem_bytes=256,
    ),
    "unsigned_atomics": Sample(
        UNSIGNED_ATOMICS, "histogram", ("in", "out", "in_bytes"), 3, 64, 258 * 4,
        lambda rng: rng.integers(0, 256, 3000, dtype=np.uint8).tobytes(), _histogram,
        dtype="uint32",
    ),
    "double_cas_add": Sample(
        DOUBLE_CAS_ADD, "sum_doubles", ("in", "out", "in_bytes"), 4, 64, 8,
        lambda rng: rng.integers(-1000, 1000, 250).astype(np.float64).tobytes(),
        lambda d: np.frombuffer(d, np.float64).sum(keepdims=True), dtype="float64",
    ),
    "template_by_mangled_name": Sample(
        TEMPLATE, TEMPLATE_ENTRY, ("in", "out", "in_bytes"), 2, 128, 1024, floats(256),
        lambda d: f32(d) * f32(d),
    ),
    "fast_math_intrinsics": Sample(
        FAST_MATH, "fast_math", ("in", "out", "in_bytes"), 2, 64, 128 * 12, floats(128),
        _fast_math, rtol=2e-5,
    ),
    "half": Sample(
        HALF, "half_twice", ("in", "out", "in_bytes"), 2, 64, 256, floats(128), _half,
        dtype="float16",
    ),
    "shared_declarations": Sample(
        SHARED_STYLES, "shared_styles", ("in", "out"), 1, 64, 256, floats(64),
        lambda d: f32(d)[::-1] + np.float32(2.0) * f32(d) + np.float32(1.0),
    ),
    "warp_intrinsics": Sample(
        WARPS, "warp_stats", ("in", "out"), 2, 96, 6 * 16, floats(192), _warp_reference,
    ),
}

UNINITIALISED_SHARED = r"""
extern "C" __global__ void block_sums(const float* x, float* out) {
  __shared__ float acc[64];
  acc[threadIdx.x] += x[blockIdx.x * blockDim.x + threadIdx.x];  // never zeroed
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int t = 0; t < 64; ++t) s += acc[t];
    out[blockIdx.x] = s;
  }
}
"""

LOST_UPDATES = r"""
extern "C" __global__ void total(const float* x, float* out) {
  out[0] += x[blockIdx.x * blockDim.x + threadIdx.x];  // not atomic: a GPU loses updates
}
"""

BLOCK_ORDER = r"""
// Block b reads what block b - 1 wrote: blocks run in any order (and at once) on a GPU.
extern "C" __global__ void chain(const unsigned* x, unsigned* out) {
  if (threadIdx.x != 0) return;
  unsigned b = blockIdx.x;
  unsigned before = b == 0 ? 0u : atomicAdd(&out[b - 1], 0u);
  atomicExch(&out[b], before + x[b]);
}
"""

DIVERGENT_BARRIER = r"""
extern "C" __global__ void half_barrier(float* out) {
  out[threadIdx.x] = (float)threadIdx.x;
  if (threadIdx.x < 32) {
    __syncthreads();  // only half the block comes here
  }
}
"""

MASK_WITHOUT_SELF = r"""
extern "C" __global__ void bad_mask(const float* x, float* out) {
  float v = x[threadIdx.x];
  v = __shfl_sync(0x0000ffffu, v, 0);  // lanes 16..31 call it but are not in the mask
  out[threadIdx.x] = v;
}
"""

INACTIVE_LANE = r"""
extern "C" __global__ void half_warp_sum(const float* x, float* out) {
  float v = x[threadIdx.x];
  if (threadIdx.x < 16) {
    v += __shfl_down_sync(0x0000ffffu, v, 8);  // lanes 8..15 read lanes 16..23: not in it
  }
  out[threadIdx.x] = v;
}
"""

PAST_OUT = r"""
extern "C" __global__ void copy(const float* x, float* out, unsigned long long n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = x[i % (n / 4)];  // 65 threads, 64 floats of out
}
"""

PAST_IN = r"""
extern "C" __global__ void sum_in(const float* x, float* out) {
  float s = 0.0f;
  for (int i = 0; i <= 1024; ++i) s += x[i];  // 1024 floats of in, one more read
  out[threadIdx.x] = s;
}
"""

DIVIDE_BY_ZERO = r"""
extern "C" __global__ void ratios(const int* x, int* out) {
  int d = x[threadIdx.x];
  out[threadIdx.x] = 1000 / d;
}
"""

STACK_OVERFLOW = r"""
__device__ int depth(int n) {
  volatile int frame[256];
  frame[0] = n;
  return n == 0 ? frame[0] : depth(n - 1) + frame[0];
}
extern "C" __global__ void recurse(int* out) { out[threadIdx.x] = depth(1 << 20); }
"""

INTER_BLOCK_WAIT = r"""
// Block b waits for block b + 1 to set its flag: on a GPU only if both are resident at once.
extern "C" __global__ void wait_for_next(const unsigned* x, unsigned* flags) {
  if (threadIdx.x != 0) return;
  unsigned b = blockIdx.x;
  if (b + 1 < gridDim.x) {
    while (atomicAdd(&flags[b + 1], 0u) == 0u) {
    }
  }
  atomicExch(&flags[b], x[0]);
}
"""

BAD: dict[str, Sample] = {
    "uninitialised_shared": Sample(
        UNINITIALISED_SHARED, "block_sums", ("in", "out"), 4, 64, 16, floats(256),
        fault=r"kernel block_sums read `__shared__ acc` \(byte \d+\) before any thread of its "
        r"block wrote it .* at line 4",
    ),
    "lost_updates": Sample(
        LOST_UPDATES, "total", ("in", "out"), 2, 64, 4, floats(128),
        fault=r"kernel total: race \(.*\) on `out` byte 0: .* at line 3, then .* at line 3",
    ),
    "block_order": Sample(
        BLOCK_ORDER, "chain", ("in", "out"), 8, 32, 32,
        lambda rng: rng.integers(1, 100, 8, dtype=np.uint32).tobytes(), dtype="uint32",
        fault=r"kernel chain: race: its output differs when its blocks and threads run in "
        r"another order",
    ),
    "divergent_barrier": Sample(
        DIVERGENT_BARRIER, "half_barrier", ("out",), 1, 64, 256, lambda rng: b"",
        fault=r"kernel half_barrier: divergent barrier at line 5: .* exited without reaching it",
    ),
    "mask_without_self": Sample(
        MASK_WITHOUT_SELF, "bad_mask", ("in", "out"), 1, 32, 128, floats(32),
        fault=r"kernel bad_mask: __shfl_sync at line 4: thread \(16,0,0\) .* mask 0x0000ffff, "
        r"which leaves out its own lane",
    ),
    "inactive_lane": Sample(
        INACTIVE_LANE, "half_warp_sum", ("in", "out"), 1, 32, 128, floats(32),
        fault=r"kernel half_warp_sum: __shfl_down_sync at line 5: thread \(8,0,0\) .* reads "
        r"lane 16, which is not taking part",
    ),
    "past_out": Sample(
        PAST_OUT, "copy", ("in", "out", "in_bytes"), 1, 65, 256, floats(64),
        fault=r"kernel copy wrote past `out` \(by 4 bytes; out is 256 bytes\) at line 4 in "
        r"thread \(64,0,0\)",
    ),
    "past_in": Sample(
        PAST_IN, "sum_in", ("in", "out"), 1, 1, 4, floats(1024),
        fault=r"kernel sum_in read past `in` \(by 4 bytes; in is 4096 bytes\) at line 4",
    ),
    "divide_by_zero": Sample(
        DIVIDE_BY_ZERO, "ratios", ("in", "out"), 1, 4, 16,
        lambda rng: np.array([5, 3, 0, 7], np.int32).tobytes(), dtype="int32",
        fault=r"kernel ratios: integer division by zero at line 4 in thread \(2,0,0\)",
    ),
    "inter_block_wait": Sample(
        INTER_BLOCK_WAIT, "wait_for_next", ("in", "out"), 4, 32, 16,
        lambda rng: np.array([1], np.uint32).tobytes(), dtype="uint32",
        fault=r"kernel wait_for_next: thread \(0,0,0\) of block \(0,0,0\) spins on an atomic "
        r"at line 7: \d+ atomics in a row",
    ),
    "stack_overflow": Sample(
        STACK_OVERFLOW, "recurse", ("out",), 1, 2, 8, lambda rng: b"", dtype="int32",
        fault=r"kernel recurse: stack overflow at line \d in thread \(0,0,0\)",
    ),
}

// CUDA built-ins on the host: a kernel's .cu source compiles with g++ under this header and
// its grid runs on one CPU thread, hostile rather than friendly (docs/kernels.md, The host
// path): every CUDA thread of a block is a fiber on a stack with a guard page; warps meet in
// lockstep at warp intrinsics, with their masks checked; every live thread must reach the
// same __syncthreads; shared memory is poisoned at each block's start; `in` and `out` end at a
// guard page; faults (a bad address, integer division by zero, a stack overflow) are caught
// and reported with the kernel's line. The check build (-DVF_CHECK, compiled with
// -fsanitize=thread so that g++ calls a hook at every memory access) also tracks who wrote
// and read each byte of `in`, `out` and shared memory: races and reads of shared memory
// before any write are reported where they happen (cuda_host_check.h).
// Parts: cuda_host_types.h (vector types, __half), cuda_host_math.h (intrinsics, atomics),
// cuda_host_run.h (the block scheduler and the launch) with cuda_host_state.h (fibers,
// guarded memory, shared memory's poison), cuda_host_warps.h (barriers, warp intrinsics) and
// cuda_host_faults.h (printf, assert, signals).
#pragma once
#include <algorithm>
#include <cassert>
#include <cmath>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>
#include <unistd.h>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))  // allowed among decl-specifiers
#define __grid_constant__
// One block at a time per OS thread: a static is that block's shared memory. The build
// registers each one (VF_SHARED) so that it is poisoned at every block's start.
#define __shared__ static thread_local
// Functions of this header that must not count as the kernel's own memory accesses in the
// check build (atomics: they are not races).
#define VF_NOSAN __attribute__((no_sanitize("thread")))
#define VF_EXPORT extern "C" __attribute__((visibility("default")))

#include "cuda_host_types.h"
#include "cuda_host_math.h"
#include "cuda_host_run.h"
#ifdef VF_CHECK
#include "cuda_host_check.h"
#endif

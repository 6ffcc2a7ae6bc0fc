// CUDA built-ins on the host: a kernel's .cu source compiles with g++ under this header and
// its grid runs as loops on one CPU thread. Each CUDA thread of a block that calls
// __syncthreads is a fiber (a register switch on x86-64, ucontext elsewhere); __shared__
// variables are one per block (static,
// per OS thread, so concurrent launches on different threads do not share them).
// Warp intrinsics, cooperative groups, tensor cores and inline PTX are refused before
// compiling (kernels/host.py scans for them).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// One block at a time per OS thread: a static is that block's shared memory.
#define __shared__ static thread_local

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

namespace vf {
#if defined(__x86_64__)
// A fiber switch that saves only the registers the System V ABI makes a callee keep (and the
// stack pointer). swapcontext also saves and restores the signal mask, a system call each
// way: 10,000 of them per hyperparam chunk (128 threads x 42 barriers) were most of its 4 ms.
extern "C" void vf_switch(void** save_sp, void* load_sp);
__asm__(
    ".text\n.p2align 4\n.globl vf_switch\n.hidden vf_switch\n.type vf_switch,@function\n"
    "vf_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size vf_switch,.-vf_switch\n");
struct Fiber { void* sp; bool done; uint3 tid; };
static thread_local void* scheduler_sp = nullptr;
inline void to_scheduler(Fiber* f) { vf_switch(&f->sp, scheduler_sp); }
inline void to_fiber(Fiber* f) { vf_switch(&scheduler_sp, f->sp); }
// The first switch to the fiber pops six zeroed registers and "returns" into entry, with the
// stack aligned as at a function's entry (entry never returns).
inline void start_fiber(Fiber& f, unsigned char* stack, size_t bytes, void (*entry)()) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;
  *--sp = reinterpret_cast<void*>(entry);
  for (int r = 0; r < 6; ++r) *--sp = nullptr;
  f.sp = sp;
}
#else
struct Fiber { ucontext_t context; bool done; uint3 tid; };
static thread_local ucontext_t scheduler;
inline void to_scheduler(Fiber* f) { swapcontext(&f->context, &scheduler); }
inline void to_fiber(Fiber* f) { swapcontext(&scheduler, &f->context); }
inline void start_fiber(Fiber& f, unsigned char* stack, size_t bytes, void (*entry)()) {
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = bytes;
  f.context.uc_link = &scheduler;
  makecontext(&f.context, entry, 0);
}
#endif
static thread_local Fiber* current = nullptr;
static thread_local unsigned char* dynamic_shared = nullptr;
}  // namespace vf

// A barrier: back to the block's scheduler, which runs every other thread up to here.
inline void __syncthreads() {
  if (vf::current != nullptr) vf::to_scheduler(vf::current);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() { std::abort(); }
inline unsigned char* __vf_dynamic_shared() { return vf::dynamic_shared; }

template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }
template <class T> inline T __ldg(const T* p) { return *p; }

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline void sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomics: real ones (GCC builtins), as other OS threads may run other chunks.
template <class T> inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral<T>::value) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  } else {
    T old = *p, next = old + v;
    while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      next = old + v;
    }
    return old;
  }
}
template <class T> inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <class T> inline T atomicCAS(T* p, T expected, T v) {
  __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
template <class T> inline T atomicMin(T* p, T v) {
  T old = *p;
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {}
  return old;
}
template <class T> inline T atomicMax(T* p, T v) {
  T old = *p;
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {}
  return old;
}

namespace vf {
static const size_t kStackBytes = 256 * 1024;

template <class F, class... P, size_t... I>
inline void call(F f, void** argv, std::index_sequence<I...>) {
  // argv[i] points at parameter i's bytes, as cuLaunchKernel's kernelParams do.
  f(*reinterpret_cast<typename std::remove_reference<P>::type*>(argv[I])...);
}

struct Launch { void (*body)(void*); void* closure; };
static thread_local Launch launch_state;
static thread_local Fiber* fibers = nullptr;

// Fiber stacks kept per OS thread for its next launches: allocating them per launch (32 MiB
// for 128 threads, an mmap and munmap each time) serialised concurrent launches of a process
// on the kernel's memory-map lock (a hyperparam chunk: 7.5 ms alone, ~430 ms beside 200 others).
struct Pool {
  unsigned char* stacks = nullptr;
  Fiber* fibers = nullptr;
  unsigned threads = 0;
  ~Pool() { std::free(stacks); std::free(fibers); }
  bool reserve(unsigned n) {
    if (n <= threads) return true;
    std::free(stacks);
    std::free(fibers);
    stacks = static_cast<unsigned char*>(std::malloc(kStackBytes * n));
    fibers = static_cast<Fiber*>(std::calloc(n, sizeof(Fiber)));
    threads = (stacks != nullptr && fibers != nullptr) ? n : 0;
    return threads != 0;
  }
};
static thread_local Pool pool;

// A fiber's whole life: the kernel's body, then back to the scheduler for good.
inline void fiber_main() {
  launch_state.body(launch_state.closure);
  current->done = true;
  to_scheduler(current);
}

// Run one block: with fibers when the kernel has barriers, else thread after thread.
inline int run_block(void (*body)(void*), void* closure, bool barriers, unsigned char* stacks) {
  unsigned n = blockDim.x * blockDim.y * blockDim.z;
  if (!barriers) {
    for (unsigned i = 0; i < n; ++i) {
      threadIdx = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
      body(closure);
    }
    return 0;
  }
  launch_state = {body, closure};
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.done = false;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    start_fiber(f, stacks + (size_t)i * kStackBytes, kStackBytes, fiber_main);
  }
  // Each round runs every live thread to its next barrier (or its end).
  for (unsigned live = n; live > 0;) {
    live = 0;
    for (unsigned i = 0; i < n; ++i) {
      if (fibers[i].done) continue;
      current = &fibers[i];
      threadIdx = fibers[i].tid;
      to_fiber(&fibers[i]);
      live += fibers[i].done ? 0 : 1;
    }
  }
  current = nullptr;
  return 0;
}

template <class... P>
inline int launch(void (*entry)(P...), const unsigned* grid, const unsigned* block,
                  unsigned long long shared_bytes, void** argv, bool barriers) {
  struct Closure { void (*entry)(P...); void** argv; } closure{entry, argv};
  auto body = [](void* c) {
    auto* cl = static_cast<Closure*>(c);
    call<void (*)(P...), P...>(cl->entry, cl->argv, std::index_sequence_for<P...>{});
  };
  gridDim = dim3(grid[0], grid[1], grid[2]);
  blockDim = dim3(block[0], block[1], block[2]);
  unsigned n = block[0] * block[1] * block[2];
  unsigned char* stacks = nullptr;
  if (barriers) {
    if (!pool.reserve(n)) return 1;
    stacks = pool.stacks;
    fibers = pool.fibers;
  }
  unsigned char* shared = static_cast<unsigned char*>(std::calloc(shared_bytes + 16, 1));
  dynamic_shared = shared;
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        blockIdx = {x, y, z};
        run_block(body, &closure, barriers, stacks);
      }
  std::free(shared);
  fibers = nullptr;
  dynamic_shared = nullptr;
  return 0;
}
}  // namespace vf

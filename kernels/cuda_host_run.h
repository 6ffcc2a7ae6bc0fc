// How a grid runs on the host. Every CUDA thread of a block is a fiber (its own stack, with a
// guard page below it); a block runs round after round, each live fiber up to its next
// __syncthreads, warp intrinsic or end. A barrier is passed only when every live thread of the
// block waits at the same one; a warp intrinsic completes when every thread its mask names
// has reached the same intrinsic with the same mask (or has exited), and then computes every
// lane's result at once, as a warp in lockstep would. A kernel without barriers or warp
// intrinsics runs its block's threads one after another on one fiber. Shared memory
// (static and dynamic) is filled with a poison pattern at each block's start. `in` and `out`
// end at a guard page; a fault (SIGSEGV, SIGBUS, SIGFPE) is caught on an alternate signal
// stack and reported with the faulting instruction's address (`@pc:OFFSET@`, turned into a
// kernel.cu line by kernels/host_faults.py), the thread and the block.
#pragma once

#include "cuda_host_state.h"
#include "cuda_host_warps.h"
#include "cuda_host_faults.h"

namespace vf {
// A fiber's whole life: the kernel's body for its thread (or, sequential, for every thread
// of the block in turn), then back to the scheduler for good.
inline void fiber_main() {
  Run& r = *run;
  if (r.sequential) {
    unsigned n = r.n;
    for (unsigned k = 0; k < n; ++k) {
      unsigned i = (r.flags & F_REVERSE) ? n - 1 - k : k;
      threadIdx = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
      current->tid = threadIdx;
      cur_linear = i;
      r.body(r.closure);
    }
  } else {
    r.body(r.closure);
  }
  Fiber* f = current;
  f->state = DONE;
  f->phase_done = r.phase;
  if (!r.sequential) {  // lanes whose warp intrinsic waited for this one may go on
    unsigned first = f->linear & ~31u;
    for (unsigned l = 0; l < 32 && first + l < r.n; ++l) {
      const Fiber& g = r.fibers[first + l];
      if (g.state == AT_WARP && (g.mask >> (f->linear & 31u) & 1u)) try_warp(g);
    }
  }
  for (;;) to_scheduler(f);
}

// Every live thread waits: at one barrier (pass it), or stuck (report why).
inline bool settle_block() {
  Run& r = *run;
  const Fiber* waiting = nullptr;
  for (unsigned i = 0; i < r.n; ++i) {
    const Fiber& f = r.fibers[i];
    if (f.state == AT_WARP) {
      unsigned first = f.linear & ~31u;
      for (unsigned l = 0; l < 32 && first + l < r.n; ++l) {
        const Fiber& g = r.fibers[first + l];
        if (!(f.mask >> l & 1u) || g.state == DONE) continue;
        if (g.state == AT_WARP && g.op == f.op && g.mask == f.mask && g.width == f.width) continue;
        char who[96], lane[200];
        where(who, sizeof who, &f);
        describe_lane(lane, sizeof lane, g);
        report("%s at line %d in %s waits for lane %u (mask 0x%08x), but %s: every thread a "
               "mask names must reach the same warp intrinsic with the same mask",
               kWarpNames[f.op], f.line, who, l, f.mask, lane);
        return false;
      }
    }
    if (f.state == AT_BARRIER && waiting == nullptr) waiting = &f;
  }
  if (waiting == nullptr) return true;  // every thread has exited
  for (unsigned i = 0; i < r.n; ++i) {
    const Fiber& f = r.fibers[i];
    char who[96], other[96];
    if (f.state == DONE && f.phase_done == r.phase) {
      where(who, sizeof who, waiting);
      where(other, sizeof other, &f);
      report("divergent barrier at line %d: %s waits at %s there, but %s exited without "
             "reaching it (every thread of the block must reach the same __syncthreads)",
             waiting->line, who, kBarrierNames[waiting->bar_kind], other);
      return false;
    }
    if (f.state == AT_BARRIER && (f.line != waiting->line || f.bar_kind != waiting->bar_kind)) {
      where(who, sizeof who, waiting);
      where(other, sizeof other, &f);
      report("divergent barrier at line %d: %s waits at %s there, but %s waits at %s at line %d "
             "(every thread of the block must reach the same __syncthreads)",
             waiting->line, who, kBarrierNames[waiting->bar_kind], other,
             kBarrierNames[f.bar_kind], f.line);
      return false;
    }
  }
  unsigned count = 0, live = 0;
  for (unsigned i = 0; i < r.n; ++i) {
    if (r.fibers[i].state != AT_BARRIER) continue;
    ++live;
    count += (unsigned)r.fibers[i].pred;
  }
  unsigned long long result = waiting->bar_kind == 1   ? count
                              : waiting->bar_kind == 2 ? (unsigned long long)(count == live)
                                                       : (unsigned long long)(count != 0);
  for (unsigned i = 0; i < r.n; ++i) {
    Fiber& f = r.fibers[i];
    if (f.state != AT_BARRIER) continue;
    f.result = result;
    f.state = READY;
  }
  r.phase++;
  return true;
}

// Run one block: fibers round after round until every thread has exited.
inline bool run_block() {
  Run& r = *run;
  unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  r.n = r.sequential ? 1 : threads;
  r.phase = 0;
  std::memset(r.warp_phase, 0, sizeof r.warp_phase);
  for (unsigned i = 0; i < r.n; ++i) {
    Fiber& f = r.fibers[i];
    f.state = READY;
    f.linear = i;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    start_fiber(f, stacks.stack(i), kStackBytes, fiber_main);
  }
  if (r.sequential) r.n = threads;  // what the body's loop runs over
  unsigned fibers = r.sequential ? 1 : r.n;
  for (;;) {
    bool ran = false;
    for (unsigned k = 0; k < fibers; ++k) {
      unsigned i = (r.flags & F_REVERSE) ? fibers - 1 - k : k;
      Fiber& f = r.fibers[i];
      if (f.state != READY) continue;
      ran = true;
      current = &f;
      threadIdx = f.tid;
      cur_linear = f.linear;
      to_fiber(&f);
      current = nullptr;
      if (r.failed) return false;
    }
    if (ran) continue;
    if (r.sequential) return true;
    bool all_done = true;
    for (unsigned i = 0; i < fibers && all_done; ++i) all_done = r.fibers[i].state == DONE;
    if (all_done) return true;
    if (!settle_block()) return false;
  }
}

template <class F, class... P, size_t... I>
inline void call(F f, void** argv, std::index_sequence<I...>) {
  // argv[i] points at parameter i's bytes, as cuLaunchKernel's kernelParams do.
  f(*reinterpret_cast<typename std::remove_reference<P>::type*>(argv[I])...);
}

inline void check_canary(const char* name, unsigned char* lo, size_t before) {
  for (size_t i = 0; i < before; ++i) {
    if (lo[-(long)before + (long)i] != 0xcb) {
      report("wrote before the start of `%s` (%lu bytes before it)", name,
             (unsigned long)(before - i));
      return;
    }
  }
}

template <class... P>
inline int launch(void (*entry)(P...), const unsigned* grid, const unsigned* block,
                  unsigned long long shared_bytes, void** argv, unsigned flags, char* text,
                  unsigned text_bytes, void (*file_shared)()) {
  struct Closure { void (*entry)(P...); void** argv; } closure{entry, argv};
  Run r{};
  r.body = [](void* c) {
    auto* cl = static_cast<Closure*>(c);
    call<void (*)(P...), P...>(cl->entry, cl->argv, std::index_sequence_for<P...>{});
  };
  r.closure = &closure;
  r.report = text;
  r.report_bytes = text_bytes;
  r.flags = flags;
  r.sequential = !(flags & F_FIBERS);
  static const uintptr_t base = [] {
    Dl_info info{};
    bool found = dladdr(reinterpret_cast<void*>(&vf::kernel_printf), &info) != 0;
    return found ? reinterpret_cast<uintptr_t>(info.dli_fbase) : uintptr_t(0);
  }();
  r.base = base;
  r.in_lo = reinterpret_cast<uintptr_t>(buffers.in);
  r.in_hi = r.in_lo + buffers.in_bytes;
  r.out_lo = reinterpret_cast<uintptr_t>(buffers.out);
  r.out_hi = r.out_lo + buffers.out_bytes;
  gridDim = dim3(grid[0], grid[1], grid[2]);
  blockDim = dim3(block[0], block[1], block[2]);
  unsigned threads = block[0] * block[1] * block[2];
  unsigned char* shared = dynamic.prepare(shared_bytes);
  if (!stacks.reserve(r.sequential ? 1 : threads) || shared == nullptr) {
    std::snprintf(text, text_bytes, "no memory for %u fiber stacks of %lu KiB on the host path",
                  threads, (unsigned long)(kStackBytes / 1024));
    return 1;
  }
  r.fibers = stacks.fibers;
  r.dyn_lo = reinterpret_cast<uintptr_t>(shared);
  r.dyn_hi = r.dyn_lo + shared_bytes;
  // Canaries before `in` and `out` (they end at guard pages; their start is mid-page).
  size_t in_before = std::min<size_t>(256, r.in_lo & (kPage - 1));
  size_t out_before = std::min<size_t>(256, r.out_lo & (kPage - 1));
  std::memset(buffers.in - in_before, 0xcb, in_before);
  std::memset(buffers.out - out_before, 0xcb, out_before);
  run = &r;
  dynamic_shared = shared;
  arm_signals();
  int status = 0;
  // No signal mask to restore (SA_NODEFER: a fault's signal is not blocked in its handler),
  // so no sigprocmask system call per launch.
  if (sigsetjmp(r.jump, 0) != 0) {
    status = 2;  // a fault: reported by the handler
  } else {
    r.armed = true;
#ifdef VF_CHECK
    chk::begin_launch();
#endif
    file_shared();
    unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    for (unsigned long long k = 0; k < blocks && status == 0; ++k) {
      unsigned long long b = (flags & F_REVERSE) ? blocks - 1 - k : k;
      blockIdx = {(unsigned)(b % grid[0]), (unsigned)((b / grid[0]) % grid[1]),
                  (unsigned)(b / ((unsigned long long)grid[0] * grid[1]))};
      r.block_linear = b;
      poison(shared, shared_bytes);
      for (unsigned i = 0; i < shared_count; ++i) poison(shared_vars[i].p, shared_vars[i].n);
#ifdef VF_CHECK
      chk::begin_block();
#endif
      if (!run_block()) status = 3;
    }
    r.armed = false;
  }
  r.armed = false;
#ifdef VF_CHECK
  chk::end_launch();
#endif
  current = nullptr;
  if (status == 0) {
    check_canary("in", buffers.in, in_before);
    check_canary("out", buffers.out, out_before);
  }
  if (r.failed && status == 0) status = 3;
  run = nullptr;
  dynamic_shared = nullptr;
  return status;
}
}  // namespace vf

VF_EXPORT int vf_buffers(unsigned long long in_bytes, unsigned long long out_bytes, void** in,
                         void** out) {
  if (!vf::buffers.prepare(in_bytes, out_bytes)) return 1;
  *in = vf::buffers.in;
  *out = vf::buffers.out;
  return 0;
}
VF_EXPORT void vf_done() { vf::buffers.done(); }

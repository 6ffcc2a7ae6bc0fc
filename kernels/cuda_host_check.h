// The check build's memory hooks. g++ -fsanitize=thread calls __tsan_readN/__tsan_writeN
// before every memory access of the kernel; here (no ThreadSanitizer runtime) they keep, for
// each byte of `in`, `out` and shared memory, who last wrote it and who last read it (block,
// thread, barrier phase, warp phase) and report the first:
//   - race: two threads touch a byte, one of them writing, not atomically, with no
//     __syncthreads (or, within a warp, warp intrinsic) between them; across blocks a write
//     after another block's write or read (blocks run at once on a GPU);
//   - a read of shared memory that no thread of the block has written yet (it holds poison);
//   - an access past the end (or before the start) of `in`, `out` or dynamic shared memory,
//     with the access's size, before it faults.
// Atomics (VF_NOSAN in cuda_host_math.h) are not seen, so they race with nothing.
#pragma once

namespace vf {
namespace chk {
struct Access {
  uint32_t block;
  uint16_t thread, phase, warp_phase;
};
struct Entry {
  Access w, r;
  uint8_t flags;  // 1: written, 2: read
  uint32_t wpc, rpc;
};
struct Region {
  uintptr_t lo, hi;
  const char* name;
  bool shared;
  Entry** pages;
  size_t npages;
};
// What every hook reads first, in one thread-local (each thread-local of a shared library
// is a __tls_get_addr call: reading five of them per access was a third of check mode).
struct Hot {
  Run* run;
  Fiber* const* current;
  bool in_hook;
  uintptr_t stacks_lo, stacks_hi;  // fiber stacks: the kernel's locals, never shared
};
static thread_local Hot hot{};
static const size_t kMaxShadowBytes = 1024u * 1024 * 1024;
static thread_local Region regions[600];
static thread_local unsigned nregions = 0;
static thread_local size_t shadow_bytes = 0;

VF_NOSAN inline void clear(Region& g) {
  for (size_t i = 0; i < g.npages; ++i) {
    if (g.pages[i] != nullptr) {
      std::free(g.pages[i]);
      shadow_bytes -= kPage * sizeof(Entry);
    }
  }
  std::free(g.pages);
  g.pages = nullptr;
  g.npages = 0;
}
VF_NOSAN inline void add(uintptr_t lo, size_t n, const char* name, bool shared) {
  if (n == 0 || nregions >= sizeof(regions) / sizeof(regions[0])) return;
  for (unsigned i = 0; i < nregions; ++i) {
    if (regions[i].lo == lo) return;
  }
  Region& g = regions[nregions++];
  g = {lo, lo + n, name, shared, nullptr, 0};
}
VF_NOSAN void add_shared(unsigned char* p, size_t n, const char* name) {
  if (run != nullptr && (run->flags & F_CHECK)) add(reinterpret_cast<uintptr_t>(p), n, name, true);
}
VF_NOSAN void begin_launch() {
  for (unsigned i = 0; i < nregions; ++i) clear(regions[i]);
  nregions = 0;
  if (!(run->flags & F_CHECK)) return;
  uintptr_t lo = reinterpret_cast<uintptr_t>(stacks.memory.base);
  hot = {run, &current, false, lo, lo + stacks.memory.bytes};
  add(run->in_lo, run->in_hi - run->in_lo, "in", false);
  add(run->out_lo, run->out_hi - run->out_lo, "out", false);
  add(run->dyn_lo, run->dyn_hi - run->dyn_lo, "extern __shared__ memory", true);
  for (unsigned i = 0; i < shared_count; ++i) {
    add(reinterpret_cast<uintptr_t>(shared_vars[i].p), shared_vars[i].n, shared_vars[i].name, true);
  }
}
VF_NOSAN void begin_block() {
  for (unsigned i = 0; i < nregions; ++i) {
    if (regions[i].shared) clear(regions[i]);
  }
}
VF_NOSAN void end_launch() {
  hot = {};
  for (unsigned i = 0; i < nregions; ++i) clear(regions[i]);
  nregions = 0;
}

VF_NOSAN inline void describe(char* text, size_t n, const Access& a) {
  unsigned t = a.thread, bx = blockDim.x, by = blockDim.y;
  unsigned long long b = a.block, gx = gridDim.x, gy = gridDim.y;
  std::snprintf(text, n, "thread (%u,%u,%u) of block (%llu,%llu,%llu)", t % bx, (t / bx) % by,
                t / (bx * by), b % gx, (b / gx) % gy, b / (gx * gy));
}
VF_NOSAN inline bool ordered(const Access& before, const Access& now) {
  if (before.block != now.block) return false;
  if (before.thread == now.thread || before.phase != now.phase) return true;
  return (before.thread >> 5) == (now.thread >> 5) && before.warp_phase != now.warp_phase;
}
VF_NOSAN inline void race(const Region& g, uintptr_t addr, const char* kind, const Access& before,
                          uint32_t before_pc, const char* before_verb, const Access& now,
                          uint32_t now_pc, const char* now_verb) {
  char first[96], second[96];
  describe(first, sizeof first, before);
  describe(second, sizeof second, now);
  report("race (%s) on `%s` byte %lu: %s %s it at @pc:%x@, then %s %s it at @pc:%x@, with no "
         "__syncthreads between them and not atomically", kind, g.name,
         (unsigned long)(addr - g.lo), first, before_verb, before_pc, second, now_verb, now_pc);
}
VF_NOSAN inline Entry* entry(Region& g, uintptr_t addr) {
  size_t page = (addr - g.lo) / kPage;
  if (g.pages == nullptr) {
    g.npages = (g.hi - g.lo + kPage - 1) / kPage;
    g.pages = static_cast<Entry**>(std::calloc(g.npages, sizeof(Entry*)));
    if (g.pages == nullptr) return nullptr;
  }
  if (g.pages[page] == nullptr) {
    if (shadow_bytes + kPage * sizeof(Entry) > kMaxShadowBytes) return nullptr;
    g.pages[page] = static_cast<Entry*>(std::calloc(kPage, sizeof(Entry)));
    if (g.pages[page] == nullptr) return nullptr;
    shadow_bytes += kPage * sizeof(Entry);
  }
  return &g.pages[page][(addr - g.lo) % kPage];
}
VF_NOSAN inline bool past(const char* name, uintptr_t lo, uintptr_t hi, uintptr_t addr,
                          unsigned size, bool write, uint32_t pc) {
  char who[96];
  if (addr < hi + kPage && addr + size > hi) {
    where(who, sizeof who, current);
    report("%s past `%s` (by %lu bytes; %s is %lu bytes) at @pc:%x@ in %s",
           write ? "wrote" : "read", name, (unsigned long)(addr + size - hi), name,
           (unsigned long)(hi - lo), pc, who);
    return true;
  }
  if (addr < lo && addr + 256 >= lo) {
    where(who, sizeof who, current);
    report("%s before the start of `%s` (%lu bytes before it) at @pc:%x@ in %s",
           write ? "wrote" : "read", name, (unsigned long)(lo - addr), pc, who);
    return true;
  }
  return false;
}

VF_NOSAN inline void access_checked(uintptr_t addr, unsigned size, bool write, void* ret);
// The hooks' own helpers are instrumented too (where, report, ...): they are not the kernel.
VF_NOSAN inline void access(uintptr_t addr, unsigned size, bool write, void* ret) {
  Hot& h = hot;
  if (h.run == nullptr || h.in_hook || *h.current == nullptr) return;
  if (addr >= h.stacks_lo && addr < h.stacks_hi) return;
  h.in_hook = true;
  access_checked(addr, size, write, ret);
  h.in_hook = false;
}
VF_NOSAN inline void access_checked(uintptr_t addr, unsigned size, bool write, void* ret) {
  Run* r = run;
  if (r->failed) return;
  uint32_t pc = (uint32_t)(reinterpret_cast<uintptr_t>(ret) - r->base - 1);
  Region* g = nullptr;
  Region* all = regions;
  for (unsigned i = 0, n = nregions; i < n; ++i) {
    if (addr >= all[i].lo && addr < all[i].hi) {
      g = &all[i];
      break;
    }
  }
  if (g == nullptr || addr + size > g->hi) {
    if (past("out", r->out_lo, r->out_hi, addr, size, write, pc) ||
        past("in", r->in_lo, r->in_hi, addr, size, write, pc) ||
        (r->dyn_hi > r->dyn_lo &&
         past("extern __shared__ memory", r->dyn_lo, r->dyn_hi, addr, size, write, pc))) {
      return;
    }
  }
  if (g == nullptr) return;  // a local, a __device__ or __constant__ global: not tracked
  unsigned linear = cur_linear;
  Access now{(uint32_t)r->block_linear, (uint16_t)linear, (uint16_t)r->phase,
             (uint16_t)r->warp_phase[(linear >> 5) & 31u]};
  // One page lookup for the access (it rarely straddles a page).
  Entry* first = entry(*g, addr);
  bool one_page = (addr & (kPage - 1)) + size <= kPage;
  for (uintptr_t a = addr; a < addr + size && a < g->hi; ++a) {
    Entry* e = one_page && first != nullptr ? first + (a - addr) : entry(*g, a);
    if (e == nullptr) return;
    if (write) {
      if ((e->flags & 1) && !ordered(e->w, now)) {
        return race(*g, a, "write after write", e->w, e->wpc, "wrote", now, pc, "wrote");
      }
      if ((e->flags & 2) && !ordered(e->r, now)) {
        return race(*g, a, "write after read", e->r, e->rpc, "read", now, pc, "wrote");
      }
      e->w = now;
      e->wpc = pc;
      e->flags = 1;
    } else {
      if (g->shared && !(e->flags & 1)) {
        char who[96];
        where(who, sizeof who, current);
        report("read `__shared__ %s` (byte %lu) before any thread of its block wrote it (it "
               "holds poison) at @pc:%x@ in %s", g->name, (unsigned long)(a - g->lo), pc, who);
        return;
      }
      if ((e->flags & 1) && e->w.block == now.block && !ordered(e->w, now)) {
        return race(*g, a, "read after write", e->w, e->wpc, "wrote", now, pc, "read");
      }
      e->r = now;
      e->rpc = pc;
      e->flags |= 2;
    }
  }
}
}  // namespace chk
}  // namespace vf

#define VF_HOOK extern "C" VF_NOSAN __attribute__((visibility("hidden")))
VF_HOOK void __tsan_init() {}
VF_HOOK void __tsan_func_entry(void*) {}
VF_HOOK void __tsan_func_exit() {}
VF_HOOK void __tsan_vptr_update(void**, void*) {}
VF_HOOK void __tsan_vptr_read(void**) {}
#define VF_HOOKS(n) \
  VF_HOOK void __tsan_read##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0)); \
  } \
  VF_HOOK void __tsan_write##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0)); \
  } \
  VF_HOOK void __tsan_unaligned_read##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0)); \
  } \
  VF_HOOK void __tsan_unaligned_write##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0)); \
  } \
  VF_HOOK void __tsan_volatile_read##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, false, __builtin_return_address(0)); \
  } \
  VF_HOOK void __tsan_volatile_write##n(void* p) { \
    vf::chk::access(reinterpret_cast<uintptr_t>(p), n, true, __builtin_return_address(0)); \
  }
VF_HOOKS(1)
VF_HOOKS(2)
VF_HOOKS(4)
VF_HOOKS(8)
VF_HOOKS(16)
VF_HOOK void __tsan_read_range(void* p, unsigned long n) {
  vf::chk::access(reinterpret_cast<uintptr_t>(p), (unsigned)n, false, __builtin_return_address(0));
}
VF_HOOK void __tsan_write_range(void* p, unsigned long n) {
  vf::chk::access(reinterpret_cast<uintptr_t>(p), (unsigned)n, true, __builtin_return_address(0));
}
// Atomic operations that g++ instrumented (a user's __atomic builtins, guards of local
// statics): done as they are, and not seen by the race check (atomics race with nothing).
#define VF_ATOMIC_HOOKS(n, T) \
  VF_HOOK T __tsan_atomic##n##_load(const volatile T* a, int) { \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK void __tsan_atomic##n##_store(volatile T* a, T v, int) { \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_exchange(volatile T* a, T v, int) { \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) { \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) { \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) { \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) { \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) { \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_fetch_nand(volatile T* a, T v, int) { \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) { \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
  } \
  VF_HOOK T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) { \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
    return c; \
  }
VF_ATOMIC_HOOKS(8, unsigned char)
VF_ATOMIC_HOOKS(16, unsigned short)
VF_ATOMIC_HOOKS(32, unsigned)
VF_ATOMIC_HOOKS(64, unsigned long long)
VF_HOOK void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
VF_HOOK void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

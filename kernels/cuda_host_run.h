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

namespace vf {
enum : unsigned char { READY, AT_BARRIER, AT_WARP, DONE };
enum : unsigned char {
  W_IDX, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ANY, W_ALL, W_SYNC,
  W_RADD, W_RMIN, W_RMAX, W_RAND, W_ROR, W_RXOR, W_MANY, W_MALL
};
static const char* const kWarpNames[] = {
    "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync", "__ballot_sync",
    "__any_sync", "__all_sync", "__syncwarp", "__reduce_add_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
    "__match_any_sync", "__match_all_sync"};
static const char* const kBarrierNames[] = {
    "__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
// Flags of a launch (kernels/host.py).
enum : unsigned { F_REVERSE = 1u, F_POISON_B = 2u, F_CHECK = 4u, F_FIBERS = 8u, F_QUIET = 16u };
static const size_t kStackBytes = 256 * 1024;
static const size_t kPage = 4096;

struct Fiber {
#if defined(__x86_64__)
  void* sp;
#else
  ucontext_t context;
#endif
  unsigned char state, op, bar_kind, is_signed;
  uint3 tid;
  unsigned linear, mask, phase_done;
  int line, arg, width, pred;
  unsigned long long value, result;
};

// The launch in progress on this OS thread.
struct Run {
  void (*body)(void*);
  void* closure;
  char* report;
  unsigned report_bytes;
  unsigned flags;
  volatile bool failed;
  sigjmp_buf jump;
  volatile bool armed;
  uintptr_t base;  // where this library is loaded: fault addresses become offsets
  uintptr_t in_lo, in_hi, out_lo, out_hi, dyn_lo, dyn_hi;
  // The block running now.
  Fiber* fibers;
  unsigned n, phase;
  bool sequential;
  unsigned warp_phase[32];
  unsigned long long block_linear;
};
static thread_local Run* run = nullptr;
static thread_local Fiber* current = nullptr;
static thread_local unsigned cur_linear = 0;
static thread_local unsigned char* dynamic_shared = nullptr;

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

inline size_t page_up(size_t n) { return (n + kPage - 1) & ~(kPage - 1); }

// Memory mapped with guard pages, kept per OS thread for its next launches (allocating it
// per launch serialised concurrent launches on the kernel's memory-map lock).
struct Mapping {
  unsigned char* base = nullptr;
  size_t bytes = 0;
  ~Mapping() { release(); }
  void release() {
    if (base != nullptr) munmap(base, bytes);
    base = nullptr;
    bytes = 0;
  }
  bool map(size_t n) {
    release();
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    base = static_cast<unsigned char*>(p);
    bytes = n;
    return true;
  }
  bool open(size_t offset, size_t n) {
    return mprotect(base + offset, n, PROT_READ | PROT_WRITE) == 0;
  }
};

// Fiber stacks: [guard][stack 0][guard][stack 1]...; a stack overflows into its guard.
struct Stacks {
  Mapping memory;
  Fiber* fibers = nullptr;
  unsigned count = 0;
  ~Stacks() { std::free(fibers); }
  bool reserve(unsigned n) {
    if (n <= count) return true;
    count = 0;
    std::free(fibers);
    fibers = static_cast<Fiber*>(std::calloc(n, sizeof(Fiber)));
    if (fibers == nullptr || !memory.map(n * (kStackBytes + kPage))) return false;
    for (unsigned i = 0; i < n; ++i) {
      if (!memory.open(i * (kStackBytes + kPage) + kPage, kStackBytes)) return false;
    }
    count = n;
    return true;
  }
  unsigned char* stack(unsigned i) { return memory.base + i * (kStackBytes + kPage) + kPage; }
  // The fiber whose guard page holds `addr`, or -1.
  long overflowed(uintptr_t addr) {
    uintptr_t lo = reinterpret_cast<uintptr_t>(memory.base);
    if (count == 0 || addr < lo || addr >= lo + memory.bytes) return -1;
    size_t off = addr - lo;
    return off % (kStackBytes + kPage) < kPage ? (long)(off / (kStackBytes + kPage)) : -1;
  }
};
static thread_local Stacks stacks;

// `in` and `out` for the next launch: [guard][.. in][guard][.. out][guard], each ending at
// its guard page, so the first byte past either faults.
struct Buffers {
  Mapping memory;
  size_t in_region = 0, out_region = 0;
  unsigned char *in = nullptr, *out = nullptr;
  size_t in_bytes = 0, out_bytes = 0;
  bool prepare(size_t in_n, size_t out_n) {
    size_t need_in = page_up(in_n + 256), need_out = page_up(out_n + 256);
    if (memory.base == nullptr || need_in > in_region || need_out > out_region) {
      if (!memory.map(need_in + need_out + 3 * kPage)) return false;
      if (!memory.open(kPage, need_in) || !memory.open(2 * kPage + need_in, need_out)) {
        memory.release();
        return false;
      }
      in_region = need_in;
      out_region = need_out;
    }
    in = memory.base + kPage + in_region - in_n;
    out = memory.base + 2 * kPage + in_region + out_region - out_n;
    in_bytes = in_n;
    out_bytes = out_n;
    std::memset(out, 0, out_n);
    return true;
  }
  // Big buffers are not kept between launches.
  void done() {
    if (memory.bytes > 8u * 1024 * 1024) memory.release(), in_region = out_region = 0;
  }
};
static thread_local Buffers buffers;

struct DynamicShared {
  Mapping memory;
  size_t bytes = 0;
  unsigned char* prepare(size_t n) {
    size_t need = page_up(n == 0 ? 1 : n);
    if (memory.base == nullptr || need != page_up(bytes == 0 ? 1 : bytes)) {
      if (!memory.map(need + kPage) || !memory.open(0, need)) return nullptr;
    }
    bytes = n;
    return memory.base + need - n;  // ends at the guard page
  }
};
static thread_local DynamicShared dynamic;

// Static __shared__ variables, registered as the build found them (VF_SHARED), poisoned at
// every block's start.
struct SharedVar { unsigned char* p; size_t n; const char* name; };
static thread_local SharedVar shared_vars[512];
static thread_local unsigned shared_count = 0;

inline unsigned poison_word() {
  return run != nullptr && (run->flags & F_POISON_B) ? 0xffb4b4b4u : 0x7fa5a5a5u;
}
inline void poison(unsigned char* p, size_t n) {
  unsigned word = poison_word();
  for (size_t i = 0; i < n; ++i) {
    p[i] = (unsigned char)(word >> (8 * ((reinterpret_cast<uintptr_t>(p) + i) & 3u)));
  }
}
#ifdef VF_CHECK
namespace chk {
void add_shared(unsigned char* p, size_t n, const char* name);
void begin_block();
void begin_launch();
void end_launch();
}  // namespace chk
#endif
inline void register_shared(void* p, size_t n, const char* name) {
  auto* bytes = static_cast<unsigned char*>(p);
  for (unsigned i = 0; i < shared_count; ++i) {
    if (shared_vars[i].p == bytes) return;
  }
  if (shared_count < sizeof(shared_vars) / sizeof(shared_vars[0])) {
    shared_vars[shared_count++] = {bytes, n, name};
  }
  poison(bytes, n);  // first reached in this block: not yet written by it
#ifdef VF_CHECK
  chk::add_shared(bytes, n, name);
#endif
}
struct SharedReg {
  SharedReg(void* p, size_t n, const char* name) { register_shared(p, n, name); }
};
#define VF_SHARED(name) static thread_local vf::SharedReg vf_shared_##name(&name, sizeof(name), #name);

inline int where(char* text, size_t n, const Fiber* f) {
  uint3 t = f != nullptr ? f->tid : threadIdx;
  return std::snprintf(text, n, "thread (%u,%u,%u) of block (%u,%u,%u)", t.x, t.y, t.z,
                       blockIdx.x, blockIdx.y, blockIdx.z);
}
inline void report(const char* fmt, ...) {
  if (run == nullptr || run->failed) return;
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(run->report, run->report_bytes, fmt, args);
  va_end(args);
  run->failed = true;
}
// Stop the launch from inside a fiber: the scheduler sees `failed` and returns.
[[noreturn]] inline void abort_fiber() {
  Fiber* f = current;
  f->state = DONE;
  for (;;) to_scheduler(f);
}
inline uintptr_t pc_offset(const void* pc) {
  return run != nullptr ? reinterpret_cast<uintptr_t>(pc) - run->base : 0;
}

// A thread that has read the same value from one address with 2^24 atomics in a row is
// waiting for another to change it: on the host the others of its block run only when it
// reaches a barrier, and later blocks after it ends, so it would wait for ever.
struct Spin {
  const void* p;
  unsigned long long value, block;
  unsigned thread, count;
};
static thread_local Spin spin{};
__attribute__((noinline)) VF_NOSAN void atomic_seen(const void* p, unsigned long long value) {
  Spin& s = spin;
  if (run == nullptr) return;
  if (s.p != p || s.value != value || s.block != run->block_linear || s.thread != cur_linear) {
    s = {p, value, run->block_linear, cur_linear, 0};
    return;
  }
  if (++s.count < (1u << 24)) return;
  char who[96];
  where(who, sizeof who, current);
  unsigned long at = (unsigned long)(pc_offset(__builtin_return_address(0)) - 1), caller = at;
#ifdef VF_CHECK
  // The check build does not inline atomics: the kernel's line is one frame further out.
  caller = (unsigned long)(pc_offset(__builtin_return_address(1)) - 1);
#endif
  report("%s spins on an atomic at @pc:%lx|%lx@: %u atomics in a row on one address read the same "
         "value, so it waits for another thread or block to change it, and on the host path "
         "that one runs after it (blocks one after another, a block's threads between barriers; "
         "a GPU promises no order either)", who, at, caller, s.count);
  s = {};
  if (current != nullptr) abort_fiber();
}

// A barrier: wait until every live thread of the block waits at this same one.
inline int sync_block(int line, unsigned char kind, int pred) {
  Fiber* f = current;
  if (f == nullptr || run->sequential) {
    report("__syncthreads at line %d ran outside the block scheduler (internal: the build did "
           "not see it)", line);
    if (f != nullptr) abort_fiber();
    return 0;
  }
  f->state = AT_BARRIER;
  f->line = line;
  f->bar_kind = kind;
  f->pred = pred != 0;
  to_scheduler(f);
  return (int)f->result;
}
#define __syncthreads() vf::sync_block(__LINE__, 0, 0)
#define __syncthreads_count(p) vf::sync_block(__LINE__, 1, (p))
#define __syncthreads_and(p) vf::sync_block(__LINE__, 2, (p))
#define __syncthreads_or(p) vf::sync_block(__LINE__, 3, (p))

inline void describe_lane(char* text, size_t n, const Fiber& g) {
  char who[96];
  where(who, sizeof who, &g);
  if (g.state == DONE) {
    std::snprintf(text, n, "%s has exited", who);
  } else if (g.state == AT_BARRIER) {
    std::snprintf(text, n, "%s waits at %s at line %d", who, kBarrierNames[g.bar_kind], g.line);
  } else if (g.state == AT_WARP) {
    std::snprintf(text, n, "%s waits at %s (mask 0x%08x) at line %d", who, kWarpNames[g.op],
                  g.mask, g.line);
  } else {
    std::snprintf(text, n, "%s is running", who);
  }
}

// The group of `a`'s warp intrinsic, when every lane its mask names has arrived or exited.
inline void compute_warp(Fiber* base, unsigned lanes, const Fiber& a, unsigned members) {
  unsigned long long bits = 0, all = 1, any = 0, acc = 0;
  bool first = true;
  for (unsigned l = 0; l < lanes; ++l) {
    if (!(members >> l & 1u)) continue;
    const Fiber& g = base[l];
    bits |= (unsigned long long)(g.value != 0) << l;
    all &= g.value != 0;
    any |= g.value != 0;
    unsigned long long v = g.value;
    if (first) {
      acc = v;
      first = false;
    } else if (a.op == W_RADD) {
      acc = (unsigned)(acc + v);
    } else if (a.op == W_RMIN || a.op == W_RMAX) {
      bool less = a.is_signed ? (int)v < (int)acc : (unsigned)v < (unsigned)acc;
      if ((a.op == W_RMIN) == less) acc = v;
    } else if (a.op == W_RAND) {
      acc &= v;
    } else if (a.op == W_ROR) {
      acc |= v;
    } else if (a.op == W_RXOR) {
      acc ^= v;
    }
  }
  for (unsigned l = 0; l < lanes; ++l) {
    if (!(members >> l & 1u)) continue;
    Fiber& g = base[l];
    unsigned width = (unsigned)g.width, seg = l & ~(width - 1), src = l;
    switch (a.op) {
      case W_IDX: src = seg + ((unsigned)g.arg & (width - 1)); break;
      case W_UP: src = (l - seg) >= (unsigned)g.arg ? l - (unsigned)g.arg : l; break;
      case W_DOWN: src = (l - seg) + (unsigned)g.arg < width ? l + (unsigned)g.arg : l; break;
      case W_XOR: src = l ^ (unsigned)g.arg; src = (src >= 32 || src > (seg | (width - 1))) ? l : src; break;
      default: break;
    }
    if (a.op <= W_XOR) {
      if (src != l && !(members >> src & 1u)) {
        char who[96], lane[160];
        where(who, sizeof who, &g);
        if (src < lanes) describe_lane(lane, sizeof lane, base[src]);
        else std::snprintf(lane, sizeof lane, "lane %u does not exist (the block ends first)", src);
        report("%s at line %d: %s reads lane %u, which is not taking part (%s; mask 0x%08x): "
               "its value is undefined on a GPU", kWarpNames[a.op], a.line, who, src, lane, a.mask);
        return;
      }
      g.result = base[src].value;
    } else if (a.op == W_BALLOT) {
      g.result = bits;
    } else if (a.op == W_ANY) {
      g.result = any;
    } else if (a.op == W_ALL) {
      g.result = all;
    } else if (a.op >= W_RADD && a.op <= W_RXOR) {
      g.result = acc;
    } else if (a.op == W_MANY || a.op == W_MALL) {
      unsigned same = 0;
      for (unsigned m = 0; m < lanes; ++m) {
        if ((members >> m & 1u) && base[m].value == g.value) same |= 1u << m;
      }
      g.result = a.op == W_MANY ? same : (same == members ? members : 0u);
      g.pred = same == members;
    }
    g.state = READY;
  }
}

inline void try_warp(const Fiber& a) {
  Run& r = *run;
  unsigned warp = a.linear >> 5, first = warp << 5;
  unsigned lanes = r.n - first < 32u ? r.n - first : 32u;
  unsigned members = 0;
  for (unsigned l = 0; l < lanes; ++l) {
    if (!(a.mask >> l & 1u)) continue;
    const Fiber& g = r.fibers[first + l];
    if (g.state == DONE) continue;
    if (g.state != AT_WARP || g.op != a.op || g.mask != a.mask || g.width != a.width) return;
    members |= 1u << l;
  }
  compute_warp(r.fibers + first, lanes, a, members);
  r.warp_phase[warp & 31u]++;
}

// A warp intrinsic of the calling thread: wait for its group, then take this lane's result.
inline unsigned long long warp_op(unsigned char op, unsigned mask, unsigned long long value,
                                  int arg, int width, int line, bool is_signed) {
  Fiber* f = current;
  if (f == nullptr || run->sequential) {
    report("%s at line %d ran outside the block scheduler (internal: the build did not see it)",
           kWarpNames[op], line);
    if (f != nullptr) abort_fiber();
    return 0;
  }
  unsigned lane = f->linear & 31u;
  char who[96];
  if (!(mask >> lane & 1u)) {
    where(who, sizeof who, f);
    report("%s at line %d: %s (lane %u) calls it with mask 0x%08x, which leaves out its own "
           "lane: undefined on a GPU", kWarpNames[op], line, who, lane, mask);
    abort_fiber();
  }
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    where(who, sizeof who, f);
    report("%s at line %d: %s: width %d is not a power of 2 from 1 to 32", kWarpNames[op], line,
           who, width);
    abort_fiber();
  }
  f->op = op;
  f->mask = mask;
  f->value = value;
  f->arg = arg;
  f->width = width;
  f->line = line;
  f->is_signed = is_signed;
  f->state = AT_WARP;
  try_warp(*f);
  if (f->state == AT_WARP) to_scheduler(f);
  if (run->failed) abort_fiber();
  return f->result;
}

struct WarpSite {
  int line;
  unsigned char op;
  template <class T> T shfl(unsigned mask, T var, int arg, int width = 32) const {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &var, sizeof(T));
    unsigned long long got = warp_op(op, mask, bits, arg, width, line, false);
    T out;
    std::memcpy(&out, &got, sizeof(T));
    return out;
  }
  unsigned ballot(unsigned mask, int pred) const {
    return (unsigned)warp_op(op, mask, pred != 0, 0, 32, line, false);
  }
  int vote(unsigned mask, int pred) const {
    return (int)warp_op(op, mask, pred != 0, 0, 32, line, false);
  }
  void sync(unsigned mask = 0xffffffffu) const { warp_op(op, mask, 0, 0, 32, line, false); }
  template <class T> T reduce(unsigned mask, T value) const {
    static_assert(sizeof(T) == 4 && std::is_integral<T>::value, "__reduce_*_sync takes 32-bit ints");
    return (T)warp_op(op, mask, (unsigned)value, 0, 32, line, std::is_signed<T>::value);
  }
  template <class T> unsigned match_any(unsigned mask, T value) const {
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    return (unsigned)warp_op(op, mask, bits, 0, 32, line, false);
  }
  template <class T> unsigned match_all(unsigned mask, T value, int* pred) const {
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    unsigned got = (unsigned)warp_op(op, mask, bits, 0, 32, line, false);
    *pred = current->pred;
    return got;
  }
};
// Lanes of the caller's warp that have not exited (a GPU may give fewer: those converged now).
inline unsigned activemask() {
  Fiber* f = current;
  if (f == nullptr || run->sequential) return 1u;
  unsigned first = f->linear & ~31u, mask = 0;
  for (unsigned l = 0; l < 32 && first + l < run->n; ++l) {
    if (run->fibers[first + l].state != DONE) mask |= 1u << l;
  }
  return mask;
}
}  // namespace vf

#define __shfl_sync vf::WarpSite{__LINE__, vf::W_IDX}.shfl
#define __shfl_up_sync vf::WarpSite{__LINE__, vf::W_UP}.shfl
#define __shfl_down_sync vf::WarpSite{__LINE__, vf::W_DOWN}.shfl
#define __shfl_xor_sync vf::WarpSite{__LINE__, vf::W_XOR}.shfl
#define __ballot_sync vf::WarpSite{__LINE__, vf::W_BALLOT}.ballot
#define __any_sync vf::WarpSite{__LINE__, vf::W_ANY}.vote
#define __all_sync vf::WarpSite{__LINE__, vf::W_ALL}.vote
#define __syncwarp vf::WarpSite{__LINE__, vf::W_SYNC}.sync
#define __reduce_add_sync vf::WarpSite{__LINE__, vf::W_RADD}.reduce
#define __reduce_min_sync vf::WarpSite{__LINE__, vf::W_RMIN}.reduce
#define __reduce_max_sync vf::WarpSite{__LINE__, vf::W_RMAX}.reduce
#define __reduce_and_sync vf::WarpSite{__LINE__, vf::W_RAND}.reduce
#define __reduce_or_sync vf::WarpSite{__LINE__, vf::W_ROR}.reduce
#define __reduce_xor_sync vf::WarpSite{__LINE__, vf::W_RXOR}.reduce
#define __match_any_sync vf::WarpSite{__LINE__, vf::W_MANY}.match_any
#define __match_all_sync vf::WarpSite{__LINE__, vf::W_MALL}.match_all
#define __activemask vf::activemask

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __nanosleep(unsigned) {}
inline long long clock64() {
  static thread_local long long ticks = 0;
  return ticks += 64;
}
inline unsigned char* __vf_dynamic_shared() { return vf::dynamic_shared; }

namespace vf {
// A kernel's printf: formatted here and written to fd 1 in one call, at once (a GPU prints at
// the kernel's end; stdio's buffer would hold it until 4 KiB or exit).
inline int kernel_printf(const char* fmt, ...) {
  if (run != nullptr && (run->flags & F_QUIET)) return 0;  // a check mode's second run
  char small[1024];
  va_list args, again;
  va_start(args, fmt);
  va_copy(again, args);
  int n = std::vsnprintf(small, sizeof small, fmt, args);
  va_end(args);
  char* text = small;
  if (n >= (int)sizeof small) {
    text = static_cast<char*>(std::malloc((size_t)n + 1));
    if (text != nullptr) std::vsnprintf(text, (size_t)n + 1, fmt, again);
  }
  va_end(again);
  for (int done = 0; text != nullptr && n > 0 && done < n;) {
    ssize_t w = ::write(1, text + done, (size_t)(n - done));
    if (w <= 0) break;
    done += (int)w;
  }
  if (text != small) std::free(text);
  return n;
}
[[noreturn]] inline void stop(const char* what, int line) {
  char who[96];
  where(who, sizeof who, current);
  report("%s at line %d in %s", what, line, who);
  if (current != nullptr) abort_fiber();
  std::abort();
}
inline void assert_fail(const char* expr, int line) {
  char what[300];
  std::snprintf(what, sizeof what, "assertion `%s` failed", expr);
  stop(what, line);
}
}  // namespace vf
#define printf vf::kernel_printf
#undef assert
#define assert(e) ((e) ? (void)0 : vf::assert_fail(#e, __LINE__))
#define __trap() vf::stop("__trap()", __LINE__)
#define __brkpt() vf::stop("__brkpt()", __LINE__)

namespace vf {
// Faults: caught on an alternate stack while a launch runs on this thread; any other fault
// goes to the handler that was there before (Python's faulthandler, or the default).
static struct sigaction previous[3];
static const int kSignals[3] = {SIGSEGV, SIGBUS, SIGFPE};
struct AltStack {
  void* memory = nullptr;
  ~AltStack() {
    if (memory == nullptr) return;
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, nullptr);
    munmap(memory, 64 * 1024);
  }
};
static thread_local AltStack alt_stack;

inline void describe_fault(int sig, siginfo_t* info, void* context) {
  uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr), pc = 0;
  bool write = false;
#if defined(__x86_64__)
  auto* uc = static_cast<ucontext_t*>(context);
  pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
  (void)context;
#endif
  Run& r = *run;
  char who[96];
  where(who, sizeof who, current);
  const char* verb = write ? "wrote" : "read";
  uintptr_t at = pc - r.base;
  long fiber = stacks.overflowed(addr);
  if (sig == SIGFPE) {
    const char* what = info->si_code == FPE_INTDIV ? "integer division by zero"
                       : info->si_code == FPE_INTOVF ? "integer overflow in a division (INT_MIN / -1)"
                                                      : "an arithmetic fault";
    report("%s at @pc:%lx@ in %s (a GPU gives an undefined value, not a fault)", what,
           (unsigned long)at, who);
  } else if (fiber >= 0) {
    report("stack overflow at @pc:%lx@ in %s: a thread's stack is %lu KiB on the host path "
           "(deep recursion or a large local array?)", (unsigned long)at, who,
           (unsigned long)(kStackBytes / 1024));
  } else if (addr >= r.out_hi && addr < r.out_hi + kPage) {
    report("%s past `out` (its byte %lu past the end; out is %lu bytes) at @pc:%lx@ in %s", verb,
           (unsigned long)(addr - r.out_hi), (unsigned long)(r.out_hi - r.out_lo),
           (unsigned long)at, who);
  } else if (addr >= r.in_hi && addr < r.in_hi + kPage) {
    report("%s past `in` (its byte %lu past the end; in is %lu bytes) at @pc:%lx@ in %s", verb,
           (unsigned long)(addr - r.in_hi), (unsigned long)(r.in_hi - r.in_lo),
           (unsigned long)at, who);
  } else if (addr >= r.dyn_hi && addr < r.dyn_hi + kPage) {
    report("%s past its dynamic shared memory (its byte %lu past the end; shared_mem_bytes=%lu) "
           "at @pc:%lx@ in %s", verb, (unsigned long)(addr - r.dyn_hi),
           (unsigned long)(r.dyn_hi - r.dyn_lo), (unsigned long)at, who);
  } else if (addr < 65536) {
    report("%s through a null pointer (address 0x%lx) at @pc:%lx@ in %s", verb,
           (unsigned long)addr, (unsigned long)at, who);
  } else {
    report("%s an invalid address 0x%lx (%s) at @pc:%lx@ in %s", verb, (unsigned long)addr,
           sig == SIGBUS ? "bus error" : "not mapped", (unsigned long)at, who);
  }
}

inline void on_fault(int sig, siginfo_t* info, void* context) {
  Run* r = run;
  if (r != nullptr && r->armed) {
    r->armed = false;
    describe_fault(sig, info, context);
    siglongjmp(r->jump, 1);
  }
  for (int i = 0; i < 3; ++i) {
    if (kSignals[i] != sig) continue;
    const struct sigaction& old = previous[i];
    if (old.sa_flags & SA_SIGINFO) {
      old.sa_sigaction(sig, info, context);
    } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
      old.sa_handler(sig);
    } else {
      signal(sig, SIG_DFL);  // the fault happens again, and kills as it would have
    }
  }
}

inline void arm_signals() {
  static bool installed = [] {
    for (int i = 0; i < 3; ++i) {
      struct sigaction action{};
      action.sa_sigaction = on_fault;
      action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
      sigemptyset(&action.sa_mask);
      sigaction(kSignals[i], &action, &previous[i]);
    }
    return true;
  }();
  (void)installed;
  if (alt_stack.memory == nullptr) {
    stack_t old{};
    sigaltstack(nullptr, &old);
    if (!(old.ss_flags & SS_DISABLE)) return;  // this thread has one already
    void* p = mmap(nullptr, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    stack_t alt{};
    alt.ss_sp = p;
    alt.ss_size = 64 * 1024;
    if (sigaltstack(&alt, nullptr) == 0) alt_stack.memory = p;
    else munmap(p, 64 * 1024);
  }
}

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
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&vf::kernel_printf), &info) != 0) {
    r.base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  }
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
  if (sigsetjmp(r.jump, 1) != 0) {
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

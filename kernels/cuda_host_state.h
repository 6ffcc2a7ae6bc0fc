// The state of a launch on the host: fibers and their switch, the memory a launch uses (fiber
// stacks, `in`/`out`, dynamic shared memory, each against guard pages), the registry of
// static shared variables and their poison, and how a launch reports what went wrong.
// Part of cuda_host.h (see cuda_host_run.h for how a grid runs).
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
      if (memory.open(i * (kStackBytes + kPage) + kPage, kStackBytes)) continue;
      // Out of memory maps (each guard splits one: vm.max_map_count is 65530 by default, and
      // a process may run 256 threads of 1024-thread blocks): one guard, below stack 0.
      if (!memory.open(kPage, memory.bytes - kPage)) return false;
      break;
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
inline void register_shared(const volatile void* p, size_t n, const char* name) {
  // volatile __shared__ variables too: their bytes are poisoned like any others.
  auto* bytes = static_cast<unsigned char*>(const_cast<void*>(p));
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
  SharedReg(const volatile void* p, size_t n, const char* name) { register_shared(p, n, name); }
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

}  // namespace vf

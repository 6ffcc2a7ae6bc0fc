// What a kernel prints or traps, and the faults of a launch: printf written to fd 1 at once,
// assert and __trap reported with their line, SIGSEGV/SIGBUS/SIGFPE caught on an alternate
// stack and described (a guard page, a stack overflow, a division by zero). Part of
// cuda_host.h.
#pragma once

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

}  // namespace vf

// Synchronisation on the host: __syncthreads and its variants (a fiber waits for its block),
// the warp intrinsics (lanes meet in lockstep, masks checked, every lane's result computed
// at once), and the spin check of atomics. Part of cuda_host.h.
#pragma once

namespace vf {
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


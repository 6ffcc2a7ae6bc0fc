// CUDA's device functions on the host: math overloads, fast-math intrinsics (computed the
// way the GPU's approximate instructions are fed: __expf is exp2 of x * log2(e) rounded to
// float, and so on), integer and bit intrinsics, bit casts, and the atomic family (real
// atomics, as other OS threads may run other chunks; the value's type is the pointer's, so
// atomicAdd(unsigned*, 1) works as on a GPU).
#pragma once

using std::abs;
using std::acos;
using std::asin;
using std::atan;
using std::atan2;
using std::cbrt;
using std::ceil;
using std::copysign;
using std::cos;
using std::cosh;
using std::erf;
using std::erfc;
using std::exp;
using std::exp2;
using std::expm1;
using std::fabs;
using std::floor;
using std::fma;
using std::fmax;
using std::fmin;
using std::fmod;
using std::hypot;
using std::isfinite;
using std::isinf;
using std::isnan;
using std::ldexp;
using std::lgamma;
using std::log;
using std::log10;
using std::log1p;
using std::log2;
using std::nearbyint;
using std::pow;
using std::rint;
using std::round;
using std::signbit;
using std::sin;
using std::sinh;
using std::sqrt;
using std::tan;
using std::tanh;
using std::tgamma;
using std::trunc;

template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }
inline unsigned umin(unsigned a, unsigned b) { return b < a ? b : a; }
inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }
inline long long llmin(long long a, long long b) { return b < a ? b : a; }
inline long long llmax(long long a, long long b) { return a < b ? b : a; }
inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return b < a ? b : a; }
inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a < b ? b : a; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }

namespace vf {
constexpr float kLog2e = 1.44269504088896340736f, kLn2 = 0.693147180559945309417f;
constexpr float kLog10_2 = 0.301029995663981195214f;
inline float expf_fast(float x) { return exp2f(x * kLog2e); }
inline float exp10f_fast(float x) { return exp2f(x * 3.32192809488736234787f); }
inline float logf_fast(float x) { return log2f(x) * kLn2; }
inline float log2f_fast(float x) { return log2f(x); }
inline float log10f_fast(float x) { return log2f(x) * kLog10_2; }
inline float sinf_fast(float x) { return sinf(x); }
inline float cosf_fast(float x) { return cosf(x); }
inline float tanf_fast(float x) { return sinf(x) / cosf(x); }
inline void sincosf_fast(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float powf_fast(float x, float y) { return exp2f(y * log2f(x)); }
// x times the reciprocal of y: two roundings, as the GPU's __fdividef.
inline float fdividef_fast(float x, float y) { return x * (1.0f / y); }
}  // namespace vf
// Macros rather than functions: glibc declares some of these names (__sincosf, __log2f) for
// itself, and calls to them would compile, then fail to load.
#define __expf vf::expf_fast
#define __exp10f vf::exp10f_fast
#define __logf vf::logf_fast
#define __log2f vf::log2f_fast
#define __log10f vf::log10f_fast
#define __sinf vf::sinf_fast
#define __cosf vf::cosf_fast
#define __tanf vf::tanf_fast
#define __sincosf vf::sincosf_fast
#define __powf vf::powf_fast
#define __fdividef vf::fdividef_fast
inline float fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float exp10f(float x) { return powf(10.0f, x); }
inline double exp10(double x) { return pow(10.0, x); }
inline float sinpif(float x) { return sinf(x * 3.14159265358979323846f); }
inline float cospif(float x) { return cosf(x * 3.14159265358979323846f); }
inline void sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline void sincos(double x, double* s, double* c) { *s = ::sin(x); *c = ::cos(x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752440f); }
inline double normcdf(double x) { return 0.5 * ::erfc(-x * 0.70710678118654752440); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return ::fma(a, b, c); }
inline double __drcp_rn(double a) { return 1.0 / a; }
inline double __dsqrt_rn(double a) { return ::sqrt(a); }

inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline int __double2int_rn(double x) { return (int)::nearbyint(x); }
inline int __double2int_rz(double x) { return (int)x; }
inline long long __double2ll_rn(double x) { return (long long)::nearbyint(x); }
inline float __double2float_rn(double x) { return (float)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline double __int2double_rn(int x) { return (double)x; }
inline double __ll2double_rn(long long x) { return (double)x; }
inline double __ull2double_rn(unsigned long long x) { return (double)x; }

template <class To, class From> inline To vf_bits(From x) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To y;
  std::memcpy(&y, &x, sizeof(To));
  return y;
}
inline int __float_as_int(float x) { return vf_bits<int>(x); }
inline unsigned __float_as_uint(float x) { return vf_bits<unsigned>(x); }
inline float __int_as_float(int i) { return vf_bits<float>(i); }
inline float __uint_as_float(unsigned i) { return vf_bits<float>(i); }
inline long long __double_as_longlong(double x) { return vf_bits<long long>(x); }
inline double __longlong_as_double(long long i) { return vf_bits<double>(i); }
inline int __double2hiint(double x) { return (int)(vf_bits<unsigned long long>(x) >> 32); }
inline int __double2loint(double x) { return (int)(unsigned)vf_bits<unsigned long long>(x); }
inline double __hiloint2double(int hi, int lo) {
  return vf_bits<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}

inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((int64_t)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) {
  return (long long)(((__int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return (int)((a << 8 >> 8) * (b << 8 >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
  unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)((v << (s & 31u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
  unsigned long long v = ((unsigned long long)hi << 32) | lo;
  return (unsigned)(v >> (s & 31u));
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned s) {
  return __funnelshift_l(lo, hi, s > 32u ? 32u : s);
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned s) {
  return __funnelshift_r(lo, hi, s > 32u ? 32u : s);
}
inline int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
inline int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a + b + 1) >> 1);
}
inline unsigned __sad(int a, int b, unsigned c) { return (unsigned)(a > b ? a - b : b - a) + c; }
inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return (a > b ? a - b : b - a) + c; }

// Atomics. The value's type is the pointer's (not deduced from the value), as CUDA's
// overloads make it: atomicAdd(unsigned*, 1) adds an unsigned 1.
namespace vf {
// Every atomic's old value passes here (cuda_host_run.h): a thread that keeps reading the same
// value from one address is waiting for another thread or block to change it.
void atomic_seen(const void* p, unsigned long long value);
template <class T> VF_NOSAN inline T seen(T* p, T old) {
  unsigned long long bits = 0;
  std::memcpy(&bits, &old, sizeof(T) < 8 ? sizeof(T) : 8);
  atomic_seen(p, bits);
  return old;
}
template <class T> struct Same { using type = T; };
template <class T> using same_t = typename Same<T>::type;
template <class T, class F> VF_NOSAN inline T cas_loop(T* p, F next) {
  T old;
  std::memcpy(&old, p, sizeof(T));
  T value = next(old);
  while (!__atomic_compare_exchange(p, &old, &value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    value = next(old);
  }
  return old;
}
}  // namespace vf
template <class T> VF_NOSAN inline T atomicAdd(T* p, vf::same_t<T> v) {
  if constexpr (std::is_integral<T>::value) {
    return vf::seen(p, __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST));
  } else {
    return vf::seen(p, vf::cas_loop(p, [v](T old) { return T(old + v); }));
  }
}
template <class T> VF_NOSAN inline T atomicSub(T* p, vf::same_t<T> v) {
  return vf::seen(p, __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST));
}
template <class T> VF_NOSAN inline T atomicAnd(T* p, vf::same_t<T> v) {
  return vf::seen(p, __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST));
}
template <class T> VF_NOSAN inline T atomicOr(T* p, vf::same_t<T> v) {
  return vf::seen(p, __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST));
}
template <class T> VF_NOSAN inline T atomicXor(T* p, vf::same_t<T> v) {
  return vf::seen(p, __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST));
}
template <class T> VF_NOSAN inline T atomicExch(T* p, vf::same_t<T> v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return vf::seen(p, old);
}
template <class T> VF_NOSAN inline T atomicCAS(T* p, vf::same_t<T> expected, vf::same_t<T> v) {
  __atomic_compare_exchange(p, &expected, &v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return vf::seen(p, expected);
}
template <class T> VF_NOSAN inline T atomicMin(T* p, vf::same_t<T> v) {
  return vf::seen(p, vf::cas_loop(p, [v](T old) { return v < old ? v : old; }));
}
template <class T> VF_NOSAN inline T atomicMax(T* p, vf::same_t<T> v) {
  return vf::seen(p, vf::cas_loop(p, [v](T old) { return old < v ? v : old; }));
}
VF_NOSAN inline unsigned atomicInc(unsigned* p, unsigned limit) {
  return vf::cas_loop(p, [limit](unsigned old) { return old >= limit ? 0u : old + 1u; });
}
VF_NOSAN inline unsigned atomicDec(unsigned* p, unsigned limit) {
  return vf::cas_loop(p, [limit](unsigned old) { return old == 0u || old > limit ? limit : old - 1u; });
}
#define VF_ATOMIC_SCOPES(name) \
  template <class T, class... V> inline T name##_block(T* p, V... v) { return name(p, v...); } \
  template <class T, class... V> inline T name##_system(T* p, V... v) { return name(p, v...); }
VF_ATOMIC_SCOPES(atomicAdd)
VF_ATOMIC_SCOPES(atomicSub)
VF_ATOMIC_SCOPES(atomicAnd)
VF_ATOMIC_SCOPES(atomicOr)
VF_ATOMIC_SCOPES(atomicXor)
VF_ATOMIC_SCOPES(atomicExch)
VF_ATOMIC_SCOPES(atomicCAS)
VF_ATOMIC_SCOPES(atomicMin)
VF_ATOMIC_SCOPES(atomicMax)

// CUDA's vector types (with CUDA's alignment, so structs in `in` and `out` lay out as on a
// GPU), dim3, the thread and block indices, and __half / __nv_bfloat16 computed through
// float with round-to-nearest-even conversions.
#pragma once

#define VF_VEC2(T, N, A) \
  struct alignas(A) N##2 { T x, y; }; \
  inline N##2 make_##N##2(T x, T y) { return {x, y}; }
#define VF_VEC3(T, N) \
  struct N##3 { T x, y, z; }; \
  inline N##3 make_##N##3(T x, T y, T z) { return {x, y, z}; }
#define VF_VEC4(T, N, A) \
  struct alignas(A) N##4 { T x, y, z, w; }; \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
#define VF_VEC1(T, N) \
  struct N##1 { T x; }; \
  inline N##1 make_##N##1(T x) { return {x}; }
#define VF_VECS(T, N, A2, A4) VF_VEC1(T, N) VF_VEC2(T, N, A2) VF_VEC3(T, N) VF_VEC4(T, N, A4)
VF_VECS(signed char, char, 2, 4)
VF_VECS(unsigned char, uchar, 2, 4)
VF_VECS(short, short, 4, 8)
VF_VECS(unsigned short, ushort, 4, 8)
VF_VECS(int, int, 8, 16)
VF_VECS(long, long, 16, 16)
VF_VECS(unsigned long, ulong, 16, 16)
VF_VECS(long long, longlong, 16, 16)
VF_VECS(unsigned long long, ulonglong, 16, 16)
VF_VECS(float, float, 8, 16)
VF_VECS(double, double, 16, 16)
VF_VEC1(unsigned, uint)
VF_VEC2(unsigned, uint, 8)
VF_VEC4(unsigned, uint, 16)
struct uint3 { unsigned x, y, z; };
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  operator uint3() const { return {x, y, z}; }
};

static thread_local uint3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

namespace vf {
inline unsigned short float_to_half(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, 4);
  unsigned sign = (bits >> 16) & 0x8000u, exp = (bits >> 23) & 0xffu, man = bits & 0x7fffffu;
  if (exp == 0xffu) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (unsigned short)(sign | 0x7c00u);
  if (e <= 0) {  // a subnormal half (or zero)
    if (e < -10) return (unsigned short)sign;
    man |= 0x800000u;
    unsigned shift = (unsigned)(14 - e), half = man >> shift, rest = man & ((1u << shift) - 1);
    unsigned mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1u))) ++half;
    return (unsigned short)(sign | half);
  }
  unsigned half = sign | ((unsigned)e << 10) | (man >> 13), rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into inf
  return (unsigned short)half;
}
inline float half_to_float(unsigned short h) {
  unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400u));
    bits = sign | ((unsigned)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline unsigned short float_to_bf16(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (unsigned short)(bits >> 16);
}
inline float bf16_to_float(unsigned short h) {
  unsigned bits = (unsigned)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace vf

// A 16-bit float: stored as CUDA stores it, computed through float.
#define VF_HALF_TYPE(T, TO, FROM) \
  struct alignas(2) T { \
    unsigned short __x; \
    T() = default; \
    T(float f) : __x(TO(f)) {} \
    T(double d) : __x(TO((float)d)) {} \
    T(int i) : __x(TO((float)i)) {} \
    T(unsigned i) : __x(TO((float)i)) {} \
    T(long long i) : __x(TO((float)i)) {} \
    operator float() const { return FROM(__x); } \
    T& operator+=(T o) { return *this = T(float(*this) + float(o)); } \
    T& operator-=(T o) { return *this = T(float(*this) - float(o)); } \
    T& operator*=(T o) { return *this = T(float(*this) * float(o)); } \
    T& operator/=(T o) { return *this = T(float(*this) / float(o)); } \
  }; \
  inline T operator+(T a, T b) { return T(float(a) + float(b)); } \
  inline T operator-(T a, T b) { return T(float(a) - float(b)); } \
  inline T operator*(T a, T b) { return T(float(a) * float(b)); } \
  inline T operator/(T a, T b) { return T(float(a) / float(b)); } \
  inline T operator-(T a) { T r = a; r.__x ^= 0x8000u; return r; } \
  inline bool operator==(T a, T b) { return float(a) == float(b); } \
  inline bool operator!=(T a, T b) { return float(a) != float(b); } \
  inline bool operator<(T a, T b) { return float(a) < float(b); } \
  inline bool operator>(T a, T b) { return float(a) > float(b); } \
  inline bool operator<=(T a, T b) { return float(a) <= float(b); } \
  inline bool operator>=(T a, T b) { return float(a) >= float(b); } \
  struct alignas(4) T##2 { T x, y; };
VF_HALF_TYPE(__half, vf::float_to_half, vf::half_to_float)
VF_HALF_TYPE(__nv_bfloat16, vf::float_to_bf16, vf::bf16_to_float)
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;
typedef __nv_bfloat16 nv_bfloat16;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline float __half2float(__half h) { return float(h); }
inline __half __int2half_rn(int i) { return __half(i); }
inline int __half2int_rn(__half h) { return (int)nearbyintf(float(h)); }
inline int __half2int_rz(__half h) { return (int)float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half __short_as_half(short u) { __half h; h.__x = (unsigned short)u; return h; }
inline __half2 __float2half2_rn(float f) { return {__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __half2half2(__half a) { return {a, a}; }
inline float2 __half22float2(__half2 h) { return {float(h.x), float(h.y)}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { a.__x &= 0x7fffu; return a; }
// A GPU rounds a fused multiply-add once: so does fmaf, and float holds the exact product.
inline __half __hfma(__half a, __half b, __half c) { return __half(fmaf(a, b, c)); }
inline __half __hmax(__half a, __half b) { return a < b ? b : a; }
inline __half __hmin(__half a, __half b) { return b < a ? b : a; }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hne(__half a, __half b) { return a != b; }
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hle(__half a, __half b) { return a <= b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hge(__half a, __half b) { return a >= b; }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline bool __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u; }
inline __half hsqrt(__half a) { return __half(sqrtf(a)); }
inline __half hexp(__half a) { return __half(expf(a)); }
inline __half hlog(__half a) { return __half(logf(a)); }
inline __half2 __hadd2(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half2 __hsub2(__half2 a, __half2 b) { return {a.x - b.x, a.y - b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __nv_bfloat16(fmaf(a, b, c));
}

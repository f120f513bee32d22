// The Metal Shading Language's kernel spellings on the CPU SIMT emulator (chroma/simt/simt.h):
// the text the MSL dialect prints (src/codegen/gpu/dialect_msl.cpp) compiles as C++ with this
// header included first. Address spaces become nothing (`device`, `constant`) or one copy per
// running threadgroup (`threadgroup`); attributes such as [[buffer(n)]] are ignored by the
// C++ compiler. Only what the generator emits is here.
#pragma once

#include <math.h>

#include <cstring>

#include "chroma/simt/simt.h"

// A storage slot: bounds-checked on the emulator (chroma::simt::Slot; a plain pointer for the
// GPU's own compiler, defined where the translation unit includes neither header).
#define CHROMA_SLOT(T) ::chroma::simt::Slot<T>

#define kernel
#define device
#define constant const
#define threadgroup static thread_local

struct uint3 {
  unsigned x, y, z;
};

namespace chroma::simt {
inline uint3 metal_uint3(Dim3 d) { return uint3{d.x, d.y, d.z}; }
}  // namespace chroma::simt

template <class T, class F>
inline T as_type(F f) {
  static_assert(sizeof(T) == sizeof(F));
  T t;
  std::memcpy(&t, &f, sizeof t);
  return t;
}
template <class T>
inline T select(T if_false, T if_true, bool c) {
  return c ? if_true : if_false;
}
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
// metal::precise: the host's libm (float).
namespace precise {
inline float exp(float x) { return expf(x); }
inline float exp2(float x) { return exp2f(x); }
inline float log(float x) { return logf(x); }
inline float log2(float x) { return log2f(x); }
inline float sqrt(float x) { return sqrtf(x); }
inline float rsqrt(float x) { return 1.0f / sqrtf(x); }
inline float sin(float x) { return sinf(x); }
inline float cos(float x) { return cosf(x); }
inline float tan(float x) { return tanf(x); }
inline float asin(float x) { return asinf(x); }
inline float acos(float x) { return acosf(x); }
inline float atan(float x) { return atanf(x); }
inline float atan2(float y, float x) { return atan2f(y, x); }
inline float sinh(float x) { return sinhf(x); }
inline float cosh(float x) { return coshf(x); }
inline float tanh(float x) { return tanhf(x); }
inline float asinh(float x) { return asinhf(x); }
inline float acosh(float x) { return acoshf(x); }
inline float atanh(float x) { return atanhf(x); }
inline float pow(float x, float y) { return powf(x, y); }
inline float fmod(float x, float y) { return fmodf(x, y); }
}  // namespace precise

enum mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return static_cast<mem_flags>(static_cast<unsigned>(a) | b); }
#define threadgroup_barrier(flags) ::chroma::simt::barrier(__LINE__)

// Atomics: one invocation runs at a time, so read-modify-write is atomic as written.
using atomic_uint = unsigned;
enum memory_order { memory_order_relaxed };
inline unsigned atomic_fetch_and_explicit(atomic_uint* p, unsigned v, memory_order) { const unsigned o = *p; *p = o & v; return o; }
inline unsigned atomic_fetch_or_explicit(atomic_uint* p, unsigned v, memory_order) { const unsigned o = *p; *p = o | v; return o; }
inline unsigned atomic_fetch_add_explicit(atomic_uint* p, unsigned v, memory_order) { const unsigned o = *p; *p = o + v; return o; }

// SIMD-group (32-lane) reductions.
template <class T>
inline T simd_sum(T v) { return ::chroma::simt::subgroup_add(__LINE__, v); }
template <class T>
inline T simd_max(T v) { return ::chroma::simt::subgroup_max(__LINE__, v); }
template <class T>
inline T simd_min(T v) { return ::chroma::simt::subgroup_min(__LINE__, v); }
template <class T>
inline T simd_product(T v) {
  for (int o = 16; o > 0; o >>= 1) v = v * ::chroma::simt::shuffle(__LINE__, v, static_cast<int>(::chroma::simt::lane_id() ^ o));
  return v;
}

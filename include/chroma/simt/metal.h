// The Metal Shading Language's kernel spellings on the CPU SIMT emulator (chroma/simt/simt.h):
// the text the MSL dialect prints (src/codegen/gpu/dialect_msl.cpp) compiles as C++ with this
// header included first. Address spaces become nothing (`device`, `constant`) or one copy per
// running threadgroup (`threadgroup`); attributes such as [[buffer(n)]] are ignored by the
// C++ compiler. Only what the generator emits is here.
#pragma once

#include <math.h>

#include <cstring>

#include "chroma/simt/simt.h"

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

// CUDA's kernel spellings on the CPU SIMT emulator (chroma/simt/simt.h): the text the CUDA
// dialect prints (src/codegen/gpu/dialect_cuda.cpp) compiles as C++ with this header included
// first. Only what the generator emits is here; anything else fails to compile, loudly.
#pragma once

#include <math.h>

#include <cstring>

#include "chroma/simt/simt.h"

// A storage slot: bounds-checked on the emulator (chroma::simt::Slot; a plain pointer for the
// GPU's own compiler, defined where the translation unit includes neither header).
#define CHROMA_SLOT(T) ::chroma::simt::Slot<T>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One copy per workgroup: the emulator runs a workgroup's invocations on one thread, one
// workgroup at a time per thread.
#define __shared__ static thread_local
#define __syncthreads() ::chroma::simt::barrier(__LINE__)
#define threadIdx (::chroma::simt::thread_id())
#define blockIdx (::chroma::simt::group_id())
#define blockDim (::chroma::simt::group_size())
#define gridDim (::chroma::simt::grid_size())
#define warpSize 32

// Subgroup (warp) operations; the mask must name the whole warp (the generator only uses
// whole warps), which the emulator checks by requiring all 32 lanes to arrive.
#define __shfl_sync(mask, v, src) ::chroma::simt::shuffle(__LINE__, (v), static_cast<int>(src) & 31)
#define __shfl_xor_sync(mask, v, m) ::chroma::simt::shuffle(__LINE__, (v), static_cast<int>(::chroma::simt::lane_id() ^ (m)))
#define __shfl_down_sync(mask, v, d) ::chroma::simt::shuffle(__LINE__, (v), static_cast<int>(::chroma::simt::lane_id() + (d)))
#define __shfl_up_sync(mask, v, d) ::chroma::simt::shuffle(__LINE__, (v), static_cast<int>(::chroma::simt::lane_id()) - static_cast<int>(d))
#define __ballot_sync(mask, p) ::chroma::simt::ballot(__LINE__, (p))
#define __reduce_add_sync(mask, v) ::chroma::simt::subgroup_add(__LINE__, (v))
#define __reduce_min_sync(mask, v) ::chroma::simt::subgroup_min(__LINE__, (v))
#define __reduce_max_sync(mask, v) ::chroma::simt::subgroup_max(__LINE__, (v))

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// Atomics: one invocation runs at a time, so read-modify-write is atomic as written.
template <class T>
T atomicAdd(T* p, T v) { const T o = *p; *p = static_cast<T>(o + v); return o; }
template <class T>
T atomicAnd(T* p, T v) { const T o = *p; *p = o & v; return o; }
template <class T>
T atomicOr(T* p, T v) { const T o = *p; *p = o | v; return o; }
template <class T>
T atomicXor(T* p, T v) { const T o = *p; *p = o ^ v; return o; }
template <class T>
T atomicMin(T* p, T v) { const T o = *p; *p = v < o ? v : o; return o; }
template <class T>
T atomicMax(T* p, T v) { const T o = *p; *p = o < v ? v : o; return o; }
template <class T>
T atomicExch(T* p, T v) { const T o = *p; *p = v; return o; }
template <class T>
T atomicCAS(T* p, T cmp, T v) { const T o = *p; if (o == cmp) *p = v; return o; }

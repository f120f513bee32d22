// Whether a bfloat16 model's convolutions and many-row products run on oneDNN's bfloat16
// kernels (conv_dnnl.h, matmul_dnnl.h): where the CPU has AVX512-BF16's dot products (every
// CPU with AMX has them too; oneDNN then uses AMX). Otherwise they run in float32 on the same
// values. CHROMA_DNNL_BF16=0 turns them off (to compare).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "chroma/half.h"

namespace chroma::et {

inline bool dnnl_bf16_kernels() {
  static const bool on = [] {
    const char* env = std::getenv("CHROMA_DNNL_BF16");
    if (env && std::string(env) == "0") return false;
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return on;
}

// dst[i] = bfloat16(src[i]), round to nearest even: the input conversion of those kernels
// (exact: the values are bfloat16 values). A loop the compiler vectorizes; oneDNN 2.6's reorder
// for it ran at a quarter of the speed (as long as the bfloat16 product it fed).
inline void to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) dst[i] = half_detail::f32_to_bf16(src[i]);
}

}  // namespace chroma::et

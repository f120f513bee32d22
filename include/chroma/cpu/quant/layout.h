// gemm_quant's packed layout: formats, group and panel sizes, and the portable decoding.
// Part of chroma/cpu/gemm_quant.h (which includes every part).
#pragma once

#include <cstdint>
#include <cstring>

#include "chroma/cpu/gemm_packed.h"
#include "chroma/half.h"
#include "chroma/cpu/quant/isa.h"

namespace chroma::et::quant_detail {

// quant::Format's values.
inline constexpr int kBF16 = 1, kQ8 = 2, kQ6 = 3, kQ4 = 4;
inline constexpr int64_t kGroup = 64;

constexpr int64_t rows_padded(int64_t K, int64_t g) {
  return ((K - g * kGroup < kGroup ? K - g * kGroup : kGroup) + 3) / 4 * 4;
}
template <int F>
constexpr int64_t group_bytes(int64_t rows) {
  if constexpr (F == kBF16) return rows * 32;
  else if constexpr (F == kQ8) return 64 + rows * 16;
  else if constexpr (F == kQ6) return 64 + rows / 4 * 48;
  else return 64 + rows * 8;
}
template <int F, int64_t K>
constexpr int64_t panel_bytes() {
  int64_t b = 0;
  for (int64_t g = 0; g * kGroup < K; ++g) b += group_bytes<F>(rows_padded(K, g));
  return b;
}

// One panel's weights as float32 [K][16] (portable code: the reference the vector paths follow).
template <int F, int64_t K>
inline void dequant_panel_portable(const uint8_t* in, float* dst) {
  for (int64_t g = 0; g * kGroup < K; ++g) {
    const int64_t k0 = g * kGroup, rows = rows_padded(K, g);
    const int64_t kg = K - k0 < kGroup ? K - k0 : kGroup;
    float s[kPanel], b[kPanel];
    if constexpr (F != kBF16) {
      for (int j = 0; j < kPanel; ++j) {
        uint16_t a, c;
        std::memcpy(&a, in + 2 * j, 2);
        std::memcpy(&c, in + 32 + 2 * j, 2);
        s[j] = from_f16_bits(a);
        b[j] = from_f16_bits(c);
      }
      in += 64;
    }
    float* out = dst + k0 * kPanel;
    if constexpr (F == kBF16) {
      for (int64_t r = 0; r < rows; r += 2, in += 64) {
        uint16_t v[32];
        std::memcpy(v, in, 64);
        for (int w = 0; w < 32; ++w) {
          const int64_t k = r + (w & 1);
          if (k < kg) out[k * kPanel + (w >> 1)] = half_detail::bf16_to_f32(v[w]);
        }
      }
    } else if constexpr (F == kQ8) {
      for (int64_t r = 0; r < rows; r += 2, in += 32) {
        for (int w = 0; w < 32; ++w) {
          const int64_t k = r + (w & 1);
          if (k < kg) out[k * kPanel + (w >> 1)] = s[w >> 1] * static_cast<float>(in[w]) + b[w >> 1];
        }
      }
    } else {
      for (int64_t r = 0; r < rows; r += 4) {
        uint8_t qa[32], qb[32];
        for (int w = 0; w < 32; ++w) {
          qa[w] = in[w] & 15;
          qb[w] = in[w] >> 4;
        }
        if constexpr (F == kQ6) {
          for (int w = 0; w < 32; ++w) {
            const unsigned h = (in[32 + (w & 15)] >> (w >= 16 ? 4 : 0)) & 15u;
            qa[w] = static_cast<uint8_t>(qa[w] | (h & 3u) << 4);
            qb[w] = static_cast<uint8_t>(qb[w] | (h >> 2) << 4);
          }
          in += 48;
        } else {
          in += 32;
        }
        for (int w = 0; w < 32; ++w) {
          const int j = w >> 1;
          const int64_t ka = r + (w & 1), kb = r + 2 + (w & 1);
          if (ka < kg) out[ka * kPanel + j] = s[j] * static_cast<float>(qa[w]) + b[j];
          if (kb < kg) out[kb * kPanel + j] = s[j] * static_cast<float>(qb[w]) + b[j];
        }
      }
    }
  }
}

// What the decoded values add to every weight: 128 for q4/q6 (128 + q), 2176 for q8
// (16 * (128 + hi) + 128 + lo), 0 for bf16.
template <int F>
inline constexpr float kOffset = F == kBF16 ? 0.0f : (F == kQ8 ? 2176.0f : 128.0f);

}  // namespace chroma::et::quant_detail

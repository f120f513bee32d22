// chroma::et::gemm_quant: C = A @ B for a constant B stored quantized (MLX's affine groups of
// 64 along K, 8, 6 or 4 bits, float16 scales and biases) or in bfloat16, packed at compile
// time in 16-column panels (the layout is written by quant::pack, src/quant/quant.h, and
// documented in docs/quantization.md). The weights are never expanded to float32 in memory:
//
// - q4 and q6 with AVX512-VNNI (activations "auto", the default): the activations quantized
//   to int8 per row and group of 64, the weights' values used as unsigned bytes, vpdpbusd;
//   per group and column, acc += s * x_scale * dot(x', q) + b * x_scale * sum(x').
// - otherwise with AVX512-BF16: each group's values are decoded in registers to bfloat16 and
//   multiplied with vdpbf16ps against the activations rounded once to bfloat16 (about 0.2%
//   relative error per product, far below q8's). The 4- and 6-bit values become bfloat16 by
//   an OR with the exponent of 128 (128 + q is exact), the 8-bit ones as two nibbles (or whole
//   from two rows); per group and column, acc += s * dot(x, q) + b * sum(x). AMX tiles instead
//   from two rows where the CPU has AMX.
//   Both run rows in blocks of 8 (the register tile), whatever their number.
// - with AVX2 and no AVX512-VNNI (AMD Zen 2/3, Intel client cores, AVX-512 without VNNI):
//   q4 and q6 take the same int8 activations, multiplied with vpmaddubsw in 256-bit registers
//   (int8_panel_avx2: the packed layout's 16-bit words already pair two rows of a column, so
//   no reordering), rows in blocks of 4.
// - activations "fp32", or none of the above (q8 and bf16 weights without AVX512-BF16): each
//   panel is dequantized (s * q + b, float32) into a small per-thread buffer, a few panels at
//   a time, and multiplied by the float32 register tiles of gemm_packed.h: exact float32
//   arithmetic on the stored weights. Without AVX512-BF16, products of up to 4 rows instead
//   decode each step in registers and multiply it at once (fp32_panel_avx2: the same values,
//   no buffer written and read back).
//
// Panels (times batches) are split between the program's threads, as for gemm_packed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "chroma/cpu/gemm_packed.h"
#include "chroma/half.h"

namespace chroma::et {

namespace quant_detail {

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

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define CHROMA_QUANT_FP32_AVX2 1

// Weights decoded to float32 with 256-bit vectors (AVX2; with AVX-512 where AVX512-BF16 is
// missing too): the same values as the portable code, s * q + b in float32.
template <int F>
inline constexpr int kStepF32 = (F == kQ4 || F == kQ6) ? 4 : 2;

// A group's float16 scales and biases, columns 0-7 and 8-15 (bf16: none). Returns what follows.
template <int F>
__attribute__((always_inline)) inline const uint8_t* group_scales(const uint8_t* in, __m256* s, __m256* b) {
  if constexpr (F == kBF16) {
    s[0] = s[1] = b[0] = b[1] = _mm256_setzero_ps();
    return in;
  } else {
    for (int h = 0; h < 2; ++h) {
      s[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * h)));
      b[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32 + 16 * h)));
    }
    return in + 64;
  }
}

// One step of a group: v[2t + h] is row r + t's columns [8h, 8h + 8). A step's bytes widened
// to 16-bit words: for columns 0-7 (the step's first half) and 8-15 (its second), 32-bit word
// j holds column j's values of two consecutive rows, the earlier in its low half (q8 and bf16
// directly; q4 and q6 from their low and high nibbles: rows r, r + 1 and r + 2, r + 3).
// Returns the next step's bytes.
template <int F>
__attribute__((always_inline)) inline const uint8_t* decode_step_f32(const uint8_t* in, const __m256* s, const __m256* b,
                                                                     __m256* v) {
  const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
  auto put = [&](int t, int h, __m256i words) {  // rows t and t + 1
    if constexpr (F == kBF16) {
      v[2 * t + h] = _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
      v[2 * t + 2 + h] = _mm256_castsi256_ps(_mm256_andnot_si256(lo16, words));
    } else {
      v[2 * t + h] = _mm256_fmadd_ps(s[h], _mm256_cvtepi32_ps(_mm256_and_si256(words, lo16)), b[h]);
      v[2 * t + 2 + h] = _mm256_fmadd_ps(s[h], _mm256_cvtepi32_ps(_mm256_srli_epi32(words, 16)), b[h]);
    }
  };
  if constexpr (F == kBF16) {
    for (int h = 0; h < 2; ++h) put(0, h, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32 * h)));
    return in + 64;
  } else if constexpr (F == kQ8) {
    for (int h = 0; h < 2; ++h) put(0, h, _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * h))));
    return in + 32;
  } else {
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * h)));
      __m256i qa = _mm256_and_si256(w, _mm256_set1_epi16(15)), qb = _mm256_srli_epi16(w, 4);
      if constexpr (F == kQ6) {
        // The high bits: columns 0-7 in the low nibbles of the 16 bytes after the step's
        // first 32, columns 8-15 in their high nibbles; bits 0-1 for rows r, r + 1, bits 2-3
        // for rows r + 2, r + 3.
        __m256i e = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32)));
        if (h == 1) e = _mm256_srli_epi16(e, 4);
        qa = _mm256_or_si256(qa, _mm256_slli_epi16(_mm256_and_si256(e, _mm256_set1_epi16(3)), 4));
        qb = _mm256_or_si256(qb, _mm256_slli_epi16(_mm256_and_si256(e, _mm256_set1_epi16(12)), 2));
      }
      put(0, h, qa);
      put(2, h, qb);
    }
    return in + (F == kQ6 ? 48 : 32);
  }
}

// One panel for MR rows (at most 4) of float32 activations: C[MR, 16] (ncols of them stored),
// each step's weights decoded to float32 in registers (the exact path's values) and multiplied
// with fused multiply-adds, k in increasing order. For few rows this reads the weights once
// from memory and writes nothing, where the exact path's buffer is written and read again;
// with one row, alternate rows of K go to two sets of accumulators (the latency of the adds).
template <int F, int MR, int64_t K>
__attribute__((always_inline)) inline void fp32_panel_avx2(const float* A, int64_t sar, int64_t sac, const uint8_t* in,
                                                           float* C, int64_t ldc, int64_t ncols) {
  constexpr int kSets = MR == 1 ? 2 : 1;
  __m256 acc[kSets][MR][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    for (int t = 0; t < kSets; ++t) acc[t][i][0] = acc[t][i][1] = _mm256_setzero_ps();
  }
  for (int64_t g = 0; g * kGroup < K; ++g) {
    const int64_t k0 = g * kGroup, rows = rows_padded(K, g);
    const int64_t kg = K - k0 < kGroup ? K - k0 : kGroup;
    __m256 s[2], b[2];
    in = group_scales<F>(in, s, b);
    for (int64_t r = 0; r < rows; r += kStepF32<F>) {
      _mm_prefetch(reinterpret_cast<const char*>(in + 4096), _MM_HINT_T0);
      __m256 v[2 * kStepF32<F>];
      in = decode_step_f32<F>(in, s, b, v);
#pragma GCC unroll 4
      for (int t = 0; t < kStepF32<F>; ++t) {
        if (r + t >= kg) break;  // padding (the last group of a K that is not whole groups)
        const int64_t k = k0 + r + t;
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m256 a = _mm256_set1_ps(A[i * sar + k * sac]);
          acc[t % kSets][i][0] = _mm256_fmadd_ps(a, v[2 * t], acc[t % kSets][i][0]);
          acc[t % kSets][i][1] = _mm256_fmadd_ps(a, v[2 * t + 1], acc[t % kSets][i][1]);
        }
      }
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols)), lane);
  const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols) - 8), lane);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    __m256 c0 = acc[0][i][0], c1 = acc[0][i][1];
    if constexpr (kSets > 1) {
      c0 = _mm256_add_ps(c0, acc[1][i][0]);
      c1 = _mm256_add_ps(c1, acc[1][i][1]);
    }
    if (ncols >= kPanel) {
      _mm256_storeu_ps(C + i * ldc, c0);
      _mm256_storeu_ps(C + i * ldc + 8, c1);
    } else {
      _mm256_maskstore_ps(C + i * ldc, m0, c0);
      _mm256_maskstore_ps(C + i * ldc + 8, m1, c1);
    }
  }
}
#endif

#if defined(__AVX512BW__) && defined(__AVX512F__)
#define CHROMA_QUANT_AVX512 1

// One step of a group's rows, decoded to 16-bit words in registers: word 2j+t of `pair[i]` is
// row 2i+t's value in column j. q formats: the integer q (4 rows a step for q4/q6, 2 for q8);
// bf16: the weight's bits (2 rows). Returns the next step's bytes.
template <int F>
__attribute__((always_inline)) inline const uint8_t* decode_step(const uint8_t* in, __m512i* pair) {
  if constexpr (F == kBF16) {
    pair[0] = _mm512_loadu_si512(in);
    return in + 64;
  } else if constexpr (F == kQ8) {
    pair[0] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
    return in + 32;
  } else {
    const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
    pair[0] = _mm512_and_si512(words, _mm512_set1_epi16(15));
    pair[1] = _mm512_srli_epi16(words, 4);
    if constexpr (F == kQ6) {
      const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
      const __m512i h = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(h16), _mm_srli_epi16(h16, 4), 1));
      pair[0] = _mm512_or_si512(pair[0], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(3)), 4));
      pair[1] = _mm512_or_si512(pair[1], _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(12)), 2));
      return in + 48;
    }
    return in + 32;
  }
}
template <int F>
inline constexpr int kStepRows = (F == kQ4 || F == kQ6) ? 4 : 2;

// One panel's weights as float32 [K][16], vectorized (the same values as the portable code).
template <int F, int64_t K>
inline void dequant_panel(const uint8_t* in, float* dst) {
  const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
  for (int64_t g = 0; g * kGroup < K; ++g) {
    const int64_t k0 = g * kGroup, rows = rows_padded(K, g);
    const int64_t kg = K - k0 < kGroup ? K - k0 : kGroup;
    __m512 s = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    if constexpr (F != kBF16) {
      s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
      b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32)));
      in += 64;
    }
    float* out = dst + k0 * kPanel;
    for (int64_t r = 0; r < rows; r += kStepRows<F>) {
      __m512i pair[2];
      in = decode_step<F>(in, pair);
      for (int i = 0; i < kStepRows<F> / 2; ++i) {
        __m512 even, odd;
        if constexpr (F == kBF16) {
          even = _mm512_castsi512_ps(_mm512_slli_epi32(pair[i], 16));
          odd = _mm512_castsi512_ps(_mm512_andnot_si512(lo16, pair[i]));
        } else {
          even = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(pair[i], lo16)), b);
          odd = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_srli_epi32(pair[i], 16)), b);
        }
        const int64_t k = r + 2 * i;
        if (k < kg) _mm512_storeu_ps(out + k * kPanel, even);
        if (k + 1 < kg) _mm512_storeu_ps(out + (k + 1) * kPanel, odd);
      }
    }
  }
}
#elif defined(CHROMA_QUANT_FP32_AVX2)

// One panel's weights as float32 [K][16] with 256-bit vectors (the same values as the portable
// code).
template <int F, int64_t K>
inline void dequant_panel(const uint8_t* in, float* dst) {
  for (int64_t g = 0; g * kGroup < K; ++g) {
    const int64_t k0 = g * kGroup, rows = rows_padded(K, g);
    const int64_t kg = K - k0 < kGroup ? K - k0 : kGroup;
    __m256 s[2], b[2];
    in = group_scales<F>(in, s, b);
    float* out = dst + k0 * kPanel;
    for (int64_t r = 0; r < rows; r += kStepF32<F>) {
      __m256 v[2 * kStepF32<F>];
      in = decode_step_f32<F>(in, s, b, v);
      for (int t = 0; t < kStepF32<F>; ++t) {
        if (r + t < kg) {
          _mm256_storeu_ps(out + (r + t) * kPanel, v[2 * t]);
          _mm256_storeu_ps(out + (r + t) * kPanel + 8, v[2 * t + 1]);
        }
      }
    }
  }
}
#else
template <int F, int64_t K>
inline void dequant_panel(const uint8_t* in, float* dst) {
  dequant_panel_portable<F, K>(in, dst);
}
#endif

// The exact path: panels [p0, p1) of one matrix, dequantized a few at a time.
template <int F, int64_t M, int64_t N, int64_t K>
inline void exact_panels(const float* A, int64_t sar, int64_t sac, const uint8_t* Bq, float* C, int64_t ldc, int64_t p0,
                         int64_t p1) {
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  // As many panels as fit in about 64 KB (at least one): every row block reads them from cache.
  constexpr int64_t kChunk = K * kPanel * 4 >= 65536 ? 1 : (65536 / (K * kPanel * 4) < 4 ? 65536 / (K * kPanel * 4) : 4);
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(kChunk * K * kPanel)) buf.resize(static_cast<size_t>(kChunk * K * kPanel));
  for (int64_t q0 = p0; q0 < p1; q0 += kChunk) {
    const int64_t q1 = q0 + kChunk < p1 ? q0 + kChunk : p1;
    for (int64_t p = q0; p < q1; ++p) dequant_panel<F, K>(Bq + p * kPanelBytes, buf.data() + (p - q0) * K * kPanel);
    packed_detail::panels(A, sar, sac, buf.data(), C + q0 * kPanel, ldc, M, N - q0 * kPanel, K, 0, q1 - q0);
  }
}

// Activations for the bfloat16 paths: per row, pairs (x[k], x[k+1]) rounded to bfloat16 in one
// 32-bit word (K padded with zeros to a multiple of 32, a whole AMX tile row), rows padded with
// zeros; per group the sum of the rounded values (for the offset the decoded weights carry and
// for the biases: the result is then exactly the dot product of the rounded activations with
// s * q + b, so the only error added is what rounding x alone causes). q8 on AMX also reads the
// rounded values times 16 (exact) in `pairs16`.
template <int64_t K>
struct Activations {
  static constexpr int64_t kPairs = (K + 31) / 32 * 16;
  static constexpr int64_t kGroups = (K + kGroup - 1) / kGroup;
  std::vector<uint32_t> pairs, pairs16;  // [rows][kPairs]
  std::vector<float> sums;               // [rows][kGroups]
  void resize(int64_t rows, bool times16) {
    pairs.assign(static_cast<size_t>(rows * kPairs), 0u);
    if (times16) pairs16.assign(static_cast<size_t>(rows * kPairs), 0u);
    sums.assign(static_cast<size_t>(rows * kGroups), 0.0f);
  }
  void fill(const float* A, int64_t sar, int64_t sac, int64_t rows, int64_t row0, bool times16) {
    for (int64_t i = 0; i < rows; ++i) {
      uint32_t* pr = pairs.data() + (row0 + i) * kPairs;
      uint32_t* p16 = times16 ? pairs16.data() + (row0 + i) * kPairs : nullptr;
      float* sm = sums.data() + (row0 + i) * kGroups;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
      if (sac == 1) {  // 32 at a time with vcvtne2ps2bf16 (the same rounding)
        const float* a = A + i * sar;
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
          const int64_t left = K - k0;
          const __mmask16 m0 = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
          const __mmask16 m1 = left >= 32 ? static_cast<__mmask16>(0xFFFF)
                                          : (left > 16 ? static_cast<__mmask16>((1u << (left - 16)) - 1u) : 0);
          const __m512 a0 = _mm512_maskz_loadu_ps(m0, a + k0), a1 = _mm512_maskz_loadu_ps(m1, a + k0 + 16);
          const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a1, a0));  // words in k order
          _mm512_storeu_si512(pr + k0 / 2, h);
          if (p16) {
            const __m512 s16 = _mm512_set1_ps(16.0f);
            _mm512_storeu_si512(p16 + k0 / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_mul_ps(a1, s16),
                                                                                             _mm512_mul_ps(a0, s16))));
          }
          const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
          const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(h, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
          sm[k0 / kGroup] += _mm512_reduce_add_ps(_mm512_add_ps(even, odd));
        }
        continue;
      }
#endif
      for (int64_t k = 0; k < K; ++k) {
        const float x = A[i * sar + k * sac];
        const uint16_t h = half_detail::f32_to_bf16(x);
        const float xr = half_detail::bf16_to_f32(h);
        pr[k / 2] |= static_cast<uint32_t>(h) << (16 * (k & 1));
        if (p16) p16[k / 2] |= static_cast<uint32_t>(half_detail::f32_to_bf16(xr * 16.0f)) << (16 * (k & 1));
        sm[k / kGroup] += xr;
      }
    }
  }
};

// What the decoded values add to every weight: 128 for q4/q6 (128 + q), 2176 for q8
// (16 * (128 + hi) + 128 + lo), 0 for bf16.
template <int F>
inline constexpr float kOffset = F == kBF16 ? 0.0f : (F == kQ8 ? 2176.0f : 128.0f);

#if defined(__AVX512BF16__) && defined(CHROMA_QUANT_AVX512)
#define CHROMA_QUANT_BF16_KERNELS 1

// Decoded words as bfloat16 operands of vdpbf16ps: q values v become 128 + v exactly (an OR
// with the exponent of 128: v < 128); q8 splits into its high and low nibbles.
template <int F>
__attribute__((always_inline)) inline void to_bf16(__m512i* pair) {
  const __m512i e128 = _mm512_set1_epi16(0x4300);
  if constexpr (F == kQ8) {
    pair[1] = _mm512_ternarylogic_epi32(pair[0], _mm512_set1_epi16(15), e128, 0xEA);  // (a & b) | c: low nibbles
    pair[0] = _mm512_or_si512(_mm512_srli_epi16(pair[0], 4), e128);                     // high nibbles
  } else if constexpr (F == kQ4 || F == kQ6) {
    pair[0] = _mm512_or_si512(pair[0], e128);
    pair[1] = _mm512_or_si512(pair[1], e128);
  }
}

// q8 for two rows or more: each value converted whole (0..255 is exact in bfloat16's 8
// significant bits) through float32: the even and odd words become floats, and bfloat16 is
// the top half of each (exact: the low 16 bits are zero). Six operations a step instead of
// three, but one vdpbf16ps per row instead of two: with several rows the products, not the
// decoding, bound the loop.
__attribute__((always_inline)) inline void q8_whole_to_bf16(__m512i* pair) {
  const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
  const __m512i even = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_and_si512(pair[0], lo16)));
  const __m512i odd = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_srli_epi32(pair[0], 16)));
  pair[0] = _mm512_ternarylogic_epi32(odd, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)), _mm512_srli_epi32(even, 16),
                                      0xEA);  // (odd & high half) | even's top half
}

// One panel for MR rows (at most 8): C[MR, 16] (ncols of them stored), with vdpbf16ps.
// Independent accumulators: the two words of a step (q4/q6: rows 4i..4i+1 and 4i+2..4i+3;
// q8: high and low nibbles) go to two chains, and with one or two rows the steps alternate
// between two sets as well, so that vdpbf16ps's latency (5 cycles) is covered by independent
// work and not paid per step (one row: 4 chains).
template <int F, int MR, int64_t K>
__attribute__((always_inline)) inline void bf16_panel(const uint32_t* xp, const float* sums, const uint8_t* in, float* C,
                                                      int64_t ldc, int64_t ncols) {
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  constexpr int kSets = MR <= 2 ? 2 : 1;
  constexpr bool kWhole = F == kQ8 && MR >= 2;  // q8 values as one bfloat16 each (above)
  __m512 tot[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) tot[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    const uint32_t* xg = xp + g * (kGroup / 2);
    __m512 s = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    if constexpr (F != kBF16) {
      s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
      b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32)));
      in += 64;
    }
    __m512 acc[kSets][MR], acc2[kSets][MR];  // acc2: the second word (unused for bf16)
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int t = 0; t < kSets; ++t) acc[t][i] = acc2[t][i] = _mm512_setzero_ps();
    }
    for (int64_t r0 = 0; r0 < rows; r0 += kStepRows<F> * kSets) {
#pragma GCC unroll 2
      for (int t = 0; t < kSets; ++t) {
        const int64_t r = r0 + t * kStepRows<F>;
        if (kSets > 1 && r >= rows) break;
        _mm_prefetch(reinterpret_cast<const char*>(in + 1024), _MM_HINT_T0);
        __m512i pair[2];
        in = decode_step<F>(in, pair);
        if constexpr (kWhole) q8_whole_to_bf16(pair);
        else to_bf16<F>(pair);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh x0 = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2])));
          acc[t][i] = _mm512_dpbf16_ps(acc[t][i], reinterpret_cast<__m512bh>(pair[0]), x0);
          if constexpr (kWhole) {
          } else if constexpr (F == kQ8) {
            acc2[t][i] = _mm512_dpbf16_ps(acc2[t][i], reinterpret_cast<__m512bh>(pair[1]), x0);
          } else if constexpr (F != kBF16) {
            const __m512bh x1 = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2 + 1])));
            acc2[t][i] = _mm512_dpbf16_ps(acc2[t][i], reinterpret_cast<__m512bh>(pair[1]), x1);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 a = acc[0][i], a2 = acc2[0][i];
      if constexpr (kSets > 1) {
        a = _mm512_add_ps(a, acc[1][i]);
        a2 = _mm512_add_ps(a2, acc2[1][i]);
      }
      if constexpr (F == kBF16) {
        tot[i] = _mm512_add_ps(tot[i], a);
      } else {
        const float rounded = sums[i * kGroups + g];
        __m512 dot;
        if constexpr (kWhole) {
          dot = a;  // the values themselves: no offset
        } else {
          dot = F == kQ8 ? _mm512_fmadd_ps(_mm512_set1_ps(16.0f), a, a2) : _mm512_add_ps(a, a2);
          dot = _mm512_sub_ps(dot, _mm512_set1_ps(kOffset<F> * rounded));
        }
        tot[i] = _mm512_fmadd_ps(s, dot, tot[i]);
        tot[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(rounded), tot[i]);
      }
    }
  }
  const __mmask16 m = ncols >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << ncols) - 1u);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(C + i * ldc, m, tot[i]);
}

#endif

#if (defined(__AVX512VNNI__) && defined(CHROMA_QUANT_AVX512)) || defined(CHROMA_QUANT_FP32_AVX2)
#if defined(__AVX512VNNI__) && defined(CHROMA_QUANT_AVX512)
#define CHROMA_QUANT_INT8_KERNELS 1
#else
#define CHROMA_QUANT_INT8_AVX2 1  // AVX2 (or AVX-512 without VNNI): vpmaddubsw
#endif

// Activations for the int8 path (q4 and q6 weights, DESIGN.md's vpdpbusd option): per row and
// group of 64 along K, the values quantized symmetrically to int8 with the group's own scale
// (scale = max|x| / 127, x' = rint(x / scale) half to even, so |x - scale * x'| <= scale / 2),
// four consecutive values of K a 32-bit word, each group padded with zeros to 16 words; per
// group the scale and the sum of the quantized values times it (the biases' term: the result is
// then exactly the dot product of scale * x' with s * q + b, up to float32 rounding of the
// per-group sums). A group holding an infinity or a NaN gets a NaN scale: the results it reaches
// are NaN, as float32 arithmetic would make them, never a finite wrong value. A group whose
// largest magnitude is below 127 times the smallest normal float (1.5e-36: its scale would not
// be a normal number) counts as zeros.
inline constexpr float kInt8Tiny = 127.0f * 1.17549435e-38f;
template <int64_t K>
struct Activations8 {
  static constexpr int64_t kGroups = (K + kGroup - 1) / kGroup;
  static constexpr int64_t kQuads = kGroups * (kGroup / 4);
  std::vector<uint32_t> quads;      // [rows][kQuads]
  std::vector<float> scales, sums;  // [rows][kGroups]
  // The 256-bit kernel's form (int8_panel_avx2): per row and pair of consecutive values of K,
  // one 32-bit word holding the pair twice, (x[2p], x[2p+1], x[2p], x[2p+1]).
  std::vector<uint32_t> pairs;  // [rows][2 * kQuads]
  void resize(int64_t rows) {
    quads.assign(static_cast<size_t>(rows * kQuads), 0u);
    scales.assign(static_cast<size_t>(rows * kGroups), 0.0f);
    sums.assign(static_cast<size_t>(rows * kGroups), 0.0f);
#if defined(CHROMA_QUANT_INT8_AVX2)
    pairs.resize(static_cast<size_t>(rows * 2 * kQuads));
#endif
  }
  void fill(const float* A, int64_t sar, int64_t sac, int64_t rows, int64_t row0) {
    for (int64_t i = 0; i < rows; ++i) {
      int8_t* q = reinterpret_cast<int8_t*>(quads.data() + (row0 + i) * kQuads);
      float* sc = scales.data() + (row0 + i) * kGroups;
      float* sm = sums.data() + (row0 + i) * kGroups;
      fill_row(A + i * sar, sac, q, sc, sm);
#if defined(CHROMA_QUANT_INT8_AVX2)
      const uint32_t* qw = quads.data() + (row0 + i) * kQuads;
      uint32_t* pw = pairs.data() + (row0 + i) * 2 * kQuads;
      for (int64_t w = 0; w < kQuads; ++w) {
        const uint32_t lo = qw[w] & 0xFFFFu, hi = qw[w] >> 16;
        pw[2 * w] = lo | lo << 16;
        pw[2 * w + 1] = hi | hi << 16;
      }
#endif
    }
  }

 private:
  static void fill_row(const float* row, int64_t sac, int8_t* q, float* sc, float* sm) {
    for (int64_t g = 0; g < kGroups; ++g) {
      const int64_t k0 = g * kGroup, n = K - k0 < kGroup ? K - k0 : kGroup;
      const float* a = row + k0 * sac;
#if defined(CHROMA_QUANT_INT8_KERNELS)
      if (sac == 1) {  // 16 at a time; the same values as the scalar code below
        __m512 x[4];
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int v = 0; v < 4; ++v) {
          const int64_t left = n - 16 * v;
          const __mmask16 m = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                         : (left > 0 ? static_cast<__mmask16>((1u << left) - 1u) : static_cast<__mmask16>(0));
          x[v] = _mm512_maskz_loadu_ps(m, a + 16 * v);
          bad = static_cast<__mmask16>(bad | _mm512_fpclass_ps_mask(x[v], 0x99));  // NaN or infinity
          amax = _mm512_max_ps(amax, _mm512_abs_ps(x[v]));
        }
        const float mx = _mm512_reduce_max_ps(amax);
        if (bad || mx < kInt8Tiny) {
          sc[g] = sm[g] = bad ? __builtin_nanf("") : 0.0f;
          continue;  // the words stay zero
        }
        const float s = mx / 127.0f;
        const __m512 vs = _mm512_set1_ps(s);
        __m512i total = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {
          const __m512i xi = _mm512_cvtps_epi32(_mm512_div_ps(x[v], vs));  // rounds half to even
          total = _mm512_add_epi32(total, xi);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kGroup + 16 * v), _mm512_cvtsepi32_epi8(xi));
        }
        sc[g] = s;
        sm[g] = s * static_cast<float>(_mm512_reduce_add_epi32(total));
        continue;
      }
#else
      if (sac == 1 && n == kGroup) {  // 8 at a time; the same values as the scalar code below
        __m256 x[8];
        __m256 amax = _mm256_setzero_ps(), fin = _mm256_setzero_ps();
        const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        for (int v = 0; v < 8; ++v) {
          x[v] = _mm256_loadu_ps(a + 8 * v);
          fin = _mm256_add_ps(fin, _mm256_sub_ps(x[v], x[v]));  // NaN where x is not finite
          amax = _mm256_max_ps(amax, _mm256_and_ps(x[v], abs_mask));
        }
        alignas(32) float m8[8], f8[8];
        _mm256_store_ps(m8, amax);
        _mm256_store_ps(f8, fin);
        float mx = 0.0f, f = 0.0f;
        for (int v = 0; v < 8; ++v) {
          mx = std::fmax(mx, m8[v]);
          f += f8[v];
        }
        const bool bad = !(f == 0.0f);
        if (bad || mx < kInt8Tiny) {
          sc[g] = sm[g] = bad ? __builtin_nanf("") : 0.0f;
          continue;
        }
        const float s = mx / 127.0f;
        const __m256 vs = _mm256_set1_ps(s);
        __m256i total = _mm256_setzero_si256();
        for (int v = 0; v < 8; v += 2) {
          const __m256i x0 = _mm256_cvtps_epi32(_mm256_div_ps(x[v], vs));  // rounds half to even
          const __m256i x1 = _mm256_cvtps_epi32(_mm256_div_ps(x[v + 1], vs));
          total = _mm256_add_epi32(total, _mm256_add_epi32(x0, x1));
          // Both in [-127, 127]: the saturating packs keep them; order restored by the permute.
          const __m256i p16 = _mm256_packs_epi32(x0, x1);  // 0-3 of x0, 0-3 of x1, 4-7 of x0, 4-7 of x1
          const __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
          // p8: x0[0-3], x1[0-3], x0[4-7], x1[4-7]
          const __m128i ordered = _mm_shuffle_epi32(p8, _MM_SHUFFLE(3, 1, 2, 0));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(q + g * kGroup + 8 * v), ordered);
        }
        alignas(32) int32_t t8[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(t8), total);
        int32_t t = 0;
        for (int v = 0; v < 8; ++v) t += t8[v];
        sc[g] = s;
        sm[g] = s * static_cast<float>(t);
        continue;
      }
#endif
      float mx = 0.0f;
      bool bad = false;
      for (int64_t k = 0; k < n; ++k) {
        const float v = a[k * sac];
        bad = bad || !(v - v == 0.0f);
        mx = std::fmax(mx, std::fabs(v));
      }
      if (bad || mx < kInt8Tiny) {
        sc[g] = sm[g] = bad ? __builtin_nanf("") : 0.0f;
        continue;
      }
      const float s = mx / 127.0f;
      int32_t total = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(a[k * sac] / s));
        q[g * kGroup + k] = static_cast<int8_t>(v);
        total += v;
      }
      sc[g] = s;
      sm[g] = s * static_cast<float>(total);
    }
  }
};

#if defined(CHROMA_QUANT_INT8_KERNELS)
// One step of 4 rows of a q4 or q6 group as bytes for vpdpbusd: 32-bit word j holds column j's
// values of rows r..r+3, in that order (the activations' order). The step's first 32 bytes
// hold column j's four low nibbles in 16-bit word j (rows r, r+2 in the low byte, r+1, r+3 in
// the high byte): (d | d << 12) & 0x0F0F0F0F puts each in its byte. q6's next 16 bytes hold
// the high 2 bits: columns 0-7 in the low nibbles of 16-bit word j (rows r, r+2 in byte 0's,
// r+1, r+3 in byte 1's), columns 8-15 in the high nibbles of word j - 8; shifts per column
// move each pair of bits to bits 4-5 of its row's byte.
template <int F>
__attribute__((always_inline)) inline const uint8_t* decode_quads(const uint8_t* in, __m512i* w) {
  const __m512i d = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
  *w = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), _mm512_set1_epi32(0x0F0F0F0F), 0xA8);  // (a | b) & c
  if constexpr (F == kQ6) {
    const __m512i e = _mm512_cvtepu16_epi32(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32))));
    // Rows r and r+1: columns 0-7 up 4 bits, 8-15 in place; rows r+2 and r+3 up 18 and 14.
    const __m512i lo = _mm512_sllv_epi32(e, _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4));
    const __m512i hi = _mm512_sllv_epi32(e, _mm512_set_epi32(14, 14, 14, 14, 14, 14, 14, 14, 18, 18, 18, 18, 18, 18, 18, 18));
    *w = _mm512_or_si512(*w, _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi32(0x30303030), 0xA8));
    return in + 48;
  }
  return in + 32;
}

// One panel for MR rows (at most 8): C[MR, 16] (ncols of them stored), with vpdpbusd of the
// unsigned weights by the int8 activations; per group and column,
// acc += s * x_scale * dot(x', q) + b * x_scale * sum(x'). Independent chains as in bf16_panel:
// one row alternates between 4 sets of accumulators, two rows between 2.
template <int F, int MR, int64_t K>
__attribute__((always_inline)) inline void int8_panel(const uint32_t* xq, const float* xs, const float* sums,
                                                      const uint8_t* in, float* C, int64_t ldc, int64_t ncols) {
  constexpr int64_t kQuads = Activations8<K>::kQuads, kGroups = Activations8<K>::kGroups;
  constexpr int kSets = MR == 1 ? 4 : (MR == 2 ? 2 : 1);
  __m512 tot[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) tot[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    const uint32_t* xg = xq + g * (kGroup / 4);
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
    const __m512 b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32)));
    in += 64;
    __m512i acc[kSets][MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int t = 0; t < kSets; ++t) acc[t][i] = _mm512_setzero_si512();
    }
    for (int64_t r0 = 0; r0 < rows; r0 += 4 * kSets) {
#pragma GCC unroll 4
      for (int t = 0; t < kSets; ++t) {
        const int64_t r = r0 + 4 * t;
        if (kSets > 1 && r >= rows) break;
        // 4 KB ahead (the weights are one stream, panel after panel): the unembedding of the
        // reference model (K = 128, 201,088 columns, one row) 0.76 -> 0.70 ms against 1 KB
        // ahead on a Zen 4 core; 16 KB was slower (0.84).
        _mm_prefetch(reinterpret_cast<const char*>(in + 4096), _MM_HINT_T0);
        __m512i w;
        in = decode_quads<F>(in, &w);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          acc[t][i] = _mm512_dpbusd_epi32(acc[t][i], w, _mm512_set1_epi32(static_cast<int>(xg[i * kQuads + r / 4])));
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512i a = acc[0][i];
#pragma GCC unroll 4
      for (int t = 1; t < kSets; ++t) a = _mm512_add_epi32(a, acc[t][i]);
      // Exact in float32: |dot| <= 64 * 63 * 127 < 2^24.
      tot[i] = _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(xs[i * kGroups + g])), _mm512_cvtepi32_ps(a), tot[i]);
      tot[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(sums[i * kGroups + g]), tot[i]);
    }
  }
  const __mmask16 m = ncols >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << ncols) - 1u);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(C + i * ldc, m, tot[i]);
}

#else  // CHROMA_QUANT_INT8_AVX2

// One panel for MR rows (at most 4): C[MR, 16] (ncols of them stored), with AVX2's vpmaddubsw
// (unsigned bytes times signed bytes, adjacent pairs added in 16 bits) of the weights' values
// by the int8 activations. A q4 or q6 step's first 32 bytes hold, in 16-bit word j, column
// j's values of rows r and r + 1 in the low nibbles of its two bytes and rows r + 2 and r + 3
// in the high ones (docs/quantization.md); the activations' pair (x[r], x[r+1]) is broadcast
// to every word, so one vpmaddubsw gives all 16 columns' sums of two rows, no reordering.
// Bounds: a pair's sum is at most 2 * 63 * 127 = 16002 and a step's two at most 32004, so a
// q6 step fits 16 bits; q4's (7620) add up over 4 steps in 16 bits before they are widened.
// The widening splits even and odd columns (shifts within 32-bit words), put back in order
// once per group. Per group and column, as int8_panel: s * x_scale * dot + b * x_scale * sum.
template <int F, int MR, int64_t K>
__attribute__((always_inline)) inline void int8_panel_avx2(const uint32_t* xp, const float* xs, const float* sums,
                                                           const uint8_t* in, float* C, int64_t ldc, int64_t ncols) {
  constexpr int64_t kPairs = 2 * Activations8<K>::kQuads, kGroups = Activations8<K>::kGroups;
  constexpr int kRun = F == kQ4 ? 4 : 1;
  const __m256i nib = _mm256_set1_epi8(15);
  __m256 tot[MR][2];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) tot[i][0] = tot[i][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    const uint32_t* xg = xp + g * (kGroup / 2);
    __m256 s[2], b[2];
    in = group_scales<F>(in, s, b);
    __m256i even[MR], odd[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) even[i] = odd[i] = _mm256_setzero_si256();
    for (int64_t r0 = 0; r0 < rows; r0 += 4 * kRun) {
      __m256i acc[MR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_si256();
      // Not unrolled: unrolled, GCC reassociates the 16-bit sums across steps into a tree
      // whose partial products spill to the stack (measured 2x slower).
#pragma GCC unroll 1
      for (int t = 0; t < kRun; ++t) {
        const int64_t r = r0 + 4 * t;
        if (kRun > 1 && r >= rows) break;
        _mm_prefetch(reinterpret_cast<const char*>(in + 4096), _MM_HINT_T0);
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
        __m256i lo = _mm256_and_si256(bytes, nib), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nib);
        if constexpr (F == kQ6) {
          // The high bits: columns 0-7 in the low nibbles of the next 16 bytes, 8-15 in their
          // high nibbles; bits 0-1 for rows r, r + 1, bits 2-3 for rows r + 2, r + 3.
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
          const __m256i e = _mm256_inserti128_si256(_mm256_castsi128_si256(h), _mm_srli_epi16(h, 4), 1);
          const __m256i top = _mm256_set1_epi8(0x30);
          lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(e, 4), top));
          hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(e, 2), top));
          in += 48;
        } else {
          in += 32;
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m256i x01 = _mm256_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2]));
          const __m256i x23 = _mm256_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2 + 1]));
          acc[i] = _mm256_add_epi16(acc[i], _mm256_add_epi16(_mm256_maddubs_epi16(lo, x01), _mm256_maddubs_epi16(hi, x23)));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        even[i] = _mm256_add_epi32(even[i], _mm256_srai_epi32(_mm256_slli_epi32(acc[i], 16), 16));
        odd[i] = _mm256_add_epi32(odd[i], _mm256_srai_epi32(acc[i], 16));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      // Exact in float32: |dot| <= 64 * 63 * 127 < 2^24. Columns back in order: 0-3 and 8-11
      // from the low interleave, 4-7 and 12-15 from the high one.
      const __m256 fe = _mm256_cvtepi32_ps(even[i]), fo = _mm256_cvtepi32_ps(odd[i]);
      const __m256 l = _mm256_unpacklo_ps(fe, fo), h = _mm256_unpackhi_ps(fe, fo);
      const __m256 d[2] = {_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31)};
      const __m256 xsv = _mm256_set1_ps(xs[i * kGroups + g]), sm = _mm256_set1_ps(sums[i * kGroups + g]);
      for (int hh = 0; hh < 2; ++hh) {
        tot[i][hh] = _mm256_fmadd_ps(_mm256_mul_ps(s[hh], xsv), d[hh], tot[i][hh]);
        tot[i][hh] = _mm256_fmadd_ps(b[hh], sm, tot[i][hh]);
      }
    }
  }
  if (ncols >= kPanel) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      _mm256_storeu_ps(C + i * ldc, tot[i][0]);
      _mm256_storeu_ps(C + i * ldc + 8, tot[i][1]);
    }
  } else {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols)), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(ncols) - 8), lane);
    for (int i = 0; i < MR; ++i) {
      _mm256_maskstore_ps(C + i * ldc, m0, tot[i][0]);
      _mm256_maskstore_ps(C + i * ldc + 8, m1, tot[i][1]);
    }
  }
}

#endif
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(CHROMA_QUANT_BF16_KERNELS)
#define CHROMA_QUANT_AMX_KERNELS 1

// AMX needs the kernel's permission for its tile data, once per process (Linux 5.16+); without
// it the vdpbf16ps kernels run.
inline bool amx_ready() {
  static const bool ok = [] {
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: tmm0 and tmm5 a group's C [rows x 16 float] for one panel each; tmm1, tmm2
// activations [rows x 32 bfloat16]; tmm3, tmm4 and tmm6, tmm7 decoded weights [16 pairs of
// rows x 16 columns] (VNNI layout: one 64-byte row is 2 rows of K x 16 columns, our packed
// layout).
inline void amx_configure(int rows) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = static_cast<uint8_t>(t == 3 || t == 4 || t == 6 || t == 7 ? 16 : rows);
  }
  _tile_loadconfig(&c);
}

// Panel p of one matrix for rows [0, M) in blocks of R (<= 16) rows (activations padded to
// whole blocks): each group's weights decoded once to bfloat16 in `wb` (zero past the group's
// rows), multiplied on AMX per row block, the group's result folded into C with its scales:
// C = sum over groups of s * (dot - offset * sum x') + b * sum x.
template <int F, int64_t M, int R, int64_t K, int NP>
inline void amx_panels(const uint32_t* pairs, const uint32_t* pairs16, const float* sums, const uint8_t* in0, float* C0,
                       int64_t ldc, int64_t ncols0, uint16_t* wbuf, float* cbuf, bool stream) {
  static_assert(NP == 1 || (NP == 2 && M <= 8), "two panels at once: at most 8 rows (their sums stay in registers)");
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  constexpr int64_t kStride = kPairs * 4;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  const uint8_t* in[NP];
  float* C[NP];
  uint16_t* wb[NP];
  float* cb[NP];
  __mmask16 m[NP];
  for (int p = 0; p < NP; ++p) {
    in[p] = in0 + p * kPanelBytes;
    C[p] = C0 + p * kPanel;
    wb[p] = wbuf + p * 2048;
    cb[p] = cbuf + p * 16 * kPanel;
    const int64_t nc = ncols0 - p * kPanel;
    m[p] = nc >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nc) - 1u);
  }
  __m512 tot[NP][M <= 16 ? M : 1];
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    __m512 s[NP], b[NP];
    for (int p = 0; p < NP; ++p) {
      s[p] = _mm512_set1_ps(1.0f);
      b[p] = _mm512_setzero_ps();
      if constexpr (F != kBF16) {
        s[p] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in[p])));
        b[p] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in[p] + 32)));
        in[p] += 64;
      }
      // Decode: wb holds 32 pair-rows (64 rows of K) of 32 words; q8 holds its low nibbles
      // there and its high nibbles in the second half (wb + 1024 words), read against 16 x.
      __m512i* w = reinterpret_cast<__m512i*>(wb[p]);
      int64_t pr = 0;
      for (int64_t r = 0; r < rows; r += kStepRows<F>) {
        __m512i pair[2];
        in[p] = decode_step<F>(in[p], pair);
        to_bf16<F>(pair);
        if constexpr (F == kQ8) {
          _mm512_store_si512(w + pr, pair[1]);       // low nibbles, times x
          _mm512_store_si512(w + 32 + pr, pair[0]);  // high nibbles, times 16 x
          pr += 1;
        } else if constexpr (F == kBF16) {
          _mm512_store_si512(w + pr, pair[0]);
          pr += 1;
        } else {
          _mm512_store_si512(w + pr, pair[0]);
          _mm512_store_si512(w + pr + 1, pair[1]);
          pr += 2;
        }
      }
      for (; pr < 32; ++pr) {  // a short last group: zero weights past its rows
        _mm512_store_si512(w + pr, _mm512_setzero_si512());
        if constexpr (F == kQ8) _mm512_store_si512(w + 32 + pr, _mm512_setzero_si512());
      }
    }
    const int64_t halves = rows > 32 ? 2 : 1;
    for (int64_t r0 = 0; r0 < M; r0 += R) {
      // Panel 0 in tiles 0 (C), 3 and 4 (weights); panel 1 in 5, 6 and 7; the activations
      // (1, and 2 for q8's 16x) are shared.
      _tile_zero(0);
      if constexpr (NP == 2) _tile_zero(5);
      for (int64_t h = 0; h < halves; ++h) {
        const int64_t col = g * (kGroup / 2) + h * 16;  // pair index of the half's first row
        _tile_loadd(1, pairs + r0 * kPairs + col, kStride);
        _tile_loadd(3, wb[0] + h * 512, 64);
        if constexpr (NP == 2) _tile_loadd(6, wb[NP - 1] + h * 512, 64);
        _tile_dpbf16ps(0, 1, 3);
        if constexpr (NP == 2) _tile_dpbf16ps(5, 1, 6);
        if constexpr (F == kQ8) {
          _tile_loadd(2, pairs16 + r0 * kPairs + col, kStride);
          _tile_loadd(4, wb[0] + 1024 + h * 512, 64);
          if constexpr (NP == 2) _tile_loadd(7, wb[NP - 1] + 1024 + h * 512, 64);
          _tile_dpbf16ps(0, 2, 4);
          if constexpr (NP == 2) _tile_dpbf16ps(5, 2, 7);
        }
      }
      _tile_stored(0, cb[0], 64);
      if constexpr (NP == 2) _tile_stored(5, cb[NP - 1], 64);
      const int64_t nr = M - r0 < R ? M - r0 : R;
      for (int p = 0; p < NP; ++p) {
        for (int64_t i = 0; i < nr; ++i) {
          const float sm = sums[(r0 + i) * kGroups + g];
          __m512 dot = _mm512_load_ps(cb[p] + i * kPanel);
          __m512 v;
          if constexpr (F == kBF16) {
            v = dot;
          } else {
            dot = _mm512_sub_ps(dot, _mm512_set1_ps(kOffset<F> * sm));
            v = _mm512_fmadd_ps(b[p], _mm512_set1_ps(sm), _mm512_mul_ps(s[p], dot));
          }
          if constexpr (M <= 16) {
            tot[p][i] = g > 0 ? _mm512_add_ps(tot[p][i], v) : v;
          } else {
            float* c = C[p] + (r0 + i) * ldc;
            if (g > 0) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m[p], c));
            _mm512_mask_storeu_ps(c, m[p], v);
          }
        }
      }
    }
  }
  if constexpr (M <= 16) {
    // A large result that nothing reads soon (the logits) is streamed past the caches: no read
    // for ownership, and the weights' lines are not evicted.
    for (int p = 0; p < NP; ++p) {
      for (int64_t i = 0; i < M; ++i) {
        float* c = C[p] + i * ldc;
        if (stream && m[p] == 0xFFFF && (reinterpret_cast<uintptr_t>(c) & 63) == 0) {
          _mm512_stream_ps(c, tot[p][i]);
        } else {
          _mm512_mask_storeu_ps(c, m[p], tot[p][i]);
        }
      }
    }
  }
}

#endif

// Work items [w0, w1) of a product's panels (item w: panel w % P of batch w / P), each over rows
// [0, M) in blocks of 8 and one holding what is left: kernel(std::integral_constant<int, MR>,
// batch, panel, first row). So the register kernels (bf16_panel, int8_panel) take any number
// of rows, each panel's weights decoded again per block from the cache. Against the exact
// path's float32 tiles (near this CPU's float32 peak) on one Zen 4 core, K = N = 2880: q4 (int8)
// 4.4x faster at 16 rows, 2.6x at 256; bf16 weights 2.8x and 2.2x; q8 1.9x and 1.7x; and at
// K = 1024, N = 4096, 1024 rows: q4 3.1x, bf16 2.2x (vpdpbusd and vdpbf16ps do 4 and 2
// multiply-adds a lane to an FMA's 1).
template <int64_t M, int64_t P, int RB = 8, class Kernel>
__attribute__((always_inline)) inline void panel_blocks(int64_t w0, int64_t w1, Kernel&& kernel) {
  constexpr int64_t kFull = M / RB, kRest = M % RB;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t b = w / P, p = w % P;
    for (int64_t r0 = 0; r0 < kFull * RB; r0 += RB) kernel(std::integral_constant<int, RB>{}, b, p, r0);
    if constexpr (kRest > 0) kernel(std::integral_constant<int, static_cast<int>(kRest)>{}, b, p, kFull * RB);
  }
}

}  // namespace quant_detail

// What the products do with the activations (the `activations` option, quant::Activations):
// kAuto: int8 for q4 and q6 weights where the CPU has AVX512-VNNI and no AMX path runs, else
// bfloat16; kBF16: bfloat16 (where the CPU has AVX512-BF16); kFP32: float32 throughout.
enum class QuantActs : int { kAuto = 0, kBF16 = 1, kFP32 = 2 };

// Batched C[b] = A[b] @ B[b] (M x K times K x N), B packed in format F (quant::Format's
// value); b_off in bytes. As gemm_packed otherwise.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void gemm_quant(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const uint8_t* Bq,
                       const int64_t* b_off, float* C, const int64_t* c_off, int64_t ldc, rt::ThreadPool* pool,
                       QuantActs acts) {
  using namespace quant_detail;
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kWork = BATCH * P;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  const bool threaded = pool && pool->size() > 1 && kWork * kPanelBytes >= (int64_t{128} << 10) && kWork > 1;
  auto run = [&](auto&& range) {
    if (threaded) {
      pool->parallel_for(kWork, range);
    } else {
      range(0, kWork);
    }
  };
  if (acts != QuantActs::kFP32) {
    // Activations rounded (bfloat16) or quantized (int8) once per call, by the calling thread.
    constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
    (void)kPairs;
    (void)kGroups;
#if defined(CHROMA_QUANT_AMX_KERNELS)
    // AMX from 2 rows (one row is bound by memory either way), in blocks of up to 16 rows.
    if (M >= 2 && amx_ready()) {
      constexpr int R = M < 16 ? static_cast<int>(M) : 16;
      // A result of 4 MB or more (the logits) is streamed to memory (amx_panel).
      constexpr bool kStream = BATCH * M * N * 4 >= (int64_t{4} << 20);
      constexpr int64_t MP = (M + R - 1) / R * R;
      thread_local Activations<K> x;
      x.resize(BATCH * MP, F == kQ8);
      for (int64_t b = 0; b < BATCH; ++b) x.fill(A + a_off[b], sar, sac, M, b * MP, F == kQ8);
      // Pointers, not the thread_local itself: a worker naming `x` would see its own.
      const uint32_t* pairs = x.pairs.data();
      const uint32_t* pairs16 = F == kQ8 ? x.pairs16.data() : nullptr;
      const float* sums = x.sums.data();
      run([&](int64_t w0, int64_t w1) {
        alignas(64) uint16_t wb[2 * 2048];
        alignas(64) float cb[2 * 16 * kPanel];
        amx_configure(R);
        for (int64_t w = w0; w < w1;) {
          const int64_t b = w / P, p = w % P;
          const uint32_t* xp = pairs + b * MP * kPairs;
          const uint32_t* xp16 = pairs16 ? pairs16 + b * MP * kPairs : nullptr;
          const float* sb = sums + b * MP * kGroups;
          const uint8_t* src = Bq + b_off[b] + p * kPanelBytes;
          float* dst = C + c_off[b] + p * kPanel;
          // Two panels at once (their tiles overlap in the AMX unit) while both lie in this range.
          if constexpr (M <= 8) {
            if (w + 1 < w1 && p + 1 < P) {
              amx_panels<F, M, R, K, 2>(xp, xp16, sb, src, dst, ldc, N - p * kPanel, wb, cb, kStream);
              w += 2;
              continue;
            }
          }
          amx_panels<F, M, R, K, 1>(xp, xp16, sb, src, dst, ldc, N - p * kPanel, wb, cb, kStream);
          w += 1;
        }
        _tile_release();
        if (kStream) _mm_sfence();  // the streamed stores are visible before the range is done
      });
      return;
    }
#endif
#if defined(CHROMA_QUANT_INT8_KERNELS) || defined(CHROMA_QUANT_INT8_AVX2)
    if constexpr (F == kQ4 || F == kQ6) {
      if (acts == QuantActs::kAuto) {
        thread_local Activations8<K> x;
        x.resize(BATCH * M);
        for (int64_t b = 0; b < BATCH; ++b) x.fill(A + a_off[b], sar, sac, M, b * M);
        const float* scales = x.scales.data();
        const float* sums = x.sums.data();
#if defined(CHROMA_QUANT_INT8_KERNELS)
        constexpr int64_t kWords = Activations8<K>::kQuads;  // a row's activations: quads (vpdpbusd)
        const uint32_t* words = x.quads.data();
        constexpr int kBlock = 8;
#else
        constexpr int64_t kWords = 2 * Activations8<K>::kQuads;  // pairs, each twice (vpmaddubsw)
        const uint32_t* words = x.pairs.data();
        constexpr int kBlock = 4;
#endif
        run([&](int64_t w0, int64_t w1) {
          panel_blocks<M, P, kBlock>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
            const int64_t row = b * M + r0;
#if defined(CHROMA_QUANT_INT8_KERNELS)
            int8_panel<F, decltype(mr)::value, K>(
#else
            int8_panel_avx2<F, decltype(mr)::value, K>(
#endif
                words + row * kWords, scales + row * kGroups, sums + row * kGroups, Bq + b_off[b] + p * kPanelBytes,
                C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
          });
        });
        return;
      }
    }
#endif
#if defined(CHROMA_QUANT_BF16_KERNELS)
    {
      thread_local Activations<K> x;
      x.resize(BATCH * M, false);
      for (int64_t b = 0; b < BATCH; ++b) x.fill(A + a_off[b], sar, sac, M, b * M, false);
      const uint32_t* pairs = x.pairs.data();
      const float* sums = x.sums.data();
      run([&](int64_t w0, int64_t w1) {
        panel_blocks<M, P>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
          const int64_t row = b * M + r0;
          bf16_panel<F, decltype(mr)::value, K>(pairs + row * kPairs, sums + row * kGroups, Bq + b_off[b] + p * kPanelBytes,
                                                C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
        });
      });
      return;
    }
#endif
  }
#if defined(CHROMA_QUANT_FP32_AVX2) && !defined(CHROMA_QUANT_BF16_KERNELS)
  // Without AVX512-BF16 (AVX2, or AVX-512 without it), up to 4 rows: float32 decoded in
  // registers (q8 and bf16 weights at any setting, q4 and q6 where it is "fp32" or no int8
  // kernel runs); from 5 rows on, each panel decoded once into the buffer serves every row.
  if constexpr (M <= 4) {
    run([&](int64_t w0, int64_t w1) {
      panel_blocks<M, P, 4>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
        fp32_panel_avx2<F, decltype(mr)::value, K>(A + a_off[b] + r0 * sar, sar, sac, Bq + b_off[b] + p * kPanelBytes,
                                                   C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
      });
    });
    return;
  }
#endif
  run([&](int64_t w0, int64_t w1) {
    while (w0 < w1) {
      const int64_t b = w0 / P;
      const int64_t p0 = w0 % P;
      const int64_t p1 = (w1 - b * P) < P ? (w1 - b * P) : P;
      exact_panels<F, M, N, K>(A + a_off[b], sar, sac, Bq + b_off[b], C + c_off[b], ldc, p0, p1);
      w0 = b * P + p1;
    }
  });
}

// The products of a mixture of experts with quantized expert matrices (gemm_packed_gathered).
template <int F, int64_t JOBS, int64_t M, int64_t N, int64_t K, int64_t E, class I>
inline bool gemm_quant_gathered(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const uint8_t* Bq,
                                const I* idx, const int64_t* i_off, float* C, const int64_t* c_off, int64_t ldc,
                                rt::ThreadPool* pool, QuantActs acts, int64_t* bad) {
  constexpr int64_t kMatrix = (N + kPanel - 1) / kPanel * quant_detail::panel_bytes<F, K>();
  int64_t b_off[JOBS];
  if (!expert_offsets<JOBS, E>(idx, i_off, kMatrix, b_off, bad)) return false;
  gemm_quant<F, JOBS, M, N, K>(A, a_off, sar, sac, Bq, b_off, C, c_off, ldc, pool, acts);
  return true;
}

namespace quant_detail {

// quant::row_bytes: one row of a table in the row layout.
template <int F>
constexpr int64_t row_group_bytes(int64_t n) {
  if constexpr (F == kBF16) return 2 * n;
  else if constexpr (F == kQ8) return 4 + n;
  else if constexpr (F == kQ6) return 4 + (n * 6 + 7) / 8;
  else return 4 + (n + 1) / 2;
}
template <int F, int64_t H>
constexpr int64_t row_bytes() {
  int64_t b = 0;
  for (int64_t k0 = 0; k0 < H; k0 += kGroup) b += row_group_bytes<F>(H - k0 < kGroup ? H - k0 : kGroup);
  return b;
}

}  // namespace quant_detail

// out[i, :] = row idx[i] of a table [V, H] stored in the row layout (quant::pack_rows),
// dequantized: s * q + b in float32 (bf16: the value). Every index is checked first; one
// outside [0, V) is an error (*bad = the index, returns false) before anything is written.
template <int F, int64_t V, int64_t H, int64_t NIDX, class I>
inline bool gather_quant(float* out, const uint8_t* table, const I* idx, int64_t* bad) {
  using namespace quant_detail;
  constexpr int64_t kRow = row_bytes<F, H>();
  constexpr int bits = F == kQ8 ? 8 : (F == kQ6 ? 6 : 4);
  for (int64_t i = 0; i < NIDX; ++i) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (v < 0 || v >= V) {
      *bad = v;
      return false;
    }
  }
  for (int64_t i = 0; i < NIDX; ++i) {
    const uint8_t* in = table + static_cast<int64_t>(idx[i]) * kRow;
    float* o = out + i * H;
    for (int64_t k0 = 0; k0 < H; k0 += kGroup) {
      const int64_t n = H - k0 < kGroup ? H - k0 : kGroup;
      if constexpr (F == kBF16) {
        for (int64_t j = 0; j < n; ++j) {
          uint16_t h;
          std::memcpy(&h, in + 2 * j, 2);
          o[k0 + j] = half_detail::bf16_to_f32(h);
        }
      } else {
        uint16_t sb, bb;
        std::memcpy(&sb, in, 2);
        std::memcpy(&bb, in + 2, 2);
        const float s = from_f16_bits(sb), b = from_f16_bits(bb);
        const uint8_t* q = in + 4;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t bit = j * bits;
          uint32_t x = q[bit / 8] >> (bit % 8);
          if ((bit % 8) + bits > 8) x |= static_cast<uint32_t>(q[bit / 8 + 1]) << (8 - bit % 8);
          o[k0 + j] = s * static_cast<float>(x & ((1u << bits) - 1u)) + b;
        }
      }
      in += row_group_bytes<F>(n);
    }
  }
  return true;
}

}  // namespace chroma::et

// gemm_quant's activations: rounded to bfloat16 pairs, or quantized to int8 per group.
// Part of chroma/cpu/gemm_quant.h (which includes every part).
#pragma once

#include <cmath>
#include <vector>
#include "chroma/cpu/quant/layout.h"

namespace chroma::et::quant_detail {

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

// The blocked kernels' activations (gemm_quant.h, blocked_product): rows [r0, r1) of A rounded
// to bfloat16 pairs into `pairs` ([row0 + i][kPairs] words, K padded with zeros to kPairs * 2),
// every word of those rows written (no zeroing needed before), no sums (the decoded weights
// hold their scales). Rows are independent: threads may fill disjoint ranges.
template <int64_t K>
inline void fill_bf16_rows(uint32_t* pairs, const float* A, int64_t sar, int64_t sac, int64_t r0, int64_t r1) {
  constexpr int64_t kPairs = Activations<K>::kPairs;
  for (int64_t i = r0; i < r1; ++i) {
    uint32_t* pr = pairs + i * kPairs;
    const float* a = A + i * sar;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (sac == 1) {
      for (int64_t k0 = 0; k0 < kPairs * 2; k0 += 32) {
        const int64_t left = K - k0;
        const __mmask16 m0 = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                        : (left > 0 ? static_cast<__mmask16>((1u << left) - 1u) : 0);
        const __mmask16 m1 = left >= 32 ? static_cast<__mmask16>(0xFFFF)
                                        : (left > 16 ? static_cast<__mmask16>((1u << (left - 16)) - 1u) : 0);
        const __m512 a0 = _mm512_maskz_loadu_ps(m0, a + k0), a1 = _mm512_maskz_loadu_ps(m1, a + k0 + 16);
        _mm512_storeu_si512(pr + k0 / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(a1, a0)));
      }
      continue;
    }
#endif
    for (int64_t w = 0; w < kPairs; ++w) {
      const int64_t k = 2 * w;
      const uint32_t lo = k < K ? half_detail::f32_to_bf16(a[k * sac]) : 0u;
      const uint32_t hi = k + 1 < K ? half_detail::f32_to_bf16(a[(k + 1) * sac]) : 0u;
      pr[w] = lo | hi << 16;
    }
  }
}

#if defined(CHROMA_QUANT_INT8_KERNELS) || defined(CHROMA_QUANT_INT8_AVX2)

// Activations for the int8 path (q4 and q6 weights; docs/quantization.md, "Kernels"): per row and
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

#endif

}  // namespace chroma::et::quant_detail

// gemm_quant's AVX2 kernels (256-bit: Zen 2/3, Intel client cores, AVX-512 CPUs without its extensions).
// Part of chroma/cpu/gemm_quant.h (which includes every part).
#pragma once
#include <cstring>

#include "chroma/cpu/quant/activations.h"

namespace chroma::et::quant_detail {

#if defined(CHROMA_QUANT_FP32_AVX2)

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
template <int F, int MR, int64_t K, bool kStream = false>
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
      prefetch_weights<kStream>(in + 4096);
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
// One panel's weights as float32 [K][16] with 256-bit vectors (the same values as the portable
// code).
template <int F, int64_t K>
inline void dequant_panel_avx2(const uint8_t* in, float* dst) {
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
#endif

#if defined(CHROMA_QUANT_INT8_AVX2)

// One q4 or q6 step (4 rows of K, 16 columns) as the two registers vpmaddubsw takes: lo holds
// rows r, r + 1 of every column, hi rows r + 2, r + 3 (values 0-15 or 0-63, one a byte).
// Returns the next step's bytes.
template <int F>
__attribute__((always_inline)) inline const uint8_t* int8_step_avx2(const uint8_t* in, __m256i& lo, __m256i& hi) {
  const __m256i nib = _mm256_set1_epi8(15);
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  lo = _mm256_and_si256(bytes, nib);
  hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nib);
  if constexpr (F == kQ6) {
    // The high bits: columns 0-7 in the low nibbles of the next 16 bytes, 8-15 in their
    // high nibbles; bits 0-1 for rows r, r + 1, bits 2-3 for rows r + 2, r + 3.
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
    const __m256i e = _mm256_inserti128_si256(_mm256_castsi128_si256(h), _mm_srli_epi16(h, 4), 1);
    const __m256i top = _mm256_set1_epi8(0x30);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(e, 4), top));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(e, 2), top));
    return in + 48;
  } else {
    return in + 32;
  }
}

// A q4 or q6 panel decoded once for products of many rows: each group's 64 bytes of scales
// and biases as stored, then every step's lo and hi (64 bytes), what every block of rows then
// reads instead of decoding again (gemm_quant uses it for q6, whose bits take 11
// instructions a step).
template <int64_t K>
constexpr int64_t decoded_panel_bytes() {
  int64_t b = 0;
  for (int64_t g = 0; g * kGroup < K; ++g) b += 64 + rows_padded(K, g) * 16;
  return b;
}
template <int F, int64_t K>
inline void decode_panel_int8_avx2(const uint8_t* in, uint8_t* out) {
  for (int64_t g = 0; g * kGroup < K; ++g) {
    std::memcpy(out, in, 64);
    in += 64;
    out += 64;
    for (int64_t r = 0; r < rows_padded(K, g); r += 4) {
      __m256i lo, hi;
      in = int8_step_avx2<F>(in, lo, hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), hi);
      out += 64;
    }
  }
}

// One panel for MR rows (at most 4): C[MR, 16] (ncols of them stored), with AVX2's vpmaddubsw
// (unsigned bytes times signed bytes, adjacent pairs added in 16 bits) of the weights' values
// by the int8 activations. A q4 or q6 step's first 32 bytes hold, in 16-bit word j, column
// j's values of rows r and r + 1 in the low nibbles of its two bytes and rows r + 2 and r + 3
// in the high ones (docs/quantization.md); the activations' pair (x[r], x[r+1]) is broadcast
// to every word, so one vpmaddubsw gives all 16 columns' sums of two rows, no reordering.
// Bounds: a pair's sum is at most 2 * 63 * 127 = 16002 and a step's two at most 32004, so a
// q6 step fits 16 bits; q4's (7620) add up over 4 steps in 16 bits before they are widened.
// The widening splits even and odd columns (within 32-bit words), put back in order
// once per group. Per group and column, as int8_panel: s * x_scale * dot + b * x_scale * sum.
//
// kDecoded: `in` is the panel as decode_panel_int8_avx2 left it (every step's two registers
// ready), read by every block of rows of the product.
template <int F, int MR, int64_t K, bool kDecoded = false, bool kStream = false>
__attribute__((always_inline)) inline void int8_panel_avx2(const uint32_t* xp, const float* xs, const float* sums,
                                                           const uint8_t* in, float* C, int64_t ldc, int64_t ncols) {
  constexpr int64_t kPairs = 2 * Activations8<K>::kQuads, kGroups = Activations8<K>::kGroups;
  constexpr int kRun = F == kQ4 ? 4 : 1;
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
      // whose partial products spill to the stack (measured slower: bench/results/README.md).
#pragma GCC unroll 1
      for (int t = 0; t < kRun; ++t) {
        const int64_t r = r0 + 4 * t;
        if (kRun > 1 && r >= rows) break;
        __m256i lo, hi;
        if constexpr (kDecoded) {
          lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
          hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32));
          in += 64;
        } else {
          prefetch_weights<kStream>(in + 4096);
          in = int8_step_avx2<F>(in, lo, hi);
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
        // Even words sign-extended by vpmaddwd with (1, 0): one instruction where a shift pair took
        // two, and not a shift (q6's bits already take four shifts a step): q6 faster at 4-8 rows,
        // q4 unchanged (bench/results/README.md). Odd words by an arithmetic shift.
        even[i] = _mm256_add_epi32(even[i], _mm256_madd_epi16(acc[i], _mm256_set1_epi32(1)));
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

}  // namespace chroma::et::quant_detail

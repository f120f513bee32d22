// gemm_quant's AVX-512 kernels: 512-bit decoding, vdpbf16ps (AVX512-BF16) and vpdpbusd (AVX512-VNNI).
// Part of chroma/cpu/gemm_quant.h (which includes every part).
#pragma once
#include "chroma/cpu/quant/activations.h"

namespace chroma::et::quant_detail {

#if defined(CHROMA_QUANT_AVX512)

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
inline void dequant_panel_avx512(const uint8_t* in, float* dst) {
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

#endif

#if defined(CHROMA_QUANT_BF16_KERNELS)

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

#if defined(CHROMA_QUANT_BF16_KERNELS)
// ---- Many rows: each panel decoded once per call ----
//
// The kernels above decode every group again for each block of 8 rows and scale each group's
// sums into the result: right for few rows, where the weights' bytes bound the product. From
// kBlockRows rows (gemm_quant.h) the product is bound by arithmetic instead, and the blocked
// kernels take over: a chunk of panels decoded once per call to bfloat16 weights, s * q + b
// rounded to nearest even (MLX's arithmetic: its quantized products dequantize to the
// activations' type; a bfloat16 weight is copied as it is), then multiplied against the
// activations summed over all of K in registers (bf16_block) or AMX tiles (amx.h).

// One panel decoded to bfloat16 pair-rows of 32 words (word 2j+t of pair-row r: row 2r+t of K,
// column j; the VNNI layout a tile of weights reads), kPairs of them: zero past the packed rows.
template <int F, int64_t K>
inline void decode_panel_bf16(const uint8_t* in, uint16_t* out) {
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
  __m512i* w = reinterpret_cast<__m512i*>(out);
  int64_t pr = 0;
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    __m512 s = _mm512_set1_ps(1.0f), b = _mm512_setzero_ps();
    if constexpr (F != kBF16) {
      s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
      b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32)));
      in += 64;
    }
    for (int64_t r = 0; r < rows; r += kStepRows<F>) {
      __m512i pair[2];
      in = decode_step<F>(in, pair);
#pragma GCC unroll 2
      for (int i = 0; i < kStepRows<F> / 2; ++i) {
        if constexpr (F == kBF16) {
          _mm512_storeu_si512(w + pr++, pair[i]);
        } else {
          const __m512 even = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_and_si512(pair[i], lo16)), b);
          const __m512 odd = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(_mm512_srli_epi32(pair[i], 16)), b);
          const __m512i h = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(odd, even));  // even's 16, then odd's
          _mm512_storeu_si512(w + pr++, _mm512_permutexvar_epi16(interleave, h));
        }
      }
    }
  }
  for (; pr < kPairs; ++pr) _mm512_storeu_si512(w + pr, _mm512_setzero_si512());
}

// Rows [r0, r0 + 12) of the padded activations (rows kPairs words apart) times one or two
// decoded panels (w0, w1 = w0 + kPairs * 32 words) over all of K: C[nr rows][nc0 columns]
// stored, vdpbf16ps with 12 x NP independent accumulators.
template <int NP>
__attribute__((always_inline)) inline void bf16_block(const uint32_t* x, int64_t kPairs, const uint16_t* w0, float* C,
                                                      int64_t ldc, int64_t nr, int64_t nc0) {
  constexpr int MR = 12;
  const uint16_t* w1 = w0 + kPairs * 32;
  __m512 acc[MR][NP];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < kPairs; ++kk) {
    __m512bh b[NP];
    b[0] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w0 + kk * 32));
    if constexpr (NP == 2) b[1] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w1 + kk * 32));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[i * kPairs + kk])));
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) acc[i][p] = _mm512_dpbf16_ps(acc[i][p], a, b[p]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int64_t nc = nc0 - p * kPanel;
    const __mmask16 m = nc >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nc) - 1u);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      if (i < nr) _mm512_mask_storeu_ps(C + i * ldc + p * kPanel, m, acc[i][p]);
    }
  }
}

// Rows [r0, r1) (whole blocks of 12 of the padded activations) of panels [p0, p1), decoded in
// `wd` ([panel - p0][kPairs][32 words]); the row block outermost, as amx_blocked_tiles.
inline void bf16_blocked_tiles(const uint32_t* xa, int64_t kPairs, const uint16_t* wd, int64_t M, int64_t N, int64_t p0,
                               int64_t p1, int64_t r0, int64_t r1, float* C, int64_t ldc) {
  for (int64_t r = r0; r < r1; r += 12) {
    const int64_t nr = M - r < 12 ? M - r : 12;
    for (int64_t p = p0; p < p1; p += 2) {
      const uint16_t* w0 = wd + (p - p0) * kPairs * 32;
      float* c = C + r * ldc + p * kPanel;
      if (p + 1 < p1) bf16_block<2>(xa + r * kPairs, kPairs, w0, c, ldc, nr, N - p * kPanel);
      else bf16_block<1>(xa + r * kPairs, kPairs, w0, c, ldc, nr, N - p * kPanel);
    }
  }
}

#endif

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
        // 4 KB ahead (the weights are one stream, panel after panel): the fastest of 1, 4 and
        // 16 KB on the reference model's unembedding (K = 128, 201,088 columns, one row;
        // bench/results/README.md).
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

#endif

}  // namespace chroma::et::quant_detail

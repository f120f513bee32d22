// chroma::et::gemm_quant: C = A @ B for a constant B stored quantized (MLX's affine groups of
// 64 along K, 8, 6 or 4 bits, float16 scales and biases) or in bfloat16, packed at compile
// time in 16-column panels (the layout is written by quant::pack, src/quant/quant.h, and
// documented in docs/quantization.md). The weights are never expanded to float32 in memory:
//
// - few rows (at most 8, decode and short prompts), with AVX512-BF16: each group's values are
//   decoded in registers to bfloat16 and multiplied with vdpbf16ps against the activations
//   rounded once to bfloat16 (about 0.2% relative error per product, far below q8's). The
//   4- and 6-bit values become bfloat16 by an OR with the exponent of 128 (128 + q is exact),
//   the 8-bit ones as two nibbles; per group and column, acc += s * dot(x, q) + b * sum(x).
// - otherwise (more rows, `exact`, or no AVX512-BF16): each panel is dequantized (s * q + b,
//   float32) into a small per-thread buffer, a few panels at a time, and multiplied by the
//   float32 register tiles of gemm_packed.h: exact float32 arithmetic on the stored weights.
//
// Panels (times batches) are split between the program's threads, as for gemm_packed.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

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

// One panel's weights as float32 [K][16].
template <int F, int64_t K>
inline void dequant_panel(const uint8_t* in, float* dst) {
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

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define CHROMA_QUANT_BF16_KERNELS 1

// Activations for the bfloat16 path: per row, pairs (x[k], x[k+1]) as bfloat16 in one 32-bit
// word (K padded with zeros to a multiple of 4), and per group the sum of the rounded values
// (the 128 offset of the decoded weights) and of the exact values (the biases).
template <int64_t K>
struct Activations {
  static constexpr int64_t kPairs = (K + 3) / 4 * 2;
  static constexpr int64_t kGroups = (K + kGroup - 1) / kGroup;
  std::vector<uint32_t> pairs;  // [rows][kPairs]
  std::vector<float> sums;      // [rows][kGroups][2]: rounded, exact
  void fill(const float* A, int64_t sar, int64_t sac, int64_t rows, int64_t row0) {
    for (int64_t i = 0; i < rows; ++i) {
      uint32_t* pr = pairs.data() + (row0 + i) * kPairs;
      float* sm = sums.data() + (row0 + i) * kGroups * 2;
      for (int64_t g = 0; g < kGroups; ++g) sm[2 * g] = sm[2 * g + 1] = 0.0f;
      for (int64_t p = 0; p < kPairs; ++p) {
        uint32_t word = 0;
        for (int t = 0; t < 2; ++t) {
          const int64_t k = 2 * p + t;
          if (k >= K) continue;
          const float x = A[i * sar + k * sac];
          const uint16_t h = half_detail::f32_to_bf16(x);
          word |= static_cast<uint32_t>(h) << (16 * t);
          sm[2 * (k / kGroup)] += half_detail::bf16_to_f32(h);
          sm[2 * (k / kGroup) + 1] += x;
        }
        pr[p] = word;
      }
    }
  }
};

// One panel for MR rows (at most 8): C[MR, 16] (ncols of them stored).
template <int F, int MR, int64_t K>
__attribute__((always_inline)) inline void bf16_panel(const uint32_t* xp, const float* sums, const uint8_t* in, float* C,
                                                      int64_t ldc, int64_t ncols) {
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  __m512 tot[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) tot[i] = _mm512_setzero_ps();
  const __m512i lo4 = _mm512_set1_epi16(0x000F), exp128 = _mm512_set1_epi16(0x4300);
  for (int64_t g = 0; g < kGroups; ++g) {
    const int64_t rows = rows_padded(K, g);
    const uint32_t* xg = xp + g * (kGroup / 2);
    __m512 s = _mm512_setzero_ps(), b = _mm512_setzero_ps();
    if constexpr (F != kBF16) {
      s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
      b = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32)));
      in += 64;
    }
    __m512 acc[MR], acc2[F == kQ8 ? MR : 1];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
    if constexpr (F == kQ8) {
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) acc2[i] = _mm512_setzero_ps();
    }
    if constexpr (F == kBF16) {
      for (int64_t r = 0; r < rows; r += 2, in += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(in + 1024), _MM_HINT_T0);
        const __m512bh w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(in));
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2])));
          acc[i] = _mm512_dpbf16_ps(acc[i], w, x);
        }
      }
    } else if constexpr (F == kQ8) {
      for (int64_t r = 0; r < rows; r += 2, in += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(in + 1024), _MM_HINT_T0);
        const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
        const __m512bh hi = reinterpret_cast<__m512bh>(_mm512_or_si512(_mm512_srli_epi16(words, 4), exp128));
        const __m512bh lo = reinterpret_cast<__m512bh>(_mm512_ternarylogic_epi32(words, lo4, exp128, 0xEA));  // (a & b) | c
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2])));
          acc[i] = _mm512_dpbf16_ps(acc[i], hi, x);
          acc2[i] = _mm512_dpbf16_ps(acc2[i], lo, x);
        }
      }
    } else {
      for (int64_t r = 0; r < rows; r += 4) {
        _mm_prefetch(reinterpret_cast<const char*>(in + 1024), _MM_HINT_T0);
        const __m512i words = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
        __m512i a = _mm512_ternarylogic_epi32(words, lo4, exp128, 0xEA);
        __m512i c = _mm512_or_si512(_mm512_srli_epi16(words, 4), exp128);
        if constexpr (F == kQ6) {
          const __m128i h16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 32));
          const __m256i h32 = _mm256_inserti128_si256(_mm256_castsi128_si256(h16), _mm_srli_epi16(h16, 4), 1);
          const __m512i h = _mm512_cvtepu8_epi16(h32);
          a = _mm512_or_si512(a, _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(3)), 4));
          c = _mm512_or_si512(c, _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi16(12)), 2));
          in += 48;
        } else {
          in += 32;
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const __m512bh xa = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2])));
          const __m512bh xc = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(xg[i * kPairs + r / 2 + 1])));
          acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(a), xa);
          acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(c), xc);
        }
      }
    }
    // acc holds sum x' (128 + q) (q8: the high nibbles in acc, the low in acc2).
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      if constexpr (F == kBF16) {
        tot[i] = _mm512_add_ps(tot[i], acc[i]);
      } else {
        const float rounded = sums[(i * kGroups + g) * 2], exact = sums[(i * kGroups + g) * 2 + 1];
        __m512 dot;
        if constexpr (F == kQ8) {
          dot = _mm512_fmadd_ps(_mm512_set1_ps(16.0f), acc[i], acc2[i]);
          dot = _mm512_sub_ps(dot, _mm512_set1_ps(2176.0f * rounded));  // 16 * 128 + 128
        } else {
          dot = _mm512_sub_ps(acc[i], _mm512_set1_ps(128.0f * rounded));
        }
        tot[i] = _mm512_fmadd_ps(s, dot, tot[i]);
        tot[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(exact), tot[i]);
      }
    }
  }
  const __mmask16 m = ncols >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << ncols) - 1u);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(C + i * ldc, m, tot[i]);
}

#endif

}  // namespace quant_detail

// Batched C[b] = A[b] @ B[b] (M x K times K x N), B packed in format F (quant::Format's
// value); b_off in bytes. As gemm_packed otherwise.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void gemm_quant(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const uint8_t* Bq,
                       const int64_t* b_off, float* C, const int64_t* c_off, int64_t ldc, rt::ThreadPool* pool,
                       bool exact) {
  using namespace quant_detail;
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kWork = BATCH * P;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
#if defined(CHROMA_QUANT_BF16_KERNELS)
  if constexpr (M <= 8) {
   if (!exact) {
    thread_local Activations<K> x;
    x.pairs.resize(static_cast<size_t>(BATCH * M * Activations<K>::kPairs));
    x.sums.resize(static_cast<size_t>(BATCH * M * Activations<K>::kGroups * 2));
    for (int64_t b = 0; b < BATCH; ++b) x.fill(A + a_off[b], sar, sac, M, b * M);
    const uint32_t* pairs = x.pairs.data();
    const float* sums = x.sums.data();
    auto range = [&](int64_t w0, int64_t w1) {
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / P, p = w % P;
        bf16_panel<F, static_cast<int>(M), K>(pairs + b * M * Activations<K>::kPairs, sums + b * M * Activations<K>::kGroups * 2,
                             Bq + b_off[b] + p * kPanelBytes, C + c_off[b] + p * kPanel, ldc, N - p * kPanel);
      }
    };
    if (pool && pool->size() > 1 && kWork * kPanelBytes >= (int64_t{128} << 10) && kWork > 1) {
      pool->parallel_for(kWork, range);
    } else {
      range(0, kWork);
    }
    return;
   }
  }
#endif
  (void)exact;
  auto range = [&](int64_t w0, int64_t w1) {
    while (w0 < w1) {
      const int64_t b = w0 / P;
      const int64_t p0 = w0 % P;
      const int64_t p1 = (w1 - b * P) < P ? (w1 - b * P) : P;
      exact_panels<F, M, N, K>(A + a_off[b], sar, sac, Bq + b_off[b], C + c_off[b], ldc, p0, p1);
      w0 = b * P + p1;
    }
  };
  if (pool && pool->size() > 1 && kWork * kPanelBytes >= (int64_t{128} << 10) && kWork > 1) {
    pool->parallel_for(kWork, range);
  } else {
    range(0, kWork);
  }
}

// The products of a mixture of experts with quantized expert matrices (gemm_packed_gathered).
template <int F, int64_t JOBS, int64_t M, int64_t N, int64_t K, int64_t E, class I>
inline bool gemm_quant_gathered(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const uint8_t* Bq,
                                const I* idx, const int64_t* i_off, float* C, const int64_t* c_off, int64_t ldc,
                                rt::ThreadPool* pool, bool exact, int64_t* bad) {
  constexpr int64_t kMatrix = (N + kPanel - 1) / kPanel * quant_detail::panel_bytes<F, K>();
  int64_t b_off[JOBS];
  for (int64_t j = 0; j < JOBS; ++j) {
    const int64_t e = static_cast<int64_t>(idx[i_off[j]]);
    if (e < 0 || e >= E) {
      *bad = e;
      return false;
    }
    b_off[j] = e * kMatrix;
  }
  gemm_quant<F, JOBS, M, N, K>(A, a_off, sar, sac, Bq, b_off, C, c_off, ldc, pool, exact);
  return true;
}

}  // namespace chroma::et

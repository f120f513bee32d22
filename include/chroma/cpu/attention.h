// chroma::et::attention: softmax(q kt * scale + bias) v in one kernel that never holds the
// scores (the Attention op, src/passes/fuse_attention.h). Each task takes one batch and a
// block of query rows, streams the keys and values in blocks and keeps, per row, the running
// maximum, the running sum of exponentials and the unnormalized output (an online softmax,
// as in FlashAttention): memory beyond the operands is a few blocks per thread, whatever the
// sequence lengths.
//
// The scores of a block are one product (oneDNN's sgemm, CBLAS or the reference GEMM, as the
// artifact's other products), then scaled (multiplied, or divided when `divide`) and biased
// in float32 with the scalar functions of the expression templates, so each score has the
// bits the unfused graph gives it; the softmax's sum and the second product add in another
// order, which moves the result by a few ulp. A row whose scores are all -inf gives NaN, as
// the softmax does (0 / 0).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "chroma/cpu/dnnl_bf16.h"   // to_bf16 (rows)
#include "chroma/cpu/gemm_quant.h"  // amx_ready, the tile configuration (quant/amx.h)
#include "chroma/cpu/scalar.h"
#include "chroma/cpu/threads.h"
#include "chroma/half.h"
#if defined(CHROMA_DNNL)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#if __has_include(<cblas.h>)
#include <cblas.h>
#endif

namespace chroma::et {

// Which GEMM the blocks use: the same one the artifact's matrix products use.
enum class AttnGemm : int { kRef = 0, kBlas = 1, kDnnl = 2 };

// A matrix operand of one batch: element (r, c) at p[r * rs + c * cs], one of the strides 1.
struct AttnOperand {
  const float* p;
  int64_t rs, cs;
};

namespace attention_detail {

inline constexpr int64_t kRows = 128;   // query rows per task
inline constexpr int64_t kCols = 512;  // keys per block

// C[m x n] = A[m x k] B[k x n] + beta C on the calling thread, A and B strided operands.
template <AttnGemm G>
inline void gemm(int64_t m, int64_t n, int64_t k, AttnOperand a, AttnOperand b, float* c, int64_t ldc, float beta) {
  const bool ta = a.cs != 1, tb = b.cs != 1;
  const int64_t lda = ta ? a.cs : a.rs, ldb = tb ? b.cs : b.rs;
#if defined(CHROMA_DNNL)
  if constexpr (G == AttnGemm::kDnnl) {
    if (omp_get_max_threads() != 1) omp_set_num_threads(1);
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a.p, std::max<int64_t>(lda, 1), b.p,
                   std::max<int64_t>(ldb, 1), beta, c, ldc) == dnnl_success) {
      return;
    }
  }
#endif
#if __has_include(<cblas.h>)
  if constexpr (G != AttnGemm::kRef) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), 1.0f, a.p, static_cast<int>(std::max<int64_t>(lda, 1)), b.p,
                static_cast<int>(std::max<int64_t>(ldb, 1)), beta, c, static_cast<int>(ldc));
    return;
  }
#endif
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : row[j] * beta;
    for (int64_t p = 0; p < k; ++p) {
      const float x = a.p[i * a.rs + p * a.cs];
      for (int64_t j = 0; j < n; ++j) row[j] += x * b.p[p * b.rs + j * b.cs];
    }
  }
}

// The largest of x[0, n): NaN where any is NaN (scalar::maximum's rule; the order of a maximum
// does not change it). Vectorized by hand: the scalar loop's NaN test kept it scalar, and it
// took as long as both products of a block.
inline float row_max(const float* x, int64_t n) {
  int64_t j = 0;
  float mx = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(mx);
  __mmask16 bad = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  mx = _mm512_reduce_max_ps(m);
  nan = bad != 0;
#elif defined(__AVX2__)
  __m256 m = _mm256_set1_ps(mx), bad = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float l : lanes) mx = l > mx ? l : mx;
  nan = _mm256_movemask_ps(bad) != 0;
#endif
  for (; j < n; ++j) {
    nan = nan || x[j] != x[j];
    mx = x[j] > mx ? x[j] : mx;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : mx;
}

// The sum of x[0, n) in 16 (or 8) running lanes, then across them.
inline float row_sum(const float* x, int64_t n) {
  int64_t j = 0;
  float total = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(x + j));
  total = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
  __m256 acc = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) total += l;
#endif
  for (; j < n; ++j) total += x[j];
  return total;
}

#if defined(__AVX512F__)
// scalar::exp_ (exp_f32) on 16 lanes, step for step (the same bits): the compiler vectorizes
// the scalar loop 8 lanes wide only.
inline __m512 exp16(__m512 x) {
  const __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ);
  __m512 xc = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(89.0f), _CMP_GT_OQ), x, _mm512_set1_ps(89.0f));
  xc = _mm512_mask_blend_ps(zero, xc, _mm512_setzero_ps());
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shift);
  const __m512 n = _mm512_sub_ps(t, shift);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), xc));
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(shift));
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i n1 = _mm512_srai_epi32(ni, 1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 f1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 f2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, n1), bias), 23));
  return _mm512_mask_blend_ps(zero, _mm512_mul_ps(_mm512_mul_ps(y, f1), f2), _mm512_setzero_ps());
}
#endif

// s[j] = exp(s[j] - m) for j < n, and their sum in row_sum's order.
inline float exp_sum(float* s, int64_t n, float m) {
  int64_t j = 0;
  float total = 0.0f;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
    _mm512_storeu_ps(s + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = _mm512_reduce_add_ps(acc);
  for (int64_t k = j; k < n; ++k) s[k] = ::chroma::scalar::exp_(s[k] - m);
  for (; j < n; ++j) total += s[j];
  return total;
#else
#pragma GCC ivdep
  for (int64_t k = 0; k < n; ++k) s[k] = ::chroma::scalar::exp_(s[k] - m);
  return row_sum(s, n);
#endif
}

// What one thread keeps: the scores of a block, the running statistics, the output rows; for
// the bfloat16 products, the block's operands in bfloat16 (q's rows, k's and v's blocks in the
// tiles' pair layout, the weights' rows).
struct Scratch {
  std::vector<float> s, acc, m, l;
  std::vector<uint16_t> qa, kb, pa, vb;
  void size(int64_t e) {
    s.resize(static_cast<size_t>(kRows * kCols));
    acc.resize(static_cast<size_t>(kRows * ((e + 15) / 16) * 16));
    m.resize(kRows);
    l.resize(kRows);
  }
};

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

#if defined(CHROMA_QUANT_AMX_KERNELS)
// ---- The bfloat16 products (operands that are bfloat16 values: a bfloat16 model's) on AMX ----
//
// Tiles, every one 16 rows of 64 bytes (quant_detail::amx_configure_blocked): tmm0..3 results
// (rows 0-15 / 16-31 x columns 0-15 / 16-31 of a 32 x 32 block), tmm4, tmm5 the A rows,
// tmm6, tmm7 the B panels. A: bfloat16 rows, `lda` elements apart, zero past K. B: panels of
// 16 columns, each [kp pairs of K rows][16 columns][2] (the tiles' pair layout), zero past K.

// C[rows x cols] (=, or += when `accumulate`) A B over kp pairs of K (a multiple of 16); rows
// and cols multiples of 16, C `ldc` floats apart, B's panels `ps` elements apart.
inline void amx_gemm(int64_t rows, int64_t cols, int64_t kp, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ps,
                     float* c, int64_t ldc, bool accumulate) {
  const int64_t cs = ldc * 4, as = lda * 2;
  for (int64_t r0 = 0; r0 < rows; r0 += 32) {
    const bool two = r0 + 16 < rows;
    const uint16_t* a0 = a + r0 * lda;
    const uint16_t* a1 = a0 + 16 * lda;
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      const bool pair = c0 + 16 < cols;
      const uint16_t* b0 = b + (c0 / 16) * ps;
      const uint16_t* b1 = b0 + ps;
      float* c00 = c + r0 * ldc + c0;
      float* c10 = c00 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c00, cs);
        if (pair) _tile_loadd(1, c00 + 16, cs);
        if (two) _tile_loadd(2, c10, cs);
        if (two && pair) _tile_loadd(3, c10 + 16, cs);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t kk = 0; kk < kp; kk += 16) {
        _tile_loadd(4, a0 + 2 * kk, as);
        _tile_loadd(6, b0 + kk * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (pair) {
          _tile_loadd(7, b1 + kk * 32, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two) {
          _tile_loadd(5, a1 + 2 * kk, as);
          _tile_dpbf16ps(2, 5, 6);
          if (pair) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c00, cs);
      if (pair) _tile_stored(1, c00 + 16, cs);
      if (two) _tile_stored(2, c10, cs);
      if (two && pair) _tile_stored(3, c10 + 16, cs);
    }
  }
}

// Rows [0, rows) of operand x (K columns) as bfloat16 rows `lda` apart (rounded to nearest
// even: exact for bfloat16 values), zero from K to lda and for rows up to `padded`.
inline void pack_rows(AttnOperand x, int64_t rows, int64_t K, uint16_t* dst, int64_t lda, int64_t padded) {
  for (int64_t r = 0; r < padded; ++r) {
    uint16_t* d = dst + r * lda;
    int64_t k = 0;
    if (r < rows) {
      const float* src = x.p + r * x.rs;
      if (x.cs == 1) {
        ::chroma::et::to_bf16(src, d, K);
      } else {
        for (int64_t j = 0; j < K; ++j) d[j] = ::chroma::half_detail::f32_to_bf16(src[j * x.cs]);
      }
      k = K;
    }
    for (; k < lda; ++k) d[k] = 0;
  }
}

// kt [D x S] (key j's D values, from any strides) as B of the scores' product: panels of 16
// keys over kp pairs of D (zero past D and S; the panels' count rounded up to even).
inline void pack_keys(AttnOperand kt, int64_t D, int64_t S, int64_t kp, uint16_t* dst, std::vector<uint16_t>& row) {
  row.resize(static_cast<size_t>(2 * kp));
  const int64_t panels = round_up(S, 32) / 16;
  for (int64_t j = 0; j < panels * 16; ++j) {
    pack_rows(AttnOperand{j < S ? kt.p + j * kt.cs : kt.p, kt.cs, kt.rs}, j < S ? 1 : 0, D, row.data(), 2 * kp, 1);
    // Key j's pairs down its panel's column: 32-bit words kp apart in the source, 16 in the panel.
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + (j / 16) * kp * 32) + j % 16;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(row.data());
    for (int64_t pr = 0; pr < kp; ++pr) d[pr * 16] = src[pr];
  }
}

// v [S x E] as B of the output's product: panels of 16 columns over the pairs of keys (kpv
// pairs, zero past S and E).
inline void pack_values(AttnOperand v, int64_t S, int64_t E, int64_t kpv, uint16_t* dst, std::vector<uint16_t>& rows) {
  const int64_t ep = round_up(E, 16);
  rows.resize(static_cast<size_t>(2 * ep));
  for (int64_t pr = 0; pr < kpv; ++pr) {
    const int64_t k = 2 * pr;
    pack_rows(AttnOperand{k < S ? v.p + k * v.rs : v.p, v.rs, v.cs}, std::max<int64_t>(0, std::min<int64_t>(2, S - k)), E,
              rows.data(), ep, 2);
    for (int64_t p = 0; p < ep / 16; ++p) {
      uint16_t* d = dst + p * kpv * 32 + pr * 32;
      for (int64_t c = 0; c < 16; ++c) {
        d[2 * c] = rows[static_cast<size_t>(p * 16 + c)];
        d[2 * c + 1] = rows[static_cast<size_t>(ep + p * 16 + c)];
      }
    }
  }
}
#endif

// One row's scores s[0, n) of a key block: scaled, biased, folded into the row's running
// maximum m and sum l, turned into the block's unnormalized weights exp(s - m); the row's
// output so far (acc[0, E)) rescaled to the new maximum.
template <class Bias>
inline void softmax_row(float* s, int64_t n, float scale, bool divide, Bias&& bias, float* m, float* l, float* acc, int64_t E) {
  if (divide) {
    for (int64_t j = 0; j < n; ++j) s[j] = s[j] / scale;
  } else {
    for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale;
  }
  bias(s);
  const float mx = row_max(s, n);
  const float m_old = *m;
  const float m_new = ::chroma::scalar::maximum(m_old, mx);
  if (m_new == -std::numeric_limits<float>::infinity()) {  // every score so far -inf: nothing to add
    std::fill(s, s + n, 0.0f);
    return;
  }
  const float corr = ::chroma::scalar::exp_(m_old - m_new);
  const float total = exp_sum(s, n, m_new);
  *l = *l * corr + total;
  *m = m_new;
  if (corr != 1.0f) {
    for (int64_t e = 0; e < E; ++e) acc[e] *= corr;
  }
}

// out rows [0, rows) (E wide) = their accumulated sums (rows `ld` apart) / their softmax sums.
inline void normalize_rows(float* o, int64_t rows, int64_t E, const float* acc, int64_t ld, const float* l) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < E; ++e) o[r * E + e] = acc[r * ld + e] / l[r];
  }
}

// Per thread: which call and batch its packed keys and values belong to.
inline std::atomic<uint64_t> attention_calls{0};
struct Packed {
  uint64_t call = 0;
  int64_t batch = -1;
};

}  // namespace attention_detail

// out[b] = softmax(q[b] kt[b] (*|/) scale + bias) v[b] for b < batches; q[b] [L x D], kt[b]
// [D x S], v[b] [S x E], out[b] [L x E] row-major. operands(b, &q, &kt, &v) gives batch b's
// operands; bias(b, i, j0, n, s) adds batch b's bias to scores s[0, n) of row i, keys j0..
// (a no-op without a bias). Tasks (batch, block of rows) run side by side on the pool.
//
// BF16 (operands whose values are all bfloat16 values: a bfloat16 model's, the lowering knows):
// where AMX runs (quant_detail::amx_ready), both products on bfloat16 tiles with float32 sums,
// the weights exp(s - m) rounded to bfloat16 before the second, as eager's bfloat16 kernel
// does; the scores' product is then exact up to the order of its sums. Elsewhere the float32
// products above.
template <AttnGemm G, bool BF16 = false, class Operands, class Bias>
void attention(rt::ThreadPool* pool, int64_t batches, int64_t L, int64_t S, int64_t D, int64_t E, float scale, bool divide,
               float* out, Operands&& operands, Bias&& bias) {
  namespace ad = attention_detail;
  if (S == 0) {  // an empty softmax times an empty matrix: zeros, as the unfused product gives
    std::fill(out, out + batches * L * E, 0.0f);
    return;
  }
  const int64_t blocks = (L + ad::kRows - 1) / ad::kRows;
  bool amx = false;
#if defined(CHROMA_QUANT_AMX_KERNELS)
  if constexpr (BF16) amx = quant_detail::amx_ready();
  const uint64_t call = amx ? ad::attention_calls.fetch_add(1) + 1 : 0;
#endif
  auto task = [&](int64_t t) {
    thread_local ad::Scratch w;
    w.size(E);
    const int64_t b = t / blocks, i0 = (t % blocks) * ad::kRows, rows = std::min(ad::kRows, L - i0);
    AttnOperand q{}, kt{}, v{};
    operands(b, &q, &kt, &v);
    float* o = out + (b * L + i0) * E;
    std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    const AttnOperand qb{q.p + i0 * q.rs, q.rs, q.cs};
#if defined(CHROMA_QUANT_AMX_KERNELS)
    if (amx) {
      thread_local ad::Packed packed;
      thread_local std::vector<uint16_t> staging;
      const int64_t kp = ad::round_up(std::max<int64_t>(D, 1), 32) / 2, kpv = ad::round_up(S, 32) / 2;
      const int64_t ep = ad::round_up(E, 16), r16 = ad::round_up(rows, 16);
      if (packed.call != call || packed.batch != b) {  // this batch's keys and values, once per thread
        w.kb.resize(static_cast<size_t>(ad::round_up(S, 32) * kp * 2));
        w.vb.resize(static_cast<size_t>(ep * kpv * 2));
        ad::pack_keys(kt, D, S, kp, w.kb.data(), staging);
        ad::pack_values(v, S, E, kpv, w.vb.data(), staging);
        packed.call = call;
        packed.batch = b;
      }
      w.qa.resize(static_cast<size_t>(ad::kRows * 2 * kp));
      w.pa.resize(static_cast<size_t>(ad::kRows * ad::kCols));
      ad::pack_rows(qb, rows, D, w.qa.data(), 2 * kp, r16);
      quant_detail::amx_configure_blocked();
      std::fill(w.acc.begin(), w.acc.begin() + r16 * ep, 0.0f);
      for (int64_t j0 = 0; j0 < S; j0 += ad::kCols) {
        const int64_t n = std::min(ad::kCols, S - j0), n16 = ad::round_up(n, 16), n32 = ad::round_up(n, 32);
        ad::amx_gemm(r16, n16, kp, w.qa.data(), 2 * kp, w.kb.data() + (j0 / 16) * kp * 32, kp * 32, w.s.data(), n16, false);
        for (int64_t r = 0; r < rows; ++r) {
          float* s = w.s.data() + r * n16;
          ad::softmax_row(s, n, scale, divide, [&](float* x) { bias(b, i0 + r, j0, n, x); }, &w.m[static_cast<size_t>(r)],
                          &w.l[static_cast<size_t>(r)], w.acc.data() + r * ep, E);
        }
        ad::pack_rows(AttnOperand{w.s.data(), n16, 1}, rows, n, w.pa.data(), n32, r16);
        ad::amx_gemm(r16, ep, n32 / 2, w.pa.data(), n32, w.vb.data() + (j0 / 2) * 32, kpv * 32, w.acc.data(), ep, true);
      }
      _tile_release();
      ad::normalize_rows(o, rows, E, w.acc.data(), ep, w.l.data());
      return;
    }
#endif
    std::fill(w.acc.begin(), w.acc.begin() + rows * E, 0.0f);
    for (int64_t j0 = 0; j0 < S; j0 += ad::kCols) {
      const int64_t n = std::min(ad::kCols, S - j0);
      if (D > 0) {
        ad::gemm<G>(rows, n, D, qb, AttnOperand{kt.p + j0 * kt.cs, kt.rs, kt.cs}, w.s.data(), n, 0.0f);
      } else {
        std::fill(w.s.begin(), w.s.begin() + rows * n, 0.0f);
      }
      for (int64_t r = 0; r < rows; ++r) {
        ad::softmax_row(w.s.data() + r * n, n, scale, divide, [&](float* x) { bias(b, i0 + r, j0, n, x); },
                        &w.m[static_cast<size_t>(r)], &w.l[static_cast<size_t>(r)], w.acc.data() + r * E, E);
      }
      ad::gemm<G>(rows, E, n, AttnOperand{w.s.data(), n, 1}, AttnOperand{v.p + j0 * v.rs, v.rs, v.cs}, w.acc.data(), E, 1.0f);
    }
    ad::normalize_rows(o, rows, E, w.acc.data(), E, w.l.data());
  };
  const int64_t tasks = batches * blocks;
  if (pool && pool->size() > 1 && tasks > 1) {
    pool->parallel_for(tasks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) task(t);
    });
  } else {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  }
}

}  // namespace chroma::et

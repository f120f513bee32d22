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
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <immintrin.h>

#include "chroma/cpu/scalar.h"
#include "chroma/cpu/threads.h"
#if __has_include(<oneapi/dnnl/dnnl.h>)
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
#if __has_include(<oneapi/dnnl/dnnl.h>)
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

// What one thread keeps: the scores of a block, the running statistics, the output rows.
struct Scratch {
  std::vector<float> s, acc, m, l;
  void size(int64_t e) {
    s.resize(static_cast<size_t>(kRows * kCols));
    acc.resize(static_cast<size_t>(kRows * e));
    m.resize(kRows);
    l.resize(kRows);
  }
};

}  // namespace attention_detail

// out[b] = softmax(q[b] kt[b] (*|/) scale + bias) v[b] for b < batches; q[b] [L x D], kt[b]
// [D x S], v[b] [S x E], out[b] [L x E] row-major. operands(b, &q, &kt, &v) gives batch b's
// operands; bias(b, i, j0, n, s) adds batch b's bias to scores s[0, n) of row i, keys j0..
// (a no-op without a bias). Tasks (batch, block of rows) run side by side on the pool.
template <AttnGemm G, class Operands, class Bias>
void attention(rt::ThreadPool* pool, int64_t batches, int64_t L, int64_t S, int64_t D, int64_t E, float scale, bool divide,
               float* out, Operands&& operands, Bias&& bias) {
  namespace ad = attention_detail;
  if (S == 0) {  // an empty softmax times an empty matrix: zeros, as the unfused product gives
    std::fill(out, out + batches * L * E, 0.0f);
    return;
  }
  const int64_t blocks = (L + ad::kRows - 1) / ad::kRows;
  auto task = [&](int64_t t) {
    thread_local ad::Scratch w;
    w.size(E);
    const int64_t b = t / blocks, i0 = (t % blocks) * ad::kRows, rows = std::min(ad::kRows, L - i0);
    AttnOperand q{}, kt{}, v{};
    operands(b, &q, &kt, &v);
    float* o = out + (b * L + i0) * E;
    std::fill(w.acc.begin(), w.acc.begin() + rows * E, 0.0f);
    std::fill(w.m.begin(), w.m.end(), -std::numeric_limits<float>::infinity());
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    const AttnOperand qb{q.p + i0 * q.rs, q.rs, q.cs};
    for (int64_t j0 = 0; j0 < S; j0 += ad::kCols) {
      const int64_t n = std::min(ad::kCols, S - j0);
      if (D > 0) {
        ad::gemm<G>(rows, n, D, qb, AttnOperand{kt.p + j0 * kt.cs, kt.rs, kt.cs}, w.s.data(), n, 0.0f);
      } else {
        std::fill(w.s.begin(), w.s.begin() + rows * n, 0.0f);
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* s = w.s.data() + r * n;
        if (divide) {
          for (int64_t j = 0; j < n; ++j) s[j] = s[j] / scale;
        } else {
          for (int64_t j = 0; j < n; ++j) s[j] = s[j] * scale;
        }
        bias(b, i0 + r, j0, n, s);
        const float mx = ad::row_max(s, n);
        const float m_old = w.m[static_cast<size_t>(r)];
        const float m_new = ::chroma::scalar::maximum(m_old, mx);
        float* acc = w.acc.data() + r * E;
        if (m_new == -std::numeric_limits<float>::infinity()) {  // every score so far -inf: nothing to add
          std::fill(s, s + n, 0.0f);
          continue;
        }
        const float corr = ::chroma::scalar::exp_(m_old - m_new);
#pragma GCC ivdep
        for (int64_t j = 0; j < n; ++j) s[j] = ::chroma::scalar::exp_(s[j] - m_new);
        const float total = ad::row_sum(s, n);
        w.l[static_cast<size_t>(r)] = w.l[static_cast<size_t>(r)] * corr + total;
        w.m[static_cast<size_t>(r)] = m_new;
        if (corr != 1.0f) {
          for (int64_t e = 0; e < E; ++e) acc[e] *= corr;
        }
      }
      ad::gemm<G>(rows, E, n, AttnOperand{w.s.data(), n, 1}, AttnOperand{v.p + j0 * v.rs, v.rs, v.cs}, w.acc.data(), E, 1.0f);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float l = w.l[static_cast<size_t>(r)];
      const float* acc = w.acc.data() + r * E;
      for (int64_t e = 0; e < E; ++e) o[r * E + e] = acc[e] / l;
    }
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

// chroma::et::sgemm: the float32 matrix products of generated code (matmul kernels and the
// GEMMs of convolutions) on oneDNN's sgemm, threaded by the program's own pool.
//
// Why oneDNN and not OpenBLAS: on the shapes models bring (linear layers of 49-3136 rows, 1x1
// convolutions, attention blocks) Debian's oneDNN 2.6 sgemm ran faster than OpenBLAS 0.3.21 at one
// thread and at two (bench/gemm.cpp; figures in bench/results/README.md). Why Chroma's pool and not
// oneDNN's OpenMP threads: oneDNN's workers and the pool's would spin on the same cores between
// kernels; the pool splits one product into one block of columns (or rows) per thread and every
// block runs on one thread, so no OpenMP team is ever started by a product.
//
// Only included where oneDNN's headers are present; the generated code calls it only when
// the artifact links oneDNN (CpuCodegenOptions::dnnl).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <oneapi/dnnl/dnnl.h>
#include <vector>

#include "chroma/cpu/threads.h"

#if __has_include(<cblas.h>)
#include <cblas.h>
#endif

namespace chroma::et {

namespace sgemm_detail {

// Products below this many multiply-adds run on one thread: splitting one costs a pool
// dispatch (a few microseconds) and packs the shared operand twice.
inline constexpr int64_t kSplitMacs = int64_t{1} << 20;
inline constexpr int64_t kMaxCols = 1024, kBlockCols = 768;
// Leading dimensions (elements) whose multiples put a matrix's rows in the same cache sets.
inline constexpr int64_t kAliasPitch = 1024;

// C[m x n] = op(A) op(B) on the calling thread. oneDNN sizes its OpenMP team from the calling
// thread's count, so that is set to 1 first (a per-thread setting; convolutions set it back).
inline void serial(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
                   int64_t ldb, float* C, int64_t ldc) {
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  // Products wider than kMaxCols columns in blocks of at most kBlockCols (A is packed once per
  // block): on wide products oneDNN 2.6 ran faster in 768-column blocks than in one call,
  // where it fell behind OpenBLAS (bench/gemm.cpp; figures in bench/results/README.md).
  if (n > kMaxCols) {
    const int64_t pieces = (n + kBlockCols - 1) / kBlockCols;
    const int64_t width = ((n + pieces - 1) / pieces + 15) / 16 * 16;
    for (int64_t j = 0; j < n; j += width) {
      serial(ta, tb, m, std::min(width, n - j), k, A, lda, tb ? B + j * ldb : B + j, ldb, C + j, ldc);
    }
    return;
  }
  // A B read as it lies (not transposed) whose rows lie a multiple of 4 KiB apart sits in the
  // same few cache sets, row after row, and oneDNN 2.6 reads it unpacked for all but large m:
  // such a product ran at a fraction of the rate it reached with a pitch of 1040 (every n a
  // multiple of 1024 alike; m = 784 unaffected). Such a B is copied first into rows of a
  // pitch that is not, which is faster even with the copy (figures in bench/results/README.md).
  thread_local std::vector<float> pitched;
  if (!tb && m > 1 && k > 1 && ldb % kAliasPitch == 0) {
    int64_t pitch = (n + 15) / 16 * 16 + 16;
    if (pitch % kAliasPitch == 0) pitch += 16;
    if (pitched.size() < static_cast<size_t>(k * pitch)) pitched.resize(static_cast<size_t>(k * pitch));
    for (int64_t q = 0; q < k; ++q) std::memcpy(pitched.data() + q * pitch, B + q * ldb, static_cast<size_t>(n) * sizeof(float));
    B = pitched.data();
    ldb = pitch;
  }
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, A, lda, B, ldb, 0.0f, C, ldc) == dnnl_success) return;
  // oneDNN refuses only arguments it considers invalid (it checks the leading dimensions
  // more strictly than BLAS for empty or single-row operands): BLAS takes those.
#if __has_include(<cblas.h>)
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), 1.0f, A, static_cast<int>(lda), B, static_cast<int>(ldb), 0.0f, C,
              static_cast<int>(ldc));
#else
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t p = 0; p < k; ++p) s += (ta ? A[p * lda + i] : A[i * lda + p]) * (tb ? B[j * ldb + p] : B[p * ldb + j]);
      C[i * ldc + j] = s;
    }
  }
#endif
}

}  // namespace sgemm_detail

// C[m x n] = op(A)[m x k] op(B)[k x n], row-major; op transposes when ta / tb. With a pool
// of more than one thread and enough work, each thread computes one block of columns (when
// n >= m) or of rows, a multiple of 16 wide, on its own.
inline void sgemm(rt::ThreadPool* pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float* C, int64_t ldc) {
  const int threads = pool ? pool->size() : 1;
  const bool cols = n >= m;
  const int64_t extent = cols ? n : m;
  const int64_t blocks = (extent + 15) / 16;
  const int64_t use = std::min<int64_t>(threads, blocks);
  if (use <= 1 || m * n * k < sgemm_detail::kSplitMacs) {
    sgemm_detail::serial(ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
    return;
  }
  pool->parallel_for(use, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = blocks * t / use * 16, e = std::min(extent, blocks * (t + 1) / use * 16);
      if (e <= b) continue;
      if (cols) {
        sgemm_detail::serial(ta, tb, m, e - b, k, A, lda, tb ? B + b * ldb : B + b, ldb, C + b, ldc);
      } else {
        sgemm_detail::serial(ta, tb, e - b, n, k, ta ? A + b : A + b * lda, lda, B, ldb, C + b * ldc, ldc);
      }
    }
  });
}

// `count` products of m x n x k, product(q, pool) runs the q-th with et::sgemm on the pool it
// is given. Small products run side by side, one per thread (pool nullptr: serial); large
// ones one after another, each split over the pool.
template <class F>
void sgemm_batch(rt::ThreadPool* pool, int64_t count, int64_t m, int64_t n, int64_t k, F&& product) {
  const int threads = pool ? pool->size() : 1;
  if (threads > 1 && count >= threads && m * n * k < 16 * sgemm_detail::kSplitMacs) {
    pool->parallel_for(count, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) product(q, static_cast<rt::ThreadPool*>(nullptr));
    });
    return;
  }
  for (int64_t q = 0; q < count; ++q) product(q, pool);
}

}  // namespace chroma::et

// chroma::et::gemm_packed: C = A @ B for a constant B pre-packed at compile time and few
// rows in A (the memory-bound products of small-batch inference: an 8-token unembedding
// reads 100 MB of weights for 200 MFLOP).
//
// Packed layout (written by the compiler, Lowerer::packed_matmul in src/lower/cpu_products.cpp):
// B [K, N] is cut into panels
// of 16 columns; panel p holds K rows of 16 floats, contiguous, zero past column N:
//   Bp[(p * K + k) * 16 + j] = B[k, p * 16 + j]
// so one pass over a panel streams 64-byte lines once. Each tile keeps up to 8 rows x 16
// columns, across 2-4 panels, of accumulators in registers; A's elements are
// broadcast from L1. The weights should sit in huge pages (program_main.h copies them
// there). Panels (times batches) are split between the program's threads.
// Accumulation is in float32 with fused multiply-adds, k in increasing order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "chroma/cpu/threads.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace chroma::et {

inline constexpr int64_t kPanel = 16;

// Streamed weights. A product whose constant operand is this large (1 MB and more, beyond a core's
// L2) and is read once per call (one block of rows: no later block reads it again) prefetches it
// non-temporally (PREFETCHNTA): the lines come to L1 without taking the place, in L2 and (through
// L2's evictions) L3, of what the rest of the program reads again every call: activations, caches,
// the small weights of a decoder's layers. The reference model's q4 decode step streams a 14.5 MB
// unembedding; prefetched for keeps it pushed out everything else, and the step's other kernels
// were slower than with it streamed (docs/cpu_kernels.md, "Streamed weights"; figures:
// bench/results/README.md). Only a hint: the same values are read either way.
inline constexpr int64_t kStreamBytes = int64_t{1} << 20;
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// The software prefetch of weights: non-temporal when they are streamed.
template <bool kStream> __attribute__((always_inline)) inline void prefetch_weights(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), kStream ? _MM_HINT_NTA : _MM_HINT_T0);
}
#endif

// Runs range(std::bool_constant<stream>, w0, w1) over [0, work): split over `split` when
// given (T0), else on this thread, streamed when the product's `batches` matrices of
// `matrix` bytes each are kStreamBytes or more, all distinct (a gathered product's jobs, or
// a broadcast B, may read one matrix several times: streamed, every job after the first read
// it from memory again, and a mixture of experts' gathered products got slower), and each
// panel is read by one block of rows. A product split over threads keeps T0: there a core's
// own misses bound how fast it reads (PREFETCHNTA fills L1 alone; T0 lets L2's prefetchers
// have more lines in flight), and on two cores the reference model's q4 unembedding was
// slower streamed. On one thread streaming costs the product itself a little, a loss the rest
// of a decode step more than makes up. Figures: bench/results/README.md.
template <int64_t BATCH, int64_t matrix, bool one_block, class Range>
inline void run_streamed(Range&& range, int64_t work, const int64_t* b_off, int64_t batches, rt::ThreadPool* split) {
  if (split) {
    split->parallel_for(work, [&](int64_t w0, int64_t w1) { range(std::false_type{}, w0, w1); });
    return;
  }
  if constexpr (BATCH * matrix >= kStreamBytes && one_block) {
    bool once = batches * matrix >= kStreamBytes && batches <= 64;
    for (int64_t i = 1; once && i < batches; ++i) {
      for (int64_t j = 0; j < i; ++j) once = once && b_off[i] != b_off[j];
    }
    if (once) {
      range(std::true_type{}, int64_t{0}, work);
      return;
    }
  }
  range(std::false_type{}, int64_t{0}, work);
}

namespace packed_detail {

#if defined(__AVX512F__)

template <int MR, int NP, bool kStream = false>
__attribute__((always_inline)) inline void tile(const float* A, int64_t sar, int64_t sac, const float* Bp, int64_t K,
                                                float* C, int64_t ldc, int64_t ncols) {
  __m512 acc[MR][NP];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t pstride = K * kPanel;
  // Software prefetch: the same row of the next group of NP panels when that is at most
  // 32 KB ahead, else 8 KB ahead inside the panel. (A fixed distance that lands in the panel
  // another stream of this tile is reading right now wastes the prefetch: measured slower,
  // bench/results/README.md.) Past the end of the panels it is harmless.
  const int64_t ahead = NP * pstride <= 8192 ? NP * pstride : 2048;
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NP];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const float* src = Bp + j * pstride + k * kPanel;
      _mm_prefetch(reinterpret_cast<const char*>(src + ahead), _MM_HINT_T0);  // T0 always: kTileStreams
      b[j] = _mm512_loadu_ps(src);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(A[r * sar + k * sac]);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[r][j] = _mm512_fmadd_ps(a, b[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
    const int64_t left = ncols - j * kPanel;
    if (left <= 0) break;
    const __mmask16 m = left >= kPanel ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(C + r * ldc + j * kPanel, m, acc[r][j]);
  }
}

#elif defined(__AVX2__) && defined(__FMA__)

// AVX2: a 16-column panel row is two 8-float registers. 16 registers in all, so tiles are
// at most 6 rows x 1 panel (12 accumulators + 2 of B + the broadcast: enough independent
// sums to cover the FMA's latency at two a cycle) or 2 rows x 2 panels.
template <int MR, int NP, bool kStream = false>
__attribute__((always_inline)) inline void tile(const float* A, int64_t sar, int64_t sac, const float* Bp, int64_t K,
                                                float* C, int64_t ldc, int64_t ncols) {
  __m256 acc[MR][NP][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) acc[r][j][0] = acc[r][j][1] = _mm256_setzero_ps();
  const int64_t pstride = K * kPanel;
  const int64_t ahead = NP * pstride <= 8192 ? NP * pstride : 2048;  // as in the AVX-512 tile
  for (int64_t k = 0; k < K; ++k) {
    __m256 b[NP][2];
#pragma GCC unroll 8
    for (int j = 0; j < NP; ++j) {
      const float* src = Bp + j * pstride + k * kPanel;
      prefetch_weights<kStream>(src + ahead);
      b[j][0] = _mm256_loadu_ps(src);
      b[j][1] = _mm256_loadu_ps(src + 8);
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(A + r * sar + k * sac);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) {
        acc[r][j][0] = _mm256_fmadd_ps(a, b[j][0], acc[r][j][0]);
        acc[r][j][1] = _mm256_fmadd_ps(a, b[j][1], acc[r][j][1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
    const int64_t left = ncols - j * kPanel;
    if (left <= 0) break;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      float* c = C + r * ldc + j * kPanel;
      if (left >= kPanel) {
        _mm256_storeu_ps(c, acc[r][j][0]);
        _mm256_storeu_ps(c + 8, acc[r][j][1]);
      } else {
        alignas(32) float t[kPanel];
        _mm256_store_ps(t, acc[r][j][0]);
        _mm256_store_ps(t + 8, acc[r][j][1]);
        for (int64_t q = 0; q < left; ++q) c[q] = t[q];
      }
    }
  }
}

#else

typedef float v16 __attribute__((vector_size(64)));

template <int MR, int NP, bool kStream = false>
inline void tile(const float* A, int64_t sar, int64_t sac, const float* Bp, int64_t K, float* C, int64_t ldc,
                 int64_t ncols) {
  v16 acc[MR][NP] = {};
  const int64_t pstride = K * kPanel;
  for (int64_t k = 0; k < K; ++k) {
    v16 b[NP];
    for (int j = 0; j < NP; ++j) __builtin_memcpy(&b[j], Bp + j * pstride + k * kPanel, sizeof(v16));
    for (int r = 0; r < MR; ++r) {
      const float a = A[r * sar + k * sac];
      for (int j = 0; j < NP; ++j) acc[r][j] += a * b[j];
    }
  }
  for (int j = 0; j < NP; ++j) {
    const int64_t left = ncols - j * kPanel;
    for (int r = 0; r < MR; ++r)
      for (int64_t c = 0; c < kPanel && c < left; ++c) C[r * ldc + j * kPanel + c] = acc[r][j][c];
  }
}

#endif

// Row blocks of MR rows across panels [p0, p1), NP panels at a time.
template <int MR, bool kStream = false>
inline void rows(const float* A, int64_t sar, int64_t sac, const float* Bp, float* C, int64_t ldc, int64_t N, int64_t K,
                 int64_t p0, int64_t p1) {
  // Two or more panel streams at once: more lines in flight per core (measured faster than
  // one stream at 8 rows: bench/results/README.md); at most 16 accumulators (AVX-512), 8 (AVX2).
#if defined(__AVX512F__) || !(defined(__AVX2__) && defined(__FMA__))
  constexpr int NP = MR >= 5 ? 2 : 4;
#else
  constexpr int NP = MR >= 3 ? 1 : 2;
#endif
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) {
    tile<MR, NP, kStream>(A, sar, sac, Bp + p * K * kPanel, K, C + p * kPanel, ldc, N - p * kPanel);
  }
  for (; p < p1; ++p) tile<MR, 1, kStream>(A, sar, sac, Bp + p * K * kPanel, K, C + p * kPanel, ldc, N - p * kPanel);
}

// Rows of a block (panels() below); whether the tiles stream (kStreamBytes: the AVX2 one).
#if defined(__AVX512F__) || !(defined(__AVX2__) && defined(__FMA__))
inline constexpr int64_t kBlockRows = 8;
inline constexpr bool kTileStreams = false;
#else
inline constexpr int64_t kBlockRows = 6;  // the AVX2 tile's registers
inline constexpr bool kTileStreams = true;
#endif

// C[M, N] over panels [p0, p1): chunks of 4 panels outside, row blocks of 8 inside, so
// every panel comes from memory once and the other row blocks find it in cache.
// kStream: the weights are streamed (kStreamBytes; only where M is one block).
template <bool kStream = false>
inline void panels(const float* A, int64_t sar, int64_t sac, const float* Bp, float* C, int64_t ldc, int64_t M,
                   int64_t N, int64_t K, int64_t p0, int64_t p1) {
  constexpr int64_t kChunk = 4;
  constexpr int64_t kRows = kBlockRows;
  for (int64_t q0 = p0; q0 < p1; q0 += kChunk) {
    const int64_t q1 = q0 + kChunk < p1 ? q0 + kChunk : p1;
    int64_t i = 0;
    for (; i + kRows <= M; i += kRows) rows<kRows, kStream>(A + i * sar, sar, sac, Bp, C + i * ldc, ldc, N, K, q0, q1);
    const float* a = A + i * sar;
    float* c = C + i * ldc;
    switch (M - i) {
#if defined(__AVX512F__) || !(defined(__AVX2__) && defined(__FMA__))
      case 7: rows<7, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      case 6: rows<6, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
#endif
      case 5: rows<5, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      case 4: rows<4, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      case 3: rows<3, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      case 2: rows<2, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      case 1: rows<1, kStream>(a, sar, sac, Bp, c, ldc, N, K, q0, q1); break;
      default: break;
    }
  }
}

}  // namespace packed_detail

// Batched C[b] = A[b] @ B[b] (M x K times K x N), B packed. a_off/b_off/c_off give each
// batch's element offset into A, Bp and C; A is addressed A[i * sar + k * sac]; C rows are
// ldc apart. Work is (batch, panel) pairs, split between the pool's threads when the
// weights to stream are large enough to pay for it. `batches` (at most BATCH): how many of
// the offsets to run (a routed product's selected experts; Kernel::routed in src/lower).
template <int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void gemm_packed(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const float* Bp,
                        const int64_t* b_off, float* C, const int64_t* c_off, int64_t ldc, rt::ThreadPool* pool,
                        int64_t batches = BATCH) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  const int64_t work = batches * P;
  auto range = [&](auto stream, int64_t w0, int64_t w1) {
    while (w0 < w1) {
      const int64_t b = w0 / P;
      const int64_t p0 = w0 % P;
      const int64_t p1 = (w1 - b * P) < P ? (w1 - b * P) : P;
      packed_detail::panels<decltype(stream)::value>(A + a_off[b], sar, sac, Bp + b_off[b], C + c_off[b], ldc, M, N, K, p0, p1);
      w0 = b * P + p1;
    }
  };
  const int64_t bytes = work * K * kPanel * 4;
  const bool threaded = pool && pool->size() > 1 && bytes >= (int64_t{256} << 10) && work > 1;
  run_streamed<BATCH, P * K * kPanel * 4, packed_detail::kTileStreams && M <= packed_detail::kBlockRows>(
      range, work, b_off, batches, threaded ? pool : nullptr);
}

// Each job's matrix offset: its index value times `matrix`; an index outside [0, E) is an
// error (*bad = the index, returns false) before anything is written.
template <int64_t JOBS, int64_t E, class I>
inline bool expert_offsets(const I* idx, const int64_t* i_off, int64_t matrix, int64_t* b_off, int64_t* bad) {
  for (int64_t j = 0; j < JOBS; ++j) {
    const int64_t e = static_cast<int64_t>(idx[i_off[j]]);
    if (e < 0 || e >= E) {
      *bad = e;
      return false;
    }
    b_off[j] = e * matrix;
  }
  return true;
}

// The products of a mixture of experts: job j is C[c_off[j]] = A[a_off[j]] @ the packed
// matrix idx[i_off[j]] of E (each P panels of K x 16). An index outside [0, E) is an error
// (*bad = the index, returns false) before anything is written, as for a Gather.
template <int64_t JOBS, int64_t M, int64_t N, int64_t K, int64_t E, class I>
inline bool gemm_packed_gathered(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const float* Bp,
                                 const I* idx, const int64_t* i_off, float* C, const int64_t* c_off, int64_t ldc,
                                 rt::ThreadPool* pool, int64_t* bad) {
  constexpr int64_t kMatrix = (N + kPanel - 1) / kPanel * K * kPanel;
  int64_t b_off[JOBS];
  if (!expert_offsets<JOBS, E>(idx, i_off, kMatrix, b_off, bad)) return false;
  gemm_packed<JOBS, M, N, K>(A, a_off, sar, sac, Bp, b_off, C, c_off, ldc, pool);
  return true;
}

}  // namespace chroma::et

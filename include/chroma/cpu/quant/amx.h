// gemm_quant's AMX kernels (bfloat16 tiles, Sapphire Rapids and later).
// Part of chroma/cpu/gemm_quant.h (which includes every part).
#pragma once

#include <cstdlib>
#include <cstring>
#if defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include "chroma/cpu/quant/avx512.h"

namespace chroma::et::quant_detail {

#if defined(CHROMA_QUANT_AMX_KERNELS)

// AMX needs the kernel's permission for its tile data, once per process (Linux 5.16+); without
// it the vdpbf16ps kernels run, as they do where CHROMA_NO_AMX is set to anything but "0"
// when a program first multiplies (to compare the two, or to test the other path).
inline bool amx_ready() {
  static const bool ok = [] {
    const char* off = std::getenv("CHROMA_NO_AMX");
    if (off && *off && std::strcmp(off, "0") != 0) return false;
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


// ---- Many rows: weights decoded once per call (decode_panel_bf16), whole-K tile products ----
//
// From kBlockRows rows (gemm_quant.h), the per-group kernel above is bound by what it does
// besides the tile products (every panel reads all rows' activations again, and every group's
// result is scaled and added into C row by row). The blocked kernel multiplies a chunk of
// decoded panels on tiles of 32 rows x 32 columns, summed over all of K in the tile registers,
// as a blocked bfloat16 GEMM does.

// Every tile 16 rows of 64 bytes: tmm0..3 the results (rows 0-15 / 16-31 x panel 0 / 1),
// tmm4, tmm5 the two row blocks' activations, tmm6, tmm7 the two panels' weights.
inline void amx_configure_blocked() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  _tile_loadconfig(&c);
}

// Tile t's 16 x 16 results into C (nr rows, nc columns of them): directly where all are
// wanted, else through `cb`.
template <int T>
__attribute__((always_inline)) inline void tile_stored(void* p, int64_t stride) {
  // (GCC's _tile_stored names its tile register by the literal it is given.)
  if constexpr (T == 0) _tile_stored(0, p, stride);
  else if constexpr (T == 1) _tile_stored(1, p, stride);
  else if constexpr (T == 2) _tile_stored(2, p, stride);
  else _tile_stored(3, p, stride);
}
template <int T>
__attribute__((always_inline)) inline void amx_store(float* C, int64_t ldc, int64_t nr, int64_t nc, float* cb) {
  if (nr >= 16 && nc >= 16) {
    tile_stored<T>(C, ldc * 4);
    return;
  }
  tile_stored<T>(cb, 64);
  const __mmask16 m = nc >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nc) - 1u);
  for (int64_t i = 0; i < nr && i < 16; ++i) _mm512_mask_storeu_ps(C + i * ldc, m, _mm512_loadu_ps(cb + i * 16));
}

// C[32 rows, 32 columns] (TWO: the second 16 rows hold rows of the product; PAIR: a second
// panel) = activations x decoded weights, over all kPairs pair-rows of K.
template <bool TWO, bool PAIR, int64_t K>
__attribute__((always_inline)) inline void amx_block(const uint32_t* x0, const uint16_t* w0, float* C, int64_t ldc,
                                                     int64_t nr, int64_t nc0, float* cb) {
  constexpr int64_t kPairs = Activations<K>::kPairs;
  constexpr int64_t kStride = kPairs * 4;
  const uint32_t* x1 = x0 + 16 * kPairs;
  const uint16_t* w1 = w0 + kPairs * 32;
  _tile_zero(0);
  if constexpr (PAIR) _tile_zero(1);
  if constexpr (TWO) _tile_zero(2);
  if constexpr (TWO && PAIR) _tile_zero(3);
  for (int64_t kk = 0; kk < kPairs; kk += 16) {
    _tile_loadd(4, x0 + kk, kStride);
    _tile_loadd(6, w0 + kk * 32, 64);
    if constexpr (TWO) _tile_loadd(5, x1 + kk, kStride);
    if constexpr (PAIR) _tile_loadd(7, w1 + kk * 32, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (PAIR) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TWO) _tile_dpbf16ps(2, 5, 6);
    if constexpr (TWO && PAIR) _tile_dpbf16ps(3, 5, 7);
  }
  amx_store<0>(C, ldc, nr, nc0, cb);
  if constexpr (PAIR) amx_store<1>(C + kPanel, ldc, nr, nc0 - kPanel, cb);
  if constexpr (TWO) amx_store<2>(C + 16 * ldc, ldc, nr - 16, nc0, cb);
  if constexpr (TWO && PAIR) amx_store<3>(C + 16 * ldc + kPanel, ldc, nr - 16, nc0 - kPanel, cb);
}

// Rows [r0, r1) (r0 a multiple of 32; the activations padded with zero rows to whole blocks of
// 32) of panels [p0, p1) of one matrix, whose decoded weights are `wd` ([panel - p0][kPairs][32]).
// The row block outermost: its activations stay in L2 while every panel pair of the chunk reads them.
template <int64_t M, int64_t N, int64_t K>
inline void amx_blocked_tiles(const uint32_t* xa, const uint16_t* wd, int64_t p0, int64_t p1, int64_t r0, int64_t r1,
                              float* C, int64_t ldc, float* cb) {
  constexpr int64_t kPairs = Activations<K>::kPairs;
  for (int64_t r = r0; r < r1; r += 32) {
    const int64_t nr = M - r < 32 ? M - r : 32;
    const uint32_t* x0 = xa + r * kPairs;
    for (int64_t p = p0; p < p1; p += 2) {
      const uint16_t* w0 = wd + (p - p0) * kPairs * 32;
      float* c = C + r * ldc + p * kPanel;
      const int64_t nc = N - p * kPanel;
      const bool two = nr > 16, pair = p + 1 < p1;
      if (two && pair) amx_block<true, true, K>(x0, w0, c, ldc, nr, nc, cb);
      else if (two) amx_block<true, false, K>(x0, w0, c, ldc, nr, nc, cb);
      else if (pair) amx_block<false, true, K>(x0, w0, c, ldc, nr, nc, cb);
      else amx_block<false, false, K>(x0, w0, c, ldc, nr, nc, cb);
    }
  }
}

#endif

}  // namespace chroma::et::quant_detail

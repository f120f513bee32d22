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
//   Both run rows in blocks of 8 (the register tile) up to 31 rows.
// - 32 rows or more with AVX512-BF16 (blocked_product): each chunk of panels decoded once per
//   call to bfloat16 weights (s * q + b rounded to nearest even), multiplied on AMX tiles of
//   32 x 32 or with vdpbf16ps on 12 x 32 registers, summed over all of K; q4 and q6 keep the
//   int8 kernel by default where there is VNNI and no AMX.
// - with AVX2 and no AVX512-VNNI (AMD Zen 2/3, Intel client cores, AVX-512 without VNNI):
//   q4 and q6 take the same int8 activations, multiplied with vpmaddubsw in 256-bit registers
//   (int8_panel_avx2: the packed layout's 16-bit words already pair two rows of a column, so
//   no reordering), rows in blocks of 4.
// - activations "fp32", or none of the above (q8 and bf16 weights without AVX512-BF16): each
//   panel is dequantized (s * q + b, float32) into a small per-thread buffer, a few panels at
//   a time, and multiplied by the float32 register tiles of gemm_packed.h: exact float32
//   arithmetic on the stored weights. Without AVX512-BF16, products of few rows (up to 16
//   for bf16 and q8, 8 for q4, 4 for q6) instead decode each step in registers and multiply
//   it at once (fp32_panel_avx2: the same values, no buffer written and read back).
//
// Panels (times batches) are split between the program's threads, as for gemm_packed.
//
// The kernels live in quant/ by instruction set (quant/isa.h says which a compilation has);
// this file holds the layout-independent driver: the dispatch, the exact path, the gathered
// products and the row-layout gather.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "chroma/cpu/gemm_packed.h"
#include "chroma/cpu/quant/isa.h"
#include "chroma/cpu/quant/layout.h"
#include "chroma/cpu/quant/activations.h"
#include "chroma/cpu/quant/avx2.h"
#include "chroma/cpu/quant/avx512.h"
#include "chroma/cpu/quant/amx.h"
#include "chroma/half.h"

namespace chroma::et {

namespace quant_detail {

// One panel's weights as float32 [K][16]: the widest decoding this compilation has (each the
// same values as dequant_panel_portable).
template <int F, int64_t K>
__attribute__((always_inline)) inline void dequant_panel(const uint8_t* in, float* dst) {
#if defined(CHROMA_QUANT_AVX512)
  dequant_panel_avx512<F, K>(in, dst);
#elif defined(CHROMA_QUANT_FP32_AVX2)
  dequant_panel_avx2<F, K>(in, dst);
#else
  dequant_panel_portable<F, K>(in, dst);
#endif
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

// Work items [w0, w1) of a product's panels (item w: panel w % P of batch w / P), each over rows
// [0, M) in blocks of 8 and one holding what is left: kernel(std::integral_constant<int, MR>,
// batch, panel, first row). So the register kernels (bf16_panel, int8_panel) take any number of
// rows, each panel's weights decoded again per block from the cache. They stay ahead of the exact
// path's float32 tiles at many rows too, compute-bound as those are, because vpdpbusd and vdpbf16ps
// do 4 and 2 multiply-adds a lane to an FMA's 1 (measured up to 1024 rows:
// bench/results/README.md).
template <int64_t M, int64_t P, int RB = 8, class Kernel>
__attribute__((always_inline)) inline void panel_blocks(int64_t w0, int64_t w1, Kernel&& kernel) {
  constexpr int64_t kFull = M / RB, kRest = M % RB;
  for (int64_t w = w0; w < w1; ++w) {
    const int64_t b = w / P, p = w % P;
    for (int64_t r0 = 0; r0 < kFull * RB; r0 += RB) kernel(std::integral_constant<int, RB>{}, b, p, r0);
    if constexpr (kRest > 0) kernel(std::integral_constant<int, static_cast<int>(kRest)>{}, b, p, kFull * RB);
  }
}

// A product's operands, as gemm_quant takes them, and its work items (`work`: batches x
// panels); `pool` is null when the product runs on the calling thread.
struct QuantProduct {
  const float* A;
  const int64_t* a_off;
  int64_t sar, sac;
  const uint8_t* Bq;
  const int64_t* b_off;
  float* C;
  const int64_t* c_off;
  int64_t ldc, batches, work;
  rt::ThreadPool* pool;
};

// Runs range(w0, w1) over the work items [0, q.work): split over q.pool's threads, or here.
template <class Range>
inline void run_items(const QuantProduct& q, Range&& range) {
  if (q.pool) {
    q.pool->parallel_for(q.work, range);
  } else {
    range(0, q.work);
  }
}


#if defined(CHROMA_QUANT_AMX_KERNELS)
// AMX tiles, rows in blocks of up to 16 (gemm_quant: from 2 rows), two panels at once where
// they can; the activations rounded to bfloat16 once per call.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void amx_product(const QuantProduct& q) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  const float* A = q.A;
  const int64_t *a_off = q.a_off, *b_off = q.b_off, *c_off = q.c_off;
  const int64_t sar = q.sar, sac = q.sac, ldc = q.ldc, batches = q.batches;
  const uint8_t* Bq = q.Bq;
  float* C = q.C;
  constexpr int R = M < 16 ? static_cast<int>(M) : 16;
  // A result of 4 MB or more (the logits) is streamed to memory (amx_panel).
  constexpr bool kStream = BATCH * M * N * 4 >= (int64_t{4} << 20);
  constexpr int64_t MP = (M + R - 1) / R * R;
  thread_local Activations<K> x;
  x.resize(BATCH * MP, F == kQ8);
  for (int64_t b = 0; b < batches; ++b) x.fill(A + a_off[b], sar, sac, M, b * MP, F == kQ8);
  // Pointers, not the thread_local itself: a worker naming `x` would see its own.
  const uint32_t* pairs = x.pairs.data();
  const uint32_t* pairs16 = F == kQ8 ? x.pairs16.data() : nullptr;
  const float* sums = x.sums.data();
  run_items(q, [&](int64_t w0, int64_t w1) {
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
}
#endif

#if defined(CHROMA_QUANT_BF16_KERNELS)
// Rows from which the blocked kernels run (avx512.h, "Many rows"): each panel decoded once per
// call to bfloat16, then multiplied for every row on AMX tiles (32 x 32) or with vdpbf16ps
// (12 rows x 32 columns of registers). Where the products of fewer rows cross over to them
// was measured (bench/quant_rows.py; docs/quantization.md, "Many rows").
inline constexpr int64_t kBlockRows = 32;

// Work items are a batch's chunks of panels (as many as keep the decoded chunk in L2 beside a
// block of activations: 1 MB with AMX, 512 KB without), each decoded once into a per-thread
// buffer and multiplied for its rows; where there are fewer chunks than twice the threads,
// each chunk's rows are split too (its decoding then done once per part).
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void blocked_product(const QuantProduct& q, rt::ThreadPool* pool, bool amx) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  constexpr int64_t kPairs = Activations<K>::kPairs;
  constexpr int64_t kDecoded = kPairs * 64;  // bytes of one decoded panel
  const int64_t budget = amx ? int64_t{1} << 20 : int64_t{512} << 10;
  const int64_t chunk = budget / kDecoded < 2 ? 2 : (budget / kDecoded > 8 ? 8 : budget / kDecoded);
  const int64_t chunks = (P + chunk - 1) / chunk;
  const int64_t rb = amx ? 32 : 12;  // rows a block
  const int64_t blocks = (M + rb - 1) / rb, MP = blocks * rb;
  const int64_t batches = q.batches;
  const int threads = pool ? pool->size() : 1;
  int64_t split = 1;
  if (batches * chunks < 2 * threads) {
    split = (2 * threads + batches * chunks - 1) / (batches * chunks);
    if (split > blocks) split = blocks;
  }
  // The activations rounded once per call, their rows split between the threads (every word
  // of a row written; the padding rows past M zeroed), kept per thread between calls.
  thread_local std::vector<uint32_t> xbuf;
  if (xbuf.size() < static_cast<size_t>(BATCH * MP * kPairs)) xbuf.resize(static_cast<size_t>(BATCH * MP * kPairs));
  uint32_t* pairs = xbuf.data();
  auto fill = [&](int64_t i0, int64_t i1) {  // rows [i0, i1) of all batches' padded rows
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / MP, r = i % MP;
      if (r < M) {
        fill_bf16_rows<K>(pairs + b * MP * kPairs, q.A + q.a_off[b], q.sar, q.sac, r, r + 1);
      } else {
        std::memset(pairs + i * kPairs, 0, static_cast<size_t>(kPairs) * 4);
      }
    }
  };
  if (pool && threads > 1) {
    pool->parallel_for(batches * MP, fill);
  } else {
    fill(0, batches * MP);
  }
  auto range = [&](int64_t w0, int64_t w1) {
    thread_local std::vector<uint16_t> wd;
    if (wd.size() < static_cast<size_t>(chunk * kDecoded / 2)) wd.resize(static_cast<size_t>(chunk * kDecoded / 2));
#if defined(CHROMA_QUANT_AMX_KERNELS)
    alignas(64) float cb[16 * kPanel];
    if (amx) amx_configure_blocked();
#endif
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (chunks * split), c = w / split % chunks, part = w % split;
      const int64_t p0 = c * chunk, p1 = p0 + chunk < P ? p0 + chunk : P;
      const uint8_t* src = q.Bq + q.b_off[b];
      for (int64_t p = p0; p < p1; ++p) decode_panel_bf16<F, K>(src + p * kPanelBytes, wd.data() + (p - p0) * kDecoded / 2);
      const int64_t r0 = blocks * part / split * rb, r1 = blocks * (part + 1) / split * rb;
      const uint32_t* xb = pairs + b * MP * kPairs;
      float* C = q.C + q.c_off[b];
#if defined(CHROMA_QUANT_AMX_KERNELS)
      if (amx) {
        amx_blocked_tiles<M, N, K>(xb, wd.data(), p0, p1, r0, r1, C, q.ldc, cb);
        continue;
      }
#endif
      bf16_blocked_tiles(xb, kPairs, wd.data(), M, N, p0, p1, r0, r1, C, q.ldc);
    }
#if defined(CHROMA_QUANT_AMX_KERNELS)
    if (amx) _tile_release();
#endif
  };
  const int64_t items = batches * chunks * split;
  if (pool && threads > 1 && items > 1) {
    pool->parallel_for(items, range);
  } else {
    range(0, items);
  }
}
#endif

#if defined(CHROMA_QUANT_INT8_KERNELS) || defined(CHROMA_QUANT_INT8_AVX2)
// q4 and q6 with int8 activations, quantized once per call: vpdpbusd (AVX512-VNNI), rows in
// blocks of 8, or vpmaddubsw (AVX2), rows in blocks of 4.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void int8_product(const QuantProduct& q) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  constexpr int64_t kGroups = Activations<K>::kGroups;
  const float* A = q.A;
  const int64_t *a_off = q.a_off, *b_off = q.b_off, *c_off = q.c_off;
  const int64_t sar = q.sar, sac = q.sac, ldc = q.ldc, batches = q.batches;
  const int64_t work = q.work;
  const uint8_t* Bq = q.Bq;
  float* C = q.C;
  thread_local Activations8<K> x;
  x.resize(BATCH * M);
  for (int64_t b = 0; b < batches; ++b) x.fill(A + a_off[b], sar, sac, M, b * M);
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
#if defined(CHROMA_QUANT_INT8_AVX2)
  // q6 with more than two blocks of rows: each panel decoded once, every block reading
  // that (faster from 16 rows on; at 8 rows, and for q4 whose steps take 3 instructions
  // to decode, no gain: the decoding the kernel does runs beside its multiplies, the
  // panel's own pass does not; figures: bench/results/README.md).
  if constexpr (F == kQ6 && M > 2 * kBlock) {
    run_items(q, [&](int64_t w0, int64_t w1) {
      thread_local std::vector<uint8_t> dec;
      if (dec.size() < static_cast<size_t>(decoded_panel_bytes<K>())) dec.resize(static_cast<size_t>(decoded_panel_bytes<K>()));
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t b = w / P, p = w % P;
        decode_panel_int8_avx2<F, K>(Bq + b_off[b] + p * kPanelBytes, dec.data());
        panel_blocks<M, P, kBlock>(w, w + 1, [&](auto mr, int64_t, int64_t, int64_t r0) {
          const int64_t row = b * M + r0;
          int8_panel_avx2<F, decltype(mr)::value, K, true>(words + row * kWords, scales + row * kGroups,
                                                           sums + row * kGroups, dec.data(),
                                                           C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
        });
      }
    });
    return;
  }
#endif
  auto range = [&](auto stream, int64_t w0, int64_t w1) {
    (void)stream;
    panel_blocks<M, P, kBlock>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
      const int64_t row = b * M + r0;
#if defined(CHROMA_QUANT_INT8_KERNELS)
      int8_panel<F, decltype(mr)::value, K>(
#else
      int8_panel_avx2<F, decltype(mr)::value, K, false, decltype(stream)::value>(
#endif
          words + row * kWords, scales + row * kGroups, sums + row * kGroups, Bq + b_off[b] + p * kPanelBytes,
          C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
    });
  };
#if defined(CHROMA_QUANT_INT8_KERNELS)
  constexpr bool kStreams = false;  // the AVX-512 kernels keep T0 (docs/cpu_kernels.md, "Streamed weights")
#else
  constexpr bool kStreams = M <= kBlock;
#endif
  run_streamed<BATCH, P * kPanelBytes, kStreams>(range, work, b_off, batches, q.pool);
}
#endif

#if defined(CHROMA_QUANT_BF16_KERNELS)
// vdpbf16ps against the activations rounded once per call to bfloat16, rows in blocks of 8.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void bf16_product(const QuantProduct& q) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  constexpr int64_t kPairs = Activations<K>::kPairs, kGroups = Activations<K>::kGroups;
  const float* A = q.A;
  const int64_t *a_off = q.a_off, *b_off = q.b_off, *c_off = q.c_off;
  const int64_t sar = q.sar, sac = q.sac, ldc = q.ldc, batches = q.batches;
  const uint8_t* Bq = q.Bq;
  float* C = q.C;
  thread_local Activations<K> x;
  x.resize(BATCH * M, false);
  for (int64_t b = 0; b < batches; ++b) x.fill(A + a_off[b], sar, sac, M, b * M, false);
  const uint32_t* pairs = x.pairs.data();
  const float* sums = x.sums.data();
  run_items(q, [&](int64_t w0, int64_t w1) {
    panel_blocks<M, P>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
      const int64_t row = b * M + r0;
      bf16_panel<F, decltype(mr)::value, K>(pairs + row * kPairs, sums + row * kGroups, Bq + b_off[b] + p * kPanelBytes,
                                            C + c_off[b] + r0 * ldc + p * kPanel, ldc, N - p * kPanel);
    });
  });
}
#endif

#if defined(CHROMA_QUANT_FP32_AVX2) && !defined(CHROMA_QUANT_BF16_KERNELS)
// Without AVX512-BF16 (AVX2, or AVX-512 without it), few rows: float32 decoded in registers
// (q8 and bf16 weights at any setting, q4 and q6 where it is "fp32" or no int8 kernel
// runs), each block of 4 rows decoding the panel again from the cache; more rows: each
// panel decoded once into the buffer serves every row. Where the two cross depends on
// what a step costs to decode (bfloat16: a shift; q6: two loads and six shifts); kRegRows
// is where they crossed when measured (bench/results/README.md).
template <int F>
inline constexpr int64_t kRegRows = (F == kBF16 || F == kQ8) ? 16 : (F == kQ4 ? 8 : 4);

// Up to kRegRows<F> rows: each step of a panel decoded to float32 in registers, rows in blocks
// of 4 (fp32_panel_avx2).
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void fp32_register_product(const QuantProduct& q) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  const float* A = q.A;
  const int64_t *a_off = q.a_off, *b_off = q.b_off, *c_off = q.c_off;
  const int64_t sar = q.sar, sac = q.sac, ldc = q.ldc, batches = q.batches;
  const int64_t work = q.work;
  const uint8_t* Bq = q.Bq;
  float* C = q.C;
  auto range = [&](auto stream, int64_t w0, int64_t w1) {
    panel_blocks<M, P, 4>(w0, w1, [&](auto mr, int64_t b, int64_t p, int64_t r0) {
      fp32_panel_avx2<F, decltype(mr)::value, K, decltype(stream)::value>(
          A + a_off[b] + r0 * sar, sar, sac, Bq + b_off[b] + p * kPanelBytes, C + c_off[b] + r0 * ldc + p * kPanel, ldc,
          N - p * kPanel);
    });
  };
  run_streamed<BATCH, P * kPanelBytes, M <= 4>(range, work, b_off, batches, q.pool);
}
#endif

// The exact path: each panel dequantized to float32 (exact_panels), whole batches or ranges of
// a batch's panels per work item.
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void exact_product(const QuantProduct& q) {
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  const float* A = q.A;
  const int64_t *a_off = q.a_off, *b_off = q.b_off, *c_off = q.c_off;
  const int64_t sar = q.sar, sac = q.sac, ldc = q.ldc;
  const uint8_t* Bq = q.Bq;
  float* C = q.C;
  run_items(q, [&](int64_t w0, int64_t w1) {
    while (w0 < w1) {
      const int64_t b = w0 / P;
      const int64_t p0 = w0 % P;
      const int64_t p1 = (w1 - b * P) < P ? (w1 - b * P) : P;
      exact_panels<F, M, N, K>(A + a_off[b], sar, sac, Bq + b_off[b], C + c_off[b], ldc, p0, p1);
      w0 = b * P + p1;
    }
  });
}

}  // namespace quant_detail

// What the products do with the activations (the `activations` option, quant::Activations):
// kAuto: int8 for q4 and q6 weights where the CPU has AVX512-VNNI and no AMX path runs, else
// bfloat16; kBF16: bfloat16 (where the CPU has AVX512-BF16); kFP32: float32 throughout.
enum class QuantActs : int { kAuto = 0, kBF16 = 1, kFP32 = 2 };

// Batched C[b] = A[b] @ B[b] (M x K times K x N), B packed in format F (quant::Format's
// value); b_off in bytes. As gemm_packed otherwise (`batches` included).
template <int F, int64_t BATCH, int64_t M, int64_t N, int64_t K>
inline void gemm_quant(const float* A, const int64_t* a_off, int64_t sar, int64_t sac, const uint8_t* Bq,
                       const int64_t* b_off, float* C, const int64_t* c_off, int64_t ldc, rt::ThreadPool* pool,
                       QuantActs acts, int64_t batches = BATCH) {
  using namespace quant_detail;
  constexpr int64_t P = (N + kPanel - 1) / kPanel;
  const int64_t work = batches * P;
  constexpr int64_t kPanelBytes = panel_bytes<F, K>();
  const bool threaded = pool && pool->size() > 1 && work * kPanelBytes >= (int64_t{128} << 10) && work > 1;
  const QuantProduct q{A, a_off, sar, sac, Bq, b_off, C, c_off, ldc, batches, work, threaded ? pool : nullptr};
  if (acts != QuantActs::kFP32) {
    // Activations rounded (bfloat16) or quantized (int8) once per call, by the calling thread.
#if defined(CHROMA_QUANT_AMX_KERNELS)
#if defined(CHROMA_QUANT_BF16_KERNELS)
    // From kBlockRows rows the blocked kernels, whose work is worth the threads whenever they
    // run: on AMX tiles; without AMX with vdpbf16ps, except where the int8 kernel takes the
    // product (q4 and q6 by default with VNNI: 4 multiply-adds a lane to vdpbf16ps's 2, ahead
    // at every row count measured).
    if constexpr (M >= kBlockRows) {
#if defined(CHROMA_QUANT_AMX_KERNELS)
      const bool amx = amx_ready();
#else
      const bool amx = false;
#endif
#if defined(CHROMA_QUANT_INT8_KERNELS)
      const bool int8 = (F == kQ4 || F == kQ6) && acts == QuantActs::kAuto;
#else
      const bool int8 = false;
#endif
      if (amx || !int8) {
        blocked_product<F, BATCH, M, N, K>(q, pool, amx);
        return;
      }
    }
#endif
    // AMX from 2 rows (one row is bound by memory either way).
    if (M >= 2 && amx_ready()) {
      amx_product<F, BATCH, M, N, K>(q);
      return;
    }
#endif
#if defined(CHROMA_QUANT_INT8_KERNELS) || defined(CHROMA_QUANT_INT8_AVX2)
    if constexpr (F == kQ4 || F == kQ6) {
      if (acts == QuantActs::kAuto) {
        int8_product<F, BATCH, M, N, K>(q);
        return;
      }
    }
#endif
#if defined(CHROMA_QUANT_BF16_KERNELS)
    bf16_product<F, BATCH, M, N, K>(q);
    return;
#endif
  }
#if defined(CHROMA_QUANT_FP32_AVX2) && !defined(CHROMA_QUANT_BF16_KERNELS)
  if constexpr (M <= kRegRows<F>) {
    fp32_register_product<F, BATCH, M, N, K>(q);
    return;
  }
#endif
  exact_product<F, BATCH, M, N, K>(q);
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

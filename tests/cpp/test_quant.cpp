// The weights policy and the packed layout of quantized weights (src/quant/quant.h). The
// quantizer's values are checked against an independent NumPy implementation of MLX's
// formula in tests/python/test_quant.py; here: the layout's round trip, the policy's rules.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "chroma/cpu/gemm_quant.h"
#include "chroma/half.h"
#include "ir/graph.h"
#include "quant/quant.h"

namespace {

using chroma::quant::Format;

TEST(Quant, PackedLayoutHoldsTheQuantizedValues) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (int64_t K : {64, 100, 130}) {
    for (int64_t N : {16, 21}) {
      std::vector<float> b(static_cast<size_t>(K * N));
      for (float& v : b) v = nd(rng);
      for (Format f : {Format::kQ8, Format::kQ6, Format::kQ4}) {
        const int bits = chroma::quant::format_bits(f);
        std::vector<uint8_t> packed(static_cast<size_t>(chroma::quant::matrix_bytes(f, K, N)));
        ASSERT_TRUE(chroma::quant::pack(f, b.data(), K, N, N, 1, packed.data()));
        const std::vector<float> w = chroma::quant::unpack(f, packed.data(), K, N);
        // Column n of B is row n of the [N, K] matrix MLX quantizes.
        const chroma::quant::Quantized q = chroma::quant::quantize_matrix(b.data(), N, K, 1, N, bits);
        ASSERT_TRUE(q.ok);
        const int64_t groups = (K + 63) / 64;
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t k = 0; k < K; ++k) {
            const size_t gi = static_cast<size_t>(n * groups + k / 64);
            const float s = chroma::half_detail::f16_to_f32(q.scales[gi]);
            const float bb = chroma::half_detail::f16_to_f32(q.biases[gi]);
            const float want = s * static_cast<float>(q.q[static_cast<size_t>(n * K + k)]) + bb;
            ASSERT_EQ(w[static_cast<size_t>(k * N + n)], want) << chroma::quant::format_name(f) << " k " << k << " n " << n;
            // Within one step (the end opposite the exact edge may be clipped by up to half a
            // step), plus the float16 rounding of the step times the steps it spans.
            const float bound = std::fabs(s) * (1.0f + static_cast<float>((1 << bits) - 1) / 1024.0f) + 1e-6f;
            ASSERT_LE(std::fabs(want - b[static_cast<size_t>(k * N + n)]), bound);
          }
        }
      }
      std::vector<uint8_t> packed(static_cast<size_t>(chroma::quant::matrix_bytes(Format::kBF16, K, N)));
      ASSERT_TRUE(chroma::quant::pack(Format::kBF16, b.data(), K, N, N, 1, packed.data()));
      const std::vector<float> w = chroma::quant::unpack(Format::kBF16, packed.data(), K, N);
      for (size_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(w[i], chroma::half_detail::bf16_to_f32(chroma::half_detail::f32_to_bf16(b[i])));
      }
    }
  }
}

TEST(Quant, BytesPerWeight) {
  // 4.5, 6.5, 8.5 bits with float16 scales and biases when K is whole groups.
  EXPECT_EQ(chroma::quant::matrix_bytes(Format::kQ4, 128, 32) * 8, 128 * 32 * 9 / 2);
  EXPECT_EQ(chroma::quant::matrix_bytes(Format::kQ6, 128, 32) * 8, 128 * 32 * 13 / 2);
  EXPECT_EQ(chroma::quant::matrix_bytes(Format::kQ8, 128, 32) * 8, 128 * 32 * 17 / 2);
  EXPECT_EQ(chroma::quant::matrix_bytes(Format::kBF16, 128, 32), 128 * 32 * 2);
}

TEST(Quant, GroupsBeyondFloat16AreRefused) {
  std::vector<float> w(64, 0.0f);
  w[3] = 1e6f;
  uint8_t q[64];
  uint16_t s, b;
  EXPECT_FALSE(chroma::quant::quantize_group(w.data(), 64, 1, 4, q, &s, &b));
  w[3] = std::nanf("");
  EXPECT_FALSE(chroma::quant::quantize_group(w.data(), 64, 1, 4, q, &s, &b));
}

TEST(Quant, PolicyRulesRolesAndKeepList) {
  using chroma::quant::decide;
  const auto p = chroma::quant::parse_policy("default=q4;unembedding=q8;*.out.weight=bf16;activations=fp32");
  EXPECT_EQ(p.activations, chroma::quant::Activations::kFP32);
  EXPECT_EQ(chroma::quant::parse_policy("default=q4").activations, chroma::quant::Activations::kAuto);
  EXPECT_EQ(chroma::quant::parse_policy("default=q4;activations=bf16").activations, chroma::quant::Activations::kBF16);
  EXPECT_EQ(p.fallback, Format::kQ4);
  EXPECT_EQ(decide(p, "layers.0.mlp.up.weight", "", 256, 256, 1).format, Format::kQ4);
  EXPECT_EQ(decide(p, "lm_head.weight", "unembedding", 256, 5000, 1).format, Format::kQ8);
  const auto out = decide(p, "blocks.3.attn.out.weight", "", 256, 256, 1);
  EXPECT_EQ(out.format, Format::kBF16);
  EXPECT_EQ(out.reason, "rule *.out.weight");
  for (const char* kept : {"blocks.0.mlp.gate.weight", "model.layers.1.mlp.router.weight", "norm.weight", "attn.sinks"}) {
    const auto d = decide(p, kept, "", 256, 256, 1);
    EXPECT_EQ(d.format, Format::kF32) << kept;
    EXPECT_TRUE(d.reason.starts_with("kept")) << kept << ": " << d.reason;
  }
  EXPECT_EQ(decide(p, "mlp.gate_proj.weight", "", 256, 256, 1).format, Format::kQ4);  // Llama's gate_proj is a product
  EXPECT_EQ(decide(p, "tiny.weight", "", 16, 16, 1).format, Format::kF32);
  // A rule naming a kept weight wins over the keep-list.
  EXPECT_EQ(decide(chroma::quant::parse_policy("q4;*.gate.weight=q8"), "a.gate.weight", "", 256, 64, 1).format, Format::kQ8);
  EXPECT_FALSE(chroma::quant::parse_policy("").quantizes());
  EXPECT_FALSE(chroma::quant::parse_policy("fp32").quantizes());
  EXPECT_THROW(chroma::quant::parse_policy("default=q5"), chroma::CompileError);
  EXPECT_THROW(chroma::quant::parse_policy("activations=fp16"), chroma::CompileError);
  EXPECT_THROW(chroma::quant::parse_policy("=q4"), chroma::CompileError);
}

// The product kernels against a float64 product with the packed weights (compiled for this
// test build's instruction set: the portable code, or the vector paths where it has them).
template <Format F, int64_t M, int64_t N, int64_t K>
void check_kernel() {
  std::mt19937 rng(static_cast<unsigned>(M * 1000 + N + K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
  for (float& v : a) v = nd(rng);
  for (float& v : b) v = 0.05f * nd(rng);
  std::vector<uint8_t> packed(static_cast<size_t>(chroma::quant::matrix_bytes(F, K, N)));
  ASSERT_TRUE(chroma::quant::pack(F, b.data(), K, N, N, 1, packed.data()));
  const std::vector<float> w = chroma::quant::unpack(F, packed.data(), K, N);
  using chroma::et::QuantActs;
  for (QuantActs acts : {QuantActs::kFP32, QuantActs::kBF16, QuantActs::kAuto}) {
    std::vector<float> c(static_cast<size_t>(M * N), -1.0f);
    const int64_t ao[1] = {0}, bo[1] = {0}, co[1] = {0};
    chroma::et::gemm_quant<static_cast<int>(F), 1, M, N, K>(a.data(), ao, K, 1, packed.data(), bo, c.data(), co, N, nullptr, acts);
    double err = 0, ref = 0;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += static_cast<double>(a[static_cast<size_t>(i * K + k)]) * w[static_cast<size_t>(k * N + n)];
        const double d = c[static_cast<size_t>(i * N + n)] - s;
        err += d * d;
        ref += s * s;
      }
    }
    // float32 arithmetic, activations rounded to bfloat16 (relative error up to 2^-9 each), or
    // (auto, q4 and q6) quantized to int8 per group of 64 (error up to max|x| / 254 each).
    const double bound = acts == QuantActs::kFP32 ? 1e-5 : (acts == QuantActs::kBF16 ? 4e-3 : 1.5e-2);
    EXPECT_LT(std::sqrt(err / ref), bound) << chroma::quant::format_name(F) << " M " << M << " acts " << static_cast<int>(acts);
  }
}

TEST(Quant, KernelsMatchTheStoredWeights) {
  check_kernel<Format::kBF16, 1, 37, 200>();
  check_kernel<Format::kQ8, 3, 37, 200>();
  check_kernel<Format::kQ6, 8, 50, 130>();
  check_kernel<Format::kQ4, 20, 33, 64>();
  check_kernel<Format::kQ4, 1, 40, 100>();
  check_kernel<Format::kQ8, 40, 40, 100>();
  check_kernel<Format::kQ6, 1, 37, 200>();
  check_kernel<Format::kQ4, 5, 33, 130>();
  // Row counts on either side of where the float32 paths switch from decoding in registers
  // (blocks of 4 rows) to the buffer: 16 rows for bf16 and q8, 8 for q4, 4 for q6.
  check_kernel<Format::kBF16, 13, 37, 200>();
  check_kernel<Format::kBF16, 17, 37, 70>();
  check_kernel<Format::kQ8, 16, 40, 130>();
  check_kernel<Format::kQ4, 8, 33, 200>();
  check_kernel<Format::kQ4, 9, 33, 64>();
  check_kernel<Format::kQ6, 5, 37, 64>();
}

}  // namespace

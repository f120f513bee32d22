// The reference for Attention (passes/fuse_attention.h), used by constant folding: what the
// unfused graph computes, one row at a time: the scores q . kt in double rounded to float32
// (as eval_MatMul), scaled and biased in float32, a softmax over the row, the product with v.
#include "interp/kernels.h"

namespace chroma::interp {

Tensors eval_Attention(const Node& n, const Tensors& in) {
  const Shape& qs = in[0].type.shape;
  const size_t r = qs.size();
  const int64_t batch = extent(qs, 0, r - 2), L = qs[r - 2], D = qs[r - 1];
  const int64_t S = in[1].type.shape[r - 1], E = in[2].type.shape[r - 1];
  const float* q = in[0].data<float>();
  const float* kt = in[1].data<float>();
  const float* v = in[2].data<float>();
  const float* bias = in.size() > 3 ? in[3].data<float>() : nullptr;
  const float scale = static_cast<float>(n.attrs.scalar.as_double());
  OutBuffer out(n.type());
  float* o = out.data<float>();
  std::vector<float> s(static_cast<size_t>(S));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < L; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(q[(b * L + i) * D + d]) * kt[(b * D + d) * S + j];
        float x = static_cast<float>(acc);
        x = n.attrs.k ? x / scale : x * scale;
        if (bias) x += bias[(b * L + i) * S + j];
        s[static_cast<size_t>(j)] = x;
        m = std::max(m, x);
      }
      double total = 0;
      for (float& x : s) {
        x = std::exp(x - m);
        total += x;
      }
      for (int64_t e = 0; e < E; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += static_cast<double>(s[static_cast<size_t>(j)]) * v[(b * S + j) * E + e];
        o[(b * L + i) * E + e] = static_cast<float>(acc / total);
      }
    }
  }
  return {out.finish()};
}

}  // namespace chroma::interp

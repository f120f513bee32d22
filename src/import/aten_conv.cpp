// ATen convolution: aten.convolution.default in all its forms, decomposed into IR primitives.
//
//  * Plain, strided, dilated, grouped and depthwise convolutions become the Conv primitive
//    (zero padding inside; its runtime kernel is include/chroma/cpu/conv.h). The bias is an
//    elementwise add that fuses into whatever reads the result.
//  * Transposed convolution is the convolution of the input with zeros inserted between
//    elements (stride - 1 of them), padded by dilation * (kernel - 1) - padding, with the
//    kernel flipped and its channel axes swapped.
//  * An inference batch norm that is a convolution's only reader is folded into its weights
//    and bias (the importer finds the pairs: conv_bn_folds in importer.cpp).
#include <numeric>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

// Convolution of batched `x` [N, Cin, S...] with `w` [Cout, Cin/groups, K...], no bias: the
// Conv primitive, after the checks that name the problem in PyTorch's terms.
Value conv_forward(Call& c, Value x, Value w, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                   const std::vector<int64_t>& dilation, int64_t groups) {
  Builder& b = c.b;
  const TensorType xt = b.type(x), wt = b.type(w);
  const int64_t d = xt.rank() - 2;
  const int64_t cin = xt.shape[1], cout = wt.shape[0], cin_g = wt.shape[1];
  std::vector<int64_t> kernel(wt.shape.begin() + 2, wt.shape.end());
  for (int64_t i = 0; i < d; ++i) {
    const size_t u = static_cast<size_t>(i);
    const int64_t span = dilation[u] * (kernel[u] - 1) + 1;
    if (xt.shape[2 + u] + 2 * padding[u] < span) {
      c.fail("convolution: the kernel (size " + gu::ints_str(kernel) + ", dilation " + gu::ints_str(dilation) +
             ") is larger than the padded input " + xt.str() + " (padding " + gu::ints_str(padding) + ")");
    }
  }
  if (groups <= 0 || cin % groups || cout % groups) {
    c.fail("convolution: groups = " + std::to_string(groups) + " must divide the input channels (" +
           std::to_string(cin) + ") and the output channels (" + std::to_string(cout) + ")");
  }
  if (cin_g * groups != cin) {
    c.fail("convolution: the weight " + wt.str() + " expects " + std::to_string(cin_g * groups) +
           " input channels with groups = " + std::to_string(groups) + ", the input " + xt.str() + " has " +
           std::to_string(cin));
  }
  Attrs a;
  a.ints = stride;
  a.ints.insert(a.ints.end(), padding.begin(), padding.end());
  a.ints.insert(a.ints.end(), dilation.begin(), dilation.end());
  a.k = groups;
  return b.graph().add(Op::kConv, {x, w}, a);
}

std::vector<int64_t> per_dim(Call& c, size_t i, const char* name, int64_t d, int64_t dflt) {
  std::vector<int64_t> v = c.has(i, name) ? c.ints(i, name) : std::vector<int64_t>{};
  if (v.empty()) v.assign(static_cast<size_t>(d), dflt);
  if (v.size() == 1 && d > 1) v.assign(static_cast<size_t>(d), v[0]);
  if (static_cast<int64_t>(v.size()) != d) {
    c.fail(std::string(name) + " " + gu::ints_str(v) + " has " + std::to_string(v.size()) + " values for a " +
           std::to_string(d) + "-d convolution");
  }
  return v;
}

Value convolution(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  Value w = c.tensor(1, "weight");
  const TensorType wt = b.type(w);
  const int64_t d = wt.rank() - 2;
  if (d < 1 || d > 3) c.fail("convolution: the weight " + wt.str() + " is not that of a 1-d, 2-d or 3-d convolution");
  const bool batched = b.type(x).rank() == d + 2;
  if (!batched && b.type(x).rank() != d + 1) {
    c.fail("convolution: the input " + b.type(x).str() + " does not fit the weight " + wt.str() + " (expected rank " +
           std::to_string(d + 2) + " or, unbatched, " + std::to_string(d + 1) + ")");
  }
  if (!batched) x = b.unsqueeze(x, 0);
  const DType dt = b.type(x).dtype;
  if (!is_float(dt)) {
    c.fail("convolution of " + b.type(x).str() + " is not supported (float32, float64, float16 and bfloat16 are)");
  }
  if (wt.dtype != dt) c.fail("convolution: input " + b.type(x).str() + " and weight " + wt.str() + " dtypes differ");
  const std::vector<int64_t> stride = per_dim(c, 3, "stride", d, 1);
  const std::vector<int64_t> padding = per_dim(c, 4, "padding", d, 0);
  const std::vector<int64_t> dilation = per_dim(c, 5, "dilation", d, 1);
  const bool transposed = c.bool_or(6, "transposed", false);
  const std::vector<int64_t> output_padding = per_dim(c, 7, "output_padding", d, 0);
  const int64_t groups = c.int_or(8, "groups", 1);
  for (int64_t i = 0; i < d; ++i) {
    const size_t u = static_cast<size_t>(i);
    if (stride[u] < 1) c.fail("convolution: stride " + gu::ints_str(stride) + " must be positive");
    if (dilation[u] < 1) c.fail("convolution: dilation " + gu::ints_str(dilation) + " must be positive");
    if (padding[u] < 0) c.fail("convolution: padding " + gu::ints_str(padding) + " must be non-negative");
    if (output_padding[u] < 0 || (transposed && output_padding[u] >= std::max(stride[u], dilation[u]))) {
      c.fail("convolution: output_padding " + gu::ints_str(output_padding) +
             " must be non-negative and smaller than the stride or the dilation");
    }
  }
  if (!transposed && std::any_of(output_padding.begin(), output_padding.end(), [](int64_t v) { return v != 0; })) {
    c.fail("convolution: output_padding " + gu::ints_str(output_padding) + " is only meaningful for a transposed convolution");
  }

  // An inference batch norm folded into this convolution (see conv_bn_folds in importer.cpp):
  // y = conv(x, w * alpha) + (bias - mean) * alpha + beta, alpha = weight / sqrt(var + eps),
  // the same alpha and beta PyTorch's CPU batch norm computes. All constants: folded at
  // compile time.
  std::optional<Value> bias;
  if (c.is_tensor(2, "bias")) bias = c.tensor(2, "bias");
  if (std::optional<Call> bn = c.fused()) {
    const int64_t cout = wt.shape[0];
    Value mean = bn->tensor(3, "running_mean"), var = bn->tensor(4, "running_var");
    const double eps = bn->float_or(6, "eps", 1e-5);
    for (Value v : {mean, var}) {
      if (b.type(v).shape != Shape{cout}) bn->fail("batch norm statistics " + b.type(v).str() + " do not match " + std::to_string(cout) + " channels");
    }
    Value alpha = b.ew(EwOp::k_div, b.full(Scalar::of_float(1.0), b.type(var).dtype, {cout}),
                       b.ew(EwOp::k_sqrt, b.ew(EwOp::k_add, var, Scalar::of_float(eps))));
    if (bn->is_tensor(1, "weight")) alpha = b.ew(EwOp::k_mul, alpha, bn->tensor(1, "weight"));
    Value beta = b.ew(EwOp::k_mul, b.ew(EwOp::k_neg, mean), alpha);
    if (bias) beta = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, *bias, alpha), beta);
    if (bn->is_tensor(2, "bias")) beta = b.ew(EwOp::k_add, beta, bn->tensor(2, "bias"));
    Shape as(static_cast<size_t>(d + 2), 1);
    as[0] = cout;
    w = b.ew(EwOp::k_mul, w, b.cast(b.reshape(alpha, as), dt));
    bias = b.cast(beta, dt);
  }

  Value y;
  if (!transposed) {
    y = conv_forward(c, x, w, stride, padding, dilation, groups);
  } else {
    // weight [Cin, Cout/G, K...] -> [Cout, Cin/G, K...], kernel flipped.
    const int64_t cin = wt.shape[0], cout_g = wt.shape[1];
    if (groups <= 0 || cin % groups) {
      c.fail("convolution: groups = " + std::to_string(groups) + " must divide the weight's " + std::to_string(cin) +
             " input channels");
    }
    if (b.type(x).shape[1] != cin) {
      c.fail("transposed convolution: the input " + b.type(x).str() + " has " + std::to_string(b.type(x).shape[1]) +
             " channels, the weight " + wt.str() + " expects " + std::to_string(cin));
    }
    const int64_t cin_g = cin / groups;
    Shape gs = {groups, cin_g, cout_g};
    gs.insert(gs.end(), wt.shape.begin() + 2, wt.shape.end());
    std::vector<int64_t> perm = {0, 2, 1};
    for (int64_t i = 0; i < d; ++i) perm.push_back(3 + i);
    Shape ws = {groups * cout_g, cin_g};
    ws.insert(ws.end(), wt.shape.begin() + 2, wt.shape.end());
    Value wf = b.reshape(b.permute(b.reshape(w, gs), perm), ws);
    Attrs fa;
    for (int64_t i = 0; i < d; ++i) fa.ints.push_back(2 + i);
    wf = b.graph().add(Op::kFlip, {wf}, fa);
    Value xs = x;
    for (int64_t i = 0; i < d; ++i) {
      const size_t u = static_cast<size_t>(i);
      xs = gu::dilate_axis(b, xs, 2 + i, stride[u]);
      const int64_t edge = dilation[u] * (wt.shape[2 + u] - 1) - padding[u];
      xs = gu::pad_or_crop(b, xs, 2 + i, edge, edge + output_padding[u]);
    }
    y = conv_forward(c, xs, wf, std::vector<int64_t>(static_cast<size_t>(d), 1),
                     std::vector<int64_t>(static_cast<size_t>(d), 0), dilation, groups);
  }
  if (bias) {
    Shape bs(static_cast<size_t>(d + 2), 1);
    bs[1] = b.type(y).shape[1];
    if (b.type(*bias).rank() != 1 || b.type(*bias).shape[0] != bs[1]) {
      c.fail("convolution: the bias " + b.type(*bias).str() + " does not match the " + std::to_string(bs[1]) +
             " output channels");
    }
    y = b.ew(EwOp::k_add, y, b.reshape(*bias, bs));
  }
  if (!batched) y = b.reshape(y, Shape(b.type(y).shape.begin() + 1, b.type(y).shape.end()));
  return y;
}

}  // namespace

void register_aten_conv(HandlerTable& t) {
  t["aten.convolution.default"] = [](Call& c) { return one(convolution(c)); };
}

}  // namespace chroma

// ATen backward ops of the core opset, decomposed into IR primitives. torch.export's default
// decompositions normally rewrite them before they reach Chroma; these handlers cover graphs
// exported with them kept (a custom decomposition table, an exported training step).
//
//  * col2im: the blocks are scattered back (IndexPut with accumulate) one spatial axis at a
//    time into the padded output, then the padding is cut off.
//  * convolution_backward: grad_input is the transposed convolution of grad_output (for a
//    transposed forward, the plain convolution); grad_weight is a convolution in which the
//    batch becomes the channels and grad_output (or, transposed, the input) the kernel, with
//    stride and dilation swapped; grad_bias a sum over all dims but the channels.
//  * embedding_dense_backward: the gradient rows added at their indices (IndexPut with
//    accumulate), padding_idx rows dropped, optionally divided by each index's frequency.
//  * native_layer_norm_backward / native_group_norm_backward: the closed forms
//    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight, xhat the
//    normalized input; dweight = sum(dy * xhat), dbias = sum(dy) over the non-channel dims.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

// out = base; out[.., idx[i], ..] += values[.., i, ..] along `axis`.
Value index_put_add(Builder& b, Value base, int64_t axis, Value idx, Value values) {
  Attrs a;
  a.axis = axis;
  a.accumulate = true;
  return b.graph().add(Op::kIndexPut, {base, idx, values}, a);
}

// out[pos[i]] += v[i] along `axis` into zeros of size `n` there.
Value scatter_add_axis(Builder& b, Value v, int64_t axis, int64_t n, const std::vector<int64_t>& pos) {
  Shape zs = b.type(v).shape;
  zs[static_cast<size_t>(axis)] = n;
  Value zeros = b.full(Scalar::of_int(0), b.type(v).dtype, zs);
  return index_put_add(b, zeros, axis, gu::const_i64(b, pos, {static_cast<int64_t>(pos.size())}), v);
}

// The list of bools `output_mask` (absent: all true).
std::vector<bool> mask_of(Call& c, size_t i, const char* name, size_t n) {
  const json* j = c.get(i, name);
  if (!j) return std::vector<bool>(n, true);
  if (!j->is_array() || j->size() != n) c.fail(std::string("argument '") + name + "' must be a list of " + std::to_string(n) + " bools");
  std::vector<bool> r;
  for (const json& e : *j) {
    if (!e.is_boolean()) c.fail(std::string("argument '") + name + "' must be a list of " + std::to_string(n) + " bools");
    r.push_back(e.get<bool>());
  }
  return r;
}

// An output the mask leaves out (None in PyTorch): an empty tensor nothing reads.
Value absent(Builder& b, DType t) { return b.full(Scalar::of_int(0), t, {0}); }

// Sum over every axis of `v` but `keep` (none left: v itself).
Value sum_except(Builder& b, Value v, const std::vector<int64_t>& keep) {
  std::vector<int64_t> axes;
  for (int64_t a = 0; a < b.type(v).rank(); ++a) {
    if (std::find(keep.begin(), keep.end(), a) == keep.end()) axes.push_back(a);
  }
  return axes.empty() ? v : b.sum(v, axes, false);
}

// ---- col2im -------------------------------------------------------------------------------

std::vector<int64_t> two(Call& c, size_t i, const char* name) {
  std::vector<int64_t> v = c.ints(i, name);
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2) c.fail(std::string("col2im: ") + name + " " + gu::ints_str(v) + " must have 2 values");
  return v;
}

// col2im(self [N, C * kH * kW, L] or unbatched, output_size, kernel_size, dilation, padding,
// stride) -> [N, C, H, W]: the sum of every block entry at its output position.
Value col2im(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType xt = b.type(x);
  const bool batched = xt.rank() == 3;
  if (!batched && xt.rank() != 2) c.fail("col2im expects a 2-d or 3-d input (N, C * prod(kernel), L), got " + xt.str());
  if (!batched) x = b.unsqueeze(x, 0);
  const std::vector<int64_t> out = two(c, 1, "output_size"), k = two(c, 2, "kernel_size"), dil = two(c, 3, "dilation"),
                             pad = two(c, 4, "padding"), st = two(c, 5, "stride");
  std::vector<int64_t> blocks(2);
  for (size_t i = 0; i < 2; ++i) {
    if (k[i] < 1 || dil[i] < 1 || st[i] < 1 || pad[i] < 0 || out[i] < 1) {
      c.fail("col2im: kernel_size " + gu::ints_str(k) + ", dilation " + gu::ints_str(dil) + ", stride " + gu::ints_str(st) +
             " must be positive, padding " + gu::ints_str(pad) + " non-negative, output_size " + gu::ints_str(out) + " positive");
    }
    blocks[i] = (out[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) / st[i] + 1;
    if (out[i] + 2 * pad[i] - dil[i] * (k[i] - 1) - 1 < 0) blocks[i] = 0;
  }
  const Shape s = b.type(x).shape;
  if (s[1] % (k[0] * k[1]) != 0 || s[1] == 0) {
    c.fail("col2im: the input's dim 1 (" + std::to_string(s[1]) + ") is not a positive multiple of the kernel size " + gu::ints_str(k));
  }
  if (blocks[0] * blocks[1] != s[2] || s[2] == 0) {
    c.fail("col2im: output_size " + gu::ints_str(out) + ", kernel_size " + gu::ints_str(k) + ", dilation " + gu::ints_str(dil) +
           ", padding " + gu::ints_str(pad) + ", stride " + gu::ints_str(st) + " give " + std::to_string(blocks[0]) + " x " +
           std::to_string(blocks[1]) + " blocks, the input " + xt.str() + " has " + std::to_string(s[2]));
  }
  const int64_t n = s[0], ch = s[1] / (k[0] * k[1]);
  // [N, C, kH, kW, LH, LW] -> [N, C, kH * LH, kW * LW]
  Value v = b.reshape(x, {n, ch, k[0], k[1], blocks[0], blocks[1]});
  v = b.reshape(b.permute(v, {0, 1, 2, 4, 3, 5}), {n, ch, k[0] * blocks[0], k[1] * blocks[1]});
  for (size_t i = 0; i < 2; ++i) {
    std::vector<int64_t> pos;
    for (int64_t kk = 0; kk < k[i]; ++kk) {
      for (int64_t l = 0; l < blocks[i]; ++l) pos.push_back(l * st[i] + kk * dil[i]);
    }
    const int64_t axis = 2 + static_cast<int64_t>(i);
    v = scatter_add_axis(b, v, axis, out[i] + 2 * pad[i], pos);
    v = b.slice(v, axis, pad[i], pad[i] + out[i], 1);
  }
  if (!batched) v = b.reshape(v, {ch, out[0], out[1]});
  return v;
}

// ---- convolution_backward -----------------------------------------------------------------

Value conv(Builder& b, Value x, Value w, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
           const std::vector<int64_t>& dilation, int64_t groups) {
  Attrs a;
  a.ints = stride;
  a.ints.insert(a.ints.end(), padding.begin(), padding.end());
  a.ints.insert(a.ints.end(), dilation.begin(), dilation.end());
  a.k = groups;
  return b.graph().add(Op::kConv, {x, w}, a);
}

// Keeps the first sizes[i] entries of spatial axis 2 + i.
Value crop_to(Builder& b, Value v, const std::vector<int64_t>& sizes) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t axis = 2 + static_cast<int64_t>(i);
    if (b.type(v).shape[static_cast<size_t>(axis)] != sizes[i]) v = b.slice(v, axis, 0, sizes[i], 1);
  }
  return v;
}

// The gradient of conv(x, w) with respect to w, for x [N, G * a, S...] and
// gy [N, G * c, O...]: gw[g * c + j, i, k] = sum_{n, o} gy[n, g * c + j, o] *
// x[n, g * a + i, o * stride + k * dilation - padding]. That is a grouped convolution of x with
// the batch as its channels ([a, G * N, S...]) by gy as the kernel ([G * c, N, O...]), stride
// and dilation swapped; its first `kernel` outputs, transposed to [G * c, a, K...].
Value weight_grad(Builder& b, Value x, Value gy, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                  const std::vector<int64_t>& dilation, int64_t groups, const std::vector<int64_t>& kernel) {
  const Shape xs = b.type(x).shape, gs = b.type(gy).shape;
  const int64_t d = static_cast<int64_t>(xs.size()) - 2, n = xs[0], a = xs[1] / groups, cg = gs[1] / groups;
  std::vector<int64_t> perm_x = {2, 1, 0}, perm_g = {1, 2, 0}, perm_out = {1, 0};
  for (int64_t i = 0; i < d; ++i) {
    perm_x.push_back(3 + i);
    perm_g.push_back(3 + i);
    perm_out.push_back(2 + i);
  }
  Shape x5 = {n, groups, a}, g5 = {n, groups, cg}, x3 = {a, groups * n}, g3 = {groups * cg, n};
  x5.insert(x5.end(), xs.begin() + 2, xs.end());
  x3.insert(x3.end(), xs.begin() + 2, xs.end());
  g5.insert(g5.end(), gs.begin() + 2, gs.end());
  g3.insert(g3.end(), gs.begin() + 2, gs.end());
  Value xi = b.reshape(b.permute(b.reshape(x, x5), perm_x), x3);
  Value wk = b.reshape(b.permute(b.reshape(gy, g5), perm_g), g3);
  Value r = crop_to(b, conv(b, xi, wk, dilation, padding, stride, groups), kernel);
  return b.permute(r, perm_out);
}

std::vector<int64_t> per_dim(Call& c, size_t i, const char* name, int64_t d, int64_t dflt) {
  std::vector<int64_t> v = c.has(i, name) ? c.ints(i, name) : std::vector<int64_t>{};
  if (v.empty()) v.assign(static_cast<size_t>(d), dflt);
  if (v.size() == 1 && d > 1) v.assign(static_cast<size_t>(d), v[0]);
  if (static_cast<int64_t>(v.size()) != d) {
    c.fail("convolution_backward: " + std::string(name) + " " + gu::ints_str(v) + " has " + std::to_string(v.size()) +
           " values for a " + std::to_string(d) + "-d convolution");
  }
  return v;
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias).
std::vector<Value> convolution_backward(Call& c) {
  Builder& b = c.b;
  Value gy = c.tensor(0, "grad_output"), x = c.tensor(1, "input"), w = c.tensor(2, "weight");
  const TensorType gt = b.type(gy), xt = b.type(x), wt = b.type(w);
  const int64_t d = wt.rank() - 2;
  if (d < 1 || d > 3) c.fail("convolution_backward: the weight " + wt.str() + " is not that of a 1-d, 2-d or 3-d convolution");
  if (xt.rank() != d + 2 || gt.rank() != d + 2) {
    c.fail("convolution_backward: input " + xt.str() + " and grad_output " + gt.str() + " must be batched (rank " +
           std::to_string(d + 2) + ") for the weight " + wt.str());
  }
  const DType dt = xt.dtype;
  if (!is_float(dt) || wt.dtype != dt || gt.dtype != dt) {
    c.fail("convolution_backward: grad_output " + gt.str() + ", input " + xt.str() + " and weight " + wt.str() +
           " must all have one floating type");
  }
  const std::vector<int64_t> stride = per_dim(c, 4, "stride", d, 1), padding = per_dim(c, 5, "padding", d, 0),
                             dilation = per_dim(c, 6, "dilation", d, 1);
  const bool transposed = c.bool_or(7, "transposed", false);
  const std::vector<int64_t> output_padding = per_dim(c, 8, "output_padding", d, 0);
  const int64_t groups = c.int_or(9, "groups", 1);
  const std::vector<bool> mask = mask_of(c, 10, "output_mask", 3);
  for (size_t u = 0; u < static_cast<size_t>(d); ++u) {
    if (stride[u] < 1 || dilation[u] < 1 || padding[u] < 0) {
      c.fail("convolution_backward: stride " + gu::ints_str(stride) + " and dilation " + gu::ints_str(dilation) +
             " must be positive, padding " + gu::ints_str(padding) + " non-negative");
    }
    if (transposed && (output_padding[u] < 0 || output_padding[u] >= std::max(stride[u], dilation[u]))) {
      c.fail("convolution_backward: output_padding " + gu::ints_str(output_padding) +
             " must be non-negative and smaller than the stride or the dilation");
    }
  }
  if (groups < 1) c.fail("convolution_backward: groups = " + std::to_string(groups) + " must be positive");
  const std::vector<int64_t> in(xt.shape.begin() + 2, xt.shape.end()), kernel(wt.shape.begin() + 2, wt.shape.end());
  // Channels and the forward output's shape.
  int64_t cin = 0, cout = 0;
  Shape want = {xt.shape[0]};
  if (!transposed) {
    cin = wt.shape[1] * groups;
    cout = wt.shape[0];
  } else {
    cin = wt.shape[0];
    cout = wt.shape[1] * groups;
  }
  if (xt.shape[1] != cin || cout % groups || cin % groups) {
    c.fail("convolution_backward: the input " + xt.str() + " and weight " + wt.str() + " do not fit groups = " +
           std::to_string(groups) + (transposed ? " (transposed)" : ""));
  }
  want.push_back(cout);
  for (size_t u = 0; u < static_cast<size_t>(d); ++u) {
    const int64_t span = dilation[u] * (kernel[u] - 1) + 1;
    if (!transposed) {
      if (in[u] + 2 * padding[u] < span) {
        c.fail("convolution_backward: the kernel " + wt.str() + " (dilation " + gu::ints_str(dilation) +
               ") is larger than the padded input " + xt.str() + " (padding " + gu::ints_str(padding) + ")");
      }
      want.push_back((in[u] + 2 * padding[u] - span) / stride[u] + 1);
    } else {
      want.push_back((in[u] - 1) * stride[u] - 2 * padding[u] + span + output_padding[u]);
    }
  }
  if (gt.shape != want) {
    std::vector<int64_t> ws(want.begin(), want.end());
    c.fail("convolution_backward: grad_output is " + gt.str() + ", the forward convolution's output has shape " + gu::ints_str(ws));
  }
  const std::vector<int64_t> ones(static_cast<size_t>(d), 1), zeros(static_cast<size_t>(d), 0);
  std::vector<Value> r;
  // grad_input
  if (!mask[0]) {
    r.push_back(absent(b, dt));
  } else if (transposed) {
    // The forward was the transpose of conv(., w): its input gradient is conv(gy, w).
    r.push_back(crop_to(b, conv(b, gy, w, stride, padding, dilation, groups), in));
  } else {
    // The transposed convolution of gy with w: zeros inserted, padded, flipped kernel with its
    // channel axes swapped per group, sized back to the input (the rows the stride skipped).
    const int64_t cin_g = cin / groups, cout_g = cout / groups;
    Shape g5 = {groups, cout_g, cin_g}, ws = {cin, cout_g};
    g5.insert(g5.end(), kernel.begin(), kernel.end());
    ws.insert(ws.end(), kernel.begin(), kernel.end());
    std::vector<int64_t> perm = {0, 2, 1};
    Attrs fa;
    for (int64_t i = 0; i < d; ++i) {
      perm.push_back(3 + i);
      fa.ints.push_back(2 + i);
    }
    Value wf = b.graph().add(Op::kFlip, {b.reshape(b.permute(b.reshape(w, g5), perm), ws)}, fa);
    Value v = gy;
    for (size_t u = 0; u < static_cast<size_t>(d); ++u) {
      const int64_t axis = 2 + static_cast<int64_t>(u);
      v = gu::dilate_axis(b, v, axis, stride[u]);
      const int64_t edge = dilation[u] * (kernel[u] - 1) - padding[u];
      const int64_t extra = in[u] - ((gt.shape[2 + u] - 1) * stride[u] - 2 * padding[u] + dilation[u] * (kernel[u] - 1) + 1);
      v = gu::pad_or_crop(b, v, axis, edge, edge + extra);
    }
    r.push_back(conv(b, v, wf, ones, zeros, dilation, groups));
  }
  // grad_weight
  if (!mask[1]) {
    r.push_back(absent(b, dt));
  } else if (transposed) {
    r.push_back(weight_grad(b, gy, x, stride, padding, dilation, groups, kernel));
  } else {
    r.push_back(weight_grad(b, x, gy, stride, padding, dilation, groups, kernel));
  }
  // grad_bias
  r.push_back(mask[2] ? sum_except(b, gy, {1}) : absent(b, dt));
  return r;
}

// ---- embedding_dense_backward -------------------------------------------------------------

// embedding_dense_backward(grad_output [..., D], indices [...], num_weights, padding_idx,
// scale_grad_by_freq) -> [num_weights, D].
Value embedding_dense_backward(Call& c) {
  Builder& b = c.b;
  Value gy = c.tensor(0, "grad_output"), idx = c.tensor(1, "indices");
  const int64_t num = c.int_(2, "num_weights"), pad = c.int_(3, "padding_idx");
  const bool scale = c.bool_or(4, "scale_grad_by_freq", false);
  const TensorType gt = b.type(gy), it = b.type(idx);
  if (!is_float(gt.dtype)) c.fail("embedding_dense_backward needs a floating-point grad_output, got " + gt.str());
  if (it.dtype != DType::kI64 && it.dtype != DType::kI32) c.fail("embedding_dense_backward: indices must be int64 or int32, got " + it.str());
  if (num < 0) c.fail("embedding_dense_backward: num_weights = " + std::to_string(num) + " must be non-negative");
  Shape lead(gt.shape.begin(), gt.shape.end() - (gt.rank() > 0 ? 1 : 0));
  if (gt.rank() < 1 || lead != it.shape) {
    c.fail("embedding_dense_backward: grad_output " + gt.str() + " must be the indices' shape " + it.str() + " plus the embedding dim");
  }
  const int64_t m = it.numel(), dim = gt.shape.back();
  Value i64 = b.reshape(b.cast(idx, DType::kI64), {m});
  Value g = b.reshape(gy, {m, dim});
  // Rows of padding_idx contribute nothing (a negative padding_idx matches no index).
  Value keep = b.reshape(b.ew(EwOp::k_ne, i64, Scalar::of_int(pad)), {m, 1});
  g = b.ew(EwOp::k_where, {Operand::of(keep), Operand::of(g), Operand::of(Scalar::of_float(0.0))});
  if (scale) {
    Value counts = index_put_add(b, b.full(Scalar::of_int(0), gt.dtype, {num}), 0, i64, b.full(Scalar::of_int(1), gt.dtype, {m}));
    Attrs ga;
    ga.axis = 0;
    Value freq = b.graph().add(Op::kGather, {counts, i64}, ga);
    g = b.ew(EwOp::k_div, g, b.reshape(freq, {m, 1}));
  }
  return index_put_add(b, b.full(Scalar::of_int(0), gt.dtype, {num, dim}), 0, i64, g);
}

// ---- normalization backward ---------------------------------------------------------------

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over `axes` (keepdim), g = dy * weight.
Value norm_input_grad(Builder& b, Value g, Value xhat, Value rstd, const std::vector<int64_t>& axes) {
  Value mg = b.mean(g, axes, true);
  Value mgx = b.mean(b.ew(EwOp::k_mul, g, xhat), axes, true);
  Value inner = b.ew(EwOp::k_sub, b.ew(EwOp::k_sub, g, mg), b.ew(EwOp::k_mul, xhat, mgx));
  return b.ew(EwOp::k_mul, rstd, inner);
}

void check_float_same(Call& c, const char* what, const std::vector<Value>& vs) {
  const DType dt = c.b.type(vs[0]).dtype;
  for (Value v : vs) {
    if (!is_float(c.b.type(v).dtype) || c.b.type(v).dtype != dt) {
      std::string s;
      for (Value u : vs) s += (s.empty() ? "" : ", ") + c.b.type(u).str();
      c.fail(std::string(what) + ": the tensors (" + s + ") must share one floating-point dtype");
    }
  }
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
// output_mask) -> (grad_input, grad_weight, grad_bias).
std::vector<Value> layer_norm_backward(Call& c) {
  Builder& b = c.b;
  const char* what = "native_layer_norm_backward";
  Value gy = c.tensor(0, "grad_out"), x = c.tensor(1, "input");
  const std::vector<int64_t> ns = c.ints(2, "normalized_shape");
  Value mean = c.tensor(3, "mean"), rstd = c.tensor(4, "rstd");
  const std::vector<bool> mask = mask_of(c, 7, "output_mask", 3);
  std::optional<Value> w;
  if (c.is_tensor(5, "weight")) w = c.tensor(5, "weight");
  const bool has_bias = c.is_tensor(6, "bias");
  const TensorType xt = b.type(x);
  std::vector<Value> all = {gy, x, mean, rstd};
  if (w) all.push_back(*w);
  check_float_same(c, what, all);
  const int64_t r = xt.rank(), k = static_cast<int64_t>(ns.size()), axis = r - k;
  if (axis < 0 || !std::equal(ns.begin(), ns.end(), xt.shape.begin() + axis)) {
    c.fail(std::string(what) + ": normalized_shape " + gu::ints_str(ns) + " is not the trailing shape of the input " + xt.str());
  }
  if (b.type(gy).shape != xt.shape) c.fail(std::string(what) + ": grad_out " + b.type(gy).str() + " and input " + xt.str() + " differ in shape");
  if (w && b.type(*w).shape != Shape(ns.begin(), ns.end())) {
    c.fail(std::string(what) + ": weight " + b.type(*w).str() + " does not have the normalized shape " + gu::ints_str(ns));
  }
  Shape stat(xt.shape.begin(), xt.shape.begin() + axis);
  stat.insert(stat.end(), static_cast<size_t>(k), 1);
  int64_t outer = 1;
  for (int64_t a = 0; a < axis; ++a) outer *= xt.shape[static_cast<size_t>(a)];
  for (Value v : {mean, rstd}) {
    if (b.type(v).numel() != outer) c.fail(std::string(what) + ": mean/rstd " + b.type(v).str() + " do not hold one value per normalized row of " + xt.str());
  }
  mean = b.reshape(mean, stat);
  rstd = b.reshape(rstd, stat);
  Value xhat = b.ew(EwOp::k_mul, b.ew(EwOp::k_sub, x, mean), rstd);
  std::vector<int64_t> inner, keep;
  for (int64_t a = axis; a < r; ++a) {
    inner.push_back(a);
    keep.push_back(a);
  }
  std::vector<Value> out;
  if (mask[0]) {
    Value g = w ? b.ew(EwOp::k_mul, gy, *w) : gy;
    out.push_back(inner.empty() ? b.ew(EwOp::k_mul, b.ew(EwOp::k_sub, g, g), rstd) : norm_input_grad(b, g, xhat, rstd, inner));
  } else {
    out.push_back(absent(b, xt.dtype));
  }
  if (mask[1] && !w) c.fail(std::string(what) + ": output_mask asks for grad_weight but there is no weight");
  if (mask[2] && !has_bias) c.fail(std::string(what) + ": output_mask asks for grad_bias but there is no bias");
  out.push_back(mask[1] ? sum_except(b, b.ew(EwOp::k_mul, gy, xhat), keep) : absent(b, xt.dtype));
  out.push_back(mask[2] ? sum_except(b, gy, keep) : absent(b, xt.dtype));
  return out;
}

// native_group_norm_backward(grad_out, input, mean [N, G], rstd [N, G], weight [C], N, C,
// HxW, group, output_mask) -> (grad_input, grad_weight [C], grad_bias [C]).
std::vector<Value> group_norm_backward(Call& c) {
  Builder& b = c.b;
  const char* what = "native_group_norm_backward";
  Value gy = c.tensor(0, "grad_out"), x = c.tensor(1, "input"), mean = c.tensor(2, "mean"), rstd = c.tensor(3, "rstd");
  std::optional<Value> w;
  if (c.is_tensor(4, "weight")) w = c.tensor(4, "weight");
  const int64_t n = c.int_(5, "N"), ch = c.int_(6, "C"), hw = c.int_(7, "HxW"), g = c.int_(8, "group");
  const std::vector<bool> mask = mask_of(c, 9, "output_mask", 3);
  std::vector<Value> all = {gy, x, mean, rstd};
  if (w) all.push_back(*w);
  check_float_same(c, what, all);
  const TensorType xt = b.type(x);
  if (g <= 0 || ch % g != 0) c.fail(std::string(what) + ": " + std::to_string(ch) + " channels cannot be split into " + std::to_string(g) + " groups");
  if (xt.rank() < 2 || xt.shape[0] != n || xt.shape[1] != ch || n * ch * hw != xt.numel()) {
    c.fail(std::string(what) + ": N=" + std::to_string(n) + ", C=" + std::to_string(ch) + ", HxW=" + std::to_string(hw) +
           " do not match the input " + xt.str());
  }
  if (b.type(gy).shape != xt.shape) c.fail(std::string(what) + ": grad_out " + b.type(gy).str() + " and input " + xt.str() + " differ in shape");
  for (Value v : {mean, rstd}) {
    if (b.type(v).numel() != n * g) c.fail(std::string(what) + ": mean/rstd " + b.type(v).str() + " are not [N, group] = [" + std::to_string(n) + ", " + std::to_string(g) + "]");
  }
  if (w && b.type(*w).shape != Shape{ch}) c.fail(std::string(what) + ": weight " + b.type(*w).str() + " is not [" + std::to_string(ch) + "]");
  const int64_t dg = ch / g;
  const Shape s4 = {n, g, dg, hw};
  Value x4 = b.reshape(x, s4), g4 = b.reshape(gy, s4);
  Value rstd4 = b.reshape(rstd, {n, g, 1, 1});
  Value xhat = b.ew(EwOp::k_mul, b.ew(EwOp::k_sub, x4, b.reshape(mean, {n, g, 1, 1})), rstd4);
  std::vector<Value> out;
  if (mask[0]) {
    Value gw = w ? b.ew(EwOp::k_mul, g4, b.reshape(*w, {1, g, dg, 1})) : g4;
    out.push_back(b.reshape(norm_input_grad(b, gw, xhat, rstd4, {2, 3}), xt.shape));
  } else {
    out.push_back(absent(b, xt.dtype));
  }
  out.push_back(mask[1] ? b.reshape(b.sum(b.ew(EwOp::k_mul, g4, xhat), {0, 3}, false), {ch}) : absent(b, xt.dtype));
  out.push_back(mask[2] ? b.reshape(b.sum(g4, {0, 3}, false), {ch}) : absent(b, xt.dtype));
  return out;
}

}  // namespace

void register_aten_backward(HandlerTable& t) {
  t["aten.col2im.default"] = [](Call& c) { return std::vector<Value>{col2im(c)}; };
  t["aten.convolution_backward.default"] = [](Call& c) { return convolution_backward(c); };
  t["aten.embedding_dense_backward.default"] = [](Call& c) { return std::vector<Value>{embedding_dense_backward(c)}; };
  t["aten.native_layer_norm_backward.default"] = [](Call& c) { return layer_norm_backward(c); };
  t["aten.native_group_norm_backward.default"] = [](Call& c) { return group_norm_backward(c); };
}

}  // namespace chroma

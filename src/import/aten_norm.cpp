// ATen normalization layers (batch norm in inference, training and functional forms; group
// norm; instance norm exports as batch norm), decomposed into IR primitives. An inference
// batch norm right after a convolution is usually folded into it instead (aten_conv.cpp).
#include <string>
#include <vector>

#include "import/aten.h"

namespace chroma {
namespace {

// ---- normalization ------------------------------------------------------------------------

// Per-channel vector [C] shaped to broadcast against x [N, C, ...].
Value per_channel(Builder& b, Value v, int64_t rank) {
  const int64_t n = b.type(v).numel();
  Shape s(static_cast<size_t>(rank), 1);
  s[1] = n;
  return b.reshape(v, s);
}

// y = x * alpha + beta with alpha = invstd * weight, beta = bias - mean * alpha (PyTorch's
// batch_norm_cpu_collect_linear_and_constant_terms); mean/invstd are [C].
Value bn_apply(Call& c, Value x, Value mean, Value invstd) {
  Builder& b = c.b;
  Value alpha = invstd;
  if (c.is_tensor(1, "weight")) alpha = b.ew(EwOp::k_mul, alpha, c.tensor(1, "weight"));
  Value beta = b.ew(EwOp::k_neg, b.ew(EwOp::k_mul, mean, alpha));
  if (c.is_tensor(2, "bias")) beta = b.ew(EwOp::k_sub, c.tensor(2, "bias"), b.ew(EwOp::k_mul, mean, alpha));
  const int64_t r = b.type(x).rank();
  return b.ew(EwOp::k_add, b.ew(EwOp::k_mul, x, per_channel(b, alpha, r)), per_channel(b, beta, r));
}

Value invstd_of(Builder& b, Value var, double eps) {
  return b.ew(EwOp::k_reciprocal, b.ew(EwOp::k_sqrt, b.ew(EwOp::k_add, var, Scalar::of_float(eps))));
}

void check_bn_input(Call& c, Value x, const char* what) {
  const TensorType t = c.b.type(x);
  if (t.rank() < 2) c.fail(std::string(what) + " expects an input with at least 2 dims (N, C, ...), got " + t.str());
  if (!is_float(t.dtype)) c.fail(std::string(what) + " needs floating-point input, got " + t.str());
}

// Batch statistics over every dim but 1: mean, biased variance, element count.
struct Stats {
  Value mean, var;
  int64_t n;
};

Stats batch_stats(Builder& b, Value x) {
  const TensorType t = b.type(x);
  std::vector<int64_t> axes;
  int64_t n = 1;
  for (int64_t a = 0; a < t.rank(); ++a) {
    if (a == 1) continue;
    axes.push_back(a);
    n *= t.shape[static_cast<size_t>(a)];
  }
  Value mean_k = b.mean(x, axes, true);
  Value centered = b.ew(EwOp::k_sub, x, mean_k);
  Value var = b.mean(b.ew(EwOp::k_mul, centered, centered), axes, false);
  return {b.reshape(mean_k, {t.shape[1]}), var, n};
}

Value empty_vec(Builder& b, DType t) { return b.full(Scalar::of_float(0.0), t, {0}); }

// _native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
// momentum, eps) -> (y, empty, empty).
std::vector<Value> bn_inference(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  check_bn_input(c, x, "batch_norm");
  const double eps = c.float_or(6, "eps", 1e-5);
  const DType dt = b.type(x).dtype;
  Value mean = c.tensor(3, "running_mean"), var = c.tensor(4, "running_var");
  Value y = bn_apply(c, x, mean, invstd_of(b, var, eps));
  return {y, empty_vec(b, dt), empty_vec(b, dt)};
}

// _native_batch_norm_legit{,.no_stats,_functional}: with training, batch statistics (saved
// mean and invstd are outputs 1 and 2; _functional also returns the updated running stats,
// running_var with the unbiased variance); without, the running statistics.
// `has_training`: the op has a `training` argument (the _batch_norm_with_update ops do not:
// they always train).
std::vector<Value> bn_legit(Call& c, bool has_running, bool functional, bool has_training = true) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  check_bn_input(c, x, "batch_norm");
  const size_t at = (has_running ? 5 : 3) - (has_training ? 0 : 1);
  const bool training = has_training ? c.bool_or(at, "training", true) : true;
  const double momentum = c.float_or(at + 1, "momentum", 0.1);
  const double eps = c.float_or(at + 2, "eps", 1e-5);
  const DType dt = b.type(x).dtype;
  if (!training) {
    if (!has_running) c.fail("batch_norm in eval mode needs running statistics");
    Value rm = c.tensor(3, "running_mean"), rv = c.tensor(4, "running_var");
    Value y = bn_apply(c, x, rm, invstd_of(b, rv, eps));
    std::vector<Value> r{y, empty_vec(b, dt), empty_vec(b, dt)};
    if (functional) {  // returned at the computation type (float32 for a half input), as PyTorch's
      const DType cd = is_half(dt) ? DType::kF32 : dt;  // decomposition gives them
      r.push_back(b.cast(rm, cd));
      r.push_back(b.cast(rv, cd));
    }
    return r;
  }
  const Stats s = batch_stats(b, x);
  Value invstd = invstd_of(b, s.var, eps);
  Value y = bn_apply(c, x, s.mean, invstd);
  std::vector<Value> r{y, s.mean, invstd};
  if (functional) {
    Value rm = c.tensor(3, "running_mean"), rv = c.tensor(4, "running_var");
    const double keep = 1.0 - momentum;
    Value unbiased = b.ew(EwOp::k_mul, s.var, Scalar::of_float(s.n > 1 ? static_cast<double>(s.n) / static_cast<double>(s.n - 1) : INFINITY));
    // The updated statistics are computed from the batch statistics at the computation type
    // (float32 for a half input) and keep the promoted type: a half running_mean comes back
    // float32, as PyTorch's decomposition returns it.
    auto updated = [&](Value stat, Value running) {
      const DType cd = is_half(dt) ? DType::kF32 : dt, rt = b.type(running).dtype;
      const DType out = (rt == DType::kF64 || cd == DType::kF64) ? DType::kF64 : (is_half(rt) ? cd : rt);
      return b.cast(b.ew(EwOp::k_add, b.ew(EwOp::k_mul, stat, Scalar::of_float(momentum)),
                         b.ew(EwOp::k_mul, running, Scalar::of_float(keep))), out);
    };
    r.push_back(updated(s.mean, rm));
    r.push_back(updated(unbiased, rv));
  }
  return r;
}

// native_group_norm(input, weight, bias, N, C, HxW, group, eps) -> (y, mean [N, G], rstd [N, G]).
std::vector<Value> group_norm(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  check_bn_input(c, x, "group_norm");
  const TensorType t = b.type(x);
  const int64_t n = c.int_(3, "N"), ch = c.int_(4, "C"), hw = c.int_(5, "HxW"), g = c.int_(6, "group");
  const double eps = c.float_or(7, "eps", 1e-5);
  if (g <= 0 || ch % g != 0) c.fail("group_norm: " + std::to_string(ch) + " channels cannot be split into " + std::to_string(g) + " groups");
  if (n * ch * hw != t.numel() || t.shape[0] != n || t.shape[1] != ch) {
    c.fail("group_norm: N=" + std::to_string(n) + ", C=" + std::to_string(ch) + ", HxW=" + std::to_string(hw) +
           " do not match the input " + t.str());
  }
  Value xg = b.reshape(x, {n, g, (ch / g) * hw});
  Value mean = b.mean(xg, {2}, true);
  Value centered = b.ew(EwOp::k_sub, xg, mean);
  Value var = b.mean(b.ew(EwOp::k_mul, centered, centered), {2}, true);
  Value rstd = invstd_of(b, var, eps);
  // y = x * a + c per (n, channel): a = rstd * gamma, c = beta - a * mean.
  Value rstd_c = b.reshape(b.expand(b.reshape(rstd, {n, g, 1}), {n, g, ch / g}), {n, ch});
  Value mean_c = b.reshape(b.expand(b.reshape(mean, {n, g, 1}), {n, g, ch / g}), {n, ch});
  Value a = rstd_c;
  if (c.is_tensor(1, "weight")) a = b.ew(EwOp::k_mul, a, b.reshape(c.tensor(1, "weight"), {1, ch}));
  Value off = b.ew(EwOp::k_neg, b.ew(EwOp::k_mul, a, mean_c));
  if (c.is_tensor(2, "bias")) off = b.ew(EwOp::k_sub, b.reshape(c.tensor(2, "bias"), {1, ch}), b.ew(EwOp::k_mul, a, mean_c));
  Value x3 = b.reshape(x, {n, ch, hw});
  Value y = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, x3, b.reshape(a, {n, ch, 1})), b.reshape(off, {n, ch, 1}));
  return {b.reshape(y, t.shape), b.reshape(mean, {n, g}), b.reshape(rstd, {n, g})};
}


}  // namespace

void register_aten_norm(HandlerTable& t) {
  t["aten._native_batch_norm_legit_no_training.default"] = [](Call& c) { return bn_inference(c); };
  t["aten._native_batch_norm_legit.default"] = [](Call& c) { return bn_legit(c, true, false); };
  t["aten._native_batch_norm_legit.no_stats"] = [](Call& c) { return bn_legit(c, false, false); };
  t["aten._native_batch_norm_legit_functional.default"] = [](Call& c) { return bn_legit(c, true, true); };
  t["aten.native_group_norm.default"] = [](Call& c) { return group_norm(c); };
  // (out, save_mean, save_invstd, reserve, running_mean_out, running_var_out); reserve is an
  // empty uint8 workspace on the CPU.
  t["aten._batch_norm_with_update_functional.default"] = [](Call& c) {
    std::vector<Value> r = bn_legit(c, true, true, false);
    r.insert(r.begin() + 3, c.b.full(Scalar::of_int(0), DType::kU8, {0}));
    return r;
  };
}

}  // namespace chroma

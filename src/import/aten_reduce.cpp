// ATen reductions and normalizations: sum/mean/prod/amax/amin/max/min/argmax/argmin/var/std,
// any/all, softmax/log_softmax, logsumexp, layer norm.
#include <cmath>

#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

std::vector<int64_t> dims_arg(Call& c, size_t i, const char* name) { return c.ints(i, name); }

// Sums of bool/integers accumulate in int64, like PyTorch.
Value sum(Call& c, bool has_dims) {
  Value x = c.tensor(0, "self");
  auto dt = c.dtype(has_dims ? 3 : 1, "dtype");
  DType t = dt ? *dt : (is_float(c.b.type(x).dtype) ? c.b.type(x).dtype : DType::kI64);
  x = c.b.cast(x, t);
  return c.b.sum(x, has_dims ? dims_arg(c, 1, "dim") : std::vector<int64_t>{}, has_dims && c.bool_or(2, "keepdim", false));
}

Value extreme(Call& c, ReduceKind k, Value x, std::vector<int64_t> dims, bool keepdim) {
  return c.b.reduce(k, x, std::move(dims), keepdim);
}

Value arg(Call& c, ReduceKind k) {
  Value x = c.tensor(0, "self");
  const bool keepdim = c.bool_or(2, "keepdim", false);
  if (!c.has(1, "dim")) {
    x = c.b.reshape(x, {c.b.type(x).numel()});
    Attrs a;
    a.reduce = k;
    a.axis = 0;
    a.keepdim = false;
    Value r = c.b.graph().add(Op::kArgReduce, {x}, a);
    if (keepdim) r = c.b.reshape(r, Shape(static_cast<size_t>(c.b.type(c.tensor(0, "self")).rank()), 1));
    return r;
  }
  Attrs a;
  a.reduce = k;
  a.axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
  a.keepdim = keepdim;
  if (c.b.type(x).rank() == 0) return c.b.full(Scalar::of_int(0), DType::kI64, {});
  return c.b.graph().add(Op::kArgReduce, {x}, a);
}

std::vector<Value> max_min_dim(Call& c, ReduceKind k) {
  Value x = c.tensor(0, "self");
  const int64_t d = c.int_(1, "dim");
  const bool keepdim = c.bool_or(2, "keepdim", false);
  Value v = c.b.reduce(k, x, {d}, keepdim);
  return {v, arg(c, k)};
}

Value var(Call& c, bool has_correction_overload) {
  Value x = c.tensor(0, "self");
  double correction = 1.0;
  if (has_correction_overload) {
    correction = c.float_or(2, "correction", 1.0);
  } else {
    correction = c.bool_or(2, "unbiased", true) ? 1.0 : 0.0;
  }
  return c.b.var(x, c.ints(1, "dim"), correction, c.bool_or(3, "keepdim", false));
}

Value any_all(Call& c, bool any, bool has_dims) {
  Value x = c.b.cast(c.tensor(0, "self"), DType::kBool);
  return c.b.reduce(any ? ReduceKind::kMax : ReduceKind::kMin, x, has_dims ? c.ints(1, "dim") : std::vector<int64_t>{},
                    has_dims && c.bool_or(2, "keepdim", false));
}

std::vector<Value> layer_norm(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "input");
  const std::vector<int64_t> norm_shape = c.ints(1, "normalized_shape");
  const double eps = c.float_or(4, "eps", 1e-5);
  const int64_t r = b.type(x).rank();
  std::vector<int64_t> axes;
  for (int64_t i = r - static_cast<int64_t>(norm_shape.size()); i < r; ++i) axes.push_back(i);
  Value mean = b.mean(x, axes, true);
  Value centered = b.ew(EwOp::k_sub, x, mean);
  Value var = b.mean(b.ew(EwOp::k_mul, centered, centered), axes, true);
  Value rstd = b.ew(EwOp::k_rsqrt, b.ew(EwOp::k_add, var, Scalar::of_float(eps)));
  Value y = b.ew(EwOp::k_mul, centered, rstd);
  if (c.is_tensor(2, "weight")) y = b.ew(EwOp::k_mul, y, c.tensor(2, "weight"));
  if (c.is_tensor(3, "bias")) y = b.ew(EwOp::k_add, y, c.tensor(3, "bias"));
  return {y, mean, rstd};
}

}  // namespace

void register_aten_reduce(HandlerTable& t) {
  t["aten.sum.dim_IntList"] = [](Call& c) { return one(sum(c, true)); };
  t["aten.sum.default"] = [](Call& c) { return one(sum(c, false)); };
  t["aten.mean.dim"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    if (auto dt = c.dtype(3, "dtype")) x = c.b.cast(x, *dt);
    return one(c.b.mean(x, c.ints(1, "dim"), c.bool_or(2, "keepdim", false)));
  };
  t["aten.mean.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    if (auto dt = c.dtype(1, "dtype")) x = c.b.cast(x, *dt);
    return one(c.b.mean(x, {}, false));
  };
  t["aten.prod.dim_int"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    if (!is_float(c.b.type(x).dtype)) x = c.b.cast(x, DType::kI64);
    return one(c.b.reduce(ReduceKind::kProd, x, {c.int_(1, "dim")}, c.bool_or(2, "keepdim", false)));
  };
  t["aten.prod.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    if (!is_float(c.b.type(x).dtype)) x = c.b.cast(x, DType::kI64);
    return one(c.b.reduce(ReduceKind::kProd, x, {}, false));
  };
  t["aten.amax.default"] = [](Call& c) {
    return one(extreme(c, ReduceKind::kMax, c.tensor(0, "self"), c.ints(1, "dim"), c.bool_or(2, "keepdim", false)));
  };
  t["aten.amin.default"] = [](Call& c) {
    return one(extreme(c, ReduceKind::kMin, c.tensor(0, "self"), c.ints(1, "dim"), c.bool_or(2, "keepdim", false)));
  };
  t["aten.max.default"] = [](Call& c) { return one(extreme(c, ReduceKind::kMax, c.tensor(0, "self"), {}, false)); };
  t["aten.min.default"] = [](Call& c) { return one(extreme(c, ReduceKind::kMin, c.tensor(0, "self"), {}, false)); };
  t["aten.max.dim"] = [](Call& c) { return max_min_dim(c, ReduceKind::kMax); };
  t["aten.min.dim"] = [](Call& c) { return max_min_dim(c, ReduceKind::kMin); };
  t["aten.argmax.default"] = [](Call& c) { return one(arg(c, ReduceKind::kMax)); };
  t["aten.argmin.default"] = [](Call& c) { return one(arg(c, ReduceKind::kMin)); };
  t["aten.var.correction"] = [](Call& c) { return one(var(c, true)); };
  t["aten.var.dim"] = [](Call& c) { return one(var(c, false)); };
  t["aten.std.correction"] = [](Call& c) { return one(c.b.ew(EwOp::k_sqrt, var(c, true))); };
  t["aten.any.default"] = [](Call& c) { return one(any_all(c, true, false)); };
  t["aten.any.dim"] = t["aten.any.dims"] = [](Call& c) { return one(any_all(c, true, true)); };
  t["aten.all.default"] = [](Call& c) { return one(any_all(c, false, false)); };
  t["aten.all.dim"] = t["aten.all.dims"] = [](Call& c) { return one(any_all(c, false, true)); };
  t["aten._softmax.default"] = [](Call& c) { return one(c.b.softmax(c.tensor(0, "self"), c.int_(1, "dim"), false)); };
  t["aten._log_softmax.default"] = [](Call& c) { return one(c.b.softmax(c.tensor(0, "self"), c.int_(1, "dim"), true)); };
  t["aten.logsumexp.default"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    if (!is_float(b.type(x).dtype)) x = b.cast(x, DType::kF32);
    std::vector<int64_t> dims = c.ints(1, "dim");
    const bool keepdim = c.bool_or(2, "keepdim", false);
    Value m = b.reduce(ReduceKind::kMax, x, dims, true);
    // Rows of -inf would give inf - inf; PyTorch masks the max to 0 there.
    Value finite = b.ew(EwOp::k_logical_not, b.ew(EwOp::k_isinf, m));
    Value ms = b.ew(EwOp::k_where, {Operand::of(finite), Operand::of(m), Operand::of(Scalar::of_float(0.0))});
    Value s = b.sum(b.ew(EwOp::k_exp, b.ew(EwOp::k_sub, x, ms)), dims, keepdim);
    Value msk = keepdim ? ms : b.reshape(ms, b.type(s).shape);
    return one(b.ew(EwOp::k_add, b.ew(EwOp::k_log, s), msk));
  };
  t["aten.linalg_vector_norm.default"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    if (auto dt = c.dtype(4, "dtype")) x = b.cast(x, *dt);
    if (!is_float(b.type(x).dtype)) c.fail("vector norms need floating-point input");
    const double ord = c.float_or(1, "ord", 2.0);
    const std::vector<int64_t> dims = c.ints(2, "dim");
    const bool keepdim = c.bool_or(3, "keepdim", false);
    Value a = b.ew(EwOp::k_abs, x);
    if (std::isinf(ord)) return one(b.reduce(ord > 0 ? ReduceKind::kMax : ReduceKind::kMin, a, dims, keepdim));
    if (ord == 0.0) return one(b.sum(b.cast(b.ew(EwOp::k_ne, x, Scalar::of_int(0)), b.type(x).dtype), dims, keepdim));
    if (ord == 1.0) return one(b.sum(a, dims, keepdim));
    if (ord == 2.0) return one(b.ew(EwOp::k_sqrt, b.sum(b.ew(EwOp::k_mul, x, x), dims, keepdim)));
    Value p = b.sum(b.ew(EwOp::k_pow, a, Scalar::of_float(ord)), dims, keepdim);
    return one(b.ew(EwOp::k_pow, p, Scalar::of_float(1.0 / ord)));
  };
  t["aten.native_layer_norm.default"] = [](Call& c) { return layer_norm(c); };
}

}  // namespace chroma

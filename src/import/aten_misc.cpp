// The rest of the core ATen opset: scans, sorting and order statistics, strided views, fills,
// and the common non-core ops that survive torch.export's decompositions.
//
// Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) are the Scan primitive; sort is TopK
// with k = n (ties in index order, NaN largest: PyTorch's stable order, NaN last ascending);
// kthvalue / median / nanmedian are TopK or sort followed by a slice or gather. Strided views
// (diagonal, as_strided) are Slice/Reshape views or a Gather with Iota indices. Scatters are
// in aten_scatter.cpp; embedding bags, distances and grid_sampler_2d in aten_sampling.cpp.
//
// Not here because run_decompositions() never leaves them in a graph: col2im/im2col (fold,
// unfold: index_put/index with several index tensors, src/import/aten_index.cpp),
// embedding_dense_backward, diag_embed, argsort (sort), fill (full_like).
#include <algorithm>
#include <limits>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

using gu::iota;
using gu::axis_iota;
using gu::flat;
using gu::where;
using gu::zeros;
using gu::scan;

// cumsum/cumprod(self, dim, dtype=None): integer and bool inputs accumulate in int64 unless
// a dtype is given (the exporter records the result type).
Value cum_scan(Call& c, ReduceKind k) {
  Value x = c.tensor(0, "self");
  const int64_t axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
  return scan(c.b, c.b.cast(x, c.out_type(0).dtype), axis, k);
}

// cummax/cummin: values are a max/min scan; the index is that of the last element equal to
// the running extreme (or the last NaN), PyTorch's `x >= best` rule: a max scan over
// (x == running || isnan(x)) ? j : -1.
std::vector<Value> cum_extreme(Call& c, bool is_max) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const TensorType t = b.type(x);
  const int64_t axis = b.dim(c.int_(1, "dim"), t.rank());
  Value v = scan(b, x, axis, is_max ? ReduceKind::kMax : ReduceKind::kMin);
  if (t.numel() == 0) return {v, zeros(b, DType::kI64, t.shape)};
  Value xs = t.rank() == 0 ? b.reshape(x, {1}) : x;
  Value vs = t.rank() == 0 ? b.reshape(v, {1}) : v;
  const Shape s = b.type(xs).shape;
  Value hit = b.ew(EwOp::k_eq, xs, vs);
  if (is_float(t.dtype)) hit = b.ew(EwOp::k_logical_or, hit, b.ew(EwOp::k_isnan, xs));
  Value j = where(b, hit, axis_iota(b, s, t.rank() == 0 ? 0 : axis), Scalar::of_int(-1));
  Value idx = scan(b, j, t.rank() == 0 ? 0 : axis, ReduceKind::kMax);
  return {v, b.reshape(idx, t.shape)};
}

// ---- sort ----------------------------------------------------------------------------------

// TopK over the whole axis: equal values keep index order (stable), NaN is the largest
// (last ascending, first descending), as PyTorch's sort.
std::vector<Value> sort(Call& c, Value x, int64_t dim, bool descending) {
  Builder& b = c.b;
  const TensorType t = b.type(x);
  if (t.rank() == 0) return {x, zeros(b, DType::kI64, {})};
  const int64_t axis = b.dim(dim, t.rank());
  if (t.numel() == 0) return {x, zeros(b, DType::kI64, t.shape)};
  Attrs a;
  a.axis = axis;
  a.k = t.shape[static_cast<size_t>(axis)];
  a.largest = descending;
  a.sorted = true;
  Value v = b.graph().add(Op::kTopK, {x}, a);
  return {v, Value{v.node, 1}};
}

// ---- strided views ---------------------------------------------------------------------------

// The view (size, stride, offset) of x's elements in row-major order: a Gather from the
// flattened x with Iota indices. Checked against x's size at compile time.
Value as_strided(Call& c, Value x, const Shape& size, const Shape& stride, int64_t offset) {
  Builder& b = c.b;
  if (size.size() != stride.size()) c.fail("as_strided: size and stride differ in length");
  const TensorType t = b.type(x);
  if (numel(size) == 0) return zeros(b, t.dtype, size);
  int64_t last = offset;
  for (size_t d = 0; d < size.size(); ++d) {
    if (stride[d] < 0) c.fail("as_strided: negative strides are not supported");
    last += (size[d] - 1) * stride[d];
  }
  if (offset < 0 || last >= t.numel()) {
    c.fail("as_strided: the view (size " + shape_str(size) + ", stride " + shape_str(stride) + ", offset " +
           std::to_string(offset) + ") reaches element " + std::to_string(last) + " of a tensor of " +
           std::to_string(t.numel()) + " elements");
  }
  std::vector<double> coeffs(stride.begin(), stride.end());
  Attrs a;
  a.axis = 0;
  if (size.empty()) {
    Value idx = iota(b, DType::kI64, {1}, {0.0}, offset);
    return b.reshape(b.graph().add(Op::kGather, {flat(b, x), idx}, a), {});
  }
  return b.graph().add(Op::kGather, {flat(b, x), iota(b, DType::kI64, size, coeffs, offset)}, a);
}

struct Diag {
  int64_t d1, d2, len, start;  // start: flat offset of the first element in the [s1 * s2] plane
};

Diag diag_geometry(Call& c, const TensorType& t, int64_t offset, int64_t dim1, int64_t dim2) {
  Diag g;
  g.d1 = c.b.dim(dim1, t.rank());
  g.d2 = c.b.dim(dim2, t.rank());
  if (g.d1 == g.d2) c.fail("diagonal dimensions cannot be identical (" + std::to_string(dim1) + ", " + std::to_string(dim2) + ")");
  const int64_t s1 = t.shape[static_cast<size_t>(g.d1)], s2 = t.shape[static_cast<size_t>(g.d2)];
  g.len = offset >= 0 ? std::max<int64_t>(0, std::min(s1, s2 - offset)) : std::max<int64_t>(0, std::min(s1 + offset, s2));
  g.start = g.len == 0 ? 0 : (offset >= 0 ? offset : -offset * s2);
  return g;
}

// diagonal: the two dims moved last, flattened, sliced with step s2 + 1: views only.
Value diagonal(Call& c, Value x, int64_t offset, int64_t dim1, int64_t dim2) {
  Builder& b = c.b;
  const TensorType t = b.type(x);
  const Diag g = diag_geometry(c, t, offset, dim1, dim2);
  std::vector<int64_t> perm;
  Shape rest;
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (d != g.d1 && d != g.d2) {
      perm.push_back(d);
      rest.push_back(t.shape[static_cast<size_t>(d)]);
    }
  }
  Shape out = rest;
  out.push_back(g.len);
  if (g.len == 0 || t.numel() == 0) return zeros(b, t.dtype, out);
  perm.push_back(g.d1);
  perm.push_back(g.d2);
  const int64_t s1 = t.shape[static_cast<size_t>(g.d1)], s2 = t.shape[static_cast<size_t>(g.d2)];
  Shape fl = rest;
  fl.push_back(s1 * s2);
  Value v = b.reshape(b.permute(x, perm), fl);
  const int64_t ax = static_cast<int64_t>(rest.size());
  return b.slice(v, ax, g.start, g.start + (g.len - 1) * (s2 + 1) + 1, s2 + 1);
}

Value diagonal_scatter(Call& c) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self");
  const TensorType t = b.type(self);
  const Diag g = diag_geometry(c, t, c.int_or(2, "offset", 0), c.int_or(3, "dim1", 0), c.int_or(4, "dim2", 1));
  if (g.len == 0 || t.numel() == 0) return self;
  const Shape strides = contiguous_strides(t.shape);
  Shape shape;
  std::vector<double> coeffs;
  for (int64_t d = 0; d < t.rank(); ++d) {
    if (d != g.d1 && d != g.d2) {
      shape.push_back(t.shape[static_cast<size_t>(d)]);
      coeffs.push_back(static_cast<double>(strides[static_cast<size_t>(d)]));
    }
  }
  shape.push_back(g.len);
  const int64_t st1 = strides[static_cast<size_t>(g.d1)], st2 = strides[static_cast<size_t>(g.d2)];
  coeffs.push_back(static_cast<double>(st1 + st2));
  const int64_t s2 = t.shape[static_cast<size_t>(g.d2)];
  const int64_t base = g.start / s2 * st1 + g.start % s2 * st2;
  Value src = c.tensor(1, "src");
  if (b.type(src).shape != shape) c.fail("diagonal_scatter: src " + b.type(src).str() + " does not match the diagonal " + shape_str(shape));
  Value idx = flat(b, iota(b, DType::kI64, shape, coeffs, base));
  Attrs a;
  a.axis = 0;
  Value out = b.graph().add(Op::kIndexPut, {flat(b, self), idx, flat(b, b.cast(src, t.dtype))}, a);
  return b.reshape(out, t.shape);
}

// ---- ops that survive torch.export's decompositions (not core, but common) --------------------

// k-th smallest along `dim` (1-based k), PyTorch's kthvalue: values and their indices.
std::vector<Value> kth(Call& c, Value x, int64_t k, int64_t dim, bool keepdim, const char* what) {
  Builder& b = c.b;
  const TensorType t = b.type(x);
  const int64_t axis = t.rank() == 0 ? 0 : b.dim(dim, t.rank());
  if (t.rank() == 0) {
    if (k != 1) c.fail(std::string(what) + ": k = " + std::to_string(k) + " is out of range for a 0-d tensor");
    return {x, zeros(b, DType::kI64, {})};
  }
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (k < 1 || k > n) c.fail(std::string(what) + ": k = " + std::to_string(k) + " is out of range for dim " +
                             std::to_string(axis) + " of " + t.str());
  Attrs a;
  a.axis = axis;
  a.k = k;
  a.largest = false;
  a.sorted = true;
  Value v = b.graph().add(Op::kTopK, {x}, a);
  Value vk = b.slice(v, axis, k - 1, k, 1), ik = b.slice(Value{v.node, 1}, axis, k - 1, k, 1);
  if (!keepdim) {
    Shape s = t.shape;
    s.erase(s.begin() + axis);
    vk = b.reshape(vk, s);
    ik = b.reshape(ik, s);
  }
  return {vk, ik};
}

// nanmedian: the lower median of the non-NaN elements along `dim` (sort puts NaN last, so
// it is element (m - 1) / 2 of the sorted slice, m the count of non-NaN); an all-NaN slice
// gives NaN at index 0, as PyTorch.
std::vector<Value> nanmedian(Call& c, Value x, int64_t dim, bool keepdim) {
  Builder& b = c.b;
  const TensorType t = b.type(x);
  if (t.rank() == 0) return {x, zeros(b, DType::kI64, {})};
  const int64_t axis = b.dim(dim, t.rank());
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (n == 0) c.fail("nanmedian: dim " + std::to_string(axis) + " of " + t.str() + " is empty");
  std::vector<Value> s = sort(c, x, axis, false);
  Value m = is_float(t.dtype) ? b.sum(b.cast(b.ew(EwOp::k_logical_not, b.ew(EwOp::k_isnan, x)), DType::kI64), {axis}, true)
                              : b.full(Scalar::of_int(n), DType::kI64, [&] { Shape k = t.shape; k[static_cast<size_t>(axis)] = 1; return k; }());
  Value k = b.ew(EwOp::k_floor_divide, b.ew(EwOp::k_maximum, b.ew(EwOp::k_sub, m, Scalar::of_int(1)), Scalar::of_int(0)),
                 Scalar::of_int(2));
  Attrs a;
  a.axis = axis;
  Value v = b.graph().add(Op::kGatherElements, {s[0], k}, a);
  Value i = b.graph().add(Op::kGatherElements, {s[1], k}, a);
  if (!keepdim) {
    Shape r = t.shape;
    r.erase(r.begin() + axis);
    v = b.reshape(v, r);
    i = b.reshape(i, r);
  }
  return {v, i};
}

// An operand as a tensor of dtype t (a cast, not arithmetic: -0.0 keeps its sign).
Value as_tensor(Builder& b, const Operand& o, DType t) {
  if (o.tensor.valid()) return b.cast(o.tensor, t);
  return b.full(*o.scalar, t, {});
}

// fmax / fmin: the other operand where one is NaN.
Value fmax_fmin(Call& c, bool is_max) {
  Builder& b = c.b;
  Operand x = c.operand(0, "self"), y = c.operand(1, "other");
  const DType t = b.promote({x, y});
  Value a = as_tensor(b, x, t), bb = as_tensor(b, y, t);
  Value m = b.ew(is_max ? EwOp::k_maximum : EwOp::k_minimum, a, bb);
  if (!is_float(t)) return m;
  Value r = b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_isnan, bb)), Operand::of(a), Operand::of(m)});
  return b.ew(EwOp::k_where, {Operand::of(b.ew(EwOp::k_isnan, a)), Operand::of(bb), Operand::of(r)});
}

// copysign(a, b): |a| with b's sign bit (-0.0 counts as negative: 1 / b < 0).
Value copysign(Call& c) {
  Builder& b = c.b;
  Operand x = c.operand(0, "self"), y = c.operand(1, "other");
  DType t = b.promote({x, y});
  if (!is_float(t)) t = DType::kF32;
  Value a = b.ew(EwOp::k_abs, as_tensor(b, x, t));
  Value s = as_tensor(b, y, t);
  Value zero = b.ew(EwOp::k_eq, s, Scalar::of_int(0));
  Value negzero = b.ew(EwOp::k_logical_and, zero, b.ew(EwOp::k_lt, b.ew(EwOp::k_reciprocal, s), Scalar::of_int(0)));
  Value neg = b.ew(EwOp::k_logical_or, b.ew(EwOp::k_lt, s, Scalar::of_int(0)), negzero);
  return b.ew(EwOp::k_where, {Operand::of(neg), Operand::of(b.ew(EwOp::k_neg, a)), Operand::of(a)});
}

// var_mean / std_mean (.correction): (variance or its square root, mean) over `dim`.
std::vector<Value> moments(Call& c, bool std_dev) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  std::vector<int64_t> dims = c.has(1, "dim") ? c.ints(1, "dim") : std::vector<int64_t>{};
  const double corr = c.float_or(2, "correction", 1.0);
  const bool keep = c.bool_or(3, "keepdim", false);
  Value v = b.var(x, dims, corr, keep);
  return {std_dev ? b.ew(EwOp::k_sqrt, v) : v, b.mean(x, dims, keep)};
}


}  // namespace

void register_aten_misc(HandlerTable& t) {

  // Common ops that survive torch.export's decompositions.
  t["aten.addmv.default"] = [](Call& c) {
    return one(scaled_add(c, c.tensor(0, "self"), c.b.matmul(c.tensor(1, "mat"), c.tensor(2, "vec"))));
  };
  t["aten.addbmm.default"] = [](Call& c) {
    Value p = c.b.sum(c.b.matmul(c.tensor(1, "batch1"), c.tensor(2, "batch2")), {0}, false);
    return one(scaled_add(c, c.tensor(0, "self"), p));
  };
  t["aten.fmax.default"] = [](Call& c) { return one(fmax_fmin(c, true)); };
  t["aten.fmin.default"] = [](Call& c) { return one(fmax_fmin(c, false)); };
  t["aten.copysign.Tensor"] = t["aten.copysign.Scalar"] = [](Call& c) { return one(copysign(c)); };
  t["aten.var_mean.correction"] = [](Call& c) { return moments(c, false); };
  t["aten.std_mean.correction"] = [](Call& c) { return moments(c, true); };
  t["aten.kthvalue.default"] = [](Call& c) {
    return kth(c, c.tensor(0, "self"), c.int_(1, "k"), c.int_or(2, "dim", -1), c.bool_or(3, "keepdim", false), "kthvalue");
  };
  t["aten.median.dim"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const TensorType xt = c.b.type(x);
    const int64_t dim = c.int_or(1, "dim", -1);
    const int64_t n = xt.rank() == 0 ? 1 : xt.shape[static_cast<size_t>(c.b.dim(dim, xt.rank()))];
    const bool keep = c.bool_or(2, "keepdim", false);
    std::vector<Value> r = kth(c, x, (n - 1) / 2 + 1, dim, keep, "median");
    if (!is_float(xt.dtype) || xt.rank() == 0) return r;
    // A NaN anywhere along the dim is the median (PyTorch propagates it), at its first index.
    Builder& b = c.b;
    const int64_t axis = b.dim(dim, xt.rank());
    Value isn = b.cast(b.ew(EwOp::k_isnan, x), DType::kI32);
    Value any = b.cast(b.reduce(ReduceKind::kMax, isn, {axis}, keep), DType::kBool);
    Attrs a;
    a.reduce = ReduceKind::kMax;
    a.axis = axis;
    a.keepdim = keep;
    Value first = b.graph().add(Op::kArgReduce, {isn}, a);
    r[0] = b.ew(EwOp::k_where, {Operand::of(any), Operand::of(Scalar::of_float(std::numeric_limits<double>::quiet_NaN())),
                                 Operand::of(r[0])}, xt.dtype);
    r[1] = b.ew(EwOp::k_where, {Operand::of(any), Operand::of(first), Operand::of(r[1])});
    return r;
  };
  t["aten.median.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t n = c.b.type(x).numel();
    if (n == 0) c.fail("median of an empty tensor");
    Builder& b = c.b;
    Value flat = b.reshape(x, {n});
    Value v = kth(c, flat, (n - 1) / 2 + 1, 0, false, "median")[0];
    if (!is_float(b.type(x).dtype)) return std::vector<Value>{v};
    Value any = b.reduce(ReduceKind::kMax, b.ew(EwOp::k_isnan, flat), {0}, false);
    return std::vector<Value>{b.ew(EwOp::k_where, {Operand::of(any),
                                                    Operand::of(Scalar::of_float(std::numeric_limits<double>::quiet_NaN())),
                                                    Operand::of(v)}, b.type(x).dtype)};
  };
  t["aten.nanmedian.dim"] = [](Call& c) {
    return nanmedian(c, c.tensor(0, "self"), c.int_or(1, "dim", -1), c.bool_or(2, "keepdim", false));
  };
  t["aten.nanmedian.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t n = c.b.type(x).numel();
    if (n == 0) c.fail("nanmedian of an empty tensor");
    return std::vector<Value>{nanmedian(c, c.b.reshape(x, {n}), 0, false)[0]};
  };
  // scans
  t["aten.cumsum.default"] = [](Call& c) { return one(cum_scan(c, ReduceKind::kSum)); };
  t["aten.cumprod.default"] = [](Call& c) { return one(cum_scan(c, ReduceKind::kProd)); };
  t["aten.cummax.default"] = [](Call& c) { return cum_extreme(c, true); };
  t["aten.cummin.default"] = [](Call& c) { return cum_extreme(c, false); };
  t["aten.logcumsumexp.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    x = c.b.cast(x, c.out_type(0).dtype);
    return one(scan(c.b, x, c.b.dim(c.int_(1, "dim"), c.b.type(x).rank()), ReduceKind::kSum, true));
  };
  // sorting
  t["aten.sort.default"] = [](Call& c) {
    return sort(c, c.tensor(0, "self"), c.int_or(1, "dim", -1), c.bool_or(2, "descending", false));
  };
  t["aten.sort.stable"] = [](Call& c) {
    return sort(c, c.tensor(0, "self"), c.int_or(2, "dim", -1), c.bool_or(3, "descending", false));
  };
  // strided views
  t["aten.diagonal.default"] = [](Call& c) {
    return one(diagonal(c, c.tensor(0, "self"), c.int_or(1, "offset", 0), c.int_or(2, "dim1", 0), c.int_or(3, "dim2", 1)));
  };
  t["aten.diagonal_scatter.default"] = [](Call& c) { return one(diagonal_scatter(c)); };
  t["aten.as_strided.default"] = [](Call& c) {
    return one(as_strided(c, c.tensor(0, "self"), c.ints(1, "size"), c.ints(2, "stride"), c.int_or(3, "storage_offset", 0)));
  };
  // fills and uninitialized memory (zeros are a valid content)
  t["aten.fill.Scalar"] = [](Call& c) {
    const TensorType x = c.b.type(c.tensor(0, "self"));
    return one(c.b.full(c.scalar(1, "value"), x.dtype, x.shape));
  };
  t["aten.fill.Tensor"] = [](Call& c) {
    const TensorType x = c.b.type(c.tensor(0, "self"));
    Value v = c.tensor(1, "value");
    if (c.b.type(v).rank() != 0) c.fail("fill: the value must be a 0-dimensional tensor");
    return one(c.b.expand(c.b.cast(v, x.dtype), x.shape));
  };
  for (const char* name : {"aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_permuted.default", "aten.empty_like.default", "aten.new_empty.default", "aten.new_empty_strided.default"}) {
    t[name] = [](Call& c) {
      const TensorType o = c.out_type(0);
      return one(zeros(c.b, o.dtype, o.shape));
    };
  }
  // native_dropout(input, p, train): the identity outside training; in training it draws
  // random numbers, which are excluded (see refusal() in importer.cpp).
  t["aten.native_dropout.default"] = [](Call& c) {
    Value x = c.tensor(0, "input");
    const json* train = c.get(2, "train");
    const bool training = train == nullptr || !train->is_boolean() || train->get<bool>();
    if (training && c.float_or(1, "p", 0.5) != 0.0) {
      c.fail("dropout in training mode draws random numbers; random-number ops are not supported "
             "(call model.eval() to disable dropout)");
    }
    return std::vector<Value>{x, c.b.full(Scalar::of_int(1), DType::kBool, c.b.type(x).shape)};
  };
  // Tensor.item() in a fixed-shape graph: the value stays a 0-d tensor for its consumers.
  t["aten._local_scalar_dense.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    if (c.b.type(x).numel() != 1) c.fail("item() of a tensor with " + std::to_string(c.b.type(x).numel()) + " elements");
    return one(c.b.reshape(x, {}));
  };
}

}  // namespace chroma

// The rest of the core ATen opset: scans, sorting, scatters, strided views and friends.
//
// Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) are the Scan primitive; sort is TopK
// with k = n (ties in index order, NaN largest: PyTorch's stable order, NaN last ascending);
// every scatter flattens the destination and becomes one IndexPut (attrs.reduce combines
// duplicates) whose flat indices come from an Iota plus the user's indices, which pass
// through a GatherElements of an Iota first so that an out-of-range index fails at run time
// with PyTorch's message (the index, the dimension and its size). Strided views (diagonal,
// as_strided) are Slice/Reshape views or a Gather with Iota indices.
//
// Not here because run_decompositions() never leaves them in a graph: col2im/im2col (fold,
// unfold: index_put/index with several index tensors, src/import/aten_index.cpp),
// embedding_dense_backward, diag_embed, argsort (sort), fill (full_like).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

using gu::iota;
using gu::axis_iota;
using gu::const_i64;
using gu::flat;
using gu::where;
using gu::zeros;
using gu::lowest;
using gu::highest;
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

// ---- scatters -------------------------------------------------------------------------------

// Flat positions in `self` (shape `st`) of the elements the index tensor `index` addresses
// along `axis`: index[i] * stride[axis] + sum_{d != axis} i_d * stride[d]. Each index is
// first passed through GatherElements of an Iota along the axis (the identity on valid
// indices), which checks it against the dimension's size at run time.
Value scatter_positions(Builder& b, const Shape& st, int64_t axis, Value index) {
  const Shape is = b.type(index).shape;
  const Shape strides = contiguous_strides(st);
  Shape src = is;
  src[static_cast<size_t>(axis)] = st[static_cast<size_t>(axis)];
  Attrs a;
  a.axis = axis;
  Value checked = b.graph().add(Op::kGatherElements, {axis_iota(b, src, axis), b.cast(index, DType::kI64)}, a);
  std::vector<double> coeffs;
  for (size_t d = 0; d < st.size(); ++d) coeffs.push_back(static_cast<int64_t>(d) == axis ? 0.0 : static_cast<double>(strides[d]));
  Value pos = iota(b, DType::kI64, is, coeffs, 0);
  return b.ew(EwOp::k_add, pos, b.ew(EwOp::k_mul, checked, Scalar::of_int(strides[static_cast<size_t>(axis)])));
}

// self with self[pos(i)] (op)= values[i] for every element i of index (values has index's
// shape). mode < 0: assignment (the last write wins), else combine with that reduction.
Value scatter_into(Call& c, Value self, int64_t axis, Value index, Value values, int mode) {
  Builder& b = c.b;
  const TensorType st = b.type(self);
  const Shape is = b.type(index).shape;
  if (numel(is) == 0) return self;
  if (st.rank() == 0) {
    // A 0-d self takes 0-d/1-element indices: treat both as rank 1.
    Value r = scatter_into(c, b.reshape(self, {1}), 0, b.reshape(index, {numel(is)}), b.reshape(values, {numel(is)}), mode);
    return b.reshape(r, {});
  }
  if (b.type(index).rank() != st.rank()) c.fail("index rank " + std::to_string(b.type(index).rank()) + " differs from self rank " + std::to_string(st.rank()));
  for (int64_t d = 0; d < st.rank(); ++d) {
    if (d != axis && is[static_cast<size_t>(d)] > st.shape[static_cast<size_t>(d)]) {
      c.fail("index " + shape_str(is) + " is larger than self " + shape_str(st.shape) + " in dimension " + std::to_string(d));
    }
  }
  Value pos = flat(b, scatter_positions(b, st.shape, axis, index));
  Attrs a;
  a.axis = 0;
  a.accumulate = mode >= 0;
  a.reduce = mode >= 0 ? static_cast<ReduceKind>(mode) : ReduceKind::kSum;
  Value out = b.graph().add(Op::kIndexPut, {flat(b, self), pos, flat(b, b.cast(values, st.dtype))}, a);
  return b.reshape(out, st.shape);
}

// `src` cut to index's shape (scatter reads src only where index has elements).
Value src_for(Call& c, Value src, Value index) {
  Builder& b = c.b;
  const Shape is = b.type(index).shape;
  const Shape ss = b.type(src).shape;
  if (ss.size() != is.size()) c.fail("src rank differs from index rank");
  for (size_t d = 0; d < is.size(); ++d) {
    if (is[d] > ss[d]) c.fail("index " + shape_str(is) + " is larger than src " + shape_str(ss) + " in dimension " + std::to_string(d));
    if (is[d] < ss[d]) src = b.slice(src, static_cast<int64_t>(d), 0, is[d], 1);
  }
  return src;
}

int reduce_mode(Call& c, const std::string& r) {
  if (r == "sum" || r == "add") return static_cast<int>(ReduceKind::kSum);
  if (r == "prod" || r == "multiply") return static_cast<int>(ReduceKind::kProd);
  if (r == "amax") return static_cast<int>(ReduceKind::kMax);
  if (r == "amin") return static_cast<int>(ReduceKind::kMin);
  if (r == "mean") return 100;
  c.fail("unknown scatter reduction '" + r + "'");
}

// scatter(self, dim, index, src|value [, reduce]): src is a tensor or a scalar.
Value scatter(Call& c, bool value, int mode) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self");
  const int64_t axis = b.dim(c.int_(1, "dim"), b.type(self).rank());
  Value index = c.tensor(2, "index");
  Value src = value ? b.full(c.scalar(3, "value"), b.type(self).dtype, b.type(index).shape) : src_for(c, c.tensor(3, "src"), index);
  return scatter_into(c, self, axis, index, src, mode);
}

// scatter_reduce.two(self, dim, index, src, reduce, include_self=True).
Value scatter_reduce(Call& c) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self");
  const TensorType st = b.type(self);
  const int64_t axis = b.dim(c.int_(1, "dim"), st.rank());
  Value index = c.tensor(2, "index");
  Value src = b.cast(src_for(c, c.tensor(3, "src"), index), st.dtype);
  const int mode = reduce_mode(c, c.str_or(4, "reduce", ""));
  const bool include_self = c.bool_or(5, "include_self", true);
  if (numel(b.type(index).shape) == 0) return self;
  if (mode == 100) {
    // mean: (self? + sum) / count, count = include_self + hits (1 where nothing lands), floor
    // division for integer types, as PyTorch.
    const DType ct = st.dtype;
    Value ones = b.full(Scalar::of_int(1), ct, b.type(index).shape);
    Value count = scatter_into(c, b.full(Scalar::of_int(include_self ? 1 : 0), ct, st.shape), axis, index, ones, 0);
    Value base = self;
    if (!include_self) base = where(b, b.ew(EwOp::k_gt, count, Scalar::of_int(0)), zeros(b, ct, st.shape), self);
    Value sum = scatter_into(c, base, axis, index, src, 0);
    count = where(b, b.ew(EwOp::k_eq, count, Scalar::of_int(0)), b.full(Scalar::of_int(1), ct, st.shape), count);
    if (is_float(ct)) return b.ew(EwOp::k_div, sum, count);
    return b.ew(EwOp::k_floor_divide, sum, count);
  }
  Value base = self;
  if (!include_self) {
    // Elements that receive values start from the reduction's identity instead of self.
    Value ones = b.full(Scalar::of_int(1), DType::kI32, b.type(index).shape);
    Value hits = scatter_into(c, zeros(b, DType::kI32, st.shape), axis, index, ones, 0);
    Scalar id = Scalar::of_int(0);
    switch (static_cast<ReduceKind>(mode)) {
      case ReduceKind::kSum: id = Scalar::of_int(0); break;
      case ReduceKind::kProd: id = Scalar::of_int(1); break;
      case ReduceKind::kMax: id = lowest(st.dtype); break;
      case ReduceKind::kMin: id = highest(st.dtype); break;
    }
    base = where(b, b.ew(EwOp::k_gt, hits, Scalar::of_int(0)), b.full(id, st.dtype, st.shape), self);
  }
  return scatter_into(c, base, axis, index, src, mode);
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

// ---- masked_scatter ----------------------------------------------------------------------------

// out = self where !mask, else the next element of source in row-major order: the k-th true
// element takes source[k], k = (running count of trues) - 1 (a Scan).
Value masked_scatter(Call& c) {
  Builder& b = c.b;
  Value self = c.tensor(0, "self");
  Value mask = c.tensor(1, "mask");
  Value source = c.tensor(2, "source");
  const TensorType ot = c.out_type(0);
  self = b.expand(self, ot.shape);
  mask = b.expand(b.cast(mask, DType::kBool), ot.shape);
  if (ot.numel() == 0 || b.type(source).numel() == 0) return self;
  Value m = flat(b, mask);
  Value k = b.ew(EwOp::k_sub, scan(b, b.cast(m, DType::kI64), 0, ReduceKind::kSum), Scalar::of_int(1));
  k = where(b, m, k, Scalar::of_int(0));
  Attrs a;
  a.axis = 0;
  Value taken = b.graph().add(Op::kGather, {flat(b, b.cast(source, ot.dtype)), k}, a);
  return b.reshape(where(b, m, taken, flat(b, self)), ot.shape);
}

// ---- embedding_bag -------------------------------------------------------------------------------

// _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
// include_last_offset, padding_idx) -> (output, offset2bag, bag_size, max_indices).
// Bag of index i: (number of offsets <= i) - 1; rows are combined with IndexPut (sum, or max
// from -inf), mean divides by the bag's count, empty bags give 0, padding_idx rows are
// skipped. Outputs 1-3 (bookkeeping for the backward pass) are offset2bag, bag sizes and
// zeros for max_indices.
std::vector<Value> embedding_bag(Call& c) {
  Builder& b = c.b;
  Value weight = c.tensor(0, "weight");
  Value indices = b.cast(c.tensor(1, "indices"), DType::kI64);
  Value offsets = b.cast(c.tensor(2, "offsets"), DType::kI64);
  const int64_t mode = c.int_or(4, "mode", 0);
  const bool has_psw = c.has(6, "per_sample_weights");
  const bool include_last = c.bool_or(7, "include_last_offset", false);
  const int64_t padding_idx = c.int_or(8, "padding_idx", -1);
  const TensorType wt = b.type(weight);
  if (b.type(indices).rank() != 1) c.fail("embedding_bag: indices must be 1-D here, got " + b.type(indices).str());
  const int64_t n = b.type(indices).numel();
  const int64_t nb = b.type(offsets).numel() - (include_last ? 1 : 0);
  const int64_t dim = wt.shape.at(1);
  const TensorType out_t = c.out_type(0);
  if (mode < 0 || mode > 2) c.fail("embedding_bag: unknown mode " + std::to_string(mode));
  if (has_psw && mode != 0) c.fail("embedding_bag: per_sample_weights is only supported with mode 'sum'");
  std::vector<Value> extras;
  auto finish = [&](Value out, Value bag, Value count) {
    std::vector<Value> r = {out};
    for (size_t k = 1; k < 4; ++k) {
      const TensorType want = c.out_type(k);
      if (k == 1 && bag.valid() && b.type(bag) == want) r.push_back(bag);
      else if (k == 2 && count.valid() && b.type(b.cast(count, DType::kI64)) == want) r.push_back(b.cast(count, DType::kI64));
      else r.push_back(zeros(b, want.dtype, want.shape));
    }
    return r;
  };
  if (nb <= 0 || n == 0) return finish(zeros(b, out_t.dtype, out_t.shape), Value{}, Value{});
  Value offs = b.slice(offsets, 0, 0, nb, 1);
  // bag[i] = sum_j (offsets[j] <= i) - 1
  Value pos = iota(b, DType::kI64, {n, nb}, {1.0, 0.0}, 0);
  Value le = b.ew(EwOp::k_le, b.expand(b.reshape(offs, {1, nb}), {n, nb}), pos);
  Value bag = b.ew(EwOp::k_sub, b.sum(b.cast(le, DType::kI64), {1}, false), Scalar::of_int(1));
  Attrs ga;
  ga.axis = 0;
  Value rows = b.graph().add(Op::kGather, {weight, indices}, ga);  // [n, dim]
  Value valid = padding_idx >= 0 ? b.ew(EwOp::k_ne, indices, Scalar::of_int(padding_idx)) : b.full(Scalar::of_int(1), DType::kBool, {n});
  Value valid2 = b.expand(b.reshape(valid, {n, 1}), {n, dim});
  Attrs ia;
  ia.axis = 0;
  ia.accumulate = true;
  Value count = b.graph().add(Op::kIndexPut, {zeros(b, wt.dtype, {nb}), bag, b.cast(valid, wt.dtype)}, ia);
  Value out;
  if (mode == 2) {
    ia.reduce = ReduceKind::kMax;
    Value vals = where(b, valid2, rows, lowest(wt.dtype));
    out = b.graph().add(Op::kIndexPut, {b.full(lowest(wt.dtype), wt.dtype, {nb, dim}), bag, vals}, ia);
    Value nonempty = b.expand(b.reshape(b.ew(EwOp::k_gt, count, Scalar::of_int(0)), {nb, 1}), {nb, dim});
    out = where(b, nonempty, out, Scalar::of_int(0));
  } else {
    Value vals = where(b, valid2, rows, Scalar::of_int(0));
    if (has_psw) vals = b.ew(EwOp::k_mul, vals, b.expand(b.reshape(b.cast(c.tensor(6, "per_sample_weights"), wt.dtype), {n, 1}), {n, dim}));
    out = b.graph().add(Op::kIndexPut, {zeros(b, wt.dtype, {nb, dim}), bag, vals}, ia);
    if (mode == 1) {
      Value cnt = b.ew(EwOp::k_maximum, count, b.full(Scalar::of_int(1), wt.dtype, {nb}));
      out = b.ew(EwOp::k_div, out, b.expand(b.reshape(cnt, {nb, 1}), {nb, dim}));
    }
  }
  return finish(out, bag, count);
}

// embedding_renorm(weight, indices, max_norm, norm_type): rows that indices reference and
// whose norm exceeds max_norm are scaled by max_norm / (norm + 1e-7), as
// embedding(max_norm=...) does in place before the lookup.
Value pnorm_last(Builder& b, Value d, double p);
Value embedding_renorm(Call& c) {
  Builder& b = c.b;
  Value w = c.tensor(0, "self");
  Value idx = b.cast(c.tensor(1, "indices"), DType::kI64);
  const double max_norm = c.float_or(2, "max_norm", 0.0);
  const double p = c.float_or(3, "norm_type", 2.0);
  const TensorType wt = b.type(w);
  if (wt.rank() != 2) c.fail("embedding_renorm needs a 2-D weight, got " + wt.str());
  const int64_t n = b.type(idx).numel(), rows = wt.shape[0], d = wt.shape[1];
  if (n == 0 || wt.numel() == 0) return w;
  Attrs a;
  a.axis = 0;
  Value used = b.graph().add(Op::kIndexPut, {zeros(b, DType::kBool, {rows}), flat(b, idx), b.full(Scalar::of_int(1), DType::kBool, {n})}, a);
  Value norm = pnorm_last(b, w, p);
  Value scale = b.ew(EwOp::k_div, b.full(Scalar::of_float(max_norm), wt.dtype, {rows}), b.ew(EwOp::k_add, norm, Scalar::of_float(1e-7)));
  Value cond = b.ew(EwOp::k_logical_and, used, b.ew(EwOp::k_gt, norm, Scalar::of_float(max_norm)));
  auto rowwise = [&](Value v) { return b.expand(b.reshape(v, {rows, 1}), {rows, d}); };
  return where(b, rowwise(cond), b.ew(EwOp::k_mul, w, rowwise(scale)), w);
}

// ---- distances -------------------------------------------------------------------------------

// The p-norm over the last axis of d (differences), as PyTorch's cdist/pdist define it.
Value pnorm_last(Builder& b, Value d, double p) {
  const int64_t last = b.type(d).rank() - 1;
  if (p == 0.0) return b.sum(b.cast(b.ew(EwOp::k_ne, d, Scalar::of_int(0)), b.type(d).dtype), {last}, false);
  Value a = b.ew(EwOp::k_abs, d);
  if (std::isinf(p)) return b.reduce(ReduceKind::kMax, a, {last}, false);
  if (p == 1.0) return b.sum(a, {last}, false);
  if (p == 2.0) return b.ew(EwOp::k_sqrt, b.sum(b.ew(EwOp::k_mul, a, a), {last}, false));
  return b.ew(EwOp::k_pow, b.sum(b.ew(EwOp::k_pow, a, Scalar::of_float(p)), {last}, false), Scalar::of_float(1.0 / p));
}

// _cdist_forward(x1 [.., P, M], x2 [.., R, M], p, compute_mode) -> [.., P, R]. p = 2 uses the
// matrix-product form exactly when PyTorch does (compute_mode 1, or 0/None with P or R > 25).
Value cdist(Call& c) {
  Builder& b = c.b;
  Value x1 = c.tensor(0, "x1");
  Value x2 = c.tensor(1, "x2");
  const double p = c.float_or(2, "p", 2.0);
  const int64_t mode = c.int_or(3, "compute_mode", 0);
  if (p < 0) c.fail("cdist only supports non-negative p values");
  const TensorType t1 = b.type(x1), t2 = b.type(x2);
  const TensorType ot = c.out_type(0);
  if (ot.numel() == 0) return zeros(b, ot.dtype, ot.shape);
  const int64_t r1 = t1.shape[t1.shape.size() - 2], r2 = t2.shape[t2.shape.size() - 2];
  const int64_t m = t1.shape.back();
  Shape batch(ot.shape.begin(), ot.shape.end() - 2);
  Shape s1 = batch, s2 = batch;
  s1.insert(s1.end(), {r1, m});
  s2.insert(s2.end(), {r2, m});
  x1 = b.expand(x1, s1);
  x2 = b.expand(x2, s2);
  if (m == 0) return zeros(b, ot.dtype, ot.shape);
  if (p == 2.0 && (mode == 1 || (mode == 0 && (r1 > 25 || r2 > 25)))) {
    const int64_t r = static_cast<int64_t>(s1.size());
    Value n1 = b.sum(b.ew(EwOp::k_pow, x1, Scalar::of_int(2)), {r - 1}, true);
    Value n2 = b.sum(b.ew(EwOp::k_pow, x2, Scalar::of_int(2)), {r - 1}, true);
    Value a1 = c.b.graph().add(Op::kConcat, {b.ew(EwOp::k_mul, x1, Scalar::of_int(-2)), n1, b.full(Scalar::of_int(1), t1.dtype, b.type(n1).shape)}, [&] { Attrs a; a.axis = r - 1; return a; }());
    Value a2 = c.b.graph().add(Op::kConcat, {x2, b.full(Scalar::of_int(1), t2.dtype, b.type(n2).shape), n2}, [&] { Attrs a; a.axis = r - 1; return a; }());
    Value prod = b.matmul(a1, b.transpose(a2, -1, -2));
    return b.ew(EwOp::k_sqrt, b.ew(EwOp::k_maximum, prod, Scalar::of_int(0)));
  }
  Shape big = batch;
  big.insert(big.end(), {r1, r2, m});
  Value d = b.ew(EwOp::k_sub, b.expand(b.unsqueeze(x1, -2), big), b.expand(b.unsqueeze(x2, -3), big));
  return pnorm_last(b, d, p);
}

// _pdist_forward(x [N, M], p) -> [N (N - 1) / 2]: rows i < j in row-major order.
Value pdist(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const double p = c.float_or(1, "p", 2.0);
  const TensorType t = b.type(x);
  if (t.rank() != 2) c.fail("pdist only supports 2-D tensors, got " + t.str());
  const int64_t n = t.shape[0];
  std::vector<int64_t> ii, jj;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i + 1; j < n; ++j) {
      ii.push_back(i);
      jj.push_back(j);
    }
  }
  const int64_t k = static_cast<int64_t>(ii.size());
  if (k == 0 || t.shape[1] == 0) return zeros(b, t.dtype, {k});
  Attrs a;
  a.axis = 0;
  Value xi = b.graph().add(Op::kGather, {x, const_i64(b, ii, {k})}, a);
  Value xj = b.graph().add(Op::kGather, {x, const_i64(b, jj, {k})}, a);
  return pnorm_last(b, b.ew(EwOp::k_sub, xi, xj), p);
}

// ---- grid_sampler_2d ---------------------------------------------------------------------------

// PyTorch's reflect_coordinates: reflect `in` into [twice_low / 2, twice_high / 2].
Value reflect(Builder& b, Value in, int64_t twice_low, int64_t twice_high) {
  if (twice_low == twice_high) return b.full(Scalar::of_int(0), b.type(in).dtype, b.type(in).shape);
  const double mn = static_cast<double>(twice_low) / 2, span = static_cast<double>(twice_high - twice_low) / 2;
  Value a = b.ew(EwOp::k_abs, b.ew(EwOp::k_sub, in, Scalar::of_float(mn)));
  Value extra = b.ew(EwOp::k_fmod, a, Scalar::of_float(span));
  Value flips = b.ew(EwOp::k_floor, b.ew(EwOp::k_div, a, Scalar::of_float(span)));
  Value even = b.ew(EwOp::k_eq, b.ew(EwOp::k_fmod, flips, Scalar::of_float(2.0)), Scalar::of_float(0.0));
  Value up = b.ew(EwOp::k_add, extra, Scalar::of_float(mn));
  Value down = b.ew(EwOp::k_add, b.ew(EwOp::k_sub, b.full(Scalar::of_float(span), b.type(in).dtype, b.type(in).shape), extra), Scalar::of_float(mn));
  return where(b, even, up, down);
}

Value clip(Builder& b, Value v, int64_t size) {
  Value lo = b.ew(EwOp::k_maximum, v, Scalar::of_float(0.0));
  return b.ew(EwOp::k_minimum, lo, Scalar::of_float(static_cast<double>(size - 1)));
}

// grid_sampler_unnormalize: [-1, 1] to pixel coordinates.
Value unnormalize(Builder& b, Value coord, int64_t size, bool align) {
  if (align) {
    return b.ew(EwOp::k_mul, b.ew(EwOp::k_div, b.ew(EwOp::k_add, coord, Scalar::of_float(1.0)), Scalar::of_float(2.0)),
                Scalar::of_float(static_cast<double>(size - 1)));
  }
  return b.ew(EwOp::k_div, b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, b.ew(EwOp::k_add, coord, Scalar::of_float(1.0)), Scalar::of_float(static_cast<double>(size))), Scalar::of_float(1.0)),
              Scalar::of_float(2.0));
}

// compute_coordinates: the padding mode applied to pixel coordinates.
Value pad_coordinates(Builder& b, Value v, int64_t size, int64_t padding, bool align) {
  if (padding == 1) return clip(b, v, size);
  if (padding == 2) {
    v = align ? reflect(b, v, 0, 2 * (size - 1)) : reflect(b, v, -1, 2 * size - 1);
    return clip(b, v, size);
  }
  return v;
}

// Cubic convolution weights of PyTorch's upsampling (A = -0.75) for the four taps around t.
std::vector<Value> cubic_coefficients(Builder& b, Value t) {
  const double A = -0.75;
  auto conv1 = [&](Value x) {  // ((A + 2) x - (A + 3)) x x + 1
    Value r = b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, x, Scalar::of_float(A + 2)), Scalar::of_float(A + 3));
    return b.ew(EwOp::k_add, b.ew(EwOp::k_mul, b.ew(EwOp::k_mul, r, x), x), Scalar::of_float(1.0));
  };
  auto conv2 = [&](Value x) {  // ((A x - 5A) x + 8A) x - 4A
    Value r = b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, x, Scalar::of_float(A)), Scalar::of_float(5 * A));
    r = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, r, x), Scalar::of_float(8 * A));
    return b.ew(EwOp::k_sub, b.ew(EwOp::k_mul, r, x), Scalar::of_float(4 * A));
  };
  auto minus = [&](double a) { return b.ew(EwOp::k_sub, b.full(Scalar::of_float(a), b.type(t).dtype, b.type(t).shape), t); };
  return {conv2(b.ew(EwOp::k_add, t, Scalar::of_float(1.0))), conv1(t), conv1(minus(1.0)), conv2(minus(2.0))};
}

Value grid_sampler_2d(Call& c) {
  Builder& b = c.b;
  Value input = c.tensor(0, "input");
  Value grid = c.tensor(1, "grid");
  const int64_t interp = c.int_(2, "interpolation_mode");
  const int64_t padding = c.int_(3, "padding_mode");
  const bool align = c.bool_or(4, "align_corners", false);
  if (interp < 0 || interp > 2 || padding < 0 || padding > 2) c.fail("grid_sampler_2d: unknown interpolation or padding mode");
  const TensorType it = b.type(input), gt = b.type(grid);
  if (it.rank() != 4 || gt.rank() != 4 || gt.shape[3] != 2) c.fail("grid_sampler_2d: expects input [N, C, H, W] and grid [N, H, W, 2]");
  const int64_t n = it.shape[0], ch = it.shape[1], h = it.shape[2], w = it.shape[3];
  const int64_t ho = gt.shape[1], wo = gt.shape[2];
  const TensorType ot = c.out_type(0);
  if (ot.numel() == 0) return zeros(b, ot.dtype, ot.shape);
  if (h * w == 0) return zeros(b, ot.dtype, ot.shape);
  const DType ft = it.dtype;
  grid = b.cast(grid, ft);
  Value gx = b.reshape(b.slice(grid, 3, 0, 1, 1), {n, ho * wo});
  Value gy = b.reshape(b.slice(grid, 3, 1, 2, 1), {n, ho * wo});
  Value ux = unnormalize(b, gx, w, align), uy = unnormalize(b, gy, h, align);
  Value ix = pad_coordinates(b, ux, w, padding, align);
  Value iy = pad_coordinates(b, uy, h, padding, align);
  Value src = b.reshape(input, {n, ch, h * w});
  const Shape full = {n, ch, ho * wo};
  // Value at integer coordinates (xi, yi) (float tensors [n, ho wo]), 0 outside the image.
  auto fetch = [&](Value xi, Value yi) {
    Value inb = b.ew(EwOp::k_logical_and,
                     b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, xi, Scalar::of_float(0.0)), b.ew(EwOp::k_le, xi, Scalar::of_float(static_cast<double>(w - 1)))),
                     b.ew(EwOp::k_logical_and, b.ew(EwOp::k_ge, yi, Scalar::of_float(0.0)), b.ew(EwOp::k_le, yi, Scalar::of_float(static_cast<double>(h - 1)))));
    Value xc = b.cast(clip(b, xi, w), DType::kI64);
    Value yc = b.cast(clip(b, yi, h), DType::kI64);
    Value pos = b.ew(EwOp::k_add, b.ew(EwOp::k_mul, yc, Scalar::of_int(w)), xc);
    pos = b.expand(b.reshape(where(b, inb, pos, Scalar::of_int(0)), {n, 1, ho * wo}), full);
    Attrs a;
    a.axis = 2;
    Value v = b.graph().add(Op::kGatherElements, {src, pos}, a);
    return where(b, b.expand(b.reshape(inb, {n, 1, ho * wo}), full), v, Scalar::of_int(0));
  };
  auto bc = [&](Value v) { return b.expand(b.reshape(v, {n, 1, ho * wo}), full); };
  Value out;
  if (interp == 1) {
    out = fetch(b.ew(EwOp::k_round, ix), b.ew(EwOp::k_round, iy));
  } else if (interp == 2) {
    // Bicubic: 4x4 taps around the unpadded coordinate, each tap's coordinates padded on
    // their own (PyTorch's get_value_bounded), rows then columns combined.
    Value x0 = b.ew(EwOp::k_floor, ux), y0 = b.ew(EwOp::k_floor, uy);
    std::vector<Value> cx = cubic_coefficients(b, b.ew(EwOp::k_sub, ux, x0));
    std::vector<Value> cy = cubic_coefficients(b, b.ew(EwOp::k_sub, uy, y0));
    for (int i = 0; i < 4; ++i) {
      Value yi = pad_coordinates(b, b.ew(EwOp::k_add, y0, Scalar::of_float(i - 1.0)), h, padding, align);
      Value row;
      for (int j = 0; j < 4; ++j) {
        Value xj = pad_coordinates(b, b.ew(EwOp::k_add, x0, Scalar::of_float(j - 1.0)), w, padding, align);
        Value term = b.ew(EwOp::k_mul, fetch(xj, yi), bc(cx[static_cast<size_t>(j)]));
        row = row.valid() ? b.ew(EwOp::k_add, row, term) : term;
      }
      Value term = b.ew(EwOp::k_mul, row, bc(cy[static_cast<size_t>(i)]));
      out = out.valid() ? b.ew(EwOp::k_add, out, term) : term;
    }
  } else {
    Value x0 = b.ew(EwOp::k_floor, ix), y0 = b.ew(EwOp::k_floor, iy);
    Value x1 = b.ew(EwOp::k_add, x0, Scalar::of_float(1.0)), y1 = b.ew(EwOp::k_add, y0, Scalar::of_float(1.0));
    Value wx = b.ew(EwOp::k_sub, ix, x0), wy = b.ew(EwOp::k_sub, iy, y0);
    Value ex = b.ew(EwOp::k_sub, b.full(Scalar::of_float(1.0), ft, b.type(wx).shape), wx);
    Value sy = b.ew(EwOp::k_sub, b.full(Scalar::of_float(1.0), ft, b.type(wy).shape), wy);
    Value nw = b.ew(EwOp::k_mul, sy, ex), ne = b.ew(EwOp::k_mul, sy, wx);
    Value sw = b.ew(EwOp::k_mul, wy, ex), se = b.ew(EwOp::k_mul, wy, wx);
    out = b.ew(EwOp::k_mul, fetch(x0, y0), bc(nw));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x1, y0), bc(ne)));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x0, y1), bc(sw)));
    out = b.ew(EwOp::k_add, out, b.ew(EwOp::k_mul, fetch(x1, y1), bc(se)));
  }
  return b.reshape(out, {n, ch, ho, wo});
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
  // scatters
  t["aten.scatter.src"] = [](Call& c) { return one(scatter(c, false, -1)); };
  t["aten.scatter.value"] = [](Call& c) { return one(scatter(c, true, -1)); };
  t["aten.scatter.reduce"] = [](Call& c) { return one(scatter(c, false, reduce_mode(c, c.str_or(4, "reduce", "")))); };
  t["aten.scatter.value_reduce"] = [](Call& c) { return one(scatter(c, true, reduce_mode(c, c.str_or(4, "reduce", "")))); };
  t["aten.scatter_add.default"] = [](Call& c) { return one(scatter(c, false, 0)); };
  t["aten.scatter_reduce.two"] = [](Call& c) { return one(scatter_reduce(c)); };
  t["aten.masked_scatter.default"] = [](Call& c) { return one(masked_scatter(c)); };
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
  // embeddings, distances, sampling
  t["aten._embedding_bag.default"] = [](Call& c) { return embedding_bag(c); };
  t["aten._embedding_bag_forward_only.default"] = [](Call& c) { return embedding_bag(c); };
  t["aten.embedding_renorm.default"] = [](Call& c) { return one(embedding_renorm(c)); };
  t["aten._cdist_forward.default"] = [](Call& c) { return one(cdist(c)); };
  t["aten._pdist_forward.default"] = [](Call& c) { return one(pdist(c)); };
  t["aten.grid_sampler_2d.default"] = [](Call& c) { return one(grid_sampler_2d(c)); };
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

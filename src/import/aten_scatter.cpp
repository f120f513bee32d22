// Scatters: scatter (.src, .value, .reduce, .value_reduce), scatter_add, scatter_reduce and
// masked_scatter.
//
// Every scatter flattens the destination and becomes one IndexPut (attrs.reduce combines
// duplicates) whose flat indices come from an Iota plus the user's indices, which pass
// through a GatherElements of an Iota first so that an out-of-range index fails at run time
// with PyTorch's message (the index, the dimension and its size). masked_scatter numbers the
// mask's hits with a Scan and gathers the source at those numbers.
#include <string>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

using gu::axis_iota;
using gu::flat;
using gu::highest;
using gu::iota;
using gu::lowest;
using gu::scan;
using gu::where;
using gu::zeros;

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

}  // namespace

void register_aten_scatter(HandlerTable& t) {
  t["aten.scatter.src"] = [](Call& c) { return one(scatter(c, false, -1)); };
  t["aten.scatter.value"] = [](Call& c) { return one(scatter(c, true, -1)); };
  t["aten.scatter.reduce"] = [](Call& c) { return one(scatter(c, false, reduce_mode(c, c.str_or(4, "reduce", "")))); };
  t["aten.scatter.value_reduce"] = [](Call& c) { return one(scatter(c, true, reduce_mode(c, c.str_or(4, "reduce", "")))); };
  t["aten.scatter_add.default"] = [](Call& c) { return one(scatter(c, false, 0)); };
  t["aten.scatter_reduce.two"] = [](Call& c) { return one(scatter_reduce(c)); };
  t["aten.masked_scatter.default"] = [](Call& c) { return one(masked_scatter(c)); };
}

}  // namespace chroma

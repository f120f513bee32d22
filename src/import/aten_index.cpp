// ATen indexing ops: embedding, index_select, index.Tensor, gather, topk, sort-free argmax
// helpers. Bounds are checked at run time by the Gather kernels (IndexError), never skipped.
#include <algorithm>
#include <string>
#include <utility>

#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

Value gather(Builder& b, Value src, Value idx, int64_t axis) {
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kGather, {src, b.cast(idx, DType::kI64)}, a);
}

// Python-style negative indices: idx < 0 ? idx + n : idx.
Value wrap_negative(Builder& b, Value idx, int64_t n) {
  idx = b.cast(idx, DType::kI64);
  Value neg = b.ew(EwOp::k_lt, idx, Scalar::of_int(0));
  Value shifted = b.ew(EwOp::k_add, idx, Scalar::of_int(n));
  return b.ew(EwOp::k_where, {Operand::of(neg), Operand::of(shifted), Operand::of(idx)});
}

// The one index tensor of an `indices` list (None elsewhere) and the dimension it indexes.
std::pair<Value, int64_t> single_index(Call& c, const char* what) {
  std::vector<std::optional<Value>> idx = c.opt_tensors(1, "indices");
  int n_tensors = 0, pos = -1;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i]) {
      ++n_tensors;
      pos = static_cast<int>(i);
    }
  }
  if (n_tensors != 1) {
    c.fail(std::string(what) + " with " + std::to_string(n_tensors) + " index tensors is not supported yet (one is)");
  }
  return {*idx[static_cast<size_t>(pos)], pos};
}

// x[idx_1, ..., idx_k] with several index tensors (None elsewhere): the indexed dims are
// merged into one and indexed by the linear index sum_i idx_i * stride_i (the index tensors
// broadcast together). PyTorch's layout: adjacent index tensors put the broadcast index shape
// where the indexed dims were; separated ones put it first. A component out of its range
// makes the whole linear index out of range, so the Gather still raises IndexError.
Value multi_index(Call& c, Value src, const std::vector<std::optional<Value>>& idx) {
  Builder& b = c.b;
  const TensorType st = b.type(src);
  std::vector<int64_t> dims;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (!idx[i]) continue;
    if (b.type(*idx[i]).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
    dims.push_back(static_cast<int64_t>(i));
  }
  if (static_cast<int64_t>(idx.size()) > st.rank()) c.fail("too many indices for a tensor of rank " + std::to_string(st.rank()));
  const bool adjacent = dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  // Bring the indexed dims together: in place when adjacent, else to the front.
  std::vector<int64_t> perm;
  if (!adjacent) {
    perm = dims;
    for (int64_t d = 0; d < st.rank(); ++d) {
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) perm.push_back(d);
    }
    src = b.permute(src, perm);
  }
  const int64_t at = adjacent ? dims.front() : 0;
  const Shape ps = b.type(src).shape;
  const int64_t k = static_cast<int64_t>(dims.size());
  int64_t total = 1;
  for (int64_t i = 0; i < k; ++i) total *= ps[static_cast<size_t>(at + i)];
  Value lin, bad;
  int64_t stride = 1;
  for (int64_t i = k - 1; i >= 0; --i) {
    const int64_t n = ps[static_cast<size_t>(at + i)];
    Value ix = wrap_negative(b, *idx[static_cast<size_t>(dims[static_cast<size_t>(i)])], n);
    Value out_of_range = b.ew(EwOp::k_logical_or, b.ew(EwOp::k_lt, ix, Scalar::of_int(0)), b.ew(EwOp::k_ge, ix, Scalar::of_int(n)));
    Value term = stride == 1 ? ix : b.ew(EwOp::k_mul, ix, Scalar::of_int(stride));
    lin = lin.valid() ? b.ew(EwOp::k_add, lin, term) : term;
    bad = bad.valid() ? b.ew(EwOp::k_logical_or, bad, out_of_range) : out_of_range;
    stride *= n;
  }
  lin = b.ew(EwOp::k_where, {Operand::of(bad), Operand::of(Scalar::of_int(total)), Operand::of(lin)});
  Shape merged(ps.begin(), ps.begin() + at);
  merged.push_back(total);
  merged.insert(merged.end(), ps.begin() + at + k, ps.end());
  return gather(b, b.reshape(src, merged), lin, at);
}

Value index_tensor(Call& c) {
  Builder& b = c.b;
  Value src = c.tensor(0, "self");
  std::vector<std::optional<Value>> idx = c.opt_tensors(1, "indices");
  int n_tensors = 0;
  for (const auto& i : idx) n_tensors += i ? 1 : 0;
  if (n_tensors > 1) return multi_index(c, src, idx);
  auto [ix, pos] = single_index(c, "indexing");
  if (b.type(ix).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
  const int64_t n = b.type(src).shape.at(static_cast<size_t>(pos));
  return gather(b, src, wrap_negative(b, ix, n), pos);
}

// out = base with out[..., idx[i], ...] = values[..., i, ...] along `axis` (or +=). idx may
// have any shape (flattened); values broadcast to base's shape with idx's shape at `axis`.
Value index_put(Call& c, Value base, int64_t axis, Value idx, Value values, bool accumulate) {
  Builder& b = c.b;
  const TensorType bt = b.type(base);
  if (b.type(idx).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
  const int64_t dim = bt.shape.at(static_cast<size_t>(axis));
  idx = wrap_negative(b, idx, dim);
  const Shape ishape = b.type(idx).shape;
  Shape vshape(bt.shape.begin(), bt.shape.begin() + axis);
  vshape.insert(vshape.end(), ishape.begin(), ishape.end());
  vshape.insert(vshape.end(), bt.shape.begin() + axis + 1, bt.shape.end());
  values = b.expand(b.cast(values, bt.dtype), vshape);
  const int64_t n = numel(ishape);
  if (n == 0) return base;
  if (ishape.size() != 1) {
    idx = b.reshape(idx, {n});
    Shape flat(bt.shape.begin(), bt.shape.begin() + axis);
    flat.push_back(n);
    flat.insert(flat.end(), bt.shape.begin() + axis + 1, bt.shape.end());
    values = b.reshape(values, flat);
  }
  Attrs a;
  a.axis = axis;
  a.accumulate = accumulate;
  return b.graph().add(Op::kIndexPut, {base, idx, values}, a);
}

// Indices start, start + step, ... (count of them) as an int64 tensor.
Value arange(Builder& b, int64_t start, int64_t step, int64_t count) {
  Attrs a;
  a.dtype = DType::kI64;
  a.ints = {count};
  a.coeffs = {static_cast<double>(step)};
  a.scalar = Scalar::of_int(start);
  return b.graph().add(Op::kIota, {}, a);
}

std::vector<Value> topk(Call& c) {
  Value x = c.tensor(0, "self");
  Attrs a;
  a.k = c.int_(1, "k");
  a.axis = c.b.dim(c.int_or(2, "dim", -1), c.b.type(x).rank());
  a.largest = c.bool_or(3, "largest", true);
  a.sorted = c.bool_or(4, "sorted", true);
  Value v = c.b.graph().add(Op::kTopK, {x}, a);
  return {v, Value{v.node, 1}};
}

}  // namespace

void register_aten_index(HandlerTable& t) {
  t["aten.embedding.default"] = [](Call& c) { return one(gather(c.b, c.tensor(0, "weight"), c.tensor(1, "indices"), 0)); };
  t["aten.index_select.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
    Value idx = c.tensor(2, "index");
    if (c.b.type(idx).rank() == 0) idx = c.b.reshape(idx, {1});
    return one(gather(c.b, x, idx, axis));
  };
  t["aten.index.Tensor"] = [](Call& c) { return one(index_tensor(c)); };
  t["aten.gather.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    Attrs a;
    a.axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
    return one(c.b.graph().add(Op::kGatherElements, {x, c.b.cast(c.tensor(2, "index"), DType::kI64)}, a));
  };
  t["aten.topk.default"] = [](Call& c) { return topk(c); };
  t["aten.index_put.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    auto [ix, pos] = single_index(c, "index_put");
    return one(index_put(c, x, pos, ix, c.tensor(2, "values"), c.bool_or(3, "accumulate", false)));
  };
  t["aten.index_copy.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
    Value idx = c.tensor(2, "index");
    if (c.b.type(idx).rank() == 0) idx = c.b.reshape(idx, {1});
    return one(index_put(c, x, axis, idx, c.tensor(3, "source"), false));
  };
  t["aten.index_add.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const int64_t axis = c.b.dim(c.int_(1, "dim"), c.b.type(x).rank());
    Value idx = c.tensor(2, "index");
    if (c.b.type(idx).rank() == 0) idx = c.b.reshape(idx, {1});
    Value src = c.tensor(3, "source");
    const Scalar alpha = c.has(4, "alpha") ? c.scalar(4, "alpha") : Scalar::of_int(1);
    if (!(alpha.is_int ? alpha.i == 1 : alpha.f == 1.0)) src = c.b.ew(EwOp::k_mul, src, alpha);
    return one(index_put(c, x, axis, idx, src, true));
  };
  t["aten.slice_scatter.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    Value src = c.tensor(1, "src");
    const TensorType xt = c.b.type(x);
    const int64_t axis = c.b.dim(c.int_or(2, "dim", 0), xt.rank());
    const int64_t n = xt.shape[static_cast<size_t>(axis)];
    const int64_t step = c.int_or(5, "step", 1);
    if (step <= 0) c.fail("slice step must be positive");
    int64_t start = c.has(3, "start") ? c.int_(3, "start") : 0;
    int64_t end = c.has(4, "end") ? c.int_(4, "end") : n;
    if (start < 0) start += n;
    if (end < 0) end += n;
    start = std::clamp<int64_t>(start, 0, n);
    end = std::clamp<int64_t>(end, start, n);
    const int64_t count = (end - start + step - 1) / step;
    return one(index_put(c, x, axis, arange(c.b, start, step, count), src, false));
  };
  t["aten.select_scatter.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    const TensorType xt = c.b.type(x);
    const int64_t axis = c.b.dim(c.int_(2, "dim"), xt.rank());
    const int64_t n = xt.shape[static_cast<size_t>(axis)];
    int64_t index = c.int_(3, "index");
    if (index < -n || index >= n) c.fail("select_scatter index " + std::to_string(index) + " is out of range for size " + std::to_string(n));
    if (index < 0) index += n;
    Value src = c.b.unsqueeze(c.tensor(1, "src"), axis);
    return one(index_put(c, x, axis, arange(c.b, index, 1, 1), src, false));
  };
  t["aten.copy.default"] = [](Call& c) {
    Value dst = c.tensor(0, "self");
    const TensorType dt = c.b.type(dst);
    return one(c.b.expand(c.b.cast(c.tensor(1, "src"), dt.dtype), dt.shape));
  };
}

}  // namespace chroma

// ATen indexing ops: embedding, index_select, index.Tensor, gather, topk, sort-free argmax
// helpers. Bounds are checked at run time by the Gather kernels (IndexError), never skipped.
#include <algorithm>
#include <string>
#include <utility>

#include "import/aten.h"
#include "import/graph_util.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

Value gather(Builder& b, Value src, Value idx, int64_t axis) {
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kGather, {src, b.cast(idx, DType::kI64)}, a);
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

// Advanced indexing with several index tensors: they broadcast to one shape B; the indexed
// dimensions are merged into one (moved to the front first when they are not adjacent, as
// PyTorch places the result) and addressed by a flat index. Each index is checked against
// its own dimension by a Gather from an Iota (the identity on valid indices), so an
// out-of-range index fails at run time naming that dimension and its size.
struct MultiIndex {
  std::vector<int64_t> perm;  // self's dims reordered so the indexed ones form one block
  Shape permuted;             // self's shape after perm
  Shape pre, post;            // dims before and after the block
  Shape bshape;               // broadcast index shape
  Value flat;                 // int64 [bshape]: positions inside the block
  Value merged;               // self permuted, the block merged into one dimension
};

bool count_index_tensors(Call& c, int* n) {
  *n = 0;
  for (const auto& ix : c.opt_tensors(1, "indices")) *n += ix ? 1 : 0;
  return *n > 1;
}

MultiIndex multi_index(Call& c, Value self) {
  Builder& b = c.b;
  const TensorType st = b.type(self);
  const std::vector<std::optional<Value>> idx = c.opt_tensors(1, "indices");
  if (static_cast<int64_t>(idx.size()) > st.rank()) c.fail("too many indices for a tensor of rank " + std::to_string(st.rank()));
  std::vector<int64_t> pos, rest;
  Shape bshape;
  for (size_t i = 0; i < static_cast<size_t>(st.rank()); ++i) {
    if (i < idx.size() && idx[i]) {
      if (b.type(*idx[i]).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
      pos.push_back(static_cast<int64_t>(i));
      bshape = Builder::broadcast_shapes(bshape, b.type(*idx[i]).shape);
    } else {
      rest.push_back(static_cast<int64_t>(i));
    }
  }
  bool adjacent = true;
  for (size_t k = 1; k < pos.size(); ++k) adjacent = adjacent && pos[k] == pos[k - 1] + 1;
  MultiIndex m;
  m.bshape = bshape;
  if (adjacent) {
    for (int64_t d = 0; d < st.rank(); ++d) m.perm.push_back(d);
    m.pre.assign(st.shape.begin(), st.shape.begin() + pos.front());
    m.post.assign(st.shape.begin() + pos.back() + 1, st.shape.end());
  } else {
    m.perm = pos;
    m.perm.insert(m.perm.end(), rest.begin(), rest.end());
    for (int64_t d : rest) m.post.push_back(st.shape[static_cast<size_t>(d)]);
  }
  int64_t block = 1;
  for (int64_t p : pos) block *= st.shape[static_cast<size_t>(p)];
  Value flat;
  int64_t stride = 1;
  for (size_t k = pos.size(); k-- > 0;) {
    const int64_t p = pos[k];
    const int64_t n = st.shape[static_cast<size_t>(p)];
    Value ix = gu::wrap_negative(b, b.expand(*idx[static_cast<size_t>(p)], bshape), n);
    Shape src(static_cast<size_t>(st.rank()), 1);
    src[static_cast<size_t>(p)] = n;
    Attrs ia;
    ia.dtype = DType::kI64;
    ia.ints = src;
    ia.coeffs.assign(src.size(), 0.0);
    ia.coeffs[static_cast<size_t>(p)] = 1.0;
    ia.scalar = Scalar::of_int(0);
    Value checked = b.reshape(gather(b, b.graph().add(Op::kIota, {}, ia), ix, p), bshape);
    Value term = stride == 1 ? checked : b.ew(EwOp::k_mul, checked, Scalar::of_int(stride));
    flat = flat.valid() ? b.ew(EwOp::k_add, flat, term) : term;
    stride *= n;
  }
  m.flat = flat;
  m.permuted = b.type(b.permute(self, m.perm)).shape;
  Shape merged = m.pre;
  merged.push_back(block);
  merged.insert(merged.end(), m.post.begin(), m.post.end());
  m.merged = b.reshape(b.permute(self, m.perm), merged);
  return m;
}

Value index_tensor(Call& c) {
  Builder& b = c.b;
  Value src = c.tensor(0, "self");
  int n_tensors = 0;
  if (count_index_tensors(c, &n_tensors)) {
    MultiIndex m = multi_index(c, src);
    return gather(b, m.merged, m.flat, static_cast<int64_t>(m.pre.size()));
  }
  auto [ix, pos] = single_index(c, "indexing");
  if (b.type(ix).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
  const int64_t n = b.type(src).shape.at(static_cast<size_t>(pos));
  return gather(b, src, gu::wrap_negative(b, ix, n), pos);
}

// out = base with out[..., idx[i], ...] = values[..., i, ...] along `axis` (or +=). idx may
// have any shape (flattened); values broadcast to base's shape with idx's shape at `axis`.
Value index_put(Call& c, Value base, int64_t axis, Value idx, Value values, bool accumulate) {
  Builder& b = c.b;
  const TensorType bt = b.type(base);
  if (b.type(idx).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
  const int64_t dim = bt.shape.at(static_cast<size_t>(axis));
  idx = gu::wrap_negative(b, idx, dim);
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
  if (accumulate) a.dtype = bt.dtype;  // a half type: each addition rounded, as eager's CPU kernel
  return b.graph().add(Op::kIndexPut, {base, idx, values}, a);
}

// x[mask] = values (index_put with one boolean index covering dims [pos, pos + mask rank)):
// the output shape is fixed even though the number of selected elements is not. A value
// that does not vary along the selection is a `where`; otherwise the k-th selected element
// (row-major) takes values[k], k = running count of the mask - 1 (a Scan), read with a Gather
// that checks k against the number of values at run time.
Value mask_put(Call& c, Value x, int64_t pos, Value mask, Value values, bool accumulate) {
  Builder& b = c.b;
  const TensorType xt = b.type(x);
  const Shape ms = b.type(mask).shape;
  const size_t p = static_cast<size_t>(pos), mr = ms.size();
  if (p + mr > xt.shape.size() || !std::equal(ms.begin(), ms.end(), xt.shape.begin() + pos)) {
    c.fail("boolean mask " + shape_str(ms) + " does not match the indexed dimensions of " + xt.str());
  }
  const Shape pre(xt.shape.begin(), xt.shape.begin() + pos);
  const Shape post(xt.shape.begin() + pos + static_cast<int64_t>(mr), xt.shape.end());
  values = b.cast(values, xt.dtype);
  const Shape vs = b.type(values).shape;
  if (numel(vs) == 0) return x;
  Shape mfull(pre.size(), 1);
  mfull.insert(mfull.end(), ms.begin(), ms.end());
  mfull.insert(mfull.end(), post.size(), 1);
  Value m = b.expand(b.reshape(mask, mfull), xt.shape);
  Value picked;
  if (numel(vs) == 1 || vs.size() <= post.size()) {
    picked = b.expand(values, xt.shape);
  } else {
    const int64_t big_m = numel(ms);
    Shape flat_shape = pre;
    flat_shape.push_back(big_m);
    flat_shape.insert(flat_shape.end(), post.begin(), post.end());
    const int64_t count = vs[vs.size() - post.size() - 1];
    Shape vshape = pre;
    vshape.push_back(count);
    vshape.insert(vshape.end(), post.begin(), post.end());
    Value mflat = b.reshape(mask, {big_m});
    Attrs sa;
    sa.axis = 0;
    Value k = b.graph().add(Op::kScan, {b.cast(mflat, DType::kI64)}, sa);
    k = b.ew(EwOp::k_sub, k, Scalar::of_int(1));
    k = b.ew(EwOp::k_where, {Operand::of(mflat), Operand::of(k), Operand::of(Scalar::of_int(0))}, DType::kI64);
    picked = b.reshape(gather(b, b.expand(values, vshape), k, pos), xt.shape);
  }
  if (accumulate) picked = b.ew(EwOp::k_add, x, picked);
  return b.ew(EwOp::k_where, {Operand::of(m), Operand::of(picked), Operand::of(x)});
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
  if (c.b.type(x).rank() == 0) {
    // A 0-d tensor is its own top-1 (PyTorch accepts dim 0 or -1 and k = 1).
    if (c.int_(1, "k") != 1) c.fail("topk of a 0-d tensor takes k = 1, got k = " + std::to_string(c.int_(1, "k")));
    return {x, c.b.full(Scalar::of_int(0), DType::kI64, {})};
  }
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
    if (c.b.type(x).rank() == 0) {
      // A 0-d input acts as one element (the index must be 0); the result is 0-d again.
      if (c.b.type(idx).numel() != 1) c.fail("index_select on a 0-d tensor takes exactly one index");
      return one(c.b.reshape(gather(c.b, c.b.reshape(x, {1}), idx, 0), {}));
    }
    return one(gather(c.b, x, idx, axis));
  };
  t["aten.index.Tensor"] = [](Call& c) { return one(index_tensor(c)); };
  // gather(self, dim, index): a 0-d self or index counts as 1-D of one element (as in
  // PyTorch), and an empty index gives an empty result whatever its rank.
  t["aten.gather.default"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    Value idx = b.cast(c.tensor(2, "index"), DType::kI64);
    const Shape out_shape = b.type(idx).shape;
    if (b.type(idx).numel() == 0) return one(b.full(Scalar::of_int(0), b.type(x).dtype, out_shape));
    const bool scalar = b.type(x).rank() == 0 || b.type(idx).rank() == 0;
    if (scalar) {
      if (b.type(x).rank() > 1 || b.type(idx).rank() > 1)
        c.fail("gather: a 0-d self or index needs the other to have at most one dimension, got self " +
               b.type(x).str() + " and index " + b.type(idx).str());
      x = b.reshape(x, {b.type(x).numel()});
      idx = b.reshape(idx, {b.type(idx).numel()});
    }
    Attrs a;
    a.axis = b.dim(c.int_(1, "dim"), std::max<int64_t>(b.type(x).rank(), 1));
    Value out = b.graph().add(Op::kGatherElements, {x, idx}, a);
    return one(scalar ? b.reshape(out, out_shape) : out);
  };
  t["aten.topk.default"] = [](Call& c) { return topk(c); };
  t["aten.index_put.default"] = [](Call& c) {
    Value x = c.tensor(0, "self");
    int n_tensors = 0;
    if (count_index_tensors(c, &n_tensors)) {
      Builder& b = c.b;
      const TensorType xt = b.type(x);
      MultiIndex m = multi_index(c, x);
      const int64_t nb = numel(m.bshape);
      if (nb == 0) return one(x);
      Shape vshape = m.pre;
      vshape.insert(vshape.end(), m.bshape.begin(), m.bshape.end());
      vshape.insert(vshape.end(), m.post.begin(), m.post.end());
      Shape flat_shape = m.pre;
      flat_shape.push_back(nb);
      flat_shape.insert(flat_shape.end(), m.post.begin(), m.post.end());
      Value values = b.reshape(b.expand(b.cast(c.tensor(2, "values"), xt.dtype), vshape), flat_shape);
      Attrs a;
      a.axis = static_cast<int64_t>(m.pre.size());
      a.accumulate = c.bool_or(3, "accumulate", false);
      if (a.accumulate) a.dtype = xt.dtype;  // a half type: each addition rounded, as eager's CPU kernel
      Value out = b.graph().add(Op::kIndexPut, {m.merged, b.reshape(m.flat, {nb}), values}, a);
      out = b.reshape(out, m.permuted);
      std::vector<int64_t> inv(m.perm.size());
      for (size_t i = 0; i < m.perm.size(); ++i) inv[static_cast<size_t>(m.perm[i])] = static_cast<int64_t>(i);
      return one(b.permute(out, inv));
    }
    auto [ix, pos] = single_index(c, "index_put");
    if (c.b.type(ix).dtype == DType::kBool || c.b.type(ix).dtype == DType::kU8) {
      return one(mask_put(c, x, pos, c.b.cast(ix, DType::kBool), c.tensor(2, "values"), c.bool_or(3, "accumulate", false)));
    }
    return one(index_put(c, x, pos, ix, c.tensor(2, "values"), c.bool_or(3, "accumulate", false)));
  };
  // put(self, index, source, accumulate): index_put into the row-major flattened tensor.
  t["aten.put.default"] = [](Call& c) {
    Builder& b = c.b;
    Value x = c.tensor(0, "self");
    Value idx = c.tensor(1, "index");
    Value src = c.tensor(2, "source");
    if (is_float(b.type(idx).dtype) || b.type(idx).dtype == DType::kBool) c.fail("put: index must be an integer tensor, got " + b.type(idx).str());
    if (b.type(idx).numel() != b.type(src).numel())
      c.fail("put: index " + b.type(idx).str() + " and source " + b.type(src).str() + " must have the same number of elements");
    const Shape shape = b.type(x).shape;
    const int64_t n = b.type(x).numel();
    Value out = index_put(c, b.reshape(x, {n}), 0, b.reshape(b.cast(idx, DType::kI64), {b.type(idx).numel()}),
                          b.reshape(src, {b.type(src).numel()}), c.bool_or(3, "accumulate", false));
    return one(b.reshape(out, shape));
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

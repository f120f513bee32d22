// ATen indexing ops: embedding, index_select, index.Tensor, gather, topk, sort-free argmax
// helpers. Bounds are checked at run time by the Gather kernels (IndexError), never skipped.
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

Value index_tensor(Call& c) {
  Builder& b = c.b;
  Value src = c.tensor(0, "self");
  std::vector<std::optional<Value>> idx = c.opt_tensors(1, "indices");
  int n_tensors = 0, pos = -1;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i]) {
      ++n_tensors;
      pos = static_cast<int>(i);
    }
  }
  if (n_tensors != 1) c.fail("indexing with " + std::to_string(n_tensors) + " index tensors is not supported yet (one is)");
  Value ix = *idx[static_cast<size_t>(pos)];
  if (b.type(ix).dtype == DType::kBool) c.fail("boolean mask indexing has a data-dependent shape and cannot be compiled");
  const int64_t n = b.type(src).shape.at(static_cast<size_t>(pos));
  return gather(b, src, wrap_negative(b, ix, n), pos);
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
}

}  // namespace chroma

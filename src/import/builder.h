// Builder: graph-construction helpers shared by the ATen handlers. They turn PyTorch's
// implicit conventions into the IR's explicit ones: negative dims are normalized, broadcasts
// become Reshape + Expand, type promotion becomes Cast, Python scalars become Full.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace chroma {

// An operand of an elementwise ATen op: a tensor or a Python scalar.
struct Operand {
  Value tensor;             // valid() for tensors
  std::optional<Scalar> scalar;
  static Operand of(Value v) { return Operand{v, std::nullopt}; }
  static Operand of(Scalar s) { return Operand{Value{}, s}; }
};

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}
  Graph& graph() { return g_; }
  const TensorType& type(Value v) const { return g_.type(v); }

  // Normalizes a possibly negative dim for a tensor of `rank` (rank 0 accepts -1 and 0).
  int64_t dim(int64_t d, int64_t rank) const;

  Value reshape(Value v, const Shape& shape);
  Value permute(Value v, const std::vector<int64_t>& perm);
  Value transpose(Value v, int64_t d0, int64_t d1);
  Value expand(Value v, const Shape& shape);       // numpy-style: may add leading dims
  Value slice(Value v, int64_t axis, int64_t start, int64_t end, int64_t step);  // PyTorch clamping rules
  Value select(Value v, int64_t axis, int64_t index);
  Value unsqueeze(Value v, int64_t axis);
  Value cast(Value v, DType t) { return g_.cast(v, t); }
  // A half value rounded to its type inside one ATen operation, for the kernels PyTorch
  // writes in bfloat16/float16 arithmetic step by step (histc's bin position): a Cast to the
  // same type under a name of its own, which widen_half treats as an operation boundary.
  // Other types: v itself.
  Value round_half(Value v) {
    if (!is_half(type(v).dtype)) return v;
    const std::string name = g_.origin_name(), source = g_.origin_source();
    g_.set_origin(name + ".round", source);
    Attrs a;
    a.dtype = type(v).dtype;
    const Value r = g_.add(Op::kCast, {v}, a);
    g_.set_origin(name, source);
    return r;
  }
  Value full(Scalar s, DType t, const Shape& shape);

  // PyTorch's type promotion over tensors and Python scalars.
  DType promote(const std::vector<Operand>& ops) const;
  static Shape broadcast_shapes(const Shape& a, const Shape& b);
  // Elementwise op with PyTorch semantics: promotes to `compute` (or the promoted type),
  // broadcasts, applies `op`.
  Value ew(EwOp op, const std::vector<Operand>& ops, std::optional<DType> compute = std::nullopt);
  Value ew(EwOp op, Value a) { return ew(op, {Operand::of(a)}); }
  Value ew(EwOp op, Value a, Value b) { return ew(op, {Operand::of(a), Operand::of(b)}); }
  Value ew(EwOp op, Value a, Scalar b) { return ew(op, {Operand::of(a), Operand::of(b)}); }

  Value reduce(ReduceKind k, Value v, std::vector<int64_t> axes, bool keepdim);
  Value sum(Value v, std::vector<int64_t> axes, bool keepdim) { return reduce(ReduceKind::kSum, v, std::move(axes), keepdim); }
  Value mean(Value v, std::vector<int64_t> axes, bool keepdim);
  int64_t reduced_count(const TensorType& t, std::vector<int64_t> axes) const;
  // Variance with `correction` (Bessel: 1).
  Value var(Value v, std::vector<int64_t> axes, double correction, bool keepdim);
  Value softmax(Value v, int64_t axis, bool log);
  Value matmul(Value a, Value b);  // torch.matmul semantics (1-D, batched, broadcast)

 private:
  Graph& g_;
};

}  // namespace chroma

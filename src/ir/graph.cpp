#include "ir/graph.h"

#include <cmath>
#include <cstdio>

namespace chroma {

std::string Scalar::str() const {
  if (is_int) return std::to_string(i);
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", f);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

Value Graph::add(Op op, std::vector<Value> args, Attrs attrs) {
  for (const Value& v : args) {
    if (v.node < 0 || static_cast<size_t>(v.node) >= nodes_.size() ||
        v.index >= static_cast<int32_t>(nodes_[static_cast<size_t>(v.node)].types.size())) {
      throw CompileError("internal: " + std::string(op_info(op).name) + " reads an invalid value");
    }
  }
  std::vector<TensorType> types;
  try {
    types = infer_types(*this, op, args, attrs);
    for (const TensorType& t : types) check_tensor_size(t, "result");
  } catch (const CompileError& e) {
    std::string where = origin_name_.empty() ? "" : " (from node '" + origin_name_ + "'";
    if (!where.empty()) where += origin_source_.empty() ? ")" : " at " + origin_source_ + ")";
    throw CompileError(std::string(op_info(op).name) + where + ": " + e.what());
  }
  Node n;
  n.op = op;
  n.inputs = std::move(args);
  n.attrs = std::move(attrs);
  n.types = std::move(types);
  n.name = origin_name_;
  n.source = origin_source_;
  nodes_.push_back(std::move(n));
  return Value{static_cast<int32_t>(nodes_.size() - 1), 0};
}

Value Graph::input(const std::string& name, TensorType t) {
  Attrs a;
  a.index = static_cast<int64_t>(inputs.size());
  a.dtype = t.dtype;
  a.ints = t.shape;
  Value v = add(Op::kInput, {}, a);
  inputs.push_back(GraphInput{name, std::move(t), v.node});
  return v;
}

Value Graph::constant(ConstantData data) {
  Attrs a;
  a.index = static_cast<int64_t>(constants.size());
  a.dtype = data.type.dtype;
  a.ints = data.type.shape;
  constants.push_back(std::move(data));
  return add(Op::kConstant, {}, a);
}

Value Graph::map(EwOp op, std::vector<Value> args) {
  Attrs a;
  a.ew = op;
  return add(Op::kMap, std::move(args), a);
}

Value Graph::full(Scalar v, TensorType t) {
  Attrs a;
  a.scalar = v;
  a.dtype = t.dtype;
  a.ints = t.shape;
  return add(Op::kFull, {}, a);
}

Value Graph::cast(Value v, DType t) {
  if (type(v).dtype == t) return v;
  Attrs a;
  a.dtype = t;
  return add(Op::kCast, {v}, a);
}

std::string Graph::describe(int32_t id) const {
  const Node& n = node(id);
  std::string s = std::string(op_info(n.op).name) + " %" + std::to_string(id);
  if (!n.name.empty()) s += " (node '" + n.name + "')";
  if (!n.source.empty()) s += " at " + n.source;
  return s;
}

}  // namespace chroma

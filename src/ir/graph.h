// Chroma's graph IR.
//
// A Graph is a list of Nodes in topological order (a node only reads earlier nodes). Every
// node is an IR primitive from ops.def with static output types. Nodes are plain structs,
// built through Graph::add(), which runs the op's shape/dtype rule and throws CompileError
// when the inputs do not fit; a built graph is never mutated in place by passes: each pass
// reads one graph and builds the next (see passes/).
//
// Values: a Value names output `index` of node `node`. Constants (weights and folded
// results) live in Graph::constants and are referenced by Constant nodes.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/blob.h"
#include "ir/dtype.h"
#include "ir/op.h"

namespace chroma {

// A scalar attribute, kept exactly: integers as int64, floats as double.
struct Scalar {
  bool is_int = false;
  int64_t i = 0;
  double f = 0.0;
  static Scalar of_int(int64_t v) { return Scalar{true, v, static_cast<double>(v)}; }
  static Scalar of_float(double v) { return Scalar{false, static_cast<int64_t>(0), v}; }
  double as_double() const { return is_int ? static_cast<double>(i) : f; }
  bool operator==(const Scalar&) const = default;
  std::string str() const;
};

struct Attrs {
  EwOp ew = EwOp::kCount;                // Map
  ReduceKind reduce = ReduceKind::kSum;  // Reduce, ArgReduce
  DType dtype = DType::kF32;             // Cast; IndexPut with accumulate: a half type here rounds
                                         // each accumulation to it (eager's index_put/index_reduce)
  std::vector<int64_t> ints;             // Permute perm, Reshape shape, Reduce axes
  std::vector<double> coeffs;            // Iota
  Scalar scalar;                         // Full value, Iota base
  int64_t axis = 0, start = 0, end = 0, step = 1, k = 0;
  int64_t index = -1;                    // Input position, Constant slot
  bool keepdim = false, largest = true, sorted = true, log = false, accumulate = false;
  // (every field here must also be in the CSE key, src/passes/cse.cpp)
  bool operator==(const Attrs&) const = default;
};

struct Value {
  int32_t node = -1;
  int32_t index = 0;
  bool valid() const { return node >= 0; }
  auto operator<=>(const Value&) const = default;
};

struct Node {
  Op op = Op::kCount;
  std::vector<Value> inputs;
  Attrs attrs;
  std::vector<TensorType> types;  // one per output
  std::string name;               // user-facing name (from the exported graph) or ""
  std::string source;             // the user's source line, "" if unknown
  const TensorType& type(int i = 0) const { return types[static_cast<size_t>(i)]; }
};

// A constant tensor's bytes, shared between graphs (passes copy graphs, not weights).
struct ConstantData {
  TensorType type;
  std::string name;  // weight name ("" for folded constants)
  BlobPtr bytes;
  const uint8_t* data() const { return bytes->data(); }
};

// Persistent state: a module buffer the model reads and updates in place (a KV cache).
// Graph input `input` is its value before the call; graph output `output` its new value
// (-1: this graph does not update it). The runtime keeps one copy per loaded program,
// shared by all its entry points, initialized from `init`.
struct StateBinding {
  std::string name;
  int32_t input = -1;
  int32_t output = -1;
  ConstantData init;
};

struct GraphInput {
  std::string name;
  TensorType type;
  int32_t node = -1;
};

class Graph {
 public:
  // Appends a node after checking its inputs and inferring its output types.
  Value add(Op op, std::vector<Value> args, Attrs attrs = {});
  // Convenience builders.
  Value input(const std::string& name, TensorType t);
  Value constant(ConstantData data);
  Value map(EwOp op, std::vector<Value> args);
  Value full(Scalar v, TensorType t);
  Value cast(Value v, DType t);

  const Node& node(Value v) const { return nodes_[static_cast<size_t>(v.node)]; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const TensorType& type(Value v) const { return node(v).type(v.index); }
  const std::vector<Node>& nodes() const { return nodes_; }
  size_t size() const { return nodes_.size(); }

  // Name and source line stamped on nodes added from now on (the importer sets these per
  // ATen node so every primitive knows where it came from).
  void set_origin(std::string name, std::string source) {
    origin_name_ = std::move(name);
    origin_source_ = std::move(source);
  }

  const std::string& origin_name() const { return origin_name_; }
  const std::string& origin_source() const { return origin_source_; }

  std::vector<GraphInput> inputs;
  std::vector<Value> outputs;
  std::string output_structure = "single";  // "single" | "tuple" | "list"
  std::vector<ConstantData> constants;
  std::vector<StateBinding> states;  // inputs/outputs bound to persistent state
  int64_t folded_constants = 0;  // nodes replaced by constants so far (constant folding)

  // Where this node came from, for error messages: "node 'addmm' (model.py:12 ...)".
  std::string describe(int32_t id) const;

 private:
  std::vector<Node> nodes_;
  std::string origin_name_, origin_source_;
};

// Shape/dtype rules, one per op (src/ir/infer.cpp), dispatched through the op table.
std::vector<TensorType> infer_types(const Graph& g, Op op, const std::vector<Value>& inputs,
                                    const Attrs& attrs);

// Checks structural invariants (topological order, arity, types re-inferred equal, outputs
// valid). Returns "" when the graph is well-formed, else a description of the first problem.
std::string verify(const Graph& g);

// The text form of the IR, used by golden tests and CHROMA_DUMP_IR.
std::string print(const Graph& g);
// Parses the text form back (src/ir/parser.cpp); throws CompileError with line:column.
Graph parse(const std::string& text);

}  // namespace chroma

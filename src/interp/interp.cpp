// The reference interpreter's entry points: eval_node() checks a node's inputs against the
// graph's types and dispatches to the op's kernel through a table generated from ops.def
// (a new op without an eval_Name kernel does not link); run() evaluates a whole graph.
#include "interp/interp.h"

#include <algorithm>
#include <array>
#include <string>

#include "interp/kernels.h"

namespace chroma::interp {

Tensor Tensor::zeros(TensorType t) {
  BlobPtr buf = make_blob(std::vector<uint8_t>(static_cast<size_t>(t.nbytes()), uint8_t{0}));
  return Tensor{std::move(t), std::move(buf)};
}

Tensor Tensor::from_constant(const ConstantData& c) { return Tensor{c.type, c.bytes}; }

// Input nodes have no value of their own: run() supplies it.
Tensors eval_Input(const Node&, const Tensors&) {
  throw CompileError("an Input node has no value outside interp::run()");
}

// Constant nodes are resolved against Graph::constants by eval_node()/run(), which know the
// graph; the kernel itself is never reached.
Tensors eval_Constant(const Node&, const Tensors&) {
  throw CompileError("internal: Constant evaluated without its graph");
}

namespace {

using Kernel = Tensors (*)(const Node&, const Tensors&);
constexpr std::array<Kernel, static_cast<size_t>(Op::kCount)> kKernels = {{
#define CHROMA_OP(name, cls, arity, outs) &eval_##name,
#include "ir/ops.def"
#undef CHROMA_OP
}};

void check_value(const Tensor& t, const TensorType& expected, const std::string& what) {
  if (t.type != expected) {
    throw CompileError(what + " has type " + t.type.str() + ", expected " + expected.str());
  }
  const int64_t have = t.bytes ? static_cast<int64_t>(t.bytes->size()) : 0;
  if (have < expected.nbytes()) {
    throw CompileError(what + " holds " + std::to_string(have) + " bytes, " + expected.str() + " needs " +
                       std::to_string(expected.nbytes()));
  }
}

Tensor constant_value(const Graph& g, const Node& n) {
  const int64_t slot = n.attrs.index;
  if (slot < 0 || slot >= static_cast<int64_t>(g.constants.size())) {
    throw CompileError("constant slot " + std::to_string(slot) + " does not exist");
  }
  Tensor t = Tensor::from_constant(g.constants[static_cast<size_t>(slot)]);
  check_value(t, n.type(), "constant " + std::to_string(slot));
  return t;
}

}  // namespace

std::vector<Tensor> eval_node(const Graph& g, int32_t id, const std::vector<Tensor>& inputs) {
  if (id < 0 || static_cast<size_t>(id) >= g.size()) {
    throw CompileError("internal: interp::eval_node on node " + std::to_string(id) + " of a graph with " +
                       std::to_string(g.size()) + " nodes");
  }
  const Node& n = g.node(id);
  try {
    if (inputs.size() != n.inputs.size()) {
      throw CompileError("internal: given " + std::to_string(inputs.size()) + " inputs, the node has " +
                         std::to_string(n.inputs.size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      check_value(inputs[i], g.type(n.inputs[i]), "input " + std::to_string(i));
    }
    if (n.op == Op::kConstant) return {constant_value(g, n)};
    if (n.op >= Op::kCount) throw CompileError("internal: invalid op");
    Tensors out = kKernels[static_cast<size_t>(n.op)](n, inputs);
    if (out.size() != n.types.size()) throw CompileError("internal: kernel returned the wrong number of results");
    for (size_t i = 0; i < out.size(); ++i) check_value(out[i], n.types[i], "internal: result " + std::to_string(i));
    return out;
  } catch (const CompileError& e) {
    throw CompileError(g.describe(id) + ": " + e.what());
  }
}

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs) {
  if (inputs.size() != g.inputs.size()) {
    throw CompileError("the graph takes " + std::to_string(g.inputs.size()) + " inputs, got " +
                       std::to_string(inputs.size()));
  }
  const size_t count = g.size();
  // Liveness: evaluate only what the outputs need; remember each node's last reader so its
  // values can be dropped early (folding large graphs should not hold every intermediate).
  std::vector<bool> live(count, false);
  for (const Value& v : g.outputs) {
    if (v.node < 0 || static_cast<size_t>(v.node) >= count) throw CompileError("graph output refers to no node");
    live[static_cast<size_t>(v.node)] = true;
  }
  std::vector<size_t> last_use(count, 0);
  for (size_t i = count; i-- > 0;) {
    if (!live[i]) continue;
    for (const Value& v : g.node(static_cast<int32_t>(i)).inputs) {
      const size_t p = static_cast<size_t>(v.node);
      live[p] = true;
      last_use[p] = std::max(last_use[p], i);
    }
  }
  std::vector<bool> is_output(count, false);
  for (const Value& v : g.outputs) is_output[static_cast<size_t>(v.node)] = true;

  std::vector<Tensors> values(count);
  for (size_t i = 0; i < count; ++i) {
    if (!live[i]) continue;
    const int32_t id = static_cast<int32_t>(i);
    const Node& n = g.node(id);
    if (n.op == Op::kInput) {
      const int64_t pos = n.attrs.index;
      if (pos < 0 || pos >= static_cast<int64_t>(inputs.size())) {
        throw CompileError(g.describe(id) + ": input position " + std::to_string(pos) + " does not exist");
      }
      const std::string& name = g.inputs[static_cast<size_t>(pos)].name;
      try {
        check_value(inputs[static_cast<size_t>(pos)], n.type(), "input '" + name + "'");
      } catch (const CompileError& e) {
        throw CompileError(g.describe(id) + ": " + e.what());
      }
      values[i] = {inputs[static_cast<size_t>(pos)]};
      continue;
    }
    Tensors args;
    args.reserve(n.inputs.size());
    for (const Value& v : n.inputs) args.push_back(values[static_cast<size_t>(v.node)][static_cast<size_t>(v.index)]);
    values[i] = eval_node(g, id, args);
    for (const Value& v : n.inputs) {
      const size_t p = static_cast<size_t>(v.node);
      if (last_use[p] == i && !is_output[p]) values[p].clear();
    }
  }
  std::vector<Tensor> result;
  result.reserve(g.outputs.size());
  for (const Value& v : g.outputs) {
    const Tensors& t = values[static_cast<size_t>(v.node)];
    if (v.index < 0 || static_cast<size_t>(v.index) >= t.size()) throw CompileError("graph output refers to no value");
    result.push_back(t[static_cast<size_t>(v.index)]);
  }
  return result;
}

}  // namespace chroma::interp

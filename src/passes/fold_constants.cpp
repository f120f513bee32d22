#include "passes/fold_constants.h"

#include <map>

#include "interp/interp.h"
#include "passes/rewrite.h"

namespace chroma {
namespace {

bool is_symbolic_constant(Op op) { return op == Op::kConstant || op == Op::kFull || op == Op::kIota || is_view(op); }

class Folder {
 public:
  Folder(const Graph& g, bool keep_half) : g_(g), rw_(g), known_(g.size(), false), keep_half_(keep_half) {}

  Graph run() {
    for (size_t i = 0; i < g_.size(); ++i) {
      const auto id = static_cast<int32_t>(i);
      const Node& n = g_.node(id);
      bool all_known = n.op != Op::kInput;
      for (Value v : n.inputs) all_known = all_known && known_[static_cast<size_t>(v.node)];
      if (!all_known) {
        rw_.copy(id);
        continue;
      }
      known_[i] = true;
      int64_t bytes = 0;
      for (const TensorType& t : n.types) bytes += t.nbytes();
      const bool half_weight = keep_half_ && n.op == Op::kCast && is_half(g_.type(n.inputs[0]).dtype);
      if (is_symbolic_constant(n.op) || half_weight || bytes > kMaxFoldBytes) {
        if (bytes > kMaxFoldBytes && !is_symbolic_constant(n.op)) known_[i] = false;
        rw_.copy(id);
        continue;
      }
      std::vector<interp::Tensor> ins;
      for (Value v : n.inputs) ins.push_back(value(v));
      std::vector<interp::Tensor> outs = interp::eval_node(g_, id, ins);
      std::vector<Value> repl;
      rw_.out().set_origin(n.name, n.source);
      for (interp::Tensor& t : outs) {
        ConstantData c;
        c.type = t.type;
        c.bytes = t.bytes;
        repl.push_back(rw_.out().constant(std::move(c)));
      }
      for (size_t k = 0; k < outs.size(); ++k) cache_[Value{id, static_cast<int32_t>(k)}] = outs[k];
      rw_.replace(id, repl);
      ++folded_;
    }
    Graph r = rw_.finish();
    r.folded_constants += folded_;
    return r;
  }

 private:
  const Graph& g_;
  GraphRewriter rw_;
  std::vector<bool> known_;
  std::map<Value, interp::Tensor> cache_;
  int64_t folded_ = 0;
  bool keep_half_ = false;

  // Dense value of a known node of the source graph.
  interp::Tensor value(Value v) {
    auto it = cache_.find(v);
    if (it != cache_.end()) return it->second;
    const Node& n = g_.node(v);
    interp::Tensor t;
    if (n.op == Op::kConstant) {
      t = interp::Tensor::from_constant(g_.constants[static_cast<size_t>(n.attrs.index)]);
    } else {
      std::vector<interp::Tensor> ins;
      for (Value in : n.inputs) ins.push_back(value(in));
      t = interp::eval_node(g_, v.node, ins)[static_cast<size_t>(v.index)];
    }
    cache_[v] = t;
    return t;
  }
};

}  // namespace

Graph fold_constants(const Graph& g) { return Folder(g, false).run(); }
Graph fold_constants_keep_half(const Graph& g) { return Folder(g, true).run(); }

}  // namespace chroma

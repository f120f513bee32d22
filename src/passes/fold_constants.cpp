#include "passes/fold_constants.h"

#include <algorithm>
#include <map>
#include <vector>

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
      // A half constant's conversion to float32 that only products read: a bfloat16 one stays a
      // Cast (the products' bf16 kernels read it as it is); a float16 one is folded whatever its
      // size (the products pack float32 panels of it; converting it at every call instead cost
      // time on every call: bench/results/README.md).
      const bool half_cast = n.op == Op::kCast && is_half(g_.type(n.inputs[0]).dtype);
      const bool for_products = half_cast && !keep_half_ && only_products_read(id);
      const bool half_weight = half_cast && (keep_half_ || (for_products && g_.type(n.inputs[0]).dtype == DType::kBF16));
      const bool too_big = bytes > kMaxFoldBytes && bytes > stored_bytes_read(n) && !for_products;
      if (is_symbolic_constant(n.op) || half_weight || too_big) {
        if (too_big && !is_symbolic_constant(n.op)) known_[i] = false;
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

  // The bytes of the stored constants node n reads (through views; each once): Constants and
  // values folded already, not Full or Iota. A result no larger than that is folded whatever
  // its size: it does not grow the weights beyond what its operands hold, and the operands
  // are usually dropped once nothing else reads them (a convolution's weight times its batch
  // norm's scale: a 1024 x 1024 x 3 x 3 one was computed and reordered at every call).
  int64_t stored_bytes_read(const Node& n) const {
    std::vector<int32_t> seen;
    int64_t total = 0;
    for (Value v : n.inputs) {
      int32_t s = v.node;
      while (is_view(g_.node(s).op) && !g_.node(s).inputs.empty()) s = g_.node(s).inputs[0].node;
      const Op op = g_.node(s).op;
      if (op == Op::kFull || op == Op::kIota || std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      for (const TensorType& t : g_.node(s).types) total += t.nbytes();
    }
    return total;
  }

  // True when every reader of node `id`'s value, seen through views, is a matrix product that
  // takes it as its right operand, or a Gather of experts (a stack's matrices along axis 0)
  // that only products read. A bfloat16 weight's conversion to float32 that only
  // products read stays a Cast on the CPU too, so that the lowering packs the 16-bit weights
  // as they are (Lowerer::packed_matmul: the bf16 product kernels, half the bytes of a float32
  // copy) whatever their size (a float32 copy over kMaxFoldBytes was converted at every call).
  // Any other reader (a convolution, a gathered expert product, an elementwise op) keeps the
  // float32 folding.
  bool only_products_read(int32_t id) {
    if (users_.empty()) {
      users_.resize(g_.size());
      for (size_t u = 0; u < g_.size(); ++u) {
        const Node& un = g_.node(static_cast<int32_t>(u));
        for (size_t k = 0; k < un.inputs.size(); ++k) {
          users_[static_cast<size_t>(un.inputs[k].node)].push_back({static_cast<int32_t>(u), static_cast<int32_t>(k)});
        }
      }
      for (const Value& v : g_.outputs) users_[static_cast<size_t>(v.node)].push_back({-1, 0});
    }
    // (node, true once past a Gather of experts: then any operand of a product will do)
    std::vector<std::pair<int32_t, bool>> todo = {{id, false}};
    bool any = false;
    while (!todo.empty()) {
      const auto [x, gathered] = todo.back();
      todo.pop_back();
      for (const auto& [u, k] : users_[static_cast<size_t>(x)]) {
        if (u < 0) return false;  // a graph output
        const Node& un = g_.node(u);
        if (is_view(un.op) && k == 0) {
          todo.push_back({u, gathered});
        } else if (un.op == Op::kMatMul && (k == 1 || gathered)) {
          any = true;
        } else if (un.op == Op::kGather && k == 0 && !gathered && un.attrs.axis == 0 && un.type().shape.size() >= 3) {
          todo.push_back({u, true});  // experts picked from a stack, read in place by the products
        } else {
          return false;
        }
      }
    }
    return any;
  }
  std::vector<std::vector<std::pair<int32_t, int32_t>>> users_;  // per node: (reader, input index)

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

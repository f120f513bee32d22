#include "passes/rewrite.h"

#include <cstdio>
#include <cstdlib>

namespace chroma {

GraphRewriter::GraphRewriter(const Graph& src) : src_(src), map_(src.size()) {}

Value GraphRewriter::map(Value v) const {
  const auto& m = map_.at(static_cast<size_t>(v.node));
  if (static_cast<size_t>(v.index) >= m.size()) throw CompileError("internal: rewrite reads an unmapped value");
  return m[static_cast<size_t>(v.index)];
}

std::vector<Value> GraphRewriter::map(const std::vector<Value>& vs) const {
  std::vector<Value> r;
  r.reserve(vs.size());
  for (Value v : vs) r.push_back(map(v));
  return r;
}

void GraphRewriter::copy(int32_t id) {
  const Node& n = src_.node(id);
  dst_.set_origin(n.name, n.source);
  Value v;
  if (n.op == Op::kInput) {
    const GraphInput& in = src_.inputs.at(static_cast<size_t>(n.attrs.index));
    v = dst_.input(in.name, in.type);
  } else if (n.op == Op::kConstant) {
    v = dst_.constant(src_.constants.at(static_cast<size_t>(n.attrs.index)));
  } else {
    v = dst_.add(n.op, map(n.inputs), n.attrs);
  }
  std::vector<Value> outs;
  for (size_t i = 0; i < n.types.size(); ++i) outs.push_back(Value{v.node, static_cast<int32_t>(i)});
  map_[static_cast<size_t>(id)] = std::move(outs);
}

void GraphRewriter::replace(int32_t id, std::vector<Value> vals) { map_[static_cast<size_t>(id)] = std::move(vals); }

Graph GraphRewriter::finish() {
  dst_.set_origin("", "");
  dst_.outputs = map(src_.outputs);
  dst_.output_structure = src_.output_structure;
  dst_.states = src_.states;
  dst_.folded_constants += src_.folded_constants;
  return std::move(dst_);
}

Graph run_pass(const char* name, const std::function<Graph(const Graph&)>& pass, const Graph& g) {
  Graph r = pass(g);
  static const bool dump = std::getenv("CHROMA_DUMP_IR") != nullptr;
#ifdef NDEBUG
  static const bool check = std::getenv("CHROMA_VERIFY") != nullptr;
#else
  static const bool check = true;
#endif
  if (check) {
    std::string err = verify(r);
    if (!err.empty()) throw CompileError(std::string("internal: IR invalid after pass ") + name + ": " + err);
  }
  if (dump) std::fprintf(stderr, "// ---- after %s ----\n%s", name, print(r).c_str());
  return r;
}

}  // namespace chroma

#include "passes/dce.h"

#include "passes/rewrite.h"

namespace chroma {

Graph eliminate_dead_code(const Graph& g) {
  std::vector<bool> live(g.size(), false);
  for (Value v : g.outputs) live[static_cast<size_t>(v.node)] = true;
  for (size_t i = g.size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::kInput) live[i] = true;
    if (!live[i]) continue;
    for (Value v : n.inputs) live[static_cast<size_t>(v.node)] = true;
  }
  GraphRewriter rw(g);
  for (size_t i = 0; i < g.size(); ++i) {
    if (live[i]) rw.copy(static_cast<int32_t>(i));
  }
  return rw.finish();
}

}  // namespace chroma

// GraphRewriter: the machinery every pass uses to build its output graph from its input.
// Nodes are visited in order; a pass either copies a node (copy()) or supplies replacement
// values (replace()); consumers are remapped automatically.
#pragma once

#include <functional>

#include <vector>

#include "ir/graph.h"

namespace chroma {

class GraphRewriter {
 public:
  explicit GraphRewriter(const Graph& src);
  Graph& out() { return dst_; }
  const Graph& src() const { return src_; }
  // The new value standing for old value `v`.
  Value map(Value v) const;
  std::vector<Value> map(const std::vector<Value>& vs) const;
  // Copies node `id` with remapped inputs (Input and Constant nodes keep their data).
  void copy(int32_t id);
  // Node `id`'s outputs are `vals` in the new graph.
  void replace(int32_t id, std::vector<Value> vals);
  // Sets outputs and structure; returns the new graph.
  Graph finish();

 private:
  const Graph& src_;
  Graph dst_;
  std::vector<std::vector<Value>> map_;
};

// Runs a pass and, when CHROMA_DUMP_IR is set, prints the IR after it; in debug builds (and
// when CHROMA_VERIFY is set) runs the verifier after it.
Graph run_pass(const char* name, const std::function<Graph(const Graph&)>& pass, const Graph& g);

}  // namespace chroma

#pragma once
#include "ir/graph.h"
namespace chroma {
// Common-subexpression elimination. Assumes: a valid graph. Guarantees: no two non-Input
// nodes have the same op, attributes and inputs; Constant nodes referring to identical
// bytes are merged too (so equal weights become one buffer).
Graph eliminate_common_subexpressions(const Graph& g);
}  // namespace chroma

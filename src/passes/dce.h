#pragma once
#include "ir/graph.h"
namespace chroma {
// Dead-code elimination. Assumes: a valid graph. Guarantees: only nodes that contribute to
// an output remain (Input nodes always remain, so the signature is unchanged); order kept.
Graph eliminate_dead_code(const Graph& g);
}  // namespace chroma

// What route_experts (passes/routed_experts.h) found about a matrix product and the lowering
// (lower/program.h, LowerOptions::routed) uses to skip, at run time, the experts no token
// selected: an annotation of the rewritten graph's MatMul node, kept beside the graph by node id.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace chroma {

struct RoutedProduct {
  Value mask;            // float32 [E] in the rewritten graph (0: no token selected e)
  int64_t axis = 0;      // the product's output axis that carries e
  int64_t step = 1;      // e = (index along axis / step) % experts
  int64_t experts = 0;
};

}  // namespace chroma

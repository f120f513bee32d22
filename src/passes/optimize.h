// The optimizing passes every target runs, in their fixed order (src/pipeline.cpp calls it
// between the import and the target's own passes).
#pragma once

#include "ir/graph.h"

namespace chroma {

// widen_half, DCE, fold_constants, DCE, CSE, DCE. `keep_half_weights` (GPU targets): float16
// and bfloat16 weights stay in 16 bits, converted by the kernels that read them
// (fold_constants_keep_half); the CPU folds them to float32 at compile time (BLAS and the
// pre-packed products read float32).
Graph optimize(const Graph& g, bool keep_half_weights = false);

}  // namespace chroma

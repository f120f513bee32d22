#pragma once
#include "ir/graph.h"
namespace chroma {
// Attention as one op. Finds softmax(q @ kt [* or / a scalar] [+ bias]) @ v, the softmax over
// the scores' last axis, in whatever form the importer left it (the products on
// batch-flattened operands with reshapes around them, float32 casts of float32 values) and
// replaces the second product with one Attention node (ops.def) over the softmax's batch
// dimensions, so the lowering can run it as one kernel that never holds the scores.
// Assumes: a valid graph. Guarantees: the same values, a float32 attention whose scores,
// weights and intermediate values are read by nothing else becomes an Attention node (the
// other forms are left as they are); dead nodes removed. `max_width` > 0: only attention whose
// query/key rows (D) and value rows (E) are at most that wide (a GPU kernel holds a row of each
// per invocation: codegen/gpu kAttentionMaxWidth); wider ones are left as they are.
Graph fuse_attention(const Graph& g, int64_t max_width = 0);
}  // namespace chroma

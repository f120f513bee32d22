#pragma once
#include "ir/graph.h"
namespace chroma {
// Constant folding. Assumes: a valid graph. Guarantees: every node whose inputs are all
// known at compile time (Constant, Full, Iota, and views of them) and whose result is at
// most kMaxFoldBytes, or no larger than the stored constants it reads (a weight times a
// per-channel scale), is replaced by a Constant computed with the reference kernels
// (src/interp, the same ones the tests trust). Full, Iota and views themselves are left
// symbolic: they cost nothing at run time and folding them would only grow the weights.
// Graph::folded_constants counts the replaced nodes. Run DCE afterwards.
// Half weights read only by matrix products (as their right operand, through views): a
// bfloat16 constant's conversion to float32 stays a Cast (the CPU's bf16 product kernels read
// the 16 bits; Lowerer::packed_matmul), a float16 one is folded whatever its size.
Graph fold_constants(const Graph& g);
// The same, except that a half constant's conversion to float32 (widen_half's Cast) stays a
// Cast: the weights keep their 16 bits and the kernels that read them convert (GPU targets,
// where the conversion fuses into the reading kernel and the weights' bytes are the cost).
Graph fold_constants_keep_half(const Graph& g);
inline constexpr int64_t kMaxFoldBytes = 16 << 20;
}  // namespace chroma

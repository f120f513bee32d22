#pragma once
#include "ir/graph.h"
namespace chroma {
// float64 constants that only ever feed float32, stored as float32 (targets that cannot store
// float64: the GPU targets). A constant folded in float64 (RoPE frequencies computed in
// float64, FluxPosEmbed's) or a float64 weight whose every reader, seen through views
// (Reshape, Expand, Permute, Slice, Flip), is a Cast to float32 becomes a float32 constant
// holding the same values rounded to float32, its views float32 views and its Casts the views
// themselves. Exact: a view moves elements without changing them, so rounding before the view
// gives the bits rounding after it gives. (The folder leaves such a Cast unfolded when its
// result would be large: an expand of the constant past kMaxFoldBytes.)
// Assumes: a valid graph. Guarantees: the same values; no float64 Constant whose readers are
// only such chains remains; other float64 values (a computation that reads a run-time input)
// are left as they are, for the target to refuse with their node; dead nodes removed.
Graph narrow_float64_constants(const Graph& g);
}  // namespace chroma

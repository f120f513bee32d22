// The templates of the lowered kernel kinds other than products and convolutions
// (docs/gpu_generator.md, "Layers", B; those are in kernel_builder.h, from products.cpp), as
// generate() (templates.cpp) calls them, and the row split they share. Each template builds
// one dispatch into a KB from a lowered kernel, reads its fused expressions through KB::eval
// (so any fused tree, view or broadcast is read in place) and writes through the output
// layouts; none knows the dialect. Internal to src/codegen/gpu.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "codegen/gpu/kernel_builder.h"

namespace chroma::gpu::internal {

// The split of an iteration space into kept (output) and reduced dimensions.
struct Split {
  Shape kept, reduced;
  std::vector<size_t> kept_dims, reduced_dims;
  size_t rank = 0;
  int64_t outputs() const { return numel(kept); }
  int64_t extent() const { return numel(reduced); }
};
Split split(const Shape& shape, const std::vector<bool>& mask);
// The coordinates of element `r` of kept row `o`.
std::vector<Ex> merge(Block& b, const Split& s, const Ex& o, const Ex& r);
// A reduction's identity in compute type `t`, and its combination of two values of dtype `t`
// (NaN-propagating max and min, narrow integers wrapped).
Ex identity(ReduceKind r, Ty t);
std::function<Ex(Block&, Ex, Ex)> combiner(ReduceKind r, DType t);
// The dimensions a reduction reduces (its attrs.ints), or an axis kernel's axis.
std::vector<bool> reduced_mask(const chroma::Kernel& lk);

// Assignments and concatenations (templates.cpp).
void t_assign(KB& kb, const chroma::Kernel& lk);
void t_concat(KB& kb, const chroma::Kernel& lk);

// Reductions along rows (reductions.cpp): reductions, row groups (a reduction and the kernels
// that finish its rows, as one dispatch; row_group gives the members, one when there is no
// group), softmax, arg-max/min and inclusive scans.
void t_reduce(KB& kb, const chroma::Kernel& lk, const Program& p);
std::vector<size_t> row_group(const Program& p, const std::function<Placement(int32_t)>& place, size_t first);
void t_row_group(KB& kb, const Program& p, const std::vector<size_t>& members);
void t_softmax(KB& kb, const chroma::Kernel& lk);
void t_arg_reduce(KB& kb, const chroma::Kernel& lk);
void t_scan(KB& kb, const chroma::Kernel& lk, const Program& p);

// Attention in one dispatch (attention.cpp): softmax(q kt (*|/) scale + bias) v with an online
// softmax, keys and values in blocks of attention_key_block(D, E, the device's workgroup
// memory) through workgroup memory.
void t_attention(KB& kb, const chroma::Kernel& lk, int64_t max_shared_bytes);
int64_t attention_key_block(int64_t d, int64_t e, int64_t max_shared_bytes);

// Gathers, top-k and scatters (indexing.cpp).
void t_gather(KB& kb, const chroma::Kernel& lk);
void t_topk(KB& kb, const chroma::Kernel& lk);
void t_index_put(KB& kb, const chroma::Kernel& lk, const Program& p);

}  // namespace chroma::gpu::internal

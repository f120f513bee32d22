#pragma once

#include <cstdint>
#include <map>

#include "ir/graph.h"
#include "ir/routed_product.h"

namespace chroma {

// A mixture of experts written densely (every expert on every token, then weighted by a
// routing matrix that is zero for the experts a token did not select), as in
//   h = einsum("th,efh->tef", x, W1) ... ; y = einsum("teh,te->th", h, routing)
// computes every expert's products although only the selected ones contribute. This pass
// finds such contractions and lets the CPU's pre-packed products skip, at run time, the
// experts that no token selected.
//
// The pattern: a contraction over the expert axis e (E >= 2 experts) of H and R: a MatMul
// contracting e, or a Map.mul read by a Reduce.sum over e (`(h * routing[..., None]).sum(1)`).
// H is computed from products through elementwise Maps, Casts, Permutes, Reshapes, Expands,
// Slices and further products that keep each element's e (an expert's second layer reads its
// first); R, the routing weights, is computed from a selection (a TopK or an argmax at most 64
// nodes back; not a constant). Every node between the products and H is read only there (no
// other reader, no graph output) and is a floating-point (or bool) tensor. Then:
//   - mask[e] = max over R's other axes of (R != 0), float32 [E], computed right after R
//     (1 where some token gives expert e a nonzero weight, NaN included);
//   - H is replaced by where(mask[e] != 0, H, 0) before the contraction, so an expert with
//     mask 0 contributes exactly 0 whatever its products left in memory;
//   - each product with a constant B whose output carries e along a batch axis or along its
//     columns in blocks of whole 16-column panels, and that comes after R, is recorded with the
//     mask: the lowering skips its inactive experts' work.
// What differs from PyTorch: where an expert no token selected would produce inf or NaN,
// eager's dense form gives NaN (0 * inf) and Chroma gives that expert's zero contribution,
// the value the model's gather form (only the selected experts) computes.
struct RoutedGraph {
  Graph graph;
  std::map<int32_t, RoutedProduct> products;  // rewritten graph's MatMul node -> its expert axis
};

RoutedGraph route_experts(const Graph& g);

}  // namespace chroma

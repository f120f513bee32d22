#pragma once
#include "ir/graph.h"
namespace chroma {
// Computes float16 and bfloat16 in float32, as PyTorch's CPU does. Assumes: a valid graph.
// Guarantees: half types appear only on Input and Constant nodes, on Casts between them and
// float32, and on the graph's outputs; every other node computes in float32. A half value is
// rounded to its type where PyTorch rounds it: at the boundary of the ATen operation that made
// it (the nodes the importer built for one ATen node share its name), so a decomposed
// operation (mean = sum / n, layer norm, GELU) keeps its intermediate values in float32 as
// PyTorch's single kernel does, and a value passed from one ATen operation to the next is
// rounded. The signature (inputs, outputs, states) is unchanged.
Graph widen_half(const Graph& g);
}  // namespace chroma

#include <algorithm>

#include "passes/fuse_attention.h"
#include "passes/narrow_float64.h"
#include "passes/rewrite.h"
#include "targets/gpu/gpu_target.h"

namespace chroma {

LowerOptions GpuTarget::lower_options(const CompileOptions& opts) const {
  LowerOptions lo;
  lo.max_expression_depth = std::min(opts.max_expression_depth, 24);
  lo.packed_max_rows = 0;
  lo.arena_alignment = 256;
  lo.device_storage = true;
  lo.row_major_constant_b = true;
  lo.product_epilogues = true;
  lo.weights = quant::parse_policy(opts.weights);  // reduced weights (Lowerer::reduced_weight)
  return lo;
}

Graph GpuTarget::prepare(const Graph& g, LowerOptions*) const {
  const Graph r = run_pass("narrow_float64_constants", &narrow_float64_constants, g);
  return run_pass("fuse_attention", [](const Graph& in) { return fuse_attention(in, gpu::kAttentionMaxWidth); }, r);
}

}  // namespace chroma

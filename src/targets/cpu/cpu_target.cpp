#include <memory>
#include <utility>

#include "passes/fuse_attention.h"
#include "passes/rewrite.h"
#include "passes/routed_experts.h"
#include "targets/cpu/cpu_target.h"

namespace chroma {
namespace {

class CpuTarget final : public Target {
 public:
  const char* name() const override { return "cpu"; }

  // Channels-last activations where oneDNN runs the float32 convolutions, pre-packed constant
  // products (pitched), quantized weights by the policy.
  LowerOptions lower_options(const CompileOptions& opts) const override {
    LowerOptions lo;
    lo.max_expression_depth = opts.max_expression_depth;
#ifdef CHROMA_DNNL_LIBRARY
    lo.channels_last = opts.blas;  // float32 convolutions run on oneDNN
#endif
    lo.weights = quant::parse_policy(opts.weights);
    lo.pitch_constant_b = true;
    return lo;
  }

  // The CPU folds float16/bfloat16 weights to float32: BLAS and the pre-packed products read float32.
  bool keep_half_weights() const override { return false; }

  // fuse_attention: attention as one kernel that never holds the scores
  // (passes/fuse_attention.h); route_experts: the pre-packed products skip the experts no
  // token selected (passes/routed_experts.h); the products it found go to the lowering with
  // the graph.
  Graph prepare(const Graph& g, LowerOptions* lo) const override {
    std::map<int32_t, RoutedProduct> products;
    Graph r = run_pass("fuse_attention", [](const Graph& in) { return fuse_attention(in); }, g);
    r = run_pass("route_experts", [&](const Graph& in) {
      RoutedGraph rg = route_experts(in);
      products = std::move(rg.products);
      return std::move(rg.graph);
    }, r);
    lo->routed = std::move(products);
    return r;
  }

  std::string write(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                    PhaseTimer& timer) const override {
    return write_cpu_artifact(entries, out_dir, opts, timer);
  }
};

}  // namespace

std::unique_ptr<Target> make_cpu_target() { return std::make_unique<CpuTarget>(); }

}  // namespace chroma

#include "pipeline.h"

#include <algorithm>
#include <utility>

#include "artifact/targets.h"
#include "codegen/gpu/gpu_codegen.h"
#include "import/importer.h"
#include "lower/program.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/fold_constants.h"
#include "passes/rewrite.h"
#include "passes/routed_experts.h"
#include "passes/widen_half.h"

namespace chroma {

Graph optimize(const Graph& g, bool keep_half_weights) {
  Graph r = run_pass("widen_half", &widen_half, g);
  // The roundings widen_half made and nothing reads: gone before folding looks at readers.
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  r = keep_half_weights ? run_pass("fold_constants", &fold_constants_keep_half, r) : run_pass("fold_constants", &fold_constants, r);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  r = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, r);
  r = run_pass("eliminate_dead_code", &eliminate_dead_code, r);
  return r;
}

namespace {

// route_experts as a pass run_pass can run (verified, printed with CHROMA_DUMP_IR): the graph,
// with the products it found left here for the lowering that follows.
thread_local std::map<int32_t, RoutedProduct> routed_products;
Graph route_experts_pass(const Graph& g) {
  RoutedGraph rg = route_experts(g);
  routed_products = std::move(rg.products);
  return std::move(rg.graph);
}
// The products the last route_experts_pass found, taken (none are left behind).
std::map<int32_t, RoutedProduct> take_routed_products() { return std::exchange(routed_products, {}); }

// The target's lowering choices: GPU targets fuse to depth 24 (docs/architecture.md, "Fusion"),
// keep products as plain matrix products (pre-packed panels and gathered expert panels are CPU
// kernels) and activations row-major (channels-last serves oneDNN); the arena holds tensors as the
// device stores them (device_storage_bytes), aligned to 256 bytes (WebGPU's
// minStorageBufferOffsetAlignment).
LowerOptions lower_options(const CompileOptions& opts) {
  LowerOptions lo;
  lo.max_expression_depth = opts.max_expression_depth;
  if (opts.target == "cpu") {
#if __has_include(<oneapi/dnnl/dnnl.hpp>)
    lo.channels_last = opts.blas;  // float32 convolutions run on oneDNN
#endif
    lo.weights = quant::parse_policy(opts.weights);
    lo.pitch_constant_b = true;
  } else {
    lo.max_expression_depth = std::min(opts.max_expression_depth, 24);
    lo.packed_max_rows = 0;
    lo.arena_alignment = 256;
    lo.device_storage = true;
    lo.row_major_constant_b = true;
    lo.product_epilogues = true;
    lo.weights = quant::parse_policy(opts.weights);  // reduced weights (Lowerer::reduced_weight)
  }
  return lo;
}

}  // namespace

std::string compile_graph_file(const std::string& graph_path, const std::string& out_dir, const CompileOptions& opts) {
  return compile_graph_files({{"forward", graph_path}}, out_dir, opts);
}

// One script for every target: import, optimize and lower each entry with the target's
// options; then the target's code generator and artifact writer.
std::string compile_graph_files(const std::vector<EntrySpec>& specs, const std::string& out_dir, const CompileOptions& opts) {
  if (opts.target != "cpu" && opts.target != "webgpu" && opts.target != "cuda" && opts.target != "metal") {
    throw CompileError("target '" + opts.target + "' is not supported (available: cpu, webgpu, cuda, metal)");
  }
  if (specs.empty()) throw CompileError("nothing to compile: no entry points");
  PhaseTimer timer;
  const LowerOptions lo = lower_options(opts);
  std::vector<CompiledEntry> entries;
  for (const EntrySpec& s : specs) {
    for (const CompiledEntry& e : entries) {
      if (e.name == s.name) throw CompileError("entry point '" + s.name + "' is given twice");
    }
    CompiledEntry e;
    e.name = s.name;
    Graph imported = import_graph_file(s.graph_path);
    e.imported_nodes = imported.size();
    timer.lap("import");
    e.graph = optimize(imported, opts.target != "cpu");
    LowerOptions entry_lo = lo;
    if (opts.target == "cpu") {
      // The CPU's pre-packed products skip the experts no token selected (routed_experts.h).
      e.graph = run_pass("route_experts", &route_experts_pass, e.graph);
      entry_lo.routed = take_routed_products();
    }
    timer.lap("optimize");
    e.program = lower(e.graph, entry_lo);
    timer.lap("lower");
    entries.push_back(std::move(e));
  }
  if (opts.target == "webgpu" || opts.target == "cuda" || opts.target == "metal") return write_webgpu_package(entries, out_dir, opts, timer);
  return write_cpu_artifact(entries, out_dir, opts, timer);
}

std::vector<std::string> gpu_kernel_sources(const std::string& graph_path, const std::string& dialect) {
  const gpu::Dialect* d = dialect == "wgsl"   ? &gpu::wgsl_dialect()
                          : dialect == "cuda" ? &gpu::cuda_dialect()
                          : dialect == "msl"  ? &gpu::msl_dialect()
                                              : nullptr;
  if (!d) throw CompileError("unknown GPU dialect '" + dialect + "' (wgsl, cuda, msl)");
  CompileOptions o;
  o.target = "webgpu";
  Program p = lower(optimize(import_graph_file(graph_path), true), lower_options(o));
  // Placement does not change a kernel's text (offsets are params); every buffer in one slot
  // per region, as a package would bind them.
  auto place = [&](int32_t id) {
    gpu::Placement pl;
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    if (b.region == Region::kConstant) pl.where = gpu::Placement::kWeights;
    if (b.region == Region::kState) pl.where = gpu::Placement::kState;
    return pl;
  };
  std::vector<std::string> out;
  for (const gpu::Module& m : gpu::generate(p, place, gpu::Capabilities{}, *d).modules) out.push_back(m.code);
  return out;
}

std::string dump_graph_file(const std::string& graph_path, const std::string& stage, int max_expression_depth) {
  Graph g = import_graph_file(graph_path);
  if (stage == "import") return print(g);
  g = optimize(g);
  if (stage == "optimized") return print(g);
  if (stage == "lowered") {
    LowerOptions lo;
    lo.max_expression_depth = max_expression_depth;
    return describe(lower(g, lo));
  }
  throw CompileError("unknown stage '" + stage + "' (import, optimized, lowered)");
}

std::string run_ir_text(const std::string& text, const std::vector<std::string>& passes, int max_expression_depth) {
  Graph g = parse(text);
  if (std::string err = verify(g); !err.empty()) throw CompileError("invalid IR: " + err);
  std::map<int32_t, RoutedProduct> routed;  // route_experts' products, while the graph is the one it made
  for (size_t i = 0; i < passes.size(); ++i) {
    const std::string& p = passes[i];
    if (p != "lower") routed.clear();
    if (p == "route_experts") {
      g = run_pass("route_experts", &route_experts_pass, g);
      routed = take_routed_products();
    } else if (p == "fold_constants") g = run_pass("fold_constants", &fold_constants, g);
    else if (p == "dce") g = run_pass("eliminate_dead_code", &eliminate_dead_code, g);
    else if (p == "widen_half") g = run_pass("widen_half", &widen_half, g);
    else if (p == "cse") g = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, g);
    else if (p == "optimize") g = optimize(g);
    else if (p == "lower") {
      if (i + 1 != passes.size()) throw CompileError("'lower' must be the last pass");
      LowerOptions lo;
      lo.max_expression_depth = max_expression_depth;
      lo.routed = routed;
      return describe(lower(g, lo));
    } else {
      throw CompileError("unknown pass '" + p + "' (widen_half, fold_constants, dce, cse, optimize, route_experts, lower)");
    }
  }
  return print(g);
}

}  // namespace chroma

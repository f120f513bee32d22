#include "pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "import/importer.h"
#include "lower/program.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/fold_constants.h"
#include "passes/fuse_attention.h"
#include "passes/narrow_float64.h"
#include "passes/rewrite.h"
#include "passes/routed_experts.h"
#include "passes/widen_half.h"
#include "targets/gpu/gpu_target.h"
#include "targets/target.h"

namespace chroma {

namespace {

// The bytes of constants a compile keeps in memory before the rest go to its scratch file
// (ir/spill.h): CHROMA_SPILL_AFTER (bytes; 0 spills every constant of 64 KiB or more), else
// 256 MiB, which no test model reaches.
int64_t spill_after() {
  if (const char* v = std::getenv("CHROMA_SPILL_AFTER")) {
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && n >= 0) return n;
  }
  return int64_t{256} << 20;
}

// Every entry imported, optimized, prepared by the target and lowered; refused at once with
// everything the target lacks, every entry's.
std::vector<CompiledEntry> lower_entries(const Target& target, const std::vector<EntrySpec>& specs, const std::string& out_dir,
                                         const CompileOptions& opts, PhaseTimer& timer) {
  if (specs.empty()) throw CompileError("nothing to compile: no entry points");
  LowerOptions base = target.lower_options(opts);  // the options checked before any file is read
  base.spill = std::make_shared<SpillFile>(out_dir, spill_after());  // one for every entry
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
    e.graph = optimize(imported, target.keep_half_weights());
    LowerOptions lo = base;
    e.graph = target.prepare(e.graph, &lo);
    timer.lap("optimize");
    e.program = lower(e.graph, lo);
    timer.lap("lower");
    entries.push_back(std::move(e));
  }
  std::vector<Refusal> refusals;  // what the target lacks, every entry's at once
  for (const CompiledEntry& e : entries) {
    for (Refusal& r : target.supports(e.program)) {
      if (entries.size() > 1) r.what = "entry '" + e.name + "': " + r.what;
      refusals.push_back(std::move(r));
    }
  }
  if (!refusals.empty()) throw UnsupportedError(target.name(), std::move(refusals));
  return entries;
}

}  // namespace

std::string compile_graph_file(const std::string& graph_path, const std::string& out_dir, const CompileOptions& opts) {
  return compile_graph_files({{"forward", graph_path}}, out_dir, opts);
}

// One script for every target: import, optimize, the target's own passes and lowering with
// the target's options for each entry; then the target's code generator and artifact writer.
std::string compile_graph_files(const std::vector<EntrySpec>& specs, const std::string& out_dir, const CompileOptions& opts) {
  const Target& target = find_target(opts.target);
  PhaseTimer timer;
  std::vector<CompiledEntry> entries = lower_entries(target, specs, out_dir, opts, timer);
  return target.write(entries, out_dir, opts, timer);
}

std::string plan_graph_files(const std::vector<EntrySpec>& specs, const std::string& scratch_dir, const CompileOptions& opts) {
  const Target& target = find_target(opts.target);
  PhaseTimer timer;
  const std::vector<CompiledEntry> entries = lower_entries(target, specs, scratch_dir, opts, timer);
  nlohmann::json out = nlohmann::json::array();
  for (const CompiledEntry& e : entries) {
    const Program& p = e.program;
    int64_t constants = 0;  // what the kernels read, before the artifact's dedup and alignment
    std::vector<bool> seen(p.constants.size(), false);
    for (const Buffer& b : p.buffers) {
      if (b.region != Region::kConstant || b.slot < 0 || seen[static_cast<size_t>(b.slot)]) continue;
      seen[static_cast<size_t>(b.slot)] = true;
      constants += static_cast<int64_t>(p.constants[static_cast<size_t>(b.slot)].bytes->size());
    }
    out.push_back({{"name", e.name},
                   {"arena", {{"bytes", p.arena_bytes}, {"lower_bound", p.arena_lower_bound},
                              {"temporaries_bytes", p.temporaries_bytes}}},
                   {"kernels", p.kernels.size()},
                   {"constant_bytes", constants}});
  }
  return out.dump();
}

std::vector<std::string> gpu_kernel_sources(const std::string& graph_path, const std::string& target_name) {
  const auto* target = dynamic_cast<const GpuTarget*>(&find_target(target_name));
  if (!target) throw CompileError("target '" + target_name + "' has no GPU kernels");
  CompileOptions o;
  o.target = target_name;
  LowerOptions lo = target->lower_options(o);
  const Graph g = target->prepare(optimize(import_graph_file(graph_path), target->keep_half_weights()), &lo);
  Program p = lower(g, lo);
  if (std::vector<Refusal> r = target->supports(p); !r.empty()) throw UnsupportedError(target->name(), std::move(r));
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
  for (const gpu::Module& m : gpu::generate(p, place, target->capabilities(), target->dialect()).modules) out.push_back(m.code);
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
      g = run_pass("route_experts", [&](const Graph& in) {
        RoutedGraph rg = route_experts(in);
        routed = std::move(rg.products);
        return std::move(rg.graph);
      }, g);
    } else if (p == "fold_constants") g = run_pass("fold_constants", &fold_constants, g);
    else if (p == "dce") g = run_pass("eliminate_dead_code", &eliminate_dead_code, g);
    else if (p == "widen_half") g = run_pass("widen_half", &widen_half, g);
    else if (p == "fuse_attention") g = run_pass("fuse_attention", [](const Graph& in) { return fuse_attention(in); }, g);
    else if (p == "narrow_float64_constants") g = run_pass("narrow_float64_constants", &narrow_float64_constants, g);
    else if (p == "cse") g = run_pass("eliminate_common_subexpressions", &eliminate_common_subexpressions, g);
    else if (p == "optimize") g = optimize(g);
    else if (p == "lower") {
      if (i + 1 != passes.size()) throw CompileError("'lower' must be the last pass");
      LowerOptions lo;
      lo.max_expression_depth = max_expression_depth;
      lo.routed = routed;
      return describe(lower(g, lo));
    } else {
      throw CompileError("unknown pass '" + p + "' (widen_half, fold_constants, dce, cse, optimize, fuse_attention, route_experts, narrow_float64_constants, lower)");
    }
  }
  return print(g);
}

}  // namespace chroma

// A compilation target as an object: what the pipeline (pipeline.cpp) asks of it between the
// shared passes. One folder per target under src/targets/ (cpu, webgpu, cuda, metal, null),
// the GPU targets sharing src/targets/gpu/ (their lowering choices and the package writer);
// one registry (registry.cpp) names them. Nothing outside this folder compares target names:
// a new target is one folder and one line in the registry (see src/targets/README.md).
#pragma once

#include <string>
#include <vector>

#include "artifact/common.h"
#include "ir/graph.h"
#include "lower/program.h"
#include "pipeline.h"

namespace chroma {

class Target {
 public:
  virtual ~Target() = default;
  // The name users give (`chroma.compile(..., target=...)`) and the manifest's "target".
  virtual const char* name() const = 0;
  // The lowering's choices for this target: fusion depth, layouts, products, the arena.
  virtual LowerOptions lower_options(const CompileOptions& opts) const = 0;
  // Whether float16 and bfloat16 weights stay in 16 bits through constant folding (converted by
  // the kernels that read them) instead of being folded to float32.
  virtual bool keep_half_weights() const = 0;
  // The target's own passes between optimize() and lower(), which may hand the lowering what
  // they found through `lo` (the CPU's route_experts: the expert products it routed).
  virtual Graph prepare(const Graph& g, LowerOptions* lo) const { return g; }
  // What of the lowered program `p` this target cannot compile, each part with the target's
  // reason (empty: all of it). The pipeline asks before writing and refuses the compile with one
  // UnsupportedError listing every refusal of every entry; the test suites skip a case the same
  // way, with the target's reason. The CPU target supports every program that lowers.
  virtual std::vector<Refusal> supports(const Program& p) const { return {}; }
  // Code generation, the native build and the artifact: writes `out_dir` (and what goes beside
  // it) and returns the manifest's text.
  virtual std::string write(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                            PhaseTimer& timer) const = 0;
};

// The target named `name`; a CompileError listing the targets there are otherwise.
const Target& find_target(const std::string& name);

// Every registered target's name, in the registry's order.
std::vector<std::string> target_names();

}  // namespace chroma

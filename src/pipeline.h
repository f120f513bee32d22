// The compiler pipeline, as one linear script for every target (pipeline.cpp):
//   import -> widen_half -> DCE -> fold constants -> DCE -> CSE -> DCE (optimize()) -> on the
//   CPU target, route_experts -> lower with the target's options (fusion,
//   kernels, arena plan) -> the target's writer (Target::write, targets/target.h): lay out
//   weights and state (shared), generate code (CPU C++ / GPU kernels), build or package,
//   write the manifest.
// CHROMA_DUMP_IR=1 prints the IR after every pass.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/optimize.h"  // optimize(): the optimizing passes, in order

namespace chroma {

struct CompileOptions {
  std::string target = "cpu";  // a registered target's name (targets/target.h)
  bool blas = true;
  std::string include_dir;     // chroma's runtime headers
  std::string python_include;  // CPython headers for the extension half ("" = C ABI only)
  std::string cache_dir;       // build cache ("" = none)
  int jobs = 0;
  int max_expression_depth = 32;
  // GPU targets: a JSON file describing the golden inputs and outputs to store in the
  // package for its self-check ("" = none; docs/webgpu_package.md, "Golden data").
  std::string golden_path;
  // Weight formats (quant/quant.h parse_policy: "q4", "default=q4;unembedding=q8;*.gate.weight=fp32";
  // "" or "fp32": every weight exact). CPU target.
  std::string weights;
};


// Compiles a graph file into an artifact directory (one entry point, "forward"); returns
// manifest.json's text.
std::string compile_graph_file(const std::string& graph_path, const std::string& out_dir, const CompileOptions& opts);

// One entry point of a multi-entry artifact: its name and graph file.
struct EntrySpec {
  std::string name;
  std::string graph_path;
};

// What a compile of these graph files would plan, without generating or writing anything:
// per entry (JSON array) its arena (bytes, lower_bound, temporaries_bytes), kernel count and
// the bytes of the constants its kernels read (before the artifact stores identical ones
// once). Refused as compile_graph_files would refuse. `scratch_dir`: where constants the
// lowering makes may be spilled (ir/spill.h); nothing is left there.
std::string plan_graph_files(const std::vector<EntrySpec>& specs, const std::string& scratch_dir, const CompileOptions& opts);

// Compiles several graphs into one artifact whose entry points share the weights (stored
// once) and the persistent state (matched by name; docs/artifact_format.md).
std::string compile_graph_files(const std::vector<EntrySpec>& entries, const std::string& out_dir,
                                const CompileOptions& opts);

// The IR after import ("import") or after optimize() ("optimized"), in text form; or the
// lowered program's kernels and memory plan ("lowered").
std::string dump_graph_file(const std::string& graph_path, const std::string& stage, int max_expression_depth = 32);

// The GPU kernels of a graph file as the GPU target `target` ("webgpu", "cuda", "metal",
// "null") generates them (its lowering options, capability record and dialect), each module's
// text once: the GPU generator without a package (golden tests, `nvcc` checks of the CUDA text).
std::vector<std::string> gpu_kernel_sources(const std::string& graph_path, const std::string& target);

// Parses IR text, runs the named passes in order (fold_constants, dce, cse, optimize,
// lower) and returns the result in text form (the IR, or the kernels and memory plan after
// `lower`). Used by golden tests and `chroma opt`.
std::string run_ir_text(const std::string& text, const std::vector<std::string>& passes, int max_expression_depth = 32);

}  // namespace chroma

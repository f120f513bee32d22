// Each target's code generator and artifact writer, called by the pipeline (pipeline.cpp)
// with the lowered entry points. Each returns the manifest's text.
#pragma once

#include <string>
#include <vector>

#include "artifact/common.h"
#include "pipeline.h"

namespace chroma {

// CPU: C++ kernels built into one shared library (Python extension + C ABI), weights.bin,
// manifest.json (docs/artifact_format.md).
std::string write_cpu_artifact(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                               PhaseTimer& timer);

// WebGPU: WGSL kernels, schedule, weights and golden data in one `.chroma-web` package
// (docs/webgpu_package.md) beside the artifact directory, which holds manifest.json.
std::string write_webgpu_package(std::vector<CompiledEntry>& entries, const std::string& out_dir,
                                 const CompileOptions& opts, PhaseTimer& timer);

}  // namespace chroma

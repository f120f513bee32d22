// The CPU target: C++ kernels (expression templates, oneDNN, Chroma's pre-packed products)
// built into one shared library (Python extension + C ABI), weights.bin and manifest.json
// (docs/artifact_format.md).
#pragma once

#include <string>
#include <vector>

#include "targets/target.h"

namespace chroma {

// The CPU artifact writer (artifact.cpp): generates the C++, builds the library, writes the
// weights and the manifest; returns the manifest's text.
std::string write_cpu_artifact(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                               PhaseTimer& timer);

}  // namespace chroma

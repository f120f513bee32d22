// CPU code generator: turns a lowered Program into C++20 source written against the
// header-only expression-template library chroma/cpu/et.h.
//
// Output: several kernels_<n>.cpp files (so the system compiler builds them in parallel)
// and program.cpp with the I/O tables, the kernel sequence and the entry points
// (chroma/cpu/program_main.h). Requires: constant buffers already have weight offsets.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lower/program.h"

namespace chroma {

struct CpuCodegenOptions {
  bool blas = true;           // FP32/FP64 matrix products through CBLAS (OpenBLAS)
  int kernels_per_file = 48;
};

struct GeneratedSource {
  std::vector<std::pair<std::string, std::string>> files;  // file name -> contents
  std::string digest;                                      // SHA-256 over all files
};

GeneratedSource generate_cpu(const Program& p, const std::string& weights_sha256, int64_t weights_bytes,
                             const CpuCodegenOptions& opts);

}  // namespace chroma

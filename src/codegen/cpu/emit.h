// CPU code generator: turns a lowered Program into C++20 source written against the
// header-only expression-template library chroma/cpu/et.h.
//
// Output: several kernels_<n>.cpp files (so the system compiler builds them in parallel)
// and program.cpp with each entry's I/O tables and kernel sequence, the state table and the
// entry points
// (chroma/cpu/program_main.h). Requires: constant buffers already have weight offsets.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lower/program.h"

namespace chroma {

struct CpuCodegenOptions {
  bool blas = true;           // FP32/FP64 matrix products through CBLAS (OpenBLAS)
  bool dnnl = false;          // FP32 convolutions through oneDNN (chroma/cpu/conv_dnnl.h)
  bool dnnl_sgemm = false;    // FP32 products (and convolutions' GEMMs) on oneDNN's sgemm (sgemm.h)
  int kernels_per_file = 48;  // at most this many kernel signatures to a file (see run())
};

struct GeneratedSource {
  std::vector<std::pair<std::string, std::string>> files;  // file name -> contents
  std::string digest;                                      // SHA-256 over all files
};

// One entry point of the artifact (a lowered program) and its name.
struct CpuEntry {
  std::string name;
  const Program* program = nullptr;
};

struct CpuStateInfo {
  std::string name;
  int64_t nbytes = 0, offset = 0, init_offset = 0;  // in the state region / weights file
};

struct CpuArtifactInfo {
  std::string weights_digest;
  int64_t weights_bytes = 0;
  std::vector<CpuStateInfo> states;
  int64_t state_bytes = 0;
};

// Requires: constant and state buffers already have their offsets.
GeneratedSource generate_cpu(const std::vector<CpuEntry>& entries, const CpuArtifactInfo& info,
                             const CpuCodegenOptions& opts);

}  // namespace chroma

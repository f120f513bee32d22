// The GPU targets' shared part: their lowering choices and the package writer
// (package.cpp: kernels from the GPU generator in the target's dialect, the schedule, the
// memory plan, weights shards and golden data in one package file, docs/webgpu_package.md),
// with what differs per target asked of the target object: its dialect, its capability
// record, its package's suffix, how many entry points a package may hold, and its native
// part (CUDA: nvcc's fatbin and the host library; Metal: the host library; both: the kernels
// as one translation unit and the SIMT emulator's library, simt_unit.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "artifact/build.h"
#include "codegen/gpu/gpu_codegen.h"
#include "targets/target.h"

namespace chroma {

class GpuTarget : public Target {
 public:
  // GPU targets fuse to depth 24 (src/lower/README.md, "Fusion"), keep products as plain
  // matrix products (pre-packed panels and gathered expert panels are CPU kernels) and
  // activations row-major (channels-last serves oneDNN); the arena holds tensors as the device
  // stores them (device_storage_bytes), aligned to 256 bytes (WebGPU's
  // minStorageBufferOffsetAlignment).
  LowerOptions lower_options(const CompileOptions& opts) const override;
  bool keep_half_weights() const override { return true; }
  // narrow_float64_constants: float64 constants that only feed float32 become float32 ones
  // (passes/narrow_float64.h; the GPU targets cannot store float64); fuse_attention: attention
  // as one kernel that never stores the scores (codegen/gpu/attention.cpp), for heads up to
  // gpu::kAttentionMaxWidth wide.
  Graph prepare(const Graph& g, LowerOptions* lo) const override;
  // float64 buffers, int64 constants beyond int32, and the GPU generator's refusals (supports.cpp).
  std::vector<Refusal> supports(const Program& p) const override;
  std::string write(std::vector<CompiledEntry>& entries, const std::string& out_dir, const CompileOptions& opts,
                    PhaseTimer& timer) const override;

  // The kernel language the generator prints.
  virtual const gpu::Dialect& dialect() const = 0;
  // The manifest's "dialect" ("wgsl", "cuda", "metal").
  virtual const char* package_dialect() const = 0;
  // The device the kernels are generated for (limits, subgroups, library products).
  virtual gpu::Capabilities capabilities() const = 0;
  // The package file's suffix (".chroma-web").
  virtual const char* package_suffix() const = 0;
  // The most entry points one package may hold, and what to say when a compile has `n`.
  virtual size_t max_entries() const { return SIZE_MAX; }
  virtual std::string entries_refusal(size_t n) const { return ""; }
  // Whether the package and the directory are written (the null target writes nothing).
  virtual bool writes_files() const { return true; }
  // The target's own files beside the package, recorded in the artifact manifest `am`.
  virtual void write_native(const gpu::Generated& gen, const std::filesystem::path& out, const CompileOptions& opts,
                            PhaseTimer& timer, nlohmann::json* am) const {}
};

// CUDA and Metal: every kernel in one translation unit (`msl`: Metal Shading Language, else
// CUDA C++), which also compiles as C++ against the SIMT emulator (include/chroma/simt) with
// CHROMA_SIMT defined; writes it as `source` ("kernels.cu", "kernels.metal"), builds the
// emulator's library from it, and records both under am[key] and am["emulator"]. Returns the
// translation unit's text and the build options its native part starts from.
struct SimtUnit {
  std::string text;
  std::string source;
  BuildOptions build;
};
SimtUnit write_simt_unit(const gpu::Generated& gen, bool msl, const std::filesystem::path& out, const CompileOptions& opts,
                         PhaseTimer& timer, const char* key, nlohmann::json* am);

// The translation unit alone (the golden CUDA/MSL texts, gpu_kernel_sources' callers).
std::string simt_translation_unit(const gpu::Generated& gen, bool msl);

}  // namespace chroma

// The GPU generator's entry point: a lowered Program -> kernel modules in one dialect and the
// schedule that replays them (docs/gpu_generator.md). Target-neutral: its user is the package
// writer the GPU targets share (targets/gpu/package.cpp); the CUDA and Metal targets add a
// dialect table, a translation unit (targets/gpu/simt_unit.cpp) and a host runtime.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codegen/gpu/kir.h"
#include "codegen/gpu/printer.h"
#include "lower/program.h"

namespace chroma::gpu {

// What the device offers; the templates and legalization read nothing else about it.
struct Capabilities {
  int subgroup_size = 0;                 // 0: no subgroup operations
  // Also print a variant of each kernel that has a use for subgroup operations
  // (Module::code_subgroups), for a runtime to pick when its device has them.
  bool subgroup_variants = false;
  int max_workgroup_size = 256;          // maxComputeInvocationsPerWorkgroup
  int64_t max_shared_bytes = 16384;      // maxComputeWorkgroupStorageSize
  int max_storage_buffers = 8;           // maxStorageBuffersPerShaderStage
  int64_t max_grid = 65535;              // maxComputeWorkgroupsPerDimension
  int64_t max_binding_bytes = 128ll << 20;  // maxStorageBufferBindingSize
  bool has_f16 = false;
  // Float32 matrix products go to the platform's BLAS (cuBLAS on CUDA) as library dispatches
  // where their operands are strided matrices (library_gemm_call); the generated kernel stays
  // for the rest (fused operands, few rows or columns).
  bool library_gemm = false;
  // The few-rows product may split K over its workgroup (products.cpp t_matmul_skinny);
  // $CHROMA_GPU_SPLIT_K=off turns it off, for the device benchmark's A/B (bench/cuda_gpu.py).
  bool split_k = true;
};

// Where a program buffer lives on the device: a word offset in the arena, the state buffer,
// or one weights shard.
struct Placement {
  enum Where : uint8_t { kArena, kState, kWeights } where = kArena;
  int shard = 0;
  int64_t word = 0;
  bool operator==(const Placement& o) const { return where == o.where && shard == o.shard; }
};

struct Module {
  std::string name;   // e.g. "k3_reduce_sum"
  std::string code;   // the dialect's text
  std::string code_subgroups;  // the same kernel with subgroup operations (or empty)
  int workgroup_size = 0;
  int params = 0;
  std::vector<bool> slot_writable;
  int64_t shared_bytes = 0;
};

// A float32 (batched) product the runtime hands to the platform's BLAS, row-major
// semantics: C[b, m, n] = sum_k A[b, m, k] B[b, k, n], each operand addressed as
// word + b * batch_stride + row * row_stride + col * col_stride in its storage slot (slots 0,
// 1, 2 of the dispatch: A, B, C), one of each matrix's two strides 1 (C's column stride 1).
struct LibraryGemm {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  struct Operand {
    int64_t word = 0, batch_stride = 0, row_stride = 0, col_stride = 1;
  } a, b, c;
};

struct Dispatch {
  int module = 0;     // -1: a library call (gemm)
  bool library = false;
  LibraryGemm gemm;
  int64_t grid_x = 1, grid_y = 1;
  std::vector<uint32_t> params;
  std::vector<Placement> slots;  // which buffer each storage slot is (word ignored)
  int lowered_kernel = 0;        // Program::kernels index
  std::string label, node, source;
};

struct Generated {
  std::vector<Module> modules;   // each distinct text once
  std::vector<Dispatch> dispatches;
  int max_slots = 0;
  int max_workgroup_size = 0;
  int64_t max_shared_bytes = 0;
  int64_t max_grid = 0;
};

// The widest query, key or value row (D or E) the attention template (attention.cpp) takes:
// each invocation holds its query and output rows in private arrays. The GPU targets fuse
// attention only up to it (GpuTarget::prepare); wider heads run as products and a softmax.
inline constexpr int64_t kAttentionMaxWidth = 256;

// Generates every kernel of the program. `place` says where each buffer lives. Every kernel
// the target cannot compile is reported at once in one CompileError (op, node, source line).
Generated generate(const Program& p, const std::function<Placement(int32_t)>& place, const Capabilities& caps,
                   const Dialect& d);

// Legalization (layer C), run on each kernel before printing: folds the grid to the
// per-dimension limit, checks workgroup size, shared memory and storage bindings against
// the capabilities, and checks that every barrier is in uniform control flow. Throws
// Unsupported naming the limit.
void legalize(Kernel& k, const Capabilities& caps);

}  // namespace chroma::gpu

// The null target (IREE's null HAL driver is the model): lowers, plans and generates kernels
// for a GPU capability record (WebGPU's defaults, WGSL) exactly as a GPU target does, and
// writes nothing: the manifest's text comes back with the plan's and the generator's figures.
// CPU-only CI checks GPU planning with it (tests/python/test_targets.py), and it shows what a
// new target is: this folder and one line in targets/registry.cpp.
#include <memory>

#include "targets/gpu/gpu_target.h"

namespace chroma {
namespace {

class NullTarget final : public GpuTarget {
 public:
  const char* name() const override { return "null"; }
  const gpu::Dialect& dialect() const override { return gpu::wgsl_dialect(); }
  const char* package_dialect() const override { return "wgsl"; }
  const char* package_suffix() const override { return ".chroma-null"; }
  gpu::Capabilities capabilities() const override { return gpu::Capabilities{}; }
  bool writes_files() const override { return false; }
};

}  // namespace

std::unique_ptr<Target> make_null_target() { return std::make_unique<NullTarget>(); }

}  // namespace chroma

// The WebGPU target: WGSL kernels (with subgroup variants of the reductions, used where the
// device has subgroups) in one `.chroma-web` package, one entry point per package.
#include <memory>

#include "targets/gpu/gpu_target.h"

namespace chroma {
namespace {

class WebGpuTarget final : public GpuTarget {
 public:
  const char* name() const override { return "webgpu"; }
  const gpu::Dialect& dialect() const override { return gpu::wgsl_dialect(); }
  const char* package_dialect() const override { return "wgsl"; }
  const char* package_suffix() const override { return ".chroma-web"; }
  // WebGPU's default limits: every package runs on a default device.
  gpu::Capabilities capabilities() const override {
    gpu::Capabilities caps;
    caps.subgroup_variants = true;  // reductions also with subgroup operations, used where the device has them
    return caps;
  }
  size_t max_entries() const override { return 1; }
  std::string entries_refusal(size_t n) const override {
    return "a WebGPU package holds one entry point for now (this compile has " + std::to_string(n) +
           "): the WebGPU runtimes run one schedule; the CUDA and Metal targets take several (a decoder's prefill and "
           "step)";
  }
};

}  // namespace

std::unique_ptr<Target> make_webgpu_target() { return std::make_unique<WebGpuTarget>(); }

}  // namespace chroma

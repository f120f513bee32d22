// GpuTarget::supports: what of a lowered program a GPU target cannot compile, each part with
// the reason (the contract: src/targets/target.h). Three capabilities are asked, in the order a
// user would fix them: storage (no float64: every GPU dialect computes in 32-bit types), 64-bit
// integer constants (stored in 32-bit words), and each kernel (the GPU generator's own refusals,
// gpu::generate's UnsupportedError: LAPACK factorizations, ...).
#include <cstring>
#include <set>

#include "codegen/gpu/elementwise.h"
#include "targets/gpu/gpu_target.h"

namespace chroma {

namespace {

std::string buffer_what(const Program& p, const Buffer& b) {
  switch (b.region) {
    case Region::kInput: return "input '" + p.input_names[static_cast<size_t>(b.slot)] + "'";
    case Region::kOutput: return "output " + std::to_string(b.slot);
    case Region::kConstant: {
      const ConstantData& c = p.constants[static_cast<size_t>(b.slot)];
      return "weight '" + (c.name.empty() ? b.name : c.name) + "'";
    }
    case Region::kState: return "state tensor '" + p.states[static_cast<size_t>(b.slot)].name + "'";
    case Region::kArena: return "temporary '" + b.name + "'";
  }
  return "buffer '" + b.name + "'";
}

void loads(const Expr& e, std::vector<int32_t>* out) {
  if (e.kind == Expr::kLoad) out->push_back(e.buffer);
  for (const Expr& c : e.children) loads(c, out);
}

// The first element of an int64 constant that 32-bit words cannot hold (after the sentinel
// narrowing the kernels apply, gpu::narrow_int64), or -1.
int64_t int64_beyond_int32(const ConstantData& c, int64_t* value) {
  const int64_t n = c.type.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, c.data() + 8 * i, 8);
    v = gpu::narrow_int64(v);
    if (v < INT32_MIN || v > INT32_MAX) {
      *value = v;
      return i;
    }
  }
  return -1;
}

}  // namespace

std::vector<Refusal> GpuTarget::supports(const Program& p) const {
  std::vector<Refusal> out;
  std::set<int32_t> seen;
  const std::string no_f64 = std::string("float64, which the ") + name() +
                             " target cannot store (its kernels compute in 32-bit types): compute in float32 (model.float())";
  auto check = [&](int32_t id, const std::string& node, const std::string& source) {
    if (id < 0 || !seen.insert(id).second) return;
    const Buffer& b = p.buffers[static_cast<size_t>(id)];
    if (b.type.dtype == DType::kF64) {
      out.push_back({buffer_what(p, b), node, source, no_f64});
      return;
    }
    if (b.region == Region::kConstant && b.type.dtype == DType::kI64) {
      int64_t v = 0;
      if (const int64_t at = int64_beyond_int32(p.constants[static_cast<size_t>(b.slot)], &v); at >= 0) {
        out.push_back({buffer_what(p, b), node, source,
                       "int64 value " + std::to_string(v) + " at element " + std::to_string(at) +
                           " does not fit in the 32-bit integers the " + name() + " target stores int64 tensors as"});
      }
    }
  };
  // Each buffer is named with the first kernel that touches it, so the refusal has its node and
  // source line (a folded constant has no name of its own).
  for (const Kernel& k : p.kernels) {
    std::vector<int32_t> ids;
    for (const Expr& e : k.inputs) loads(e, &ids);
    ids.insert(ids.end(), k.outputs.begin(), k.outputs.end());
    for (int32_t id : ids) check(id, k.name, k.source);
  }
  // A buffer no kernel touches (an input nothing reads): named by its own value.
  for (size_t id = 0; id < p.buffers.size(); ++id) check(static_cast<int32_t>(id), p.buffers[id].name, "");
  if (!out.empty()) return out;  // the kernels' own refusals once the storage is settled

  // The generator's refusals: placement does not change whether a kernel can be generated.
  auto place = [&](int32_t id) {
    gpu::Placement pl;
    const Region r = p.buffers[static_cast<size_t>(id)].region;
    if (r == Region::kConstant) pl.where = gpu::Placement::kWeights;
    if (r == Region::kState) pl.where = gpu::Placement::kState;
    return pl;
  };
  try {
    gpu::generate(p, place, capabilities(), dialect());
  } catch (const UnsupportedError& e) {
    return e.refusals();
  }
  return out;
}

}  // namespace chroma

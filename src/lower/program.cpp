// The program's own functions (program.h): an expression's shape and depth, a kernel's
// payload checks, the kernel kinds' names, and the listing `chroma inspect` prints. The lowering is in lower.cpp.
#include "lower/program.h"

#include <algorithm>
#include <sstream>

namespace chroma {

Shape Expr::shape() const {
  switch (kind) {
    case kLoad: return layout.shape;
    case kIota: return affine.shape;
    case kLiteral: return {};
    default: {
      for (const Expr& c : children) {
        if (c.kind != kLiteral) return c.shape();
      }
      return {};
    }
  }
}

int Expr::depth() const {
  int d = 0;
  for (const Expr& c : children) d = std::max(d, c.depth());
  return children.empty() ? 0 : d + 1;
}

void Kernel::wrong_kind(Kind want) const {
  throw CompileError(std::string("internal: kernel ") + name + " (" + kernel_kind(kind) + ") asked for the payload of a " +
                     kernel_kind(want) + " kernel");
}

Kernel::Weights& Kernel::weights() {
  switch (kind) {
    case kMatMul: return matmul().weights;
    case kConv: return conv().weights;
    case kMatMulPacked: return packed().weights;
    case kMatMulGathered: return gathered().weights;
    case kGather: return own<Gather>(kGather).weights;
    default: wrong_kind(kGather);
  }
}

const Kernel::Weights& Kernel::weights() const {
  static const Weights kFloat32{};
  switch (kind) {
    case kMatMul: return matmul().weights;
    case kConv: return conv().weights;
    case kMatMulPacked: return packed().weights;
    case kMatMulGathered: return gathered().weights;
    case kGather: return view<Gather>(kGather).weights;
    default: return kFloat32;  // no constant operand: what float32 weights would be
  }
}

const char* kernel_kind(Kernel::Kind k) {
  static const char* names[] = {"assign", "reduce",   "arg_reduce", "matmul",        "gather",    "gather_elements",
                                "concat", "topk",     "softmax",    "matmul_packed", "index_put", "scan",
                                "conv",   "linalg",   "matmul_gathered", "attention"};
  return names[k];
}

std::string describe(const Program& p) {
  std::ostringstream o;
  o << "kernels: " << p.kernels.size() << "\n";
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const Kernel& k = p.kernels[i];
    o << "  k" << i << ": " << k.label << " -> ";
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      const Buffer& b = p.buffers[static_cast<size_t>(k.outputs[j])];
      if (j && k.outputs[j] == k.outputs[j - 1]) continue;
      o << (j ? ", " : "") << b.type.str();
    }
    if (!k.source.empty()) o << "   (" << k.source << ")";
    o << "\n";
  }
  o << "memory plan: arena " << p.arena_bytes << " B for " << p.temporaries_bytes << " B of temporaries (lower bound "
    << p.arena_lower_bound << " B)\n";
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    const Buffer& b = p.buffers[i];
    if (b.region != Region::kArena) continue;
    o << "  buf" << i << " " << b.type.str() << (b.channels_last() ? " channels-last" : "") << " offset " << b.offset
      << " size " << b.type.nbytes() << " kernels [" << b.first << ", " << b.last << "]" << (b.name.empty() ? "" : "  " + b.name)
      << "\n";
  }
  o << p.plan_description;
  return o.str();
}

}  // namespace chroma

#include "ir/op.h"

#include <array>

namespace chroma {
namespace {

constexpr std::array<OpInfo, static_cast<size_t>(Op::kCount)> kOpInfo = {{
#define CHROMA_OP(name, cls, arity, outs) {#name, FusionClass::cls, arity, outs},
#include "ir/ops.def"
#undef CHROMA_OP
}};

constexpr std::array<EwInfo, static_cast<size_t>(EwOp::kCount)> kEwInfo = {{
#define CHROMA_EW(name, arity, result, expr) {#name, arity, EwResult::result},
#include "chroma/elementwise.def"
#undef CHROMA_EW
}};

}  // namespace

const OpInfo& op_info(Op op) { return kOpInfo[static_cast<size_t>(op)]; }
const EwInfo& ew_info(EwOp op) { return kEwInfo[static_cast<size_t>(op)]; }

bool parse_ew(std::string_view name, EwOp* out) {
  for (size_t i = 0; i < kEwInfo.size(); ++i) {
    if (kEwInfo[i].name == name) {
      *out = static_cast<EwOp>(i);
      return true;
    }
  }
  return false;
}

std::string_view reduce_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum: return "sum";
    case ReduceKind::kProd: return "prod";
    case ReduceKind::kMax: return "max";
    case ReduceKind::kMin: return "min";
  }
  return "?";
}

}  // namespace chroma

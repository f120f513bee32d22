// Op enums generated from the tables: ops.def (IR primitives) and elementwise.def.
#pragma once

#include <cstdint>
#include <string_view>

namespace chroma {

// Fusion classes, ordered as in TVM's OpPatternKind: a consumer can absorb producers of a
// lower class.
enum class FusionClass : uint8_t { kElementwise, kBroadcast, kInjective, kReduce, kOpaque };

enum class Op : uint8_t {
#define CHROMA_OP(name, cls, arity, outs) k##name,
#include "ir/ops.def"
#undef CHROMA_OP
  kCount
};

enum class EwOp : uint8_t {
#define CHROMA_EW(name, arity, result, expr) k_##name,
#include "chroma/elementwise.def"
#undef CHROMA_EW
  kCount
};

enum class EwResult : uint8_t { kSame, kBool, kFloat };

enum class ReduceKind : uint8_t { kSum, kProd, kMax, kMin };

struct OpInfo {
  std::string_view name;
  FusionClass cls;
  int arity;    // -1: variadic
  int outputs;
};
const OpInfo& op_info(Op op);

struct EwInfo {
  std::string_view name;
  int arity;
  EwResult result;
};
const EwInfo& ew_info(EwOp op);
bool parse_ew(std::string_view name, EwOp* out);
// The operations whose result is one of their data operands' values, unchanged (relu,
// maximum, minimum, abs, neg, where's branches): of a half type's values they make one of its
// values, so widen_half need not round them (and the lowering knows them bfloat16-valued).
inline bool ew_picks_operand(EwOp op) {
  return op == EwOp::k_relu || op == EwOp::k_maximum || op == EwOp::k_minimum || op == EwOp::k_abs || op == EwOp::k_neg ||
         op == EwOp::k_where;
}

std::string_view reduce_name(ReduceKind k);

// Deferred (fusable) ops: stay expressions until a consumer forces them into a buffer.
inline bool is_elementwise(Op op) { return op == Op::kMap || op == Op::kCast || op == Op::kFull || op == Op::kIota; }
// Views: become layout metadata (shape, strides, offset) during lowering.
inline bool is_view(Op op) {
  return op == Op::kPermute || op == Op::kExpand || op == Op::kSlice || op == Op::kReshape || op == Op::kFlip;
}

}  // namespace chroma

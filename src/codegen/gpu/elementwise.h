// Elementwise arithmetic of the lowered program's expression trees as kernel IR.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "codegen/gpu/kir.h"
#include "lower/program.h"

namespace chroma::gpu {

// Something a GPU target cannot compile (yet); the generator adds the kernel's node and
// source line and reports every such kernel of the model at once.
class Unsupported : public std::runtime_error {
 public:
  explicit Unsupported(const std::string& what) : std::runtime_error(what) {}
};

// The type a value of dtype t is computed in: float32 and the half types -> f32, every integer type -> i32
// (narrow types wrapped after each operation, int64 narrowed: see legalize.cpp), bool -> bool.
Ty compute_type(DType t);
// int64 values of magnitude 2^62 or more as int32's extremes; other values unchanged. Such
// values are the sentinels decompositions use as the identity of a min or max over indices
// (INT64_MAX, INT64_MIN, -INT64_MAX); narrowed to int32's extremes they stay sentinels:
// every comparison with an in-range value is unchanged.
inline int64_t narrow_int64(int64_t v) {
  if (v >= (int64_t{1} << 62)) return INT32_MAX;
  if (v <= -(int64_t{1} << 62)) return INT32_MIN;
  return v;
}
// An i32 value wrapped to the range of a narrow integer type (uint8, int8, int16).
Ex wrap_to(DType t, Ex v);
// A value of dtype `from` converted to dtype `to` (PyTorch's cast semantics). Half types
// (float16, bfloat16) are computed in f32 holding a value of the type: a cast to one rounds
// (round_to_half).
Ex cast_value(Block& b, Ex v, DType from, DType to);
// Half types in storage: the 16 bits of an f32 value of the type (rounded to nearest even,
// NaN kept quiet, overflow to infinity), and an f32 from those bits (exact). Integer
// operations only, so every dialect rounds as chroma/half.h does on the CPU.
Ex half_bits(Block& b, DType t, const Ex& v);      // u32, the bits in the low 16
Ex half_value(Block& b, DType t, const Ex& bits);  // f32 from a u32 with the bits in the low 16
// One elementwise.def operation on operands already in their compute types; `operands` are
// the expression nodes they came from (a literal exponent of pow is specialised).
Ex map_op(Block& b, EwOp op, DType result, const std::vector<DType>& operand_types, const std::vector<Ex>& x,
          const std::vector<const Expr*>& operands);

}  // namespace chroma::gpu

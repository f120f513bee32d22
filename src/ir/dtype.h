// Element types Chroma computes with, and their names in every format we read or write.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace chroma {

// Columns: CHROMA_DTYPE(Enum, name in graph/manifest files, C++ type in generated code, bytes)
#define CHROMA_FOR_EACH_DTYPE(X)      \
  X(kF32, "float32", float, 4)        \
  X(kF64, "float64", double, 8)       \
  X(kI64, "int64", int64_t, 8)        \
  X(kI32, "int32", int32_t, 4)        \
  X(kI16, "int16", int16_t, 2)        \
  X(kI8, "int8", int8_t, 1)           \
  X(kU8, "uint8", uint8_t, 1)         \
  X(kBool, "bool", bool, 1)

enum class DType : uint8_t {
#define X(e, n, c, b) e,
  CHROMA_FOR_EACH_DTYPE(X)
#undef X
};

std::string_view dtype_name(DType t);
std::string_view dtype_ctype(DType t);
int64_t dtype_size(DType t);
// Returns false for names Chroma does not compute with (e.g. "bfloat16" for now).
bool parse_dtype(std::string_view name, DType* out);
inline bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64; }
inline bool is_int(DType t) { return !is_float(t) && t != DType::kBool; }

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);
// Row-major strides of a shape.
Shape contiguous_strides(const Shape& s);

// A tensor type: element type and static shape.
struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t numel() const { return chroma::numel(shape); }
  int64_t nbytes() const { return numel() * dtype_size(dtype); }
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool operator==(const TensorType&) const = default;
  std::string str() const;  // "f32[4,7]"
};

}  // namespace chroma

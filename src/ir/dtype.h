// Element types Chroma computes with, and their names in every format we read or write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include "chroma/half.h"

namespace chroma {

// Columns: CHROMA_DTYPE(Enum, name in graph/manifest files, C++ type in generated code, bytes)
// The types kernels compute with:
#define CHROMA_FOR_EACH_COMPUTE_DTYPE(X) \
  X(kF32, "float32", float, 4)        \
  X(kF64, "float64", double, 8)       \
  X(kI64, "int64", int64_t, 8)        \
  X(kI32, "int32", int32_t, 4)        \
  X(kI16, "int16", int16_t, 2)        \
  X(kI8, "int8", int8_t, 1)           \
  X(kU8, "uint8", uint8_t, 1)         \
  X(kBool, "bool", bool, 1)
// Storage-only types (chroma/half.h): computed in float32 and rounded after every operation,
// as PyTorch's CPU does; the widen_half pass (passes/widen_half.cpp) rewrites every operation
// on them into float32 between casts, so kernels only load, store and convert them.
#define CHROMA_FOR_EACH_HALF_DTYPE(X) \
  X(kF16, "float16", chroma::f16, 2)  \
  X(kBF16, "bfloat16", chroma::bf16, 2)
#define CHROMA_FOR_EACH_DTYPE(X) CHROMA_FOR_EACH_COMPUTE_DTYPE(X) CHROMA_FOR_EACH_HALF_DTYPE(X)

enum class DType : uint8_t {
#define X(e, n, c, b) e,
  CHROMA_FOR_EACH_DTYPE(X)
#undef X
};

std::string_view dtype_name(DType t);
std::string_view dtype_ctype(DType t);
int64_t dtype_size(DType t);
// Returns false for names Chroma does not compute with (e.g. "complex64").
bool parse_dtype(std::string_view name, DType* out);
inline bool is_half(DType t) { return t == DType::kF16 || t == DType::kBF16; }
inline bool is_float(DType t) { return t == DType::kF32 || t == DType::kF64 || is_half(t); }
inline bool is_int(DType t) { return !is_float(t) && t != DType::kBool; }
// Whether scalar v is a value of half type t (NaN and the infinities are).
bool half_value(double v, DType t);

// Thrown for any problem with the user's model or inputs; the message names the op, node
// and source line when they are known.
// Messages quote text from the graph file; bytes that are not valid UTF-8 are shown as \xNN
// so the message itself is always valid UTF-8 (Python decodes it strictly).
class CompileError : public std::runtime_error {
 public:
  explicit CompileError(const std::string& msg) : std::runtime_error(valid_utf8(msg)) {}
  explicit CompileError(const char* msg) : CompileError(std::string(msg)) {}
  static std::string valid_utf8(const std::string& s);
};

// What a target cannot do, for one part of a program: `what` names the part (a kernel with its
// label, a weight, an input, a state tensor), `node` and `source` the IR node and source line
// when known, `reason` the target's own words (Target::supports, src/targets/target.h).
struct Refusal {
  std::string what, node, source, reason;
};

// A CompileError that only says the chosen target lacks a capability the program needs (no
// float64 storage, no LAPACK on a GPU, ...), listing every refusal at once: the same program
// compiles for a target that has it. Python sees it as chroma.UnsupportedError, a CompileError.
class UnsupportedError : public CompileError {
 public:
  UnsupportedError(const std::string& target, std::vector<Refusal> refusals);
  const std::vector<Refusal>& refusals() const { return refusals_; }

 private:
  std::vector<Refusal> refusals_;
};

// A vector whose indexing is checked: a rule or handler that asks for a dimension a tensor
// does not have (a 0-d tensor's dim 0, a negative index cast to size_t) or an element a list
// argument does not have raises CompileError, which the importer attributes to the node,
// instead of reading out of bounds.
template <class T> class CheckedVector : public std::vector<T> {
 public:
  using std::vector<T>::vector;
  CheckedVector() = default;
  CheckedVector(const std::vector<T>& v) : std::vector<T>(v) {}  // NOLINT: implicit by design
  CheckedVector(std::vector<T>&& v) : std::vector<T>(std::move(v)) {}  // NOLINT
  T& operator[](size_t i) { return i < this->size() ? this->data()[i] : out_of_range(i); }
  const T& operator[](size_t i) const { return i < this->size() ? this->data()[i] : out_of_range(i); }

 private:
  [[noreturn]] T& out_of_range(size_t i) const {
    const std::string idx = std::to_string(static_cast<int64_t>(i)), n = std::to_string(this->size());
    if constexpr (std::is_same_v<T, int64_t>) {
      throw CompileError("dimension " + idx + " does not exist in a rank-" + n + " shape (or element " + idx +
                         " of a " + n + "-element list)");
    } else {
      throw CompileError("element " + idx + " does not exist in a " + n + "-element list");
    }
  }
};

// A static shape (also the type of integer-list arguments).
using Shape = CheckedVector<int64_t>;

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

// The largest tensor Chroma compiles: 2^42 bytes (4 TiB). Every byte count, offset and arena
// size is computed in int64; with each tensor under this bound no sum of them can overflow.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 42;
// Throws CompileError (naming `what`) when a dimension is negative or the byte count of
// `t` exceeds kMaxTensorBytes, computed without overflowing.
void check_tensor_size(const TensorType& t, const std::string& what);

}  // namespace chroma

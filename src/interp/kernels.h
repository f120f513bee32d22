// Internal to the reference interpreter: the per-op kernels and the helpers they share.
//
// Each IR primitive Name has a kernel eval_Name (the ops.def convention) taking the node and
// its already type-checked dense inputs. Kernels write results with the node's inferred
// output types (n.types) and throw CompileError with a bare message; eval_node() prefixes
// it with the node's description.
//
//   eval_elementwise.cpp   Map, Cast, Full, Iota
//   eval_structural.cpp    Permute, Expand, Slice, Reshape, Concat, Gather, GatherElements
//   eval_compute.cpp       Reduce, ArgReduce, MatMul, Conv, TopK, Scan
//   interp.cpp             Input, Constant, eval_node, run
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "interp/interp.h"

namespace chroma::interp {

using Tensors = std::vector<Tensor>;

#define CHROMA_OP(name, cls, arity, outs) Tensors eval_##name(const Node& n, const Tensors& in);
#include "ir/ops.def"
#undef CHROMA_OP

// Calls f(std::type_identity<C>{}) with C the C++ element type of `t`.
// Half types are not computed with (widen_half turned their operations into float32 ones);
// only dispatch_bits and the casts (eval_Cast) see them.
template <class F> decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
#define CHROMA_DISPATCH_CASE(e, n, c, b) \
  case DType::e: return f(std::type_identity<c>{});
    CHROMA_FOR_EACH_COMPUTE_DTYPE(CHROMA_DISPATCH_CASE)
#undef CHROMA_DISPATCH_CASE
    case DType::kF16:
    case DType::kBF16: break;
  }
  throw CompileError("internal: an operation on " + std::string(dtype_name(t)) +
                     " reached the constant folder (widen_half computes half types in float32)");
}

// Calls f(std::type_identity<U>{}) with U an unsigned integer type as wide as one element of
// `t`: for kernels that only move elements around.
template <class F> decltype(auto) dispatch_bits(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: return f(std::type_identity<uint8_t>{});
    case 2: return f(std::type_identity<uint16_t>{});
    case 4: return f(std::type_identity<uint32_t>{});
    case 8: return f(std::type_identity<uint64_t>{});
    default: break;
  }
  throw CompileError("internal: unsupported element size");
}

// A fresh zero-filled output buffer of `t` and the tensor wrapping it; write through out().
class OutBuffer {
 public:
  explicit OutBuffer(TensorType t)
      : type_(std::move(t)),
        buf_(std::make_shared<Blob>(std::vector<uint8_t>(static_cast<size_t>(type_.nbytes())))) {}
  template <class T> T* data() { return reinterpret_cast<T*>(buf_->writable()); }
  Tensor finish() { return Tensor{type_, buf_}; }

 private:
  TensorType type_;
  std::shared_ptr<Blob> buf_;
};

// Calls f(offset) for every multi-index of `shape` in row-major order, where offset =
// base + sum_k index_k * strides[k] (in elements). The innermost dimension runs as a tight
// loop; nothing is called when any dimension is 0.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, F&& f) {
  const size_t r = shape.size();
  for (int64_t d : shape) {
    if (d == 0) return;
  }
  if (r == 0) {
    f(base);
    return;
  }
  std::vector<int64_t> idx(r, 0);
  const int64_t inner_n = shape[r - 1];
  const int64_t inner_s = strides[r - 1];
  int64_t off = base;
  for (;;) {
    for (int64_t i = 0; i < inner_n; ++i) f(off + i * inner_s);
    size_t d = r - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// Materializes the strided view (shape, strides, offset; in elements) of `src` as a dense
// tensor of type {src dtype, shape}. Permute, Expand, Slice and the reductions use it.
Tensor materialize(const Tensor& src, const Shape& shape, const Shape& strides, int64_t offset);

// Product of shape[begin, end).
inline int64_t extent(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

// Element conversion with C semantics (static_cast), made total: -> bool is != 0, and float
// values outside the target integer type (NaN, inf, overflow) give what x86's cvtt*2si gives
// instead of undefined behaviour (int64: INT64_MIN; narrower: INT32_MIN narrowed modulo 2^n,
// which is what compilers emit for static_cast<int8_t>(float)).
template <class To, class From> inline To convert(From x) {
  if constexpr (std::is_same_v<To, bool>) {
    return x != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if constexpr (sizeof(To) == 8) {
      constexpr double kLim = 9223372036854775808.0;  // 2^63
      if (!(x >= -kLim && x < kLim)) return std::numeric_limits<To>::min();
      return static_cast<To>(x);
    } else {
      constexpr double kLim = 2147483648.0;  // 2^31
      if (!(x >= -kLim && x < kLim)) return static_cast<To>(std::numeric_limits<int32_t>::min());
      return static_cast<To>(static_cast<int32_t>(x));
    }
  } else {
    return static_cast<To>(x);
  }
}

// NaN test that compiles for every element type.
template <class T> inline bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(x);
  else return false;
}

}  // namespace chroma::interp

// Small graph-building helpers shared by the ATen handler files: Iota grids, where, zeros,
// dtype extremes, scans, zero padding/dilation of an axis (convolutions), message text.
#pragma once

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "import/builder.h"

namespace chroma::gu {

// "[1, 2, 3]", for messages.
inline std::string ints_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline Value iota(Builder& b, DType t, const Shape& shape, std::vector<double> coeffs, int64_t base) {
  Attrs a;
  a.dtype = t;
  a.ints = shape;
  a.coeffs = std::move(coeffs);
  a.scalar = Scalar::of_int(base);
  return b.graph().add(Op::kIota, {}, a);
}

// int64 index of dimension `axis` over `shape`.
inline Value axis_iota(Builder& b, const Shape& shape, int64_t axis) {
  std::vector<double> c(shape.size(), 0.0);
  c[static_cast<size_t>(axis)] = 1.0;
  return iota(b, DType::kI64, shape, c, 0);
}

inline Value const_i64(Builder& b, const std::vector<int64_t>& data, const Shape& shape) {
  ConstantData c;
  c.type = TensorType{DType::kI64, shape};
  std::vector<uint8_t> bytes(data.size() * sizeof(int64_t));
  if (!data.empty()) std::memcpy(bytes.data(), data.data(), bytes.size());
  c.bytes = make_blob(std::move(bytes));
  return b.graph().constant(std::move(c));
}

inline Value flat(Builder& b, Value v) { return b.reshape(v, {b.type(v).numel()}); }

inline Value where(Builder& b, Value cond, Value x, Value y) {
  return b.ew(EwOp::k_where, {Operand::of(cond), Operand::of(x), Operand::of(y)});
}
inline Value where(Builder& b, Value cond, Value x, Scalar y) {
  return b.ew(EwOp::k_where, {Operand::of(cond), Operand::of(x), Operand::of(y)}, b.type(x).dtype);
}

// Python-style negative indices: idx < 0 ? idx + n : idx (as int64).
inline Value wrap_negative(Builder& b, Value idx, int64_t n) {
  idx = b.cast(idx, DType::kI64);
  return where(b, b.ew(EwOp::k_lt, idx, Scalar::of_int(0)), b.ew(EwOp::k_add, idx, Scalar::of_int(n)), idx);
}

inline Value zeros(Builder& b, DType t, const Shape& s) { return b.full(Scalar::of_int(0), t, s); }

// The largest/smallest value of a dtype (infinities for floats): identities of max and min.
inline Scalar lowest(DType t) {
  if (is_float(t)) return Scalar::of_float(-std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::kI64: return Scalar::of_int(std::numeric_limits<int64_t>::min());
    case DType::kI32: return Scalar::of_int(std::numeric_limits<int32_t>::min());
    case DType::kI16: return Scalar::of_int(std::numeric_limits<int16_t>::min());
    case DType::kI8: return Scalar::of_int(std::numeric_limits<int8_t>::min());
    default: return Scalar::of_int(0);  // uint8, bool
  }
}
inline Scalar highest(DType t) {
  if (is_float(t)) return Scalar::of_float(std::numeric_limits<double>::infinity());
  switch (t) {
    case DType::kI64: return Scalar::of_int(std::numeric_limits<int64_t>::max());
    case DType::kI32: return Scalar::of_int(std::numeric_limits<int32_t>::max());
    case DType::kI16: return Scalar::of_int(std::numeric_limits<int16_t>::max());
    case DType::kI8: return Scalar::of_int(std::numeric_limits<int8_t>::max());
    case DType::kU8: return Scalar::of_int(255);
    default: return Scalar::of_int(1);
  }
}

// Inclusive scan along `axis` (0-d tensors are scanned as [1]).
inline Value scan(Builder& b, Value x, int64_t axis, ReduceKind k, bool log = false) {
  const TensorType t = b.type(x);
  if (t.rank() == 0) return b.reshape(scan(b, b.reshape(x, {1}), 0, k, log), {});
  if (t.numel() == 0) return x;
  Attrs a;
  a.axis = axis;
  a.reduce = k;
  a.log = log;
  return b.graph().add(Op::kScan, {x}, a);
}

// Pads (or, for negative amounts, crops) `axis` with zeros.
inline Value pad_or_crop(Builder& b, Value x, int64_t axis, int64_t lo, int64_t hi) {
  const int64_t n = b.type(x).shape[static_cast<size_t>(axis)];
  if (lo < 0 || hi < 0) {
    x = b.slice(x, axis, lo < 0 ? -lo : 0, hi < 0 ? n + hi : n, 1);
    lo = std::max<int64_t>(lo, 0);
    hi = std::max<int64_t>(hi, 0);
  }
  if (lo == 0 && hi == 0) return x;
  const TensorType t = b.type(x);
  std::vector<Value> parts;
  auto filler = [&](int64_t size) {
    Shape s = t.shape;
    s[static_cast<size_t>(axis)] = size;
    return b.full(Scalar::of_int(0), t.dtype, s);
  };
  if (lo) parts.push_back(filler(lo));
  parts.push_back(x);
  if (hi) parts.push_back(filler(hi));
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kConcat, parts, a);
}

// Inserts `s - 1` zeros between consecutive elements along `axis`: n -> (n - 1) * s + 1
// (the input of a transposed or strided-backward convolution).
inline Value dilate_axis(Builder& b, Value x, int64_t axis, int64_t s) {
  if (s == 1) return x;
  const TensorType t = b.type(x);
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  Shape col = t.shape;
  col.insert(col.begin() + axis + 1, 1);
  Shape zs = col;
  zs[static_cast<size_t>(axis) + 1] = s - 1;
  Attrs a;
  a.axis = axis + 1;
  Value v = b.graph().add(Op::kConcat, {b.reshape(x, col), b.full(Scalar::of_int(0), t.dtype, zs)}, a);
  Shape flat = t.shape;
  flat[static_cast<size_t>(axis)] = n * s;
  return b.slice(b.reshape(v, flat), axis, 0, (n - 1) * s + 1, 1);
}

}  // namespace chroma::gu

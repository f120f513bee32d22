// Helpers shared by the pooling (aten_pool.cpp) and upsampling (aten_upsample.cpp) handlers:
// constant tables, per-axis broadcast shapes, padding and constant-index gathers.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "import/builder.h"

namespace chroma::pool {

// ---- constants ----------------------------------------------------------------------------

inline Value constant_bytes(Builder& b, const TensorType& t, std::vector<uint8_t> bytes) {
  ConstantData cd;
  cd.type = t;
  cd.bytes = make_blob(std::move(bytes));
  return b.graph().constant(std::move(cd));
}

inline Value const_i64(Builder& b, const Shape& shape, const std::vector<int64_t>& v) {
  std::vector<uint8_t> bytes(v.size() * sizeof(int64_t));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return constant_bytes(b, TensorType{DType::kI64, shape}, std::move(bytes));
}

// A float constant in dtype `t` (float32 or float64).
inline Value const_float(Builder& b, DType t, const Shape& shape, const std::vector<double>& v) {
  if (is_half(t)) return b.cast(const_float(b, DType::kF32, shape, v), t);  // rounded once, to t
  std::vector<uint8_t> bytes;
  if (t == DType::kF64) {
    bytes.resize(v.size() * sizeof(double));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  } else {
    std::vector<float> f(v.begin(), v.end());
    bytes.resize(f.size() * sizeof(float));
    if (!f.empty()) std::memcpy(bytes.data(), f.data(), bytes.size());
  }
  return constant_bytes(b, TensorType{t, shape}, std::move(bytes));
}

// Shape of rank `rank` that is 1 everywhere except `n` at `axis` (to broadcast a per-axis
// table along that axis).
inline Shape along(int64_t rank, int64_t axis, int64_t n) {
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(axis)] = n;
  return s;
}

inline Value concat(Builder& b, const std::vector<Value>& parts, int64_t axis) {
  if (parts.size() == 1) return parts[0];
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kConcat, parts, a);
}

inline Value pad_axis(Builder& b, Value x, int64_t axis, int64_t lo, int64_t hi, Scalar value) {
  if (lo <= 0 && hi <= 0) return x;
  const TensorType t = b.type(x);
  auto filler = [&](int64_t n) {
    Shape s = t.shape;
    s[static_cast<size_t>(axis)] = n;
    return b.full(value, t.dtype, s);
  };
  std::vector<Value> parts;
  if (lo > 0) parts.push_back(filler(lo));
  parts.push_back(x);
  if (hi > 0) parts.push_back(filler(hi));
  return concat(b, parts, axis);
}

inline Value gather(Builder& b, Value x, int64_t axis, Value idx) {
  Attrs a;
  a.axis = axis;
  return b.graph().add(Op::kGather, {x, idx}, a);
}

// Gathers x[..., idx[o], ...] along `axis` with a constant index vector. Identity and
// "each element repeated r times" tables become views (no copy).
inline Value take(Builder& b, Value x, int64_t axis, const std::vector<int64_t>& idx) {
  const Shape shape = b.type(x).shape;
  const int64_t n = shape[static_cast<size_t>(axis)], m = static_cast<int64_t>(idx.size());
  bool identity = n == m;
  for (int64_t i = 0; identity && i < m; ++i) identity = idx[static_cast<size_t>(i)] == i;
  if (identity) return x;
  if (n > 0 && m % n == 0) {
    const int64_t r = m / n;
    bool repeat = true;
    for (int64_t i = 0; repeat && i < m; ++i) repeat = idx[static_cast<size_t>(i)] == i / r;
    if (repeat) {
      Shape s1 = shape, s2 = shape, s3 = shape;
      s1.insert(s1.begin() + axis + 1, 1);
      s2.insert(s2.begin() + axis + 1, r);
      s3[static_cast<size_t>(axis)] = m;
      return b.reshape(b.expand(b.reshape(x, s1), s2), s3);
    }
  }
  return gather(b, x, axis, const_i64(b, {m}, idx));
}

}  // namespace chroma::pool

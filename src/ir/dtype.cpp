#include "ir/dtype.h"

#include <cmath>
#include <utility>

namespace chroma {

std::string_view dtype_name(DType t) {
  switch (t) {
#define X(e, n, c, b) case DType::e: return n;
    CHROMA_FOR_EACH_DTYPE(X)
#undef X
  }
  return "?";
}

std::string_view dtype_ctype(DType t) {
  switch (t) {
#define X(e, n, c, b) case DType::e: return #c;
    CHROMA_FOR_EACH_DTYPE(X)
#undef X
  }
  return "?";
}

int64_t dtype_size(DType t) {
  switch (t) {
#define X(e, n, c, b) case DType::e: return b;
    CHROMA_FOR_EACH_DTYPE(X)
#undef X
  }
  return 0;
}

bool parse_dtype(std::string_view name, DType* out) {
#define X(e, n, c, b) if (name == n) { *out = DType::e; return true; }
  CHROMA_FOR_EACH_DTYPE(X)
#undef X
  return false;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

namespace {

std::string refusal_message(const std::string& target, const std::vector<Refusal>& refusals) {
  std::string m = "target '" + target + "': " + std::to_string(refusals.size()) +
                  " part(s) of the program cannot be compiled for it:";
  for (const Refusal& r : refusals) {
    m += "\n  " + r.what;
    if (!r.node.empty() || !r.source.empty()) {
      m += " (node " + (r.node.empty() ? std::string("?") : r.node) + (r.source.empty() ? "" : ", " + r.source) + ")";
    }
    m += ": " + r.reason;
  }
  return m;
}

}  // namespace

UnsupportedError::UnsupportedError(const std::string& target, std::vector<Refusal> refusals)
    : CompileError(refusal_message(target, refusals)), refusals_(std::move(refusals)) {}

std::string CompileError::valid_utf8(const std::string& s) {
  std::string r;
  r.reserve(s.size());
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = b[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n && !(len == 2 && c < 0xC2) && !(len == 4 && c > 0xF4);
    for (size_t k = 1; ok && k < len; ++k) ok = (b[i + k] & 0xC0) == 0x80;
    if (ok && len == 3) {
      const unsigned cp = ((c & 0xF) << 12) | ((b[i + 1] & 0x3F) << 6) | (b[i + 2] & 0x3F);
      ok = cp >= 0x800 && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok && len == 4) {
      const unsigned cp = ((c & 0x7) << 18) | ((b[i + 1] & 0x3F) << 12) | ((b[i + 2] & 0x3F) << 6) | (b[i + 3] & 0x3F);
      ok = cp >= 0x10000 && cp <= 0x10FFFF;
    }
    if (ok) {
      r.append(s, i, len);
      i += len;
    } else {
      static const char kHex[] = "0123456789abcdef";
      r += "\\x";
      r += kHex[c >> 4];
      r += kHex[c & 15];
      ++i;
    }
  }
  return r;
}

void check_tensor_size(const TensorType& t, const std::string& what) {
  int64_t bytes = dtype_size(t.dtype);
  bool zero = false;
  for (int64_t d : t.shape) {
    if (d < 0) throw CompileError(what + ": negative dimension in shape " + shape_str(t.shape));
    zero = zero || d == 0;
  }
  if (zero) return;
  for (int64_t d : t.shape) {
    if (d > kMaxTensorBytes / bytes) {
      throw CompileError(what + ": a " + std::string(dtype_name(t.dtype)) + " tensor of shape " + shape_str(t.shape) +
                         " is larger than the " + std::to_string(kMaxTensorBytes) + "-byte limit");
    }
    bytes *= d;
  }
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::string TensorType::str() const {
  std::string_view n = dtype_name(dtype);
  std::string short_name;
  if (n == "float32") short_name = "f32";
  else if (n == "float64") short_name = "f64";
  else if (n == "int64") short_name = "i64";
  else if (n == "int32") short_name = "i32";
  else if (n == "int16") short_name = "i16";
  else if (n == "int8") short_name = "i8";
  else if (n == "uint8") short_name = "u8";
  else if (n == "float16") short_name = "f16";
  else if (n == "bfloat16") short_name = "bf16";
  else short_name = "bool";
  return short_name + shape_str(shape);
}

bool half_value(double v, DType t) {
  if (std::isnan(v)) return true;
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) != v) return false;
  const float r = t == DType::kBF16 ? half_detail::round_to_bf16(f) : half_detail::f16_to_f32(half_detail::f32_to_f16(f));
  return r == f;
}

}  // namespace chroma

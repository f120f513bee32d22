#include "ir/dtype.h"

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
  else short_name = "bool";
  return short_name + shape_str(shape);
}

}  // namespace chroma

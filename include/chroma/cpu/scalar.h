// Scalar helpers used by the elementwise table (chroma/elementwise.def).
//
// These define Chroma's elementwise semantics once, for both the compiler's constant folder
// and the generated code. They follow PyTorch's eager semantics: NaN propagates through
// maximum/minimum/relu, integer division and remainder round toward negative infinity like
// Python, bool arithmetic is logical.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace chroma::scalar {

template <class T> inline constexpr bool kIsFloat = std::is_floating_point_v<T>;

// Integer division by zero has no value: the helpers return 0 and raise this flag, which the
// program entry point checks after a run (PyTorch raises ZeroDivisionError).
inline thread_local bool int_division_by_zero = false;
template <class T> inline constexpr bool kIsBool = std::is_same_v<T, bool>;

template <class T> inline bool truthy(T a) { return a != T(0); }

template <class T> inline T abs_(T a) {
  if constexpr (kIsBool<T>) return a;
  else if constexpr (kIsFloat<T>) return std::fabs(a);
  else return a < 0 ? T(-a) : a;
}
template <class T> inline T rsqrt(T a) { return T(1) / std::sqrt(a); }
template <class T> inline T reciprocal(T a) { return T(1) / a; }
template <class T> inline T sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }
template <class T> inline T ceil_(T a) { if constexpr (kIsFloat<T>) return std::ceil(a); else return a; }
template <class T> inline T floor_(T a) { if constexpr (kIsFloat<T>) return std::floor(a); else return a; }
template <class T> inline T trunc_(T a) { if constexpr (kIsFloat<T>) return std::trunc(a); else return a; }
// Round half to even, as torch.round does (std::nearbyint in the default rounding mode).
template <class T> inline T round_even(T a) { if constexpr (kIsFloat<T>) return std::nearbyint(a); else return a; }
template <class T> inline T sign(T a) {
  if constexpr (kIsBool<T>) return a;
  else if constexpr (kIsFloat<T>) return T((a > T(0)) - (a < T(0)));  // sign(NaN) = 0, as PyTorch's CPU kernel
  else return T((a > T(0)) - (a < T(0)));
}
// NaN propagates: NaN < 0 is false, so NaN is returned unchanged.
template <class T> inline T relu(T a) { return a < T(0) ? T(0) : a; }
// Bitwise ops on floating types are rejected by the importer; the float branch only keeps
// every instantiation well-formed.
template <class T> inline T bitwise_not(T a) { if constexpr (kIsBool<T>) return !a; else if constexpr (kIsFloat<T>) return a; else return T(~a); }
template <class T> inline bool isnan_(T a) { if constexpr (kIsFloat<T>) return std::isnan(a); else return false; }
template <class T> inline bool isinf_(T a) { if constexpr (kIsFloat<T>) return std::isinf(a); else return false; }

template <class T> inline T add(T a, T b) { if constexpr (kIsBool<T>) return a || b; else return T(a + b); }
template <class T> inline T mul(T a, T b) { if constexpr (kIsBool<T>) return a && b; else return T(a * b); }

template <class T> inline T floor_divide(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return std::floor(a / b);
  } else if constexpr (kIsBool<T>) {
    return a;
  } else {
    if (b == 0) {
      int_division_by_zero = true;
      return T(0);
    }
    T q = T(a / b);
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  }
}
template <class T> inline T remainder(T a, T b) {
  if constexpr (kIsFloat<T>) {
    T r = std::fmod(a, b);
    if (r != T(0) && ((r < T(0)) != (b < T(0)))) r += b;
    return r;
  } else if constexpr (kIsBool<T>) {
    return false;
  } else {
    if (b == 0) {
      int_division_by_zero = true;
      return T(0);
    }
    T r = T(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
    return r;
  }
}
template <class T> inline T fmod_(T a, T b) {
  if constexpr (kIsFloat<T>) return std::fmod(a, b);
  else if constexpr (kIsBool<T>) return false;
  else {
    if (b == 0) {
      int_division_by_zero = true;
      return T(0);
    }
    return T(a % b);
  }
}
template <class T> inline T pow_(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return std::pow(a, b);
  } else if constexpr (kIsBool<T>) {
    return a || !b;
  } else {
    if (b < 0) return a == 1 ? T(1) : (a == -1 ? T((b % 2) ? -1 : 1) : T(0));
    T r = 1, base = a;
    for (T e = b; e > 0; e >>= 1) {
      if (e & 1) r = T(r * base);
      base = T(base * base);
    }
    return r;
  }
}
template <class T> inline T maximum(T a, T b) {
  if constexpr (kIsFloat<T>) { if (std::isnan(a) || std::isnan(b)) return a + b; }
  return a < b ? b : a;
}
template <class T> inline T minimum(T a, T b) {
  if constexpr (kIsFloat<T>) { if (std::isnan(a) || std::isnan(b)) return a + b; }
  return b < a ? b : a;
}
template <class T> inline T bitwise_and(T a, T b) { if constexpr (kIsBool<T>) return a && b; else if constexpr (kIsFloat<T>) return a; else return T(a & b); }
template <class T> inline T bitwise_or(T a, T b) { if constexpr (kIsBool<T>) return a || b; else if constexpr (kIsFloat<T>) return a; else return T(a | b); }
template <class T> inline T bitwise_xor(T a, T b) { if constexpr (kIsBool<T>) return a != b; else if constexpr (kIsFloat<T>) return a; else return T(a ^ b); }

}  // namespace chroma::scalar

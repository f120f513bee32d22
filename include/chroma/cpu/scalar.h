// Scalar helpers used by the elementwise table (chroma/elementwise.def).
//
// These define Chroma's elementwise semantics once, for both the compiler's constant folder
// and the generated code. They follow PyTorch's eager semantics: NaN propagates through
// maximum/minimum/relu, integer division and remainder round toward negative infinity like
// Python, bool arithmetic is logical.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

// The transcendental helpers below are written to vectorize inside the kernels' loops, which
// needs them inlined there whatever the inliner's size heuristics say.
#if defined(__GNUC__)
#define CHROMA_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define CHROMA_ALWAYS_INLINE inline
#endif

namespace chroma::scalar {

template <class T> inline constexpr bool kIsFloat = std::is_floating_point_v<T>;

// Integer division by zero has no value: the helpers return 0 and raise this flag, which the
// program entry point checks after a run (PyTorch raises ZeroDivisionError).
inline thread_local bool int_division_by_zero = false;
template <class T> inline constexpr bool kIsBool = std::is_same_v<T, bool>;

template <class T> CHROMA_ALWAYS_INLINE bool truthy(T a) { return a != T(0); }

template <class T> CHROMA_ALWAYS_INLINE T abs_(T a) {
  if constexpr (kIsBool<T>) return a;
  else if constexpr (kIsFloat<T>) return std::fabs(a);
  else return a < 0 ? T(-a) : a;
}
template <class T> CHROMA_ALWAYS_INLINE T rsqrt(T a) { return T(1) / std::sqrt(a); }
template <class T> CHROMA_ALWAYS_INLINE T reciprocal(T a) { return T(1) / a; }
// ---- transcendental functions ------------------------------------------------------------
//
// float: branch-free implementations (selects instead of branches, integer bit manipulation
// instead of frexp/ldexp, no calls) that GCC auto-vectorizes inside the generated kernels'
// loops. Polynomials use std::fma, which is correctly rounded everywhere (one vfmadd under
// -march=native, a libm call in the constant folder), so folding and run time compute
// bit-identical values. double and every other type: std:: functions, unchanged.
//
// Accuracy: maximum error in ulp of the exact result, measured over all 2^32 float inputs
// against double libm (tests/cpp/test_scalar_math.cpp checks slightly looser bounds on a
// sweep of every 251st bit pattern). Special values follow libm:
//   exp_     1.01 ulp. NaN -> NaN, +inf -> +inf, -inf -> 0; +inf above 88.7228, gradual
//            underflow (subnormal results), 0 below -103.97.
//   expm1_   1.44 ulp (relative, also near 0). -> -1 below -17.4, +inf above 88.7228,
//            expm1(-0) = -0.
//   log_     0.83 ulp. log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, subnormal inputs.
//   log1p_   1.44 ulp. log1p(-1) = -inf, log1p(x < -1) = NaN, log1p(+-0) = +-0.
//   tanh_    1.33 ulp. Saturates to +-1, tanh(+-0) = +-0.
//   sigmoid  2.40 ulp, subnormal results included (no flush to 0 below -88.7).
//            sigmoid(+inf) = 1, sigmoid(-inf) = 0.
//   erf_     1.20 ulp (glibc erff: 0.97). erf(+-0) = +-0, erf(+-inf) = +-1. PyTorch's
//            CPU torch.erf is also within ~1 ulp, so results agree to ~1e-7 relative.
// NaN inputs give NaN everywhere.
namespace detail {

CHROMA_ALWAYS_INLINE uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }
CHROMA_ALWAYS_INLINE float f32_from_bits(uint32_t u) { return std::bit_cast<float>(u); }
CHROMA_ALWAYS_INLINE float fabs_f32(float x) { return f32_from_bits(f32_bits(x) & 0x7fffffffu); }
// |m| with the sign of s.
CHROMA_ALWAYS_INLINE float with_sign_of(float m, float s) { return f32_from_bits(f32_bits(m) | (f32_bits(s) & 0x80000000u)); }
// a * b + c, rounded once (std::fma is exact everywhere, so folding and run time agree).
CHROMA_ALWAYS_INLINE float fma_(float a, float b, float c) { return std::fma(a, b, c); }
// 2^n as a float for n in [-126, 127] (other n give garbage, never UB).
CHROMA_ALWAYS_INLINE float pow2i(int32_t n) { return f32_from_bits((static_cast<uint32_t>(n) + 127u) << 23); }

// x = n ln2 + r, |r| <= ln2/2 (Cody-Waite: n ln2_hi is exact, n ln2_lo adds the rest).
// n = round-to-nearest(x log2e) through the 1.5 * 2^23 shifter (no rounding call, so loops
// still vectorize); valid for |x| < 2^21.
struct Reduced { float r; int32_t n; };
CHROMA_ALWAYS_INLINE Reduced reduce_ln2(float x) {
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23
  const float t = fma_(x, 1.44269504088896341f, kShift);
  const float n = t - kShift;
  const float r = fma_(n, 2.12194440e-4f, fma_(n, -0.693359375f, x));
  return {r, static_cast<int32_t>(f32_bits(t) - f32_bits(kShift))};
}

// exp(r) - 1 for |r| <= ln2/2: r + r^2 P(r), Cephes expf's minimax polynomial.
CHROMA_ALWAYS_INLINE float expm1_poly(float r) {
  float p = fma_(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = fma_(p, r, 8.3334519073e-3f);
  p = fma_(p, r, 4.1665795894e-2f);
  p = fma_(p, r, 1.6666665459e-1f);
  p = fma_(p, r, 5.0000001201e-1f);
  return fma_(p, r * r, r);
}

// exp(x) for x in [-86.6, 88.0] (the result stays normal); no special-value handling.
CHROMA_ALWAYS_INLINE float exp_core(float x) {
  const Reduced d = reduce_ln2(x);
  const float y = expm1_poly(d.r) + 1.0f;
  return f32_from_bits(f32_bits(y) + (static_cast<uint32_t>(d.n) << 23));
}

CHROMA_ALWAYS_INLINE float exp_f32(float x) {
  // Clamp so that n stays at most 128; beyond, the scaling below overflows to inf by itself. Below
  // -104 the result is 0 (exp(-103.97) is half the smallest subnormal): it is selected, and the
  // arithmetic runs on a harmless 0 instead, because scaling down to a subnormal or zero costs a
  // microcode assist per element on x86 (a causal mask's -inf half of every softmax row ran many
  // times slower than PyTorch: bench/results/README.md). NaN passes through the selects and the
  // arithmetic.
  const bool zero = x < -104.0f;
  float xc = x > 89.0f ? 89.0f : x;
  xc = zero ? 0.0f : xc;
  const Reduced d = reduce_ln2(xc);
  const float y = expm1_poly(d.r) + 1.0f;
  // 2^n as two normal factors: overflow gives inf, the last multiply rounds subnormal
  // results once.
  const int32_t n1 = d.n >> 1;
  const float r = y * pow2i(n1) * pow2i(d.n - n1);
  return zero ? 0.0f : r;
}

CHROMA_ALWAYS_INLINE float expm1_f32(float x) {
  float xc = x > 89.0f ? 89.0f : x;
  xc = xc < -30.0f ? -30.0f : xc;
  const Reduced d = reduce_ln2(xc);
  const float u = expm1_poly(d.r);
  // expm1(x) = 2^n (u + 1 - 2^-n); 2^-n is clamped to 2^-126, where 1 - 2^-n is 1 anyway.
  const int32_t neg = d.n > 126 ? -126 : -d.n;
  const int32_t n1 = d.n >> 1;
  const float v = (u + (1.0f - pow2i(neg))) * pow2i(n1) * pow2i(d.n - n1);
  const float r = d.n == 0 ? u : v;
  return x == 0.0f ? x : r;  // expm1(-0) = -0
}

CHROMA_ALWAYS_INLINE float log_f32(float x) {
  // Subnormals: scale by 2^23 first.
  const bool sub = x < 1.17549435e-38f;
  const float xs = sub ? x * 8388608.0f : x;
  // x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact).
  const uint32_t t = f32_bits(xs) - 0x3f3504f3u;
  const int32_t e = (static_cast<int32_t>(t) >> 23) - (sub ? 23 : 0);
  const float f = f32_from_bits((t & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  const float fe = static_cast<float>(e);
  // Cephes logf: log(1 + f) = f - f^2/2 + f^3 P(f); e ln2 in two parts.
  const float z = f * f;
  float p = fma_(7.0376836292e-2f, f, -1.1514610310e-1f);
  p = fma_(p, f, 1.1676998740e-1f);
  p = fma_(p, f, -1.2420140846e-1f);
  p = fma_(p, f, 1.4249322787e-1f);
  p = fma_(p, f, -1.6668057665e-1f);
  p = fma_(p, f, 2.0000714765e-1f);
  p = fma_(p, f, -2.4999993993e-1f);
  p = fma_(p, f, 3.3333331174e-1f);
  float y = fma_(fe, -2.12194440e-4f, p * f * z);
  y = fma_(z, -0.5f, y);
  float r = fma_(fe, 0.693359375f, f + y);
  r = x == std::numeric_limits<float>::infinity() ? x : r;
  r = x == 0.0f ? -std::numeric_limits<float>::infinity() : r;
  r = x < 0.0f ? std::numeric_limits<float>::quiet_NaN() : r;
  return x != x ? x : r;
}

CHROMA_ALWAYS_INLINE float log1p_f32(float x) {
  // log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x rounded: the second term corrects
  // the rounding of u to first order (and gives x itself when u == 1).
  const float u = 1.0f + x;
  float r = log_f32(u) + (x - (u - 1.0f)) / u;
  r = x == std::numeric_limits<float>::infinity() ? x : r;
  r = x == -1.0f ? -std::numeric_limits<float>::infinity() : r;
  r = x < -1.0f ? std::numeric_limits<float>::quiet_NaN() : r;
  r = x == 0.0f ? x : r;
  return x != x ? x : r;
}

CHROMA_ALWAYS_INLINE float tanh_f32(float x) {
  // Evaluated on a = |x|; the sign of x is put back at the end (tanh(-0) = -0).
  const float a = fabs_f32(x);
  // |x| < 0.625: Cephes tanhf's odd polynomial.
  const float z = a * a;
  float p = fma_(-5.70498872745e-3f, z, 2.06390887954e-2f);
  p = fma_(p, z, -5.37397155531e-2f);
  p = fma_(p, z, 1.33314422036e-1f);
  p = fma_(p, z, -3.33332819422e-1f);
  const float small = fma_(p * z, a, a);
  // Otherwise 1 - 2 / (exp(2|x|) + 1); tanh rounds to 1 from |x| = 9.01 on, so clamping to
  // 9.5 keeps exp_core in range.
  const float c = a > 9.5f ? 9.5f : a;
  const float big = 1.0f - 2.0f / (exp_core(c + c) + 1.0f);
  const float r = with_sign_of(a < 0.625f ? small : big, x);
  return x != x ? x : r;
}

// 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) for x < 0: e = exp(-|x|) never overflows, and
// tiny results come out accurate (down to subnormals).
CHROMA_ALWAYS_INLINE float sigmoid_f32(float x) {
  const float e = exp_f32(-fabs_f32(x));
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

CHROMA_ALWAYS_INLINE float erf_f32(float x) {
  // Evaluated on a = |x|; the sign of x is put back at the end (erf(-0) = -0).
  const float a = fabs_f32(x);
  // |x| < 0.921875: erf(a) = a + a P(a^2), P minimax for relative error.
  const float s = a * a;
  float p = fma_(-5.99085295e-4f, s, 4.99318028e-3f);
  p = fma_(p, s, -2.67666169e-2f);
  p = fma_(p, s, 1.12818159e-1f);
  p = fma_(p, s, -3.76124948e-1f);
  p = fma_(p, s, 1.28379151e-1f);
  const float small = fma_(p, a, a);
  // Otherwise erf(a) = 1 - exp(R(t) - t^2), R(t) = log(erfc(t)) + t^2 minimax on
  // [0.921875, 4] (weighted by erfc/erf); erf rounds to 1 from 3.92 on, so t is clamped to 4.
  const float t = a > 4.0f ? 4.0f : a;
  float q = fma_(1.95720786e-4f, t, -3.04109394e-3f);
  q = fma_(q, t, 2.22184546e-2f);
  q = fma_(q, t, -1.03914030e-1f);
  q = fma_(q, t, 3.62797737e-1f);
  q = fma_(q, t, -1.12766373e+0f);
  q = fma_(q, t, -1.98554044e-4f);
  const float big = 1.0f - exp_core(fma_(-t, t, q));
  const float r = with_sign_of(a < 0.921875f ? small : big, x);
  return x != x ? x : r;
}

}  // namespace detail

// float -> the vectorizable versions above; other types keep std:: (and its result type).
template <class T> CHROMA_ALWAYS_INLINE auto exp_(T a) { if constexpr (std::is_same_v<T, float>) return detail::exp_f32(a); else return std::exp(a); }
template <class T> CHROMA_ALWAYS_INLINE auto expm1_(T a) { if constexpr (std::is_same_v<T, float>) return detail::expm1_f32(a); else return std::expm1(a); }
template <class T> CHROMA_ALWAYS_INLINE auto log_(T a) { if constexpr (std::is_same_v<T, float>) return detail::log_f32(a); else return std::log(a); }
template <class T> CHROMA_ALWAYS_INLINE auto log1p_(T a) { if constexpr (std::is_same_v<T, float>) return detail::log1p_f32(a); else return std::log1p(a); }
template <class T> CHROMA_ALWAYS_INLINE auto tanh_(T a) { if constexpr (std::is_same_v<T, float>) return detail::tanh_f32(a); else return std::tanh(a); }
template <class T> CHROMA_ALWAYS_INLINE auto erf_(T a) { if constexpr (std::is_same_v<T, float>) return detail::erf_f32(a); else return std::erf(a); }
template <class T> CHROMA_ALWAYS_INLINE T sigmoid(T a) {
  if constexpr (std::is_same_v<T, float>) return detail::sigmoid_f32(a);
  else return T(1) / (T(1) + std::exp(-a));
}

template <class T> CHROMA_ALWAYS_INLINE T ceil_(T a) { if constexpr (kIsFloat<T>) return std::ceil(a); else return a; }
template <class T> CHROMA_ALWAYS_INLINE T floor_(T a) { if constexpr (kIsFloat<T>) return std::floor(a); else return a; }
template <class T> CHROMA_ALWAYS_INLINE T trunc_(T a) { if constexpr (kIsFloat<T>) return std::trunc(a); else return a; }
// Round half to even, as torch.round does (std::nearbyint in the default rounding mode).
template <class T> CHROMA_ALWAYS_INLINE T round_even(T a) { if constexpr (kIsFloat<T>) return std::nearbyint(a); else return a; }
template <class T> CHROMA_ALWAYS_INLINE T sign(T a) {
  if constexpr (kIsBool<T>) return a;
  else if constexpr (kIsFloat<T>) return T((a > T(0)) - (a < T(0)));  // sign(NaN) = 0, as PyTorch's CPU kernel
  else return T((a > T(0)) - (a < T(0)));
}
// NaN propagates: NaN < 0 is false, so NaN is returned unchanged.
template <class T> CHROMA_ALWAYS_INLINE T relu(T a) { return a < T(0) ? T(0) : a; }
// Bitwise ops on floating types are rejected by the importer; the float branch only keeps
// every instantiation well-formed.
template <class T> CHROMA_ALWAYS_INLINE T bitwise_not(T a) { if constexpr (kIsBool<T>) return !a; else if constexpr (kIsFloat<T>) return a; else return T(~a); }
template <class T> CHROMA_ALWAYS_INLINE bool isnan_(T a) { if constexpr (kIsFloat<T>) return std::isnan(a); else return false; }
template <class T> CHROMA_ALWAYS_INLINE bool isinf_(T a) { if constexpr (kIsFloat<T>) return std::isinf(a); else return false; }

template <class T> CHROMA_ALWAYS_INLINE T add(T a, T b) { if constexpr (kIsBool<T>) return a || b; else return T(a + b); }
template <class T> CHROMA_ALWAYS_INLINE T mul(T a, T b) { if constexpr (kIsBool<T>) return a && b; else return T(a * b); }

// x / -1 never reaches the hardware divide: INT_MIN / -1 traps (SIGFPE) on x86. PyTorch's
// floor division wraps it to INT_MIN, and its remainder and fmod give 0; so do these.
template <class T> CHROMA_ALWAYS_INLINE T negate_wrapping(T a) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(U(0) - static_cast<U>(a)));
}

template <class T> CHROMA_ALWAYS_INLINE T floor_divide(T a, T b) {
  if constexpr (kIsFloat<T>) {
    return std::floor(a / b);
  } else if constexpr (kIsBool<T>) {
    return a;
  } else {
    if (b == 0) {
      int_division_by_zero = true;
      return T(0);
    }
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return negate_wrapping(a);
    }
    T q = T(a / b);
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  }
}
template <class T> CHROMA_ALWAYS_INLINE T remainder(T a, T b) {
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
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);
    }
    T r = T(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
    return r;
  }
}
template <class T> CHROMA_ALWAYS_INLINE T fmod_(T a, T b) {
  if constexpr (kIsFloat<T>) return std::fmod(a, b);
  else if constexpr (kIsBool<T>) return false;
  else {
    if (b == 0) {
      int_division_by_zero = true;
      return T(0);
    }
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return T(0);
    }
    return T(a % b);
  }
}
template <class T> CHROMA_ALWAYS_INLINE T pow_(T a, T b) {
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
// NaN propagates: a NaN operand is returned (b's when both are). maximum(-0, +0) returns a. Written
// as two selects, each on one comparison, so that both max/min reductions and elementwise trees of
// them vectorize: with the condition `a < b || b != b` GCC 12 turned a tree of 8 maximums (a 3x3
// max pool) into branches, and the pool ran scalar (bench/results/README.md).
template <class T> CHROMA_ALWAYS_INLINE T maximum(T a, T b) {
  if constexpr (kIsFloat<T>) {
    const T a2 = b != b ? b : a;
    return a2 < b ? b : a2;
  } else {
    return a < b ? b : a;
  }
}
template <class T> CHROMA_ALWAYS_INLINE T minimum(T a, T b) {
  if constexpr (kIsFloat<T>) {
    const T a2 = b != b ? b : a;
    return b < a2 ? b : a2;
  } else {
    return b < a ? b : a;
  }
}
template <class T> CHROMA_ALWAYS_INLINE T bitwise_and(T a, T b) { if constexpr (kIsBool<T>) return a && b; else if constexpr (kIsFloat<T>) return a; else return T(a & b); }
template <class T> CHROMA_ALWAYS_INLINE T bitwise_or(T a, T b) { if constexpr (kIsBool<T>) return a || b; else if constexpr (kIsFloat<T>) return a; else return T(a | b); }
template <class T> CHROMA_ALWAYS_INLINE T bitwise_xor(T a, T b) { if constexpr (kIsBool<T>) return a != b; else if constexpr (kIsFloat<T>) return a; else return T(a ^ b); }
// PyTorch's shifts (lshift_kernel/rshift_kernel): a negative or too large shift gives 0 to the
// left, and to the right the sign fill (0 for unsigned types). Integers only; the importer
// refuses float and bool operands.
template <class T> CHROMA_ALWAYS_INLINE T shift_left(T a, T b) {
  if constexpr (kIsBool<T> || kIsFloat<T>) {
    return a;
  } else {
    constexpr int64_t bits = sizeof(T) * 8;
    if (static_cast<std::make_signed_t<T>>(b) < 0 || static_cast<int64_t>(b) >= bits) return T(0);
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) << b);
  }
}
template <class T> CHROMA_ALWAYS_INLINE T shift_right(T a, T b) {
  if constexpr (kIsBool<T> || kIsFloat<T>) {
    return a;
  } else {
    constexpr int64_t most = sizeof(T) * 8 - (std::is_signed_v<T> ? 1 : 0);
    if (static_cast<std::make_signed_t<T>>(b) < 0 || static_cast<int64_t>(b) >= most) return static_cast<T>(a >> most);
    return static_cast<T>(a >> b);
  }
}
// Greatest common divisor of |a| and |b| (PyTorch's calc_gcd: Euclid's algorithm).
template <class T> CHROMA_ALWAYS_INLINE T gcd_(T a, T b) {
  if constexpr (kIsBool<T> || kIsFloat<T>) {
    return a;
  } else {
    if constexpr (std::is_signed_v<T>) {
      a = a < 0 ? static_cast<T>(-a) : a;
      b = b < 0 ? static_cast<T>(-b) : b;
    }
    while (a != 0) {
      const T c = a;
      a = static_cast<T>(b % a);
      b = c;
    }
    return b;
  }
}

// Scans (cumsum, cumprod, cummax, cummin, logcumsumexp) and combining scatters: shared by
// constant folding and the generated code so both compute the same thing. Kind: 0 sum,
// 1 prod, 2 max, 3 min (NaN propagates), 4 log-sum-exp. Sums and products of floats
// accumulate in double, as PyTorch's CPU cumsum/cumprod do; of integers in uint64 (wrapping).
template <int Kind, class T>
using ScanAcc = std::conditional_t<Kind == 2 || Kind == 3 || kIsBool<T>, T,
                                   std::conditional_t<kIsFloat<T>, double, uint64_t>>;
template <class A> inline A log_add_exp(A a, A b) {
  if (a != a) return a;
  if (b != b) return b;
  const A lo = a < b ? a : b, hi = a < b ? b : a;
  if (lo == hi && !std::isfinite(lo)) return a;  // both +inf or both -inf
  return hi + std::log1p(std::exp(lo - hi));
}
template <int Kind, class A> inline A scan_combine(A a, A b) {
  if constexpr (Kind == 0) return add(a, b);
  else if constexpr (Kind == 1) return mul(a, b);
  else if constexpr (Kind == 2) return maximum(a, b);
  else if constexpr (Kind == 3) return minimum(a, b);
  else return log_add_exp(a, b);
}

}  // namespace chroma::scalar

#include "chroma/cpu/special.h"  // special functions (Bessel, gamma, zeta, polynomials, ...)

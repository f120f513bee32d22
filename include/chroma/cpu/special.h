// Special functions for the elementwise table (chroma/elementwise.def): gamma family, error
// function inverses, incomplete gamma, Hurwitz zeta, Bessel and Airy functions, orthogonal
// polynomials, and a few float utilities (frexp, nextafter, signbit, angle).
//
// Included from chroma/cpu/scalar.h, so the constant folder and the generated code compute the
// same values. Semantics follow eager PyTorch (edge values checked by
// tests/python/test_special_ops.py):
//   * Most functions compute in double and round to the operand type (float32 results are then
//     at least as accurate as PyTorch's float kernels). Bessel functions use C++17's special
//     math functions (std::cyl_bessel_*), guarded so that they never see arguments outside
//     their domain (they would throw).
//   * The orthogonal polynomials and trigamma compute in the operand type with the recurrence
//     PyTorch uses, including its fused multiply-adds (std::fma), its special cases and its
//     switch to the trigonometric closed forms for large n, so float results agree to the bit
//     (rounding errors of a recurrence grow with n; any other evaluation order would differ).
//   * The degree n of a polynomial is truncated to an integer; NaN, +-inf and negative n give 0.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace chroma::scalar {
namespace sp {

constexpr double kPi = 3.14159265358979323846;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- Bessel functions of the first kind, modified ------------------------------------------

// The sums of the large-x (Hankel) expansions e^-x I_nu(x) = S_I / sqrt(2 pi x) and
// e^x K_nu(x) = S_K sqrt(pi / (2x)): S = sum_k c_k a_k(nu) / x^k with
// a_k = prod_{j<=k} (4 nu^2 - (2j-1)^2) / (k! 8^k), c_k = (-1)^k for I (alternate), 1 for K.
// Used above x = 40, where the smallest term is far below double precision.
inline double hankel_sum(int nu, double x, bool alternate) {
  const double mu = 4.0 * nu * nu;
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 60; ++k) {
    const double f = (mu - (2.0 * k - 1) * (2.0 * k - 1)) / (k * 8.0 * x);
    const double next = term * (alternate ? -f : f);
    if (std::fabs(next) >= std::fabs(term)) break;  // asymptotic series: stop at the smallest term
    term = next;
    sum += term;
    if (std::fabs(term) < 1e-17 * std::fabs(sum)) break;
  }
  return sum;
}

// e^-|x| I_nu(|x|) for nu = 0, 1 (sign handled by the callers).
inline double bessel_i_scaled(int nu, double ax) {
  if (ax > 40.0) return hankel_sum(nu, ax, true) / std::sqrt(2.0 * kPi * ax);
  return std::exp(-ax) * std::cyl_bessel_i(static_cast<double>(nu), ax);
}
inline double bessel_i(int nu, double x) {
  if (std::isnan(x) || std::isinf(x)) return kNaN;
  const double ax = std::fabs(x);
  double r;
  if (ax > 40.0) {
    const double h = std::exp(0.5 * ax);  // e^x in two halves: I_nu stays finite past e^709
    r = hankel_sum(nu, ax, true) / std::sqrt(2.0 * kPi * ax) * h * h;
  } else {
    r = std::cyl_bessel_i(static_cast<double>(nu), ax);
  }
  return (nu == 1 && x < 0) ? -r : r;
}
inline double bessel_ie(int nu, double x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return (nu == 1 && x < 0) ? -0.0 : 0.0;
  const double r = bessel_i_scaled(nu, std::fabs(x));
  return (nu == 1 && x < 0) ? -r : r;
}
// K_nu(x) (scaled: e^x K_nu(x)); x < 0 -> NaN, 0 -> inf, inf -> 0.
inline double bessel_k(int nu, double x, bool scaled) {
  if (std::isnan(x) || x < 0) return kNaN;
  if (x == 0) return kInf;
  if (std::isinf(x)) return 0.0;
  if (x > 40.0) {
    const double s = hankel_sum(nu, x, false) * std::sqrt(kPi / (2.0 * x));
    return scaled ? s : s * std::exp(-x);
  }
  const double k = std::cyl_bessel_k(static_cast<double>(nu), x);
  return scaled ? k * std::exp(x) : k;
}
// J_nu(x) for nu = 0, 1: J0 even, J1 odd; +-inf -> NaN (as PyTorch).
inline double bessel_j(int nu, double x) {
  if (std::isnan(x) || std::isinf(x)) return kNaN;
  const double r = std::cyl_bessel_j(static_cast<double>(nu), std::fabs(x));
  return (nu == 1 && x < 0) ? -r : r;
}
// Y_nu(x): x < 0 -> NaN, 0 -> -inf, inf -> NaN (as PyTorch).
inline double bessel_y(int nu, double x) {
  if (std::isnan(x) || x < 0 || std::isinf(x)) return kNaN;
  if (x == 0) return -kInf;
  return std::cyl_neumann(static_cast<double>(nu), x);
}
inline double spherical_j0(double x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return 0.0;
  if (std::fabs(x) < 0.5) {  // sin(x)/x = 1 - x^2/6 + x^4/120 - ...
    const double z = x * x;
    return 1.0 + z * (-1.0 / 6 + z * (1.0 / 120 + z * (-1.0 / 5040 + z * (1.0 / 362880 + z * (-1.0 / 39916800)))));
  }
  return std::sin(x) / x;
}
// Ai(x) through Bessel functions of order 1/3 (zeta = 2/3 |x|^{3/2}):
//   x > 0: Ai(x)  = sqrt(x/3) K_{1/3}(zeta) / pi
//   x < 0: Ai(-y) = sqrt(y)/2 (J_{1/3}(zeta) - Y_{1/3}(zeta) / sqrt(3))
// (the second from J_{-1/3} = (J_{1/3} - sqrt(3) Y_{1/3}) / 2); +-inf -> NaN (as PyTorch).
inline double airy_ai(double x) {
  if (std::isnan(x) || std::isinf(x)) return kNaN;
  constexpr double kAi0 = 0.355028053887817239260;  // Ai(0)
  if (x == 0) return kAi0;
  const double ax = std::fabs(x);
  if (ax < 1e-8) return kAi0 - 0.258819403792806798405 * x;  // Ai(0) + Ai'(0) x
  const double zeta = 2.0 / 3.0 * ax * std::sqrt(ax);
  if (x > 0) {
    if (zeta > 700.0) return 0.0;
    return std::sqrt(x / 3.0) * std::cyl_bessel_k(1.0 / 3.0, zeta) / kPi;
  }
  const double j = std::cyl_bessel_j(1.0 / 3.0, zeta), y = std::cyl_neumann(1.0 / 3.0, zeta);
  return std::sqrt(ax) / 2.0 * (j - y / std::sqrt(3.0));
}

// ---- gamma family ----------------------------------------------------------------------

// digamma: reflection below 0, recurrence up to x >= 10, then the asymptotic series.
// digamma(+-0) = -+inf, negative integers and -inf -> NaN.
inline double digamma(double x) {
  if (std::isnan(x)) return x;
  if (x == 0) return std::signbit(x) ? kInf : -kInf;
  if (x == kInf) return x;
  if (x < 0) {
    if (x == std::floor(x)) return kNaN;  // poles (and -inf)
    const double r = x - std::nearbyint(x);  // exact; tan(pi x) has period 1
    return digamma(1.0 - x) - kPi / std::tan(kPi * r);
  }
  double acc = 0.0;
  while (x < 10.0) {
    acc -= 1.0 / x;
    x += 1.0;
  }
  const double z = 1.0 / (x * x);
  const double series =
      z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (691.0 / 32760 - z / 12))))));
  return acc + std::log(x) - 0.5 / x - series;
}

// trigamma in the operand type T with PyTorch's evaluation (reflection below 1/2 with
// sin(pi x), six recurrence steps, a short asymptotic series), so poles agree: trigamma(0) =
// inf, trigamma(-1) is large but finite (sin(-pi) is not 0 in floating point).
template <class T> inline T trigamma(T x) {
  T sign = T(1), result = T(0);
  if (x < T(0.5)) {
    sign = T(-1);
    const T s = std::sin(static_cast<T>(kPi) * x);
    result -= static_cast<T>(kPi * kPi) / (s * s);
    x = T(1) - x;
  }
  for (int i = 0; i < 6; ++i) {
    result += T(1) / (x * x);
    x += T(1);
  }
  const T ixx = T(1) / (x * x);
  result += (T(1) + T(1) / (T(2) * x) + ixx * (T(1) / T(6) - ixx * (T(1) / T(30) - ixx * (T(1) / T(42))))) / x;
  return sign * result;
}

// Hurwitz zeta(s, q) = sum_k (q + k)^-s by Euler-Maclaurin: a direct sum up to q + N >= 10,
// the integral of the tail, and Bernoulli corrections. PyTorch's edge values: s == 1 -> inf,
// s < 1 -> NaN, q a non-positive integer -> inf, q < 0 with non-integer s -> NaN, q = inf -> NaN,
// checked in that order (so zeta(1, NaN) = zeta(NaN, 0) = inf, as in PyTorch).
inline double zeta(double s, double q) {
  if (s == 1) return kInf;
  if (s < 1) return kNaN;
  if (q <= 0) {
    if (q == std::floor(q)) return kInf;
    if (s != std::floor(s)) return kNaN;
  }
  if (std::isnan(s) || std::isnan(q)) return kNaN;
  if (std::isinf(q)) return kNaN;
  // q < 0 (integer s) is summed term by term up to q + N >= 10, as PyTorch does; below -2^24
  // that would take more than 16 million terms per element (PyTorch's float32 loop never
  // ends there), so the result is NaN instead.
  if (q < -16777216.0) return kNaN;
  if (std::isinf(s)) return q == 1 ? 1.0 : (q < 1 ? kInf : kNaN);
  double sum = 0.0;
  double a = q;
  int n = 0;
  while (a < 10.0 || n < 10) {
    sum += std::pow(a, -s);
    a += 1.0;
    ++n;
  }
  // tail: a^(1-s)/(s-1) + a^-s/2 + sum_j B_2j/(2j)! s(s+1)...(s+2j-2) a^(-s-2j+1)
  static constexpr double kB2jOverFact[] = {
      1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600, 1.0 / 47900160, -691.0 / 1307674368000.0,
      1.0 / 74724249600.0, -3617.0 / 10670622842880000.0, 43867.0 / 5109094217170944000.0,
      -174611.0 / 802857662698291200000.0};
  const double as = std::pow(a, -s);
  sum += a * as / (s - 1.0) + 0.5 * as;
  double rising = s, pw = as / a;  // s (s+1)...(s+2j-2), a^(-s-2j+1)
  for (int j = 0; j < 10; ++j) {
    const double t = kB2jOverFact[j] * rising * pw;
    sum += t;
    if (std::fabs(t) < 1e-17 * std::fabs(sum)) break;
    rising *= (s + 2 * j + 1) * (s + 2 * j + 2);
    pw /= a * a;
  }
  return sum;
}

// polygamma(n, x) for integer n >= 0: digamma, trigamma, else (-1)^(n+1) n! zeta(n+1, x).
template <class T> inline T polygamma(T n, T x) {
  if (n == T(0)) return static_cast<T>(digamma(static_cast<double>(x)));
  if (n == T(1)) return trigamma(x);
  const double nn = static_cast<double>(n);
  const double f = std::tgamma(nn + 1.0);
  const double sign = std::fmod(nn, 2.0) == 0 ? -1.0 : 1.0;
  return static_cast<T>(sign * f * zeta(nn + 1.0, static_cast<double>(x)));
}

// Regularized incomplete gamma P(a, x) (upper = false) or Q(a, x) (upper = true): the series
// for x < a + 1, the continued fraction (modified Lentz) otherwise.
// The edge cases are checked in PyTorch's order, so a NaN in the other operand does not always
// propagate: P(inf, NaN) = 0, P(NaN, 0) = 0, P(NaN, inf) = 1.
inline double igamma(double a, double x, bool upper) {
  if (a < 0 || x < 0) return kNaN;
  if (a == 0) return x > 0 ? (upper ? 0.0 : 1.0) : kNaN;
  if (x == 0) return upper ? 1.0 : 0.0;
  if (std::isinf(a)) return std::isinf(x) ? kNaN : (upper ? 1.0 : 0.0);
  if (std::isinf(x)) return upper ? 0.0 : 1.0;
  if (std::isnan(a) || std::isnan(x)) return kNaN;
  const double lpre = a * std::log(x) - x - std::lgamma(a);  // log(x^a e^-x / Gamma(a))
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term;
    for (int k = 1; k < 100000; ++k) {
      term *= x / (a + k);
      sum += term;
      if (term < sum * 1e-17) break;
    }
    const double p = std::exp(lpre) * sum;
    return upper ? 1.0 - p : p;
  }
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / kTiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::fabs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1.0) < 1e-16) break;
  }
  const double q = std::exp(lpre) * h;
  return upper ? q : 1.0 - q;
}

// ---- error function family --------------------------------------------------------------

// erfinv: an initial guess (Giles' single-precision approximation) refined by Newton steps on
// erf (erfc near +-1, where 1 - |y| is exact).
inline double erfinv(double y) {
  if (std::isnan(y) || y < -1 || y > 1) return kNaN;
  if (y == 1) return kInf;
  if (y == -1) return -kInf;
  if (y == 0) return y;
  const double ay = std::fabs(y);
  double w = -std::log((1.0 - ay) * (1.0 + ay)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * ay;
  const double k2sqrtpi = 1.12837916709551257390;  // 2/sqrt(pi)
  for (int i = 0; i < 3; ++i) {
    const double f = ay > 0.5 ? (1.0 - ay) - std::erfc(x) : std::erf(x) - ay;
    const double step = f / (k2sqrtpi * std::exp(-x * x));
    x -= step;
    if (std::fabs(step) <= 1e-17 * x) break;
  }
  return y < 0 ? -x : x;
}

// ndtri(p): the x with Phi(x) = p. Phi(x) = erfc(-x/sqrt2)/2; for p < 1/2 Newton steps on
// that form keep relative accuracy for tiny p, for p > 1/2 on 1 - p = erfc(x/sqrt2)/2.
inline double ndtri(double p) {
  if (std::isnan(p) || p < 0 || p > 1) return kNaN;
  if (p == 0) return -kInf;
  if (p == 1) return kInf;
  const bool lower = p < 0.5;
  const double pp = lower ? p : 1.0 - p;  // exact for p >= 1/2
  // start: x = -sqrt2 erfcinv(2 pp), from erfinv when 2pp is not tiny, else the tail form
  double x;
  if (pp > 1e-300) {
    x = -1.41421356237309504880 * erfinv(1.0 - 2.0 * pp);
    if (std::isinf(x)) x = -std::sqrt(-2.0 * std::log(pp));
  } else {
    x = -std::sqrt(-2.0 * std::log(pp));
  }
  constexpr double kInvSqrt2 = 0.70710678118654752440, kInvSqrt2Pi = 0.39894228040143267794;
  for (int i = 0; i < 50; ++i) {
    const double phi = 0.5 * std::erfc(-x * kInvSqrt2);
    const double dens = kInvSqrt2Pi * std::exp(-0.5 * x * x);
    if (dens == 0) break;
    // Newton on log(Phi) for relative accuracy in the tail
    const double step = (std::log(phi) - std::log(pp)) * phi / dens;
    x -= step;
    if (!(std::fabs(step) > 1e-16 * std::fabs(x))) break;
  }
  return lower ? x : -x;
}

// erfcx(x) = e^{x^2} erfc(x): direct below 12, the asymptotic series above (no overflow);
// x < 0: 2 e^{x^2} - erfcx(-x) (inf below -26.6, as PyTorch).
inline double erfcx(double x) {
  if (std::isnan(x)) return x;
  if (x < 0) {
    if (x < -26.7) return kInf;
    return 2.0 * std::exp(x * x) - erfcx(-x);
  }
  if (x < 12.0) return std::exp(x * x) * std::erfc(x);
  if (std::isinf(x)) return 0.0;
  // 1/(x sqrt(pi)) sum_k (-1)^k (2k-1)!! / (2x^2)^k
  const double z = 1.0 / (2.0 * x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k < 40; ++k) {
    term *= -(2.0 * k - 1) * z;
    sum += term;
    if (std::fabs(term) < 1e-17) break;
  }
  return sum / (x * 1.77245385090551602730);
}

// ---- orthogonal polynomials (in the operand type; see the header comment) ---------------

// Degree from a tensor element: truncated toward 0; NaN, out of int64 range -> -1 (result 0).
template <class T> inline int64_t degree(T n) {
  if (!(n > T(-9.2e18) && n < T(9.2e18))) return -1;
  return static_cast<int64_t>(n);
}
// Three-term recurrence r = fma(m, q, -p), starting from p0 = 1 and p1 = q1.
template <class T> inline T cheb_rec(T m, T q1, int64_t n) {
  T p = T(1), q = q1;
  for (int64_t k = 2; k <= n; ++k) {
    const T r = std::fma(m, q, -p);
    p = q;
    q = r;
    if (q != q) break;  // NaN stays NaN
  }
  return q;
}
template <class T> inline T odd_neg(int64_t n, T v) { return (n % 2 == 0) ? v : -v; }

template <class T> inline T chebyshev_t(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return (x > 0 || n % 2 == 0) ? T(1) : T(-1);
  if (n > 6 && std::fabs(x) < T(1)) return std::cos(static_cast<T>(n) * std::acos(x));
  if (n == 0) return T(1);
  if (n == 1) return x;
  return cheb_rec(x + x, x, n);
}
template <class T> inline T chebyshev_u(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return x > 0 ? static_cast<T>(n + 1) : odd_neg(n, static_cast<T>(n + 1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T t = std::acos(x);
    return std::sin(static_cast<T>(n + 1) * t) / std::sin(t);
  }
  if (n == 0) return T(1);
  if (n == 1) return x + x;
  return cheb_rec(x + x, x + x, n);
}
template <class T> inline T chebyshev_v(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return x > 0 ? T(1) : odd_neg(n, static_cast<T>(2 * n + 1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T t = std::acos(x);
    return std::cos((static_cast<T>(n) + T(0.5)) * t) / std::cos(t / T(2));
  }
  if (n == 0) return T(1);
  if (n == 1) return x + x - T(1);
  return cheb_rec(x + x, x + x - T(1), n);
}
template <class T> inline T chebyshev_w(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return x > 0 ? static_cast<T>(2 * n + 1) : odd_neg(n, T(1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T t = std::acos(x);
    return std::sin((static_cast<T>(n) + T(0.5)) * t) / std::sin(t / T(2));
  }
  if (n == 0) return T(1);
  if (n == 1) return x + x + T(1);
  return cheb_rec(x + x, x + x + T(1), n);
}
// Shifted: the same in y = 2x - 1, with PyTorch's thresholds for the closed forms
// (T, U, V: n > 6; W: n > 4).
template <class T> inline T shifted_chebyshev(int kind, T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  const T y = x + x - T(1);
  const int limit = kind == 3 ? 4 : 6;
  if (n > limit && std::fabs(y) < T(1)) {
    const T t = std::acos(y);
    switch (kind) {
      case 0: return std::cos(static_cast<T>(n) * t);
      case 1: return std::sin(static_cast<T>(n + 1) * t) / std::sin(t);
      case 2: return std::cos((static_cast<T>(n) + T(0.5)) * t) / std::cos(t / T(2));
      default: return std::sin((static_cast<T>(n) + T(0.5)) * t) / std::sin(t / T(2));
    }
  }
  switch (kind) {
    case 0: return chebyshev_t(y, nt);
    case 1: return chebyshev_u(y, nt);
    case 2: return chebyshev_v(y, nt);
    default: return chebyshev_w(y, nt);
  }
}
template <class T> inline T hermite_h(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (n == 0) return T(1);
  T p = T(1), q = x + x;
  for (int64_t k = 1; k < n; ++k) {
    const T r = std::fma(x + x, q, -(static_cast<T>(k + k) * p));
    p = q;
    q = r;
    if (q != q) break;
  }
  return q;
}
template <class T> inline T hermite_he(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (n == 0) return T(1);
  T p = T(1), q = x;
  for (int64_t k = 1; k < n; ++k) {
    const T r = std::fma(x, q, -(static_cast<T>(k) * p));
    p = q;
    q = r;
    if (q != q) break;
  }
  return q;
}
template <class T> inline T laguerre_l(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (x == T(0) || n == 0) return T(1);
  T p = T(1), q = T(1) - x;
  for (int64_t k = 1; k < n; ++k) {
    const T kk = static_cast<T>(k);
    const T r = std::fma(kk + (static_cast<T>(k + 1) - x), q, -(kk * p)) / static_cast<T>(k + 1);
    p = q;
    q = r;
    if (q != q) break;
  }
  return q;
}
template <class T> inline T legendre_p(T x, T nt) {
  const int64_t n = degree(nt);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return (x > 0 || n == 0) ? T(1) : odd_neg(n, T(1));
  if (n == 0) return T(1);
  T p = T(1), q = x;
  for (int64_t k = 1; k < n; ++k) {
    const T kk = static_cast<T>(k);
    const T r = std::fma(static_cast<T>(k + k + 1) * x, q, -(kk * p)) / static_cast<T>(k + 1);
    p = q;
    q = r;
    if (q != q) break;
  }
  return q;
}

}  // namespace sp

// ---- entry points used by elementwise.def ------------------------------------------------
// D: evaluate in double, round to the operand type.
#define CHROMA_SP_D1(name, expr) \
  template <class T> inline T name(T a) { const double x = static_cast<double>(a); return static_cast<T>(expr); }
#define CHROMA_SP_D2(name, expr)                                          \
  template <class T> inline T name(T a, T b) {                            \
    const double x = static_cast<double>(a), y = static_cast<double>(b); \
    return static_cast<T>(expr);                                          \
  }
// I0, I1 overflow to +-inf as soon as e^|x| does in the operand type (PyTorch scales e^|x|
// down afterwards, so float32 i0(89) is inf although I0(89) = 1.9e37 is representable).
template <class T> inline T i0_(T a) {
  if (std::isfinite(a) && std::isinf(std::exp(std::fabs(a)))) return std::numeric_limits<T>::infinity();
  return static_cast<T>(sp::bessel_i(0, static_cast<double>(a)));
}
template <class T> inline T i1_(T a) {
  if (std::isfinite(a) && std::isinf(std::exp(std::fabs(a)))) return a < 0 ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  return static_cast<T>(sp::bessel_i(1, static_cast<double>(a)));
}
CHROMA_SP_D1(i0e_, sp::bessel_ie(0, x))
CHROMA_SP_D1(i1e_, sp::bessel_ie(1, x))
CHROMA_SP_D1(k0_, sp::bessel_k(0, x, false))
CHROMA_SP_D1(k1_, sp::bessel_k(1, x, false))
CHROMA_SP_D1(k0e_, sp::bessel_k(0, x, true))
CHROMA_SP_D1(k1e_, sp::bessel_k(1, x, true))
CHROMA_SP_D1(j0_, sp::bessel_j(0, x))
CHROMA_SP_D1(j1_, sp::bessel_j(1, x))
CHROMA_SP_D1(y0_, sp::bessel_y(0, x))
CHROMA_SP_D1(y1_, sp::bessel_y(1, x))
CHROMA_SP_D1(spherical_j0_, sp::spherical_j0(x))
CHROMA_SP_D1(airy_ai_, sp::airy_ai(x))
CHROMA_SP_D1(lgamma_, std::lgamma(x))
CHROMA_SP_D1(digamma_, sp::digamma(x))
CHROMA_SP_D1(erfinv_, sp::erfinv(x))
CHROMA_SP_D1(ndtri_, sp::ndtri(x))
CHROMA_SP_D1(erfcx_, sp::erfcx(x))
CHROMA_SP_D2(igamma_, sp::igamma(x, y, false))
CHROMA_SP_D2(igammac_, sp::igamma(x, y, true))
CHROMA_SP_D2(zeta_, sp::zeta(x, y))
#undef CHROMA_SP_D1
#undef CHROMA_SP_D2

template <class T> inline T polygamma_(T n, T x) { return sp::polygamma(n, x); }
template <class T> inline T hypot_(T a, T b) { return std::hypot(a, b); }
template <class T> inline T nextafter_(T a, T b) { return std::nextafter(a, b); }
template <class T> inline T frexp_mantissa(T a) { int e = 0; return std::frexp(a, &e); }
template <class T> inline T frexp_exponent(T a) { int e = 0; std::frexp(a, &e); return static_cast<T>(e); }
template <class T> inline bool signbit_(T a) {
  // The sign bit read through the bits, not std::signbit: GCC 12 with -march=znver4 stops
  // with an internal compiler error when it vectorizes std::signbit over floats widened from
  // bfloat16 (a V4SI shift of a V4SF subreg).
  if constexpr (std::is_same_v<T, float>) return (std::bit_cast<std::uint32_t>(a) >> 31) != 0;
  else if constexpr (std::is_same_v<T, double>) return (std::bit_cast<std::uint64_t>(a) >> 63) != 0;
  else if constexpr (std::is_floating_point_v<T>) return std::signbit(a);
  else if constexpr (std::is_signed_v<T>) return a < 0;
  else return false;
}
// angle of a real number: pi for negatives (and -inf), NaN stays NaN, else 0.
template <class T> inline T angle_(T a) { return a != a ? a : (a < T(0) ? static_cast<T>(sp::kPi) : T(0)); }

}  // namespace chroma::scalar

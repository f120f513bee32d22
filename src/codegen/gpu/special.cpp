// Special functions in float32 for GPU kernels: the gamma family (lgamma, digamma, trigamma,
// polygamma), Hurwitz zeta, the incomplete gamma functions, the error-function family (erfc,
// erfcx, erfinv, ndtri), the orthogonal polynomials and the bit-level float utilities
// (nextafter, frexp); the Bessel functions and airy_ai are in special_bessel.cpp, the helpers
// both share in special_common.h. The CPU computes these in float64 (chroma/cpu/special.h); a
// GPU has no float64, so each is written for float32 arithmetic, with its own argument
// reduction and polynomials fitted to the float64 functions (special_fits.h, printed by
// scripts/fit_gpu_special.py with their measured float32 error). None relies on a dialect
// builtin's accuracy beyond log, sqrt and pow (zeta's terms): sin/cos/tan of pi*x are
// polynomials on an exactly reduced argument (WGSL allows sin an absolute error of 2^-11),
// sin x and cos x are reduced by pi/2 in five parts (to |x| = 1e5), e^x by ln 2 in two, NaN
// tests are bit tests, and nextafter/frexp work on the bits alone (denormals included,
// whatever the device's flushing).
#include "codegen/gpu/special.h"

#include <cmath>
#include <functional>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <vector>

#include "codegen/gpu/special_common.h"
#include "codegen/gpu/special_fits.h"

namespace chroma::gpu {

using namespace special_detail;

namespace special_detail {

Ex exp_reduced(Block& b, const Ex& s_in, const Ex& tail) {
  // clamped (NaN to 0) so that k converts to an integer: callers select their own results
  // outside [-110, 100]
  Ex s = select(s_in, f(-110.0), lt(s_in, f(-110.0)));
  s = b.let(select(select(s, f(100.0), gt(s, f(100.0))), f(0.0), is_nan(s_in)));
  const Ex k = b.let(fcall("round", {s * f(1.44269504088896341)}));
  const Ex r = b.let(fma(k, f(-1.42860682030941723e-06), fma(k, f(-0.693145751953125), s)) + tail);
  const Ex e = poly(b, r, {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320});
  const Ex ki = b.let(convert(Ty::kI32, k));
  const Ex half = b.let(ki / lit_i(2));
  auto pow2 = [&](const Ex& n) {
    return from_bits(convert(Ty::kU32, (n + lit_i(127)) << lit_i(23)));
  };
  return b.let(e * pow2(half) * pow2(ki - half));
}

// sin r and cos r for |r| <= pi/4 (a little beyond is fine): Taylor to r^13 and r^14.
SinCos sincos_poly(Block& b, const Ex& r) {
  const Ex r2 = b.let(r * r);
  const Ex sr = b.let(r * poly(b, r2, {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800,
                                               1.0 / 6227020800.0}));
  const Ex cr = b.let(poly(b, r2, {1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800, 1.0 / 479001600,
                                   -1.0 / 87178291200.0}));
  return {sr, cr};
}

// sin and cos of k pi/2 + r from those of r (k an integral float).
SinCos rotate_quadrants(Block& b, const Ex& k, const SinCos& r) {
  const Ex q = b.let(convert(Ty::kI32, k) & lit_i(3));
  const Ex odd = b.let(eq(q & lit_i(1), lit_i(1)));
  const Ex sp = b.let(select(r.s, r.c, odd)), cp = b.let(select(r.c, r.s, odd));
  // sin: +sin r, +cos r, -sin r, -cos r; cos: +cos r, -sin r, -cos r, +sin r
  const Ex s = b.let(select(sp, -sp, ge(q, lit_i(2))));
  const Ex c = b.let(select(cp, -cp, lor(eq(q, lit_i(1)), eq(q, lit_i(2)))));
  return {s, c};
}

SinCos sincos_f32(Block& b, const Ex& x_in) {
  const Ex x = b.let(select(f(0.0), x_in, le(fcall("abs", {x_in}), f(1e5))));
  const Ex k = b.let(fcall("round", {x * f(0.636619772367581343)}));
  Ex r = x;
  for (double part : {1.5703125, 0.000484466552734375, -6.407499313354492e-07, 9.89530235528946e-10,
                      2.5633440682570896e-12}) {
    r = b.let(r - k * f(part));
  }
  return rotate_quadrants(b, k, sincos_poly(b, r));
}
Ex sin_f32(Block& b, const Ex& x) { return sincos_f32(b, x).s; }

}  // namespace special_detail

namespace {

// sin(pi r) for |r| <= 1/2: the Taylor series of sin(pi r) to r^17 (its remainder is below
// 2e-10 there), relative error of an ulp or two, exact at r = 0.
Ex sinpi_reduced(Block& b, const Ex& r) {
  const Ex r2 = b.let(r * r);
  const Ex s = poly(b, r2, {3.14159265358979324, -5.16771278004997003, 2.55016403987734549, -0.599264529320792077,
                            0.0821458866111282288, -0.00737043094571435087, 0.000466302805767612549,
                            -2.19153534478302168e-05, 7.95205400147551263e-07});
  return s * r;
}

// r = x - nearest integer (exact for every float32; x must be finite and below 2^23 in
// magnitude to be non-integral at all).
Ex reduce_half(Block& b, const Ex& x) { return b.let(x - fcall("round", {x})); }

// cos(pi r) for |r| <= 1/2 as sin(pi (1/2 - |r|)): relative accuracy near its zeros.
Ex cospi_reduced(Block& b, const Ex& r) {
  return sinpi_reduced(b, b.let(f(0.5) - fcall("abs", {r})));
}

// x is a non-positive integer (or -inf): lgamma's poles, digamma's NaNs below zero.
Ex nonpositive_integer(Block& b, const Ex& x) {
  return b.let(land(le(x, f(0.0)), eq(x, fcall("floor", {x}))));
}

}  // namespace

// ---- the gamma family ---------------------------------------------------------------------

// digamma: x < 0 reflects, digamma(x) = digamma(1 - x) - pi cos(pi x) / sin(pi x); the
// positive argument climbs to 10 (subtracting 1/x per step), then the asymptotic series
// log y - 1/(2y) - sum B_2k / (2k y^2k) to y^-6. digamma(+-0) = -+inf, negative integers and
// -inf give NaN, +inf gives +inf (PyTorch's).
Ex digamma_f32(Block& b, const Ex& x) {
  const Ex neg = b.let(lt(x, f(0.0)));
  const Ex y = b.mut(Ty::kF32, select(x, f(1.0) - x, neg), "dy");
  const Ex acc = b.mut(Ty::kF32, f(0.0), "da");
  b.loop("di", lit_i(0), lit_i(10), lit_i(1), [&](Block& in, const Ex&) {
    in.if_(lt(y, f(10.0)), [&](Block& t) {
      t.assign(acc, acc - f(1.0) / y);
      t.assign(y, y + f(1.0));
    });
  });
  const Ex z = b.let(f(1.0) / (y * y));
  const Ex series = z * poly(b, z, {1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240});
  const Ex positive = b.let(acc + fcall("log", {y}) - f(0.5) / y - series);
  const Ex r = reduce_half(b, x);
  const Ex reflection = bin(BinOp::kDiv, f(3.14159265358979324) * cospi_reduced(b, r), sinpi_reduced(b, r));
  Ex out = select(positive, positive - reflection, neg);
  out = select(out, nan(), nonpositive_integer(b, x));
  // +-0: -+inf (the sign of zero decides)
  out = select(out, from_bits(lit_u(0xff800000u) ^ (bits(x) & lit_u(0x80000000u))),
               eq(magnitude(x), lit_u(0)));
  out = select(out, x, eq(bits(x), lit_u(0x7f800000u)));
  return select(out, x, is_nan(x));
}

// lgamma(2 + t) = t P(t) on 0 <= t < 1 (P fitted; lgamma is 0 at 1 and 2, and this keeps its
// relative accuracy there).
Ex lgamma_near_two(Block& b, const Ex& t) {
  return t * poly(b, t, kLgamma2PlusT);
}

// lgamma: x >= 8 by Stirling's series to x^-5; 0 < x < 8 moved into [2, 3) (the product of
// the steps taken, whose logarithm is added or subtracted) and the fitted P there; x < 0 by
// reflection, lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x). Non-positive integers and
// +-inf give +inf, NaN stays NaN.
Ex lgamma_f32(Block& b, const Ex& x) {
  const Ex neg = b.let(lt(x, f(0.0)));
  const Ex y = b.let(select(x, f(1.0) - x, neg));
  // Stirling: (y - 1/2) log y - y + log(2 pi)/2 + 1/(12 y) - 1/(360 y^3) + 1/(1260 y^5)
  const Ex ly = b.let(fcall("log", {y}));
  const Ex iy = b.let(f(1.0) / y);
  const Ex iy2 = b.let(iy * iy);
  const Ex corr = iy * poly(b, iy2, {1.0 / 12, -1.0 / 360, 1.0 / 1260});
  const Ex big = b.let(fma(y - f(0.5), ly, f(0.918938533204672742) - y) + corr);
  // below 8: step into [2, 3), multiplying the factors passed
  const Ex z = b.mut(Ty::kF32, y, "gz");
  const Ex up = b.mut(Ty::kF32, f(1.0), "gu");    // product of the factors below 2
  const Ex down = b.mut(Ty::kF32, f(1.0), "gd");  // product of the factors from 3 up
  b.loop("gi", lit_i(0), lit_i(6), lit_i(1), [&](Block& in, const Ex&) {
    in.if_(land(ge(z, f(3.0)), lt(z, f(8.0))), [&](Block& t) {
      t.assign(z, z - f(1.0));
      t.assign(down, down * z);
    });
    in.if_(lt(z, f(2.0)), [&](Block& t) {
      t.assign(up, up * z);
      t.assign(z, z + f(1.0));
    });
  });
  const Ex small = b.let(lgamma_near_two(b, z - f(2.0)) + fcall("log", {down}) - fcall("log", {up}));
  const Ex pos = b.let(select(small, big, ge(y, f(8.0))));
  const Ex r = reduce_half(b, x);
  const Ex s = fcall("abs", {sinpi_reduced(b, r)});
  const Ex reflected = fcall("log", {f(3.14159265358979324) / s}) - pos;
  Ex out = select(pos, reflected, neg);
  out = select(out, f(INFINITY), lor(nonpositive_integer(b, x), is_inf(x)));
  return select(out, x, is_nan(x));
}

// trigamma with PyTorch's float32 evaluation, so that its poles agree: reflection below 1/2
// through sin of the rounded product pi x (sin(-pi) is not 0 in float32: trigamma(-1) is large
// but finite, trigamma(0) inf), six recurrence steps, a short asymptotic series.
Ex trigamma_f32(Block& b, const Ex& x) {
  const Ex reflect = b.let(lt(x, f(0.5)));
  const Ex px = b.let(f(3.14159265358979324) * x);
  const Ex sn = b.let(select(fcall("sin", {px}), sin_f32(b, px), le(fcall("abs", {px}), f(1e5))));
  const Ex result = b.mut(Ty::kF32, select(f(0.0), -(f(9.86960440108935862) / (sn * sn)), reflect), "tr");
  const Ex y = b.mut(Ty::kF32, select(x, f(1.0) - x, reflect), "ty");
  b.loop("ti", lit_i(0), lit_i(6), lit_i(1), [&](Block& in, const Ex&) {
    in.assign(result, result + f(1.0) / (y * y));
    in.assign(y, y + f(1.0));
  });
  const Ex ixx = b.let(f(1.0) / (y * y));
  const Ex series = f(1.0) + f(1.0) / (f(2.0) * y) + ixx * poly(b, ixx, {1.0 / 6, -1.0 / 30, 1.0 / 42});
  const Ex r = b.let(result + series / y);
  return select(r, -r, reflect);
}

// Hurwitz zeta(s, q) = sum_k (q + k)^-s by Euler-Maclaurin, as the CPU's (special.h): the
// direct sum up to q + N >= 10 (N >= 10), the tail's integral, half its first term and ten
// Bernoulli corrections; PyTorch's edge values checked in its order. q < 0 (integer s) sums
// term by term up to 10 as PyTorch does; below -65536 the result is NaN (the CPU's limit is
// -2^24: a GPU invocation must not walk millions of terms).
Ex zeta_f32(Block& b, const Ex& s, const Ex& q) {
  const Ex terms = b.let(select(lit_i(10), convert(Ty::kI32, fcall("ceil", {f(10.0) - q})),
                                land(lt(q, f(0.0)), ge(q, f(-65536.0)))));
  const Ex odd_s = b.let(eq(s % f(2.0), f(1.0)));
  // Neumaier's compensated sum: terms of both signs (q < 0) cancel, (-1/2)^-5 against
  // (1/2)^-5, and would leave the float32 rounding of the largest partial sum
  const Ex sum = b.mut(Ty::kF32, f(0.0), "zs");
  const Ex comp = b.mut(Ty::kF32, f(0.0), "zc");
  const Ex a = b.mut(Ty::kF32, q, "za");
  b.loop("zi", lit_i(0), terms, lit_i(1), [&](Block& in, const Ex&) {
    // (a)^-s, a negative base only with an integer s (the edge cases below take the rest)
    const Ex p0 = in.let(fcall("pow", {fcall("abs", {a}), -s}));
    const Ex p = in.let(select(p0, -p0, land(lt(a, f(0.0)), odd_s)));
    const Ex t = in.let(sum + p);
    const Ex lost = select(p - t + sum, sum - t + p,
                           ge(fcall("abs", {sum}), fcall("abs", {p})));
    in.assign(comp, comp + select(lost, f(0.0), is_inf(t)));  // (an infinite sum stays so)
    in.assign(sum, t);
    in.assign(a, a + f(1.0));
  });
  b.assign(sum, sum + comp);
  const Ex as = b.let(fcall("pow", {a, -s}));
  const Ex total = b.mut(Ty::kF32, sum + fma(a / (s - f(1.0)), as, f(0.5) * as), "zt");
  const Ex rising = b.mut(Ty::kF32, s, "zr");
  const Ex pw = b.mut(Ty::kF32, as / a, "zp");
  static constexpr double kB2jOverFact[] = {
      1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600, 1.0 / 47900160, -691.0 / 1307674368000.0,
      1.0 / 74724249600.0, -3617.0 / 10670622842880000.0, 43867.0 / 5109094217170944000.0,
      -174611.0 / 802857662698291200000.0};
  for (int j = 0; j < 10; ++j) {
    b.assign(total, fma(f(kB2jOverFact[j]) * rising, pw, total));
    b.assign(rising, rising * ((s + f(2.0 * j + 1)) * (s + f(2.0 * j + 2))));
    b.assign(pw, pw / (a * a));
  }
  Ex out = b.let(total);
  // PyTorch's order: q = inf, s = inf, q beyond the walk, NaN, then q <= 0, s < 1, s == 1
  out = select(out, select(select(nan(), f(INFINITY), lt(q, f(1.0))), f(1.0), eq(q, f(1.0))),
               eq(bits(s), lit_u(0x7f800000u)));
  out = select(out, nan(), lor(is_inf(q), lt(q, f(-65536.0))));
  out = select(out, nan(), lor(is_nan(s), is_nan(q)));
  const Ex q_nonpositive = le(q, f(0.0));
  out = select(out, nan(), land(q_nonpositive, ne(s, fcall("floor", {s}))));
  out = select(out, f(INFINITY), land(q_nonpositive, eq(q, fcall("floor", {q}))));
  out = select(out, nan(), lt(s, f(1.0)));
  return select(out, f(INFINITY), eq(s, f(1.0)));
}

// polygamma(n, x) for a literal n >= 0: digamma, trigamma, else (-1)^(n+1) n! zeta(n+1, x).
Ex polygamma_f32(Block& b, int64_t n, const Ex& x) {
  if (n == 0) return digamma_f32(b, x);
  if (n == 1) return trigamma_f32(b, x);
  double factorial = 1.0;
  for (int64_t i = 2; i <= n; ++i) factorial *= static_cast<double>(i);
  const double sign = n % 2 == 0 ? -1.0 : 1.0;
  return f(sign * factorial) * zeta_f32(b, f(static_cast<double>(n + 1)), x);
}

// ---- orthogonal polynomials ------------------------------------------------------------------
//
// As the CPU's (special.h, PyTorch's evaluation in the operand type): the degree truncated
// toward 0 (NaN, infinite or negative: the result is 0), the special values at |x| = 1, the
// closed forms in t = acos(x) for |x| < 1 above a small degree (Chebyshev kinds), else the
// three-term recurrence with fused multiply-adds. A GPU invocation walks at most 65536 steps:
// a degree beyond that whose recurrence has not already ended in NaN (the CPU's early exit,
// reached once the values overflow) gives NaN rather than a walk of millions of steps.

namespace {

constexpr int kMaxRecurrence = 65536;

struct Degree {
  Ex valid;  // a finite degree that is not negative
  Ex n;      // f32, truncated
  Ex odd;    // bool
};

Degree degree_of(Block& b, const Ex& nt) {
  const Ex finite = land(gt(nt, f(-9.2e18)), lt(nt, f(9.2e18)));
  const Ex n = b.let(select(f(-1.0), fcall("trunc", {nt}), finite));
  const Ex ni = b.let(convert(Ty::kI32, select(select(n, f(1073741824.0), gt(n, f(1073741824.0))), f(-1.0),
                                               lt(n, f(0.0)))));
  return {b.let(ge(n, f(0.0))), n, b.let(eq(ni & lit_i(1), lit_i(1)))};
}

// The recurrence r = step(k, p, q) for k = first .. last - 1 from (p0, q0), when `run`
// (at most kMaxRecurrence steps; NaN past that unless already NaN). Returns q.
template <class Step>
Ex recurrence(Block& b, const Ex& run, const Ex& first, const Ex& last_f, const Ex& p0, const Ex& q0, Step step) {
  const Ex count_f = b.let(last_f - convert(Ty::kF32, first));
  const Ex over = b.let(land(run, gt(count_f, f(kMaxRecurrence))));
  const Ex count = b.let(select(lit_i(0), convert(Ty::kI32, select(count_f, f(kMaxRecurrence), over)),
                                land(run, gt(count_f, f(0.0)))));
  const Ex p = b.mut(Ty::kF32, p0, "op"), q = b.mut(Ty::kF32, q0, "oq");
  b.loop("oi", lit_i(0), count, lit_i(1), [&](Block& in, const Ex& i) {
    in.if_(lnot(is_nan(q)), [&](Block& t) {  // NaN stays NaN (the CPU's early exit)
      const Ex k = t.let(convert(Ty::kF32, first + i));
      const Ex r = t.let(step(t, k, p, q));
      t.assign(p, q);
      t.assign(q, r);
    });
  });
  return select(q, nan(), land(over, lnot(is_nan(q))));
}

// (-1)^n v
Ex odd_neg(const Degree& d, const Ex& v) { return select(v, -v, d.odd); }

// cos(a) and sin(a) of a float32 argument, reduced exactly to 1e5, the device's beyond
SinCos sincos_any(Block& b, const Ex& a) {
  const SinCos sc = sincos_f32(b, a);
  const Ex big = b.let(gt(fcall("abs", {a}), f(1e5)));
  return {b.let(select(sc.s, fcall("sin", {a}), big)), b.let(select(sc.c, fcall("cos", {a}), big))};
}

// acos x as 2 asin(sqrt((1 - |x|) / 2)) above 1/2 (1 - |x| exact there), pi/2 - asin(x)
// below, asin(z) = z P(z^2) fitted: not the device's acos (lavapipe's is 5e-4 off).
Ex acos_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex z = b.let(fcall("sqrt", {(f(1.0) - ax) * f(0.5)}));
  const Ex half = b.let(f(2.0) * (z * poly(b, b.let(z * z), kAsinOverZ)));
  const Ex outer = select(half, f(3.14159265358979324) - half, lt(x, f(0.0)));
  const Ex inner = f(1.57079632679489662) - x * poly(b, b.let(x * x), kAsinOverZ);
  return b.let(select(select(outer, inner, le(ax, f(0.5))), nan(), gt(ax, f(1.0))));
}

// Chebyshev of kind 0..3 (T, U, V, W) at y with degree d; `limit`: the closed forms above it.
Ex chebyshev(Block& b, int kind, const Ex& y, const Degree& d, double limit) {
  const Ex n = d.n;
  const Ex ay = b.let(fcall("abs", {y}));
  const Ex one = b.let(eq(ay, f(1.0)));
  const Ex pos = gt(y, f(0.0));
  Ex at_one;
  switch (kind) {
    case 0: at_one = select(f(-1.0), f(1.0), lor(pos, lnot(d.odd))); break;
    case 1: at_one = select(odd_neg(d, n + f(1.0)), n + f(1.0), pos); break;
    case 2: at_one = select(odd_neg(d, fma(f(2.0), n, f(1.0))), f(1.0), pos); break;
    default: at_one = select(odd_neg(d, f(1.0)), fma(f(2.0), n, f(1.0)), pos); break;
  }
  const Ex closed_ok = b.let(land(gt(n, f(limit)), lt(ay, f(1.0))));
  const Ex t = acos_f32(b, b.let(select(f(0.0), y, closed_ok)));
  Ex closed;
  switch (kind) {
    case 0: closed = sincos_any(b, b.let(n * t)).c; break;
    case 1: closed = bin(BinOp::kDiv, sincos_any(b, b.let((n + f(1.0)) * t)).s, sincos_any(b, t).s); break;
    case 2:
      closed = bin(BinOp::kDiv, sincos_any(b, b.let((n + f(0.5)) * t)).c, sincos_any(b, b.let(t / f(2.0))).c);
      break;
    default:
      closed = bin(BinOp::kDiv, sincos_any(b, b.let((n + f(0.5)) * t)).s, sincos_any(b, b.let(t / f(2.0))).s);
      break;
  }
  const Ex m = b.let(y + y);
  const Ex q1 = b.let(kind == 0 ? y : kind == 1 ? m : kind == 2 ? m - f(1.0) : m + f(1.0));
  const Ex run = b.let(land(land(d.valid, lnot(one)), land(lnot(closed_ok), ge(n, f(2.0)))));
  const Ex rec = recurrence(b, run, lit_i(2), n + f(1.0), f(1.0), q1,
                            [&](Block&, const Ex&, const Ex& p, const Ex& q) { return fma(m, q, -p); });
  Ex out = select(rec, q1, eq(n, f(1.0)));
  out = select(out, f(1.0), eq(n, f(0.0)));
  out = select(out, closed, closed_ok);
  out = select(out, at_one, one);
  return select(f(0.0), out, d.valid);
}

}  // namespace

Ex orthogonal_polynomial_f32(Block& b, EwOp op, const Ex& x, const Ex& nt) {
  const Degree d = degree_of(b, nt);
  const Ex n = d.n;
  switch (op) {
    case EwOp::k_chebyshev_polynomial_t: return chebyshev(b, 0, x, d, 6);
    case EwOp::k_chebyshev_polynomial_u: return chebyshev(b, 1, x, d, 8);
    case EwOp::k_chebyshev_polynomial_v: return chebyshev(b, 2, x, d, 8);
    case EwOp::k_chebyshev_polynomial_w: return chebyshev(b, 3, x, d, 8);
    case EwOp::k_shifted_chebyshev_polynomial_t:
    case EwOp::k_shifted_chebyshev_polynomial_u:
    case EwOp::k_shifted_chebyshev_polynomial_v:
    case EwOp::k_shifted_chebyshev_polynomial_w: {
      const int kind = static_cast<int>(op) - static_cast<int>(EwOp::k_shifted_chebyshev_polynomial_t);
      // in y = 2x - 1, with PyTorch's thresholds for the closed forms (T, U, V: 6; W: 4); at
      // or below them the unshifted function's (whose own thresholds then do not apply)
      return chebyshev(b, kind, b.let(x + x - f(1.0)), d, kind == 3 ? 4 : 6);
    }
    default: break;
  }
  Ex q0, fallback = f(1.0), special = lit_b(false), special_value = f(0.0);
  std::function<Ex(Block&, const Ex&, const Ex&, const Ex&)> step;
  const Ex x2 = b.let(x + x);
  switch (op) {
    case EwOp::k_hermite_polynomial_h:
      q0 = x2;
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) { return fma(x2, q, -((k + k) * p)); };
      break;
    case EwOp::k_hermite_polynomial_he:
      q0 = x;
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) { return fma(x, q, -(k * p)); };
      break;
    case EwOp::k_laguerre_polynomial_l:
      q0 = f(1.0) - x;
      special = eq(x, f(0.0));
      special_value = f(1.0);
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) {
        const Ex k1 = k + f(1.0);
        return fma(k + (k1 - x), q, -(k * p)) / k1;
      };
      break;
    case EwOp::k_legendre_polynomial_p:
      q0 = x;
      special = eq(fcall("abs", {x}), f(1.0));
      special_value = select(odd_neg(d, f(1.0)), f(1.0), lor(gt(x, f(0.0)), eq(n, f(0.0))));
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) {
        return fma(fma(f(2.0), k, f(1.0)) * x, q, -(k * p)) / (k + f(1.0));
      };
      break;
    default: throw std::logic_error("orthogonal_polynomial_f32: not a polynomial");
  }
  const Ex sp = b.let(special);
  const Ex run = b.let(land(land(d.valid, lnot(sp)), ge(n, f(2.0))));
  const Ex q1 = b.let(q0);
  const Ex rec = recurrence(b, run, lit_i(1), n, f(1.0), q1, step);
  Ex out = select(rec, q1, eq(n, f(1.0)));
  out = select(out, fallback, eq(n, f(0.0)));
  out = select(out, special_value, sp);
  return select(f(0.0), out, d.valid);
}

// Regularized incomplete gamma P(a, x) (upper: Q = 1 - P) as the CPU's: the series for
// x < a + 1, the continued fraction (modified Lentz) beyond, times x^a e^-x / Gamma(a). That
// factor's logarithm is formed without the float32 cancellation of a log x - x - lgamma(a)
// (6900 - 1100 - 5900 at a = 1000): above a = 10 as a (log(1 + t) - t) + log(a)/2 -
// log(2 pi)/2 - (Stirling's correction of lgamma(a)), t = (x - a)/a, log(1 + t) - t by its
// series for |t| < 1/2. Walks at most 8 sqrt(max(a, x)) + 32 steps (a term decays like
// e^(-k^2 / 2a) where x ~ a), capped at 16384. PyTorch's edge values in its order.
Ex igamma_f32(Block& b, const Ex& a, const Ex& x, bool upper) {
  // log(x^a e^-x / Gamma(a))
  const Ex t = b.let((x - a) / a);
  const Ex t2 = b.let(t * t);
  std::vector<double> c;  // log(1 + t) - t = t^2 (-1/2 + t/3 - t^2/4 ...), to t^24
  for (int k = 2; k <= 24; ++k) c.push_back((k % 2 == 0 ? -1.0 : 1.0) / k);
  const Ex series = t2 * poly(b, t, c);
  const Ex direct = fcall("log", {f(1.0) + t}) - t;
  const Ex l1pmx = b.let(select(direct, series, lt(fcall("abs", {t}), f(0.5))));
  const Ex ia = b.let(f(1.0) / a);
  const Ex ia2 = b.let(ia * ia);
  const Ex corr = ia * poly(b, ia2, {1.0 / 12, -1.0 / 360, 1.0 / 1260});
  const Ex large = fma(a, l1pmx, fma(f(0.5), fcall("log", {a}), f(-0.918938533204672742))) - corr;
  const Ex small = a * fcall("log", {x}) - x - lgamma_f32(b, a);
  const Ex factor = b.let(exp_reduced(b, b.let(select(small, large, gt(a, f(10.0)))), f(0.0)));
  // (NaN: 0, so that the conversion is defined; the edge values below take those)
  const Ex larger = b.let(select(max(a, x), f(0.0), lor(is_nan(a), is_nan(x))));
  const Ex steps = fma(f(8.0), fcall("sqrt", {larger}), f(32.0));
  const Ex limit = b.let(convert(Ty::kI32, select(steps, f(16384.0), gt(steps, f(16384.0)))));
  const Ex use_series = b.let(lt(x, a + f(1.0)));
  // the series: sum_k x^k / (a (a+1) ... (a+k))
  const Ex term = b.mut(Ty::kF32, ia, "gt"), sum = b.mut(Ty::kF32, ia, "gs");
  b.loop("gk", lit_i(1), select(lit_i(0), limit, use_series), lit_i(1), [&](Block& in, const Ex& k) {
    in.if_(ge(term, sum * f(3e-8)), [&](Block& tb) {
      tb.assign(term, term * (x / (a + convert(Ty::kF32, k))));
      tb.assign(sum, sum + term);
    });
  });
  // the continued fraction for Q (modified Lentz)
  const double tiny = 1e-30;
  const Ex bb = b.mut(Ty::kF32, x + f(1.0) - a, "gb");
  const Ex cc = b.mut(Ty::kF32, f(1.0 / tiny), "gc");
  const Ex dd = b.mut(Ty::kF32, f(1.0) / bb, "gd");
  const Ex h = b.mut(Ty::kF32, dd, "gh");
  const Ex done = b.mut(Ty::kBool, lit_b(false), "gz");
  b.loop("gi", lit_i(1), select(limit, lit_i(0), use_series), lit_i(1), [&](Block& in, const Ex& i) {
    in.if_(lnot(done), [&](Block& tb) {
      const Ex fi = tb.let(convert(Ty::kF32, i));
      const Ex an = tb.let(-(fi * (fi - a)));
      tb.assign(bb, bb + f(2.0));
      const Ex d1 = tb.let(fma(an, dd, bb));
      const Ex d2 = tb.let(select(d1, f(tiny), lt(fcall("abs", {d1}), f(tiny))));
      const Ex c1 = tb.let(bb + an / cc);
      tb.assign(cc, select(c1, f(tiny), lt(fcall("abs", {c1}), f(tiny))));
      tb.assign(dd, f(1.0) / d2);
      const Ex del = tb.let(dd * cc);
      tb.assign(h, h * del);
      tb.assign(done, lt(fcall("abs", {del - f(1.0)}), f(3e-8)));
    });
  });
  const Ex p_series = b.let(factor * sum);
  const Ex q_fraction = b.let(factor * h);
  Ex out = upper ? select(q_fraction, f(1.0) - p_series, use_series)
                 : select(f(1.0) - q_fraction, p_series, use_series);
  // PyTorch's edge values, the first that applies wins (so reversed here)
  out = select(out, nan(), lor(is_nan(a), is_nan(x)));
  out = select(out, f(upper ? 0.0 : 1.0), is_inf(x));
  out = select(out, select(f(upper ? 1.0 : 0.0), nan(), is_inf(x)), is_inf(a));
  out = select(out, f(upper ? 1.0 : 0.0), eq(x, f(0.0)));
  out = select(out, select(nan(), f(upper ? 0.0 : 1.0), gt(x, f(0.0))), eq(a, f(0.0)));
  return select(out, nan(), lor(lt(a, f(0.0)), lt(x, f(0.0))));
}

// ---- the error-function family --------------------------------------------------------------

// erfcx(x) = e^(x^2) erfc(x) for x >= 0 as Q(t) / (1 + 2x), t = (x - 2) / (x + 2) mapping
// [0, inf) onto [-1, 1) (Q fitted; Q -> 2/sqrt(pi) as x -> inf, so no asymptotic branch).
Ex erfcx_nonnegative(Block& b, const Ex& x) {
  const Ex t = b.let((x - f(2.0)) / (x + f(2.0)));
  const Ex q = poly(b, t, kErfcxQ);
  return b.let(q / fma(f(2.0), x, f(1.0)));
}

// e^(+-x^2) with x^2 split into an exact head (x with its low 12 bits cleared, squared: 24
// bits) and a small tail, so that neither the rounding of x^2 (relative 6e-8, times x^2 in
// the result) nor the device's exp reaches the result. (Not fma(x, x, -s): WGSL lets fma
// round twice, and lavapipe's does.)
Ex exp_square(Block& b, const Ex& x, bool negative) {
  const Ex hi = b.let(from_bits(bits(x) & lit_u(0xfffff000u)));
  const Ex lo = b.let(x - hi);
  const Ex head = b.let(hi * hi);
  const Ex tail = b.let(lo * (f(2.0) * hi + lo));
  return negative ? exp_reduced(b, -head, -tail) : exp_reduced(b, head, tail);
}

// erfcx: x < 0 as 2 e^(x^2) - erfcx(-x) (+inf once e^(x^2) overflows, as PyTorch).
Ex erfcx_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex pos = erfcx_nonnegative(b, ax);
  const Ex negative = f(2.0) * exp_square(b, x, false) - pos;
  Ex out = select(pos, negative, lt(x, f(0.0)));
  out = select(out, f(0.0), eq(bits(x), lit_u(0x7f800000u)));
  out = select(out, f(INFINITY), lt(x, f(-9.5)));
  return select(out, x, is_nan(x));
}

// erfc: e^(-x^2) erfcx(|x|) for x >= 0.5 (relative accuracy in the tail), 1 - erf(x) below,
// 2 - erfc(-x) for x < -0.5.
Ex erfc_f32(Block& b, const Ex& x, const Ex& erf_x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex tail = b.let(bin(BinOp::kMul, exp_square(b, ax, true), erfcx_nonnegative(b, ax)));
  Ex out = select(f(1.0) - erf_x, tail, ge(x, f(0.5)));
  out = select(out, f(2.0) - tail, le(x, f(-0.5)));
  out = select(out, f(0.0), gt(x, f(10.5)));   // below the smallest float32
  out = select(out, f(2.0), lt(x, f(-10.5)));  // (and +-inf, whose tail is NaN)
  return select(out, x, is_nan(x));
}

// erfinv from y and 1 - |y| (exact, or computed exactly by the caller): w = -log((1 - |y|)
// (1 + |y|)); erfinv(y) = y P(w) for w < 5, y P(sqrt w) on [5, 16) and on [16, 90] (90: 1 - |y| = 1e-38).
Ex erfinv_core(Block& b, const Ex& y, const Ex& one_minus, const Ex& one_plus) {
  const Ex w = b.let(-fcall("log", {one_minus * one_plus}));
  const Ex central = poly(b, b.let(w - f(2.5)), kErfinvCentral);
  const Ex s = b.let(fcall("sqrt", {w}));
  const Ex tail = poly(b, b.let(s - f(3.0)), kErfinvTail);
  const Ex far = poly(b, b.let(s - f(6.75)), kErfinvFarTail);
  return b.let(y * select(select(central, tail, ge(w, f(5.0))), far, ge(w, f(16.0))));
}

Ex erfinv_f32(Block& b, const Ex& y) {
  const Ex ay = b.let(fcall("abs", {y}));
  Ex out = erfinv_core(b, y, b.let(f(1.0) - ay), b.let(f(1.0) + ay));
  out = select(out, y, eq(ay, f(0.0)));  // +-0
  out = select(out, from_bits(lit_u(0x7f800000u) | (bits(y) & lit_u(0x80000000u))),
               eq(ay, f(1.0)));
  return select(out, nan(), lor(gt(ay, f(1.0)), is_nan(y)));
}

// ndtri(p) = sqrt(2) erfinv(2p - 1), with 1 - |2p - 1| formed exactly: 2p below 1/2, 2 - 2p
// above, so tiny p (down to 1e-38) keeps its relative accuracy.
Ex ndtri_f32(Block& b, const Ex& p) {
  const Ex y = b.let(fma(f(2.0), p, f(-1.0)));
  const Ex lower = b.let(lt(p, f(0.5)));
  const Ex one_minus = select(f(2.0) - f(2.0) * p, f(2.0) * p, lower);
  const Ex one_plus = select(f(2.0) * p, f(2.0) - f(2.0) * p, lower);
  Ex out = f(1.41421356237309505) * erfinv_core(b, y, b.let(one_minus), b.let(one_plus));
  out = select(out, f(0.0), eq(p, f(0.5)));
  out = select(out, f(-INFINITY), eq(p, f(0.0)));
  out = select(out, f(INFINITY), eq(p, f(1.0)));
  return select(out, nan(), lor(lor(lt(p, f(0.0)), gt(p, f(1.0))), is_nan(p)));
}

// ---- float utilities (on the bits) -------------------------------------------------------------

// The float's bits as an integer that orders like the values (-0 and +0 both 0).
namespace {
Ex ordered(Block& b, const Ex& x) {
  const Ex m = b.let(convert(Ty::kI32, magnitude(x)));
  return b.let(select(m, -m, ne(bits(x) & lit_u(0x80000000u), lit_u(0))));
}
}  // namespace

// nextafter(a, c): the neighbour of a toward c; c when they are equal (so +-0 keeps c's
// sign), NaN when either is.
Ex nextafter_f32(Block& b, const Ex& a, const Ex& c) {
  const Ex ka = ordered(b, a), kc = ordered(b, c);
  const Ex k = b.let(select(ka - lit_i(1), ka + lit_i(1), lt(ka, kc)));
  // back to bits; from +-0 the first step is the smallest denormal with c's sign, and a
  // step onto 0 keeps a's sign
  const Ex magnitude_bits = convert(Ty::kU32, select(k, -k, lt(k, lit_i(0))));
  Ex r = from_bits(magnitude_bits | select(lit_u(0), lit_u(0x80000000u), lt(k, lit_i(0))));
  r = select(r, from_bits(bits(a) & lit_u(0x80000000u)), eq(k, lit_i(0)));
  r = select(r, c, eq(ka, kc));
  return select(r, a + c, lor(is_nan(a), is_nan(c)));
}

// frexp: x = m 2^e with 0.5 <= |m| < 1; 0, +-inf and NaN give m = x, e = 0. Denormals are
// normalised on the bits (a five-step shift search), not by a multiplication a flushing
// device would turn into 0.
namespace {
struct Frexp {
  Ex mantissa_bits;  // u32: the fraction bits (the implicit 1 dropped) of the normalised value
  Ex exponent;       // i32: e
};
Frexp frexp_parts(Block& b, const Ex& x) {
  const Ex u = b.let(bits(x));
  const Ex biased = b.let(convert(Ty::kI32, (u >> lit_u(23)) & lit_u(0xffu)));
  const Ex frac = b.mut(Ty::kU32, u & lit_u(0x7fffffu), "ff");
  const Ex shift = b.mut(Ty::kI32, lit_i(0), "fs");
  b.if_(eq(biased, lit_i(0)), [&](Block& t) {  // denormal: move the leading 1 to bit 23
    for (int step : {16, 8, 4, 2, 1}) {
      t.if_(eq(frac >> lit_u(static_cast<uint64_t>(24 - step)), lit_u(0)), [&](Block& s) {
        s.assign(frac, frac << lit_u(static_cast<uint64_t>(step)));
        s.assign(shift, shift + lit_i(step));
      });
    }
  });
  // normal: e = biased - 126; denormal: the leading 1 sat `shift` bits below bit 23, and the
  // value's exponent is -126 - shift + 1 ... written as 1 - 126 - shift (biased 0 acts as 1)
  const Ex e = select(biased - lit_i(126), lit_i(-125) - shift, eq(biased, lit_i(0)));
  return {b.let(frac & lit_u(0x7fffffu)), b.let(e)};
}
Ex frexp_special(const Ex& x) { return lor(eq(magnitude(x), lit_u(0)), ge(magnitude(x), lit_u(0x7f800000u))); }
}  // namespace

Ex frexp_mantissa_f32(Block& b, const Ex& x) {
  const Frexp p = frexp_parts(b, x);
  const Ex m = from_bits((bits(x) & lit_u(0x80000000u)) | lit_u(126u << 23) | p.mantissa_bits);
  return select(m, x, frexp_special(x));
}

Ex frexp_exponent_f32(Block& b, const Ex& x) {
  const Frexp p = frexp_parts(b, x);
  return select(convert(Ty::kF32, p.exponent), f(0.0), frexp_special(x));
}

}  // namespace chroma::gpu

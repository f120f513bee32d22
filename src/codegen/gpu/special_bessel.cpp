// The Bessel functions (j0, j1, y0, y1, i0, i1, k0, k1 and the scaled forms,
// spherical_bessel_j0) and airy_ai in float32 for GPU kernels: power series or fitted
// polynomials near 0, fitted scaled or modulus-phase forms beyond, with the exact reductions of
// e^x and sin/cos of special_common.h (docs/gpu_generator.md, "Special functions in float32").
#include <utility>
#include <vector>

#include "codegen/gpu/special.h"
#include "codegen/gpu/special_common.h"
#include "codegen/gpu/special_fits.h"

namespace chroma::gpu {

using namespace special_detail;

namespace {

constexpr double kEuler = 0.577215664901532861;

// The power series of I0 and I1 / (x/2) in z = x^2/4: sum z^k / (k! (k + nu)!) to k = 16
// (below 1e-9 relative for |x| <= 8; every term positive, so no cancellation).
Ex bessel_i_series(Block& b, const Ex& z, int nu) {
  std::vector<double> c;
  double fk = 1.0;
  for (int k = 0; k <= 16; ++k) {
    if (k > 0) fk *= k;
    c.push_back(1.0 / (fk * (nu == 0 ? fk : fk * (k + 1))));
  }
  return poly(b, z, c);
}

// The series parts of K0 and K1 for 0 < x <= 1 beside their logarithm terms:
// K0 = -(log(x/2) + gamma) I0 + sum_{k>=1} H_k z^k / (k!)^2,
// K1 = 1/x + log(x/2) I1 - (x/4) sum_{k>=0} (psi(k+1) + psi(k+2)) z^k / (k! (k+1)!).
Ex bessel_k_series(Block& b, const Ex& z, int nu) {
  std::vector<double> c;
  double fk = 1.0, h = 0.0;  // k!, H_k
  for (int k = 0; k <= 9; ++k) {
    if (k > 0) {
      fk *= k;
      h += 1.0 / k;
    }
    if (nu == 0) {
      c.push_back(h / (fk * fk));
    } else {
      const double psi_sum = (h - kEuler) + (h + 1.0 / (k + 1) - kEuler);  // psi(k+1) + psi(k+2)
      c.push_back(psi_sum / (fk * fk * (k + 1)));
    }
  }
  return poly(b, z, c);
}

}  // namespace

// i0, i0e, i1, i1e: the power series up to |x| = 8, then e^-|x| I(x) sqrt|x| = P(8/|x|); the
// unscaled forms multiply by e^|x| and so overflow where it does (float32 i0(89) is inf, as
// PyTorch's), and at +-inf give NaN (0 times inf, as PyTorch's).
Ex bessel_i_f32(Block& b, const Ex& x, int nu, bool scaled) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex z = b.let(ax * ax * f(0.25));
  Ex small = bessel_i_series(b, z, nu);
  if (nu == 1) small = x * f(0.5) * small;
  small = b.let(small);
  Ex tail = b.let(poly(b, b.let(f(8.0) / ax), nu == 0 ? std::span<const double>(kI0eTail) : std::span<const double>(kI1eTail)) /
                  fcall("sqrt", {ax}));
  if (nu == 1) tail = b.let(select(tail, -tail, lt(x, f(0.0))));
  const Ex near = le(ax, f(8.0));
  Ex out = scaled ? select(tail, small * exp_reduced(b, -ax, f(0.0)), near)
                  : select(tail * exp_reduced(b, ax, f(0.0)), small, near);
  if (!scaled) out = select(out, tail * f(INFINITY), is_inf(x));  // 0 * inf: NaN
  return select(out, x, is_nan(x));
}

// k0, k0e, k1, k1e: the series with their logarithms up to x = 1, then e^x K(x) sqrt x =
// P(1/x - 1/2); K(+-0) = inf, x < 0 gives NaN, K(inf) = 0.
Ex bessel_k_f32(Block& b, const Ex& x, int nu, bool scaled) {
  const Ex z = b.let(x * x * f(0.25));
  const Ex lh = b.let(fcall("log", {x * f(0.5)}));
  Ex small;
  if (nu == 0) {
    small = fma(-(lh + f(kEuler)), bessel_i_series(b, z, 0), bessel_k_series(b, z, 0));
  } else {
    const Ex i1 = x * f(0.5) * bessel_i_series(b, z, 1);
    small = fma(lh, i1, f(1.0) / x) - x * f(0.25) * bessel_k_series(b, z, 1);
  }
  small = b.let(small);
  const Ex v = b.let(f(1.0) / x - f(0.5));
  const Ex tail =
      b.let(poly(b, v, nu == 0 ? std::span<const double>(kK0eTail) : std::span<const double>(kK1eTail)) / fcall("sqrt", {x}));
  const Ex near = le(x, f(1.0));
  Ex out = scaled ? select(tail, small * exp_reduced(b, x, f(0.0)), near)
                  : select(tail * exp_reduced(b, -x, f(0.0)), small, near);
  out = select(out, f(0.0), eq(bits(x), lit_u(0x7f800000u)));
  out = select(out, f(INFINITY), eq(magnitude(x), lit_u(0)));
  return select(out, nan(), lor(lt(x, f(0.0)), is_nan(x)));
}

// j0, j1, y0, y1: up to |x| = 8 fitted polynomials in u = x^2/32 - 1 (y0 and y1 beside their
// logarithm terms), beyond the modulus-phase form with P and Q fitted in 8/x:
// J = (P cos xi - Q sin xi) / sqrt(pi x / 2), Y = (P sin xi + Q cos xi) / sqrt(pi x / 2),
// xi = x - pi/4 (J0, Y0) or x - 3 pi/4 (J1, Y1), written with sin x and cos x. j0 and j1 are
// even and odd; y0 and y1 are NaN below 0 and -inf at +-0. At +-inf (and for NaN) all are
// NaN, as PyTorch's; beyond 1e5 the device's sin and cos.
Ex bessel_jy_f32(Block& b, const Ex& x, int nu, bool second_kind) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex u = b.let(fma(x * x, f(1.0 / 32), f(-1.0)));
  Ex near;
  if (!second_kind) {
    near = nu == 0 ? poly(b, u, kJ0Near) : x * poly(b, u, kJ1Near);
  } else {
    const Ex l = b.let(fcall("log", {x}) * f(0.636619772367581343));  // 2/pi log x
    if (nu == 0) {
      near = fma(l, poly(b, u, kJ0Near), poly(b, u, kY0Near));
    } else {
      const Ex j1 = x * poly(b, u, kJ1Near);
      near = fma(l, j1, f(-0.636619772367581343) / x) + x * poly(b, u, kY1Near);
    }
  }
  near = b.let(near);
  const Ex t = b.let(f(8.0) / ax);
  const Ex v = b.let(t - f(0.5));
  const Ex p = b.let(poly(b, v, nu == 0 ? std::span<const double>(kJ0P) : std::span<const double>(kJ1P)));
  const Ex q = b.let(t * poly(b, v, nu == 0 ? std::span<const double>(kJ0Q) : std::span<const double>(kJ1Q)));
  const SinCos sc = sincos_f32(b, ax);
  const Ex big = b.let(gt(ax, f(1e5)));
  const Ex sx = b.let(select(sc.s, fcall("sin", {ax}), big)), cx = b.let(select(sc.c, fcall("cos", {ax}), big));
  const Ex spc = b.let(sx + cx), smc = b.let(sx - cx);
  // sqrt(2) cos xi and sqrt(2) sin xi: xi = x - pi/4: (c + s, s - c); x - 3 pi/4: (s - c, -(s + c))
  const Ex cxi = nu == 0 ? spc : smc;
  const Ex sxi = nu == 0 ? smc : -spc;
  const Ex m = b.let(fcall("sqrt", {ax * f(3.14159265358979324)}));
  Ex far = second_kind ? p * sxi + q * cxi : p * cxi - q * sxi;
  far = b.let(far / m);
  if (nu == 1 && !second_kind) far = select(far, -far, lt(x, f(0.0)));  // odd
  Ex out = select(far, near, le(ax, f(8.0)));
  if (second_kind) {
    out = select(out, f(-INFINITY), eq(magnitude(x), lit_u(0)));
    out = select(out, nan(), lt(x, f(0.0)));
  }
  out = select(out, nan(), is_inf(x));
  return select(out, x, is_nan(x));
}

// spherical_bessel_j0 = sin x / x: its Taylor series below 1/2, the reduced sin to 1e5, the
// device's sin beyond (where |sin x / x| <= 1e-5 whatever its error), 0 at +-inf.
Ex spherical_j0_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex x2 = b.let(x * x);
  const Ex near = poly(b, x2, {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880});
  const Ex mid = sin_f32(b, x) / x;
  Ex out = select(mid, near, lt(ax, f(0.5)));
  out = select(out, fcall("sin", {x}) / x, gt(ax, f(1e5)));
  out = select(out, f(0.0), is_inf(x));
  return select(out, x, is_nan(x));
}

// Ai(x): a fitted polynomial on [-2.5, 2]; beyond 2, e^-zeta x^(-1/4) F(zeta(2)/zeta) with F
// fitted (zeta = 2/3 x^(3/2); the reduced e^-zeta underflows to 0 from x = 26.5); below -2.5,
// y^(-1/4) (P sin theta - Q cos theta) with theta = zeta + pi/4, y = -x, P and Q fitted in
// zeta(2.5)/zeta. theta is reduced exactly: y^(3/2) as a float pair (the rounding errors of
// sqrt y and of y sqrt y recovered by splitting into 12-bit halves, whose products are exact),
// then 2 y^(3/2) - k 3pi/2 with 3pi/2 in five parts, divided by 3 (so to y = 2800, where k
// reaches 2^16; the device's sin and cos beyond, where |Ai| <= 0.08). NaN and +-inf give NaN,
// as PyTorch's.
Ex airy_ai_f32(Block& b, const Ex& x) {
  const Ex near = poly(b, b.let((x + f(0.25)) / f(2.25)), kAiryNear);
  constexpr double kZeta2 = 1.88561808316412674, kZeta25 = 2.63523138347365150;
  // x > 2
  const Ex xr = b.let(select(f(2.0), x, gt(x, f(2.0))));
  const Ex sr = b.let(fcall("sqrt", {xr}));
  const Ex zr = b.let(f(2.0 / 3.0) * (xr * sr));
  const Ex right =
      bin(BinOp::kMul, exp_reduced(b, -zr, f(0.0)), poly(b, b.let(f(kZeta2) / zr - f(0.5)), kAiryRight)) / fcall("sqrt", {sr});
  // x < -2.5: y^(3/2) = hi + lo
  const Ex y = b.let(select(f(2.5), -x, lt(x, f(-2.5))));
  auto split = [&](const Ex& v) {
    const Ex hi = b.let(from_bits(bits(v) & lit_u(0xfffff000u)));
    return std::pair<Ex, Ex>{hi, b.let(v - hi)};
  };
  const Ex s = b.let(fcall("sqrt", {y}));
  const auto [s_hi, s_lo] = split(s);
  const auto [y_hi, y_lo] = split(y);
  // y - s^2 (exact: each product of halves is), then sqrt y = s + (y - s^2) / 2s
  const Ex rem = b.let(y - s_hi * s_hi - f(2.0) * (s_hi * s_lo) - s_lo * s_lo);
  const Ex hi = b.let(y * s);
  Ex lo = y_hi * s_hi - hi + y_hi * s_lo + y_lo * s_hi + y_lo * s_lo;
  lo = b.let(lo + y * (rem / (f(2.0) * s)));
  // theta - pi/4 = 2/3 (hi + lo) = k pi/2 + r, r = (2 hi - k 3pi/2 + 2 lo) / 3
  const Ex in_range = b.let(lt(hi, f(1.5e5)));
  const Ex k = b.let(fcall("round", {select(f(0.0), hi, in_range) * f(0.42441317439079285)}));
  Ex r3 = f(2.0) * hi;
  for (double part : {4.71875, -0.00634765625, -1.33514404296875e-05, -1.1932570487260818e-08,
                      7.690032638452138e-12}) {
    r3 = b.let(r3 - k * f(part));
  }
  const Ex r = b.let((r3 + f(2.0) * lo) / f(3.0));
  const SinCos sc = sincos_poly(b, r);
  // r + pi/4
  const SinCos shifted{b.let((sc.s + sc.c) * f(0.707106781186547524)),
                       b.let((sc.c - sc.s) * f(0.707106781186547524))};
  const SinCos th = rotate_quadrants(b, k, shifted);
  const Ex zl = b.let(f(2.0 / 3.0) * hi);
  const Ex theta_f = b.let(zl + f(0.785398163397448310));
  const Ex sin_t = b.let(select(fcall("sin", {theta_f}), th.s, in_range));
  const Ex cos_t = b.let(select(fcall("cos", {theta_f}), th.c, in_range));
  const Ex t = b.let(f(kZeta25) / zl);
  const Ex v = b.let(t - f(0.5));
  const Ex left =
      bin(BinOp::kSub, poly(b, v, kAiryLeftP) * sin_t, t * poly(b, v, kAiryLeftQ) * cos_t) / fcall("sqrt", {s});
  Ex out = select(select(near, left, lt(x, f(-2.5))), right, gt(x, f(2.0)));
  return select(out, nan(), lor(is_nan(x), is_inf(x)));
}

}  // namespace chroma::gpu

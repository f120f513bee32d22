// Special functions in float32 for GPU kernels: the gamma family (lgamma, digamma, trigamma,
// polygamma), Hurwitz zeta, the error-function family (erfc, erfcx, erfinv, ndtri), the
// Bessel functions (j0, j1, y0, y1, i0, i1, k0, k1 and the scaled forms, spherical_bessel_j0),
// airy_ai, the incomplete gamma functions, the orthogonal polynomials and the bit-level float utilities (nextafter, frexp). The CPU computes these in float64
// (chroma/cpu/special.h); a GPU has no float64, so each is written for float32 arithmetic,
// with its own argument reduction and polynomials fitted to the float64 functions
// (scripts/fit_gpu_special.py prints them and their measured float32 error). None relies on a
// dialect builtin's accuracy beyond log, sqrt and pow (zeta's terms): sin/cos/tan of pi*x are
// polynomials on an exactly reduced argument (WGSL allows sin an absolute error of 2^-11),
// sin x and cos x are reduced by pi/2 in five parts (to |x| = 1e5), e^x by ln 2 in two, NaN
// tests are bit tests, and nextafter/frexp work on the bits alone (denormals included,
// whatever the device's flushing).
#include "codegen/gpu/special.h"

#include <cmath>
#include <initializer_list>
#include <functional>
#include <span>
#include <utility>
#include <stdexcept>

namespace chroma::gpu {

namespace {

Ex bits(const Ex& x) { return bitcast(Ty::kU32, x); }
Ex from_bits(const Ex& u) { return bitcast(Ty::kF32, u); }
Ex f(double v) { return lit_f(v); }
Ex fcall(const char* fn, std::vector<Ex> a) { return call(fn, Ty::kF32, std::move(a)); }
Ex fma(Ex a, Ex b, Ex c) { return fcall("fma", {std::move(a), std::move(b), std::move(c)}); }
Ex magnitude(const Ex& x) { return bin("&", bits(x), lit_u(0x7fffffffu)); }
Ex is_nan(const Ex& x) { return bin(">", magnitude(x), lit_u(0x7f800000u)); }
Ex is_inf(const Ex& x) { return bin("==", magnitude(x), lit_u(0x7f800000u)); }
Ex nan() { return f(std::nan("")); }

// The fitted polynomials' coefficients, constant term first, as scripts/fit_gpu_special.py
// prints them (with each one's float32 error measured there).
// t = x - 2, lgamma(x) = t P(t): degree 8, float32 relative error 9.37e-08 (the fit's own 2.9e-10)
constexpr double kLgamma2PlusT[] = {
    0.422784335, 0.322467013, -0.0673517443, 0.0205748636, -0.00735329038, 0.00278983218,
    -0.00100034522, 0.000277034972, -4.05187168e-05};
// t = (x - 2) / (x + 2), erfcx(x) = Q(t) / (1 + 2x): degree 15, float32 relative error 1.01e-07 (the fit's own 5.3e-11)
constexpr double kErfcxQ[] = {
    1.27697838, -0.0927638265, -0.166030391, 0.164051274, -0.054220154, -0.00803393528,
    0.00872393209, 0.00127086436, -0.00146214077, -0.00045290041, 0.000218740676, 0.00014877798,
    -1.81971719e-05, -3.49791317e-05, -5.88233642e-07, 4.30836666e-06};
// v = w - 2.5, erfinv(y) = y P(v), w = -log(1 - y^2) < 5: degree 9, float32 relative error 1.09e-07 (the fit's own 6.4e-09)
constexpr double kErfinvCentral[] = {
    1.50140936, 0.246640289, -0.00417738976, -0.00125274842, 0.000218346915, -4.95974349e-06,
    -3.46335617e-06, 4.6542873e-07, 2.32858445e-08, -8.73983097e-09};
// v = sqrt(w) - 3, erfinv(y) = y P(v), 5 <= w < 16: degree 9, float32 relative error 1.02e-07 (the fit's own 6.6e-09)
constexpr double kErfinvTail[] = {
    2.8329768, 1.00167507, 0.00944558564, -0.0076390915, 0.0056839635, -0.00358849413,
    0.00149385817, -7.37748462e-05, -0.000317152809, 0.000127057218};
// v = sqrt(w) - 6.75, erfinv(y) = y P(v), 16 <= w <= 90: degree 9, float32 relative error 1.62e-07 (the fit's own 9.9e-09)
constexpr double kErfinvFarTail[] = {
    6.61683866, 1.00885269, -0.000514986968, -8.20200058e-07, 8.5708373e-06, -2.21676773e-06,
    3.67874289e-07, -6.17548849e-08, 2.01051763e-08, -3.37733437e-09};
// t = 8 / |x|, i0e(x) = P(t) / sqrt|x|: degree 10, float32 relative error 6.58e-08 (the fit's own 5.9e-12)
constexpr double kI0eTail[] = {
    0.39894228, 0.00623347366, 0.000438269863, 5.73980133e-05, 8.33937287e-06, 1.44108822e-05,
    -3.10304167e-05, 5.42646034e-05, -5.4650933e-05, 3.05158027e-05, -6.92889228e-06};
// t = 8 / |x|, |i1e(x)| = P(t) / sqrt|x|: degree 10, float32 relative error 6.89e-08 (the fit's own 6.7e-12)
constexpr double kI1eTail[] = {
    0.39894228, -0.01870042, -0.000730461838, -8.02568208e-05, -1.122404e-05, -1.60515563e-05,
    3.35746364e-05, -5.86957421e-05, 5.88822597e-05, -3.27667086e-05, 7.40599223e-06};
// v = 1 / x - 1/2, k0e(x) = P(v) / sqrt x: degree 14, float32 relative error 5.89e-08 (the fit's own 7.1e-11)
constexpr double kK0eTail[] = {
    1.19015718, -0.104558025, 0.0322695551, -0.0152669931, 0.00910712108, -0.00632198952,
    0.00489114197, -0.00391042251, 0.00330909787, -0.00485820936, 0.00583719982, 0.00317771504,
    -0.00653805813, -0.0171449168, 0.0227224134};
// v = 1 / x - 1/2, k1e(x) = P(v) / sqrt x: degree 14, float32 relative error 9.71e-08 (the fit's own 8.2e-11)
constexpr double kK1eTail[] = {
    1.46155697, 0.375957815, -0.0634114284, 0.0248958011, -0.0135094629, 0.0088436557,
    -0.00657043154, 0.00512829338, -0.00426344508, 0.00594363704, -0.0069870307, -0.00345838504,
    0.0073032355, 0.0200114838, -0.026310437};
// v = z^2, asin(z) = z P(v) for |z| <= 1/2: degree 6, float32 relative error 6.01e-08 (the fit's own 2.6e-10)
constexpr double kAsinOverZ[] = {
    1, 0.166666572, 0.075005915, 0.044505242, 0.031884143, 0.014198828, 0.0378063615};
// v = (x + 1/4) / 2.25, Ai(x) = P(v) on [-2.5, 2]: degree 20, float32 absolute error 1.53e-07 (the fit's own 2.2e-13)
constexpr double kAiryNear[] = {
    0.418724614, -0.554375677, -0.26497417, 0.91186113, -0.498277293, -0.20861479, 0.367243346,
    -0.128849016, -0.0507329522, 0.0603635762, -0.0155940116, -0.00594668014, 0.00535842012,
    -0.00109308058, -0.000409392335, 0.000300802778, -4.97750028e-05, -2.14710612e-05,
    1.14427866e-05, -1.94508702e-07, -6.97965826e-07};
// v = zeta(2) / zeta - 1/2, Ai(x) = e^-zeta x^(-1/4) P(v) for x > 2: degree 12, float32 relative error 8.34e-08 (the fit's own 3.8e-12)
constexpr double kAiryRight[] = {
    0.277490802, -0.00824476117, 0.00159462703, -0.000514209482, 0.000218744697, -0.000111458502,
    6.46685516e-05, -4.24101614e-05, 3.00177274e-05, -1.61691369e-05, 1.05627236e-05,
    -2.80245073e-05, 2.68273376e-05};
// v = zeta(2.5) / zeta - 1/2, P(v) for x < -2.5: degree 12, float32 relative error 5.71e-08 (the fit's own 3.0e-12)
constexpr double kAiryLeftP[] = {
    0.563471732, -0.0027440144, -0.00229217294, 0.000715213288, 1.42059007e-05, -0.000171321429,
    0.000124351317, -4.29053487e-05, -1.76979217e-05, 5.77656016e-05, -5.92335549e-05,
    -1.62194666e-06, 3.32460775e-05};
// v as above, Q = t R(v), t = zeta(2.5) / zeta: degree 12, float32 relative error 5.17e-08 (the fit's own 3.6e-08)
constexpr double kAiryLeftQ[] = {
    0.014600955, -0.000980531509, -0.000688611161, 0.000416912711, -6.99442122e-05, -9.25287609e-05,
    0.000114261339, -7.27791698e-05, 1.65046002e-05, 5.30104641e-05, -9.20500353e-05, 1.7663145e-05,
    4.43028201e-05};
// u = x^2/32 - 1, j0(x) = P(u) for |x| <= 8: degree 13, float32 absolute error 2.91e-07 (the fit's own 4.3e-14)
constexpr double kJ0Near[] = {
    0.0458296649, 0.930301247, -0.648469283, -0.808088808, 1.03837946, -0.507468046, 0.145988848,
    -0.0284727186, 0.0040580801, -0.000443545976, 3.8471574e-05, -2.71767941e-06, 1.60741209e-07,
    -7.96187703e-09};
// u = x^2/32 - 1, j1(x) = x P(u): degree 13, float32 absolute error 9.50e-08 (the fit's own 1.9e-15)
constexpr double kJ1Near[] = {
    -0.058143828, 0.0810586604, 0.151516651, -0.259594865, 0.158583764, -0.0547458182, 0.0124568144,
    -0.00202903949, 0.00024949462, -2.40457498e-05, 1.86839649e-06, -1.19669081e-07, 6.47200385e-09,
    -2.95631861e-10};
// u = x^2/32 - 1, y0(x) = 2/pi log(x) j0(x) + P(u) for 0 < x <= 8: degree 13, float32 absolute error 2.68e-07 (the fit's own 8.9e-14)
constexpr double kY0Near[] = {
    -0.382250654, -0.82843589, 1.64709648, 0.144126324, -1.07754773, 0.672177078, -0.21895747,
    0.0463670476, -0.00702574341, 0.000806158724, -7.27919753e-05, 5.3211655e-06, -3.24353036e-07,
    1.64924217e-08};
// u = x^2/32 - 1, y1(x) = 2/pi (log(x) j1(x) - 1/x) + x P(u): degree 13, float32 absolute error 7.41e-08 (the fit's own 1.0e-13)
constexpr double kY1Near[] = {
    0.0707598588, -0.243377431, 0.0233675717, 0.235072092, -0.196398399, 0.0785478692,
    -0.0196287568, 0.00342249079, -0.000443817389, 4.4674246e-05, -3.60091489e-06, 2.38121082e-07,
    -1.32278461e-08, 5.94679358e-10};
// v = 8/x - 1/2, P0(v) for x > 8: degree 8, float32 relative error 3.94e-08 (the fit's own 5.2e-13)
constexpr double kJ0P[] = {
    0.99972702, -0.001085331, -0.00105946617, 4.98543599e-05, 2.05053707e-05, -4.6186724e-06,
    -5.68982399e-07, 5.385058e-07, -7.33183845e-08};
// v = 8/x - 1/2, Q0 = (8/x) P(v): degree 8, float32 relative error 3.04e-08 (the fit's own 1.4e-11)
constexpr double kJ0Q[] = {
    -0.0155896582, 0.00013972996, 0.000133357407, -1.20706543e-05, -4.47350711e-06, 1.55983713e-06,
    9.13921958e-08, -2.14926412e-07, 5.0516186e-08};
// v = 8/x - 1/2, P1(v): degree 8, float32 relative error 7.53e-08 (the fit's own 6.0e-13)
constexpr double kJ1P[] = {
    1.0004556, 0.00181391294, 0.00178050621, -6.4583556e-05, -2.70212337e-05, 5.53787697e-06,
    7.30873555e-07, -6.25778057e-07, 7.82282136e-08};
// v = 8/x - 1/2, Q1 = (8/x) P(v): degree 8, float32 relative error 6.62e-08 (the fit's own 5.3e-12)
constexpr double kJ1Q[] = {
    0.0468254474, -0.000196202867, -0.000188378011, 1.48667018e-05, 5.61581385e-06, -1.82628507e-06,
    -1.23251465e-07, 2.4637435e-07, -5.49465807e-08};

// c[0] + c[1] x + ... + c[n] x^n, by Horner's rule with fused multiply-adds.
Ex poly(Block& b, const Ex& x, std::span<const double> c) {
  const double* p = c.data() + c.size() - 1;
  Ex acc = f(*p);
  while (p != c.data()) acc = b.let(fma(acc, x, f(*--p)));
  return acc;
}
Ex poly(Block& b, const Ex& x, std::initializer_list<double> c) { return poly(b, x, std::span<const double>(c.begin(), c.size())); }

// e^s for -110 <= s <= 100 to an ulp or two whatever the device's exp (WGSL allows exp an error of
// 3 + 2|s| ulp, and lavapipe's reaches 100 ulp near s = 70): s = k ln2 + r with ln2 in two
// parts (k ln2_hi exact), e^r by its Taylor series to r^8 (|r| <= 0.35), then 2^k in two
// exact halves so that k = 128 and the denormal results stay representable; `tail` is a
// small correction added to r (the rounding error of s, when the caller has it).
Ex exp_reduced(Block& b, const Ex& s_in, const Ex& tail) {
  // clamped (NaN to 0) so that k converts to an integer: callers select their own results
  // outside [-110, 100]
  Ex s = select(s_in, f(-110.0), bin("<", s_in, f(-110.0)));
  s = b.let(select(select(s, f(100.0), bin(">", s, f(100.0))), f(0.0), is_nan(s_in)));
  const Ex k = b.let(fcall("round", {bin("*", s, f(1.44269504088896341))}));
  const Ex r = b.let(bin("+", fma(k, f(-1.42860682030941723e-06), fma(k, f(-0.693145751953125), s)), tail));
  const Ex e = poly(b, r, {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320});
  const Ex ki = b.let(convert(Ty::kI32, k));
  const Ex half = b.let(bin("/", ki, lit_i(2)));
  auto pow2 = [&](const Ex& n) {
    return from_bits(convert(Ty::kU32, bin("<<", bin("+", n, lit_i(127)), lit_i(23))));
  };
  return b.let(bin("*", bin("*", e, pow2(half)), pow2(bin("-", ki, half))));
}

// sin(pi r) for |r| <= 1/2: the Taylor series of sin(pi r) to r^17 (its remainder is below
// 2e-10 there), relative error of an ulp or two, exact at r = 0.
Ex sinpi_reduced(Block& b, const Ex& r) {
  const Ex r2 = b.let(bin("*", r, r));
  const Ex s = poly(b, r2, {3.14159265358979324, -5.16771278004997003, 2.55016403987734549, -0.599264529320792077,
                            0.0821458866111282288, -0.00737043094571435087, 0.000466302805767612549,
                            -2.19153534478302168e-05, 7.95205400147551263e-07});
  return bin("*", s, r);
}

// r = x - nearest integer (exact for every float32; x must be finite and below 2^23 in
// magnitude to be non-integral at all).
Ex reduce_half(Block& b, const Ex& x) { return b.let(bin("-", x, fcall("round", {x}))); }

// cos(pi r) for |r| <= 1/2 as sin(pi (1/2 - |r|)): relative accuracy near its zeros.
Ex cospi_reduced(Block& b, const Ex& r) {
  return sinpi_reduced(b, b.let(bin("-", f(0.5), fcall("abs", {r}))));
}

// x is a non-positive integer (or -inf): lgamma's poles, digamma's NaNs below zero.
Ex nonpositive_integer(Block& b, const Ex& x) {
  return b.let(bin("&&", bin("<=", x, f(0.0)), bin("==", x, fcall("floor", {x}))));
}

}  // namespace

// ---- the gamma family ---------------------------------------------------------------------

// digamma: x < 0 reflects, digamma(x) = digamma(1 - x) - pi cos(pi x) / sin(pi x); the
// positive argument climbs to 10 (subtracting 1/x per step), then the asymptotic series
// log y - 1/(2y) - sum B_2k / (2k y^2k) to y^-6. digamma(+-0) = -+inf, negative integers and
// -inf give NaN, +inf gives +inf (PyTorch's).
Ex digamma_f32(Block& b, const Ex& x) {
  const Ex neg = b.let(bin("<", x, f(0.0)));
  const Ex y = b.mut(Ty::kF32, select(x, bin("-", f(1.0), x), neg), "dy");
  const Ex acc = b.mut(Ty::kF32, f(0.0), "da");
  b.loop("di", lit_i(0), lit_i(10), lit_i(1), [&](Block& in, const Ex&) {
    in.if_(bin("<", y, f(10.0)), [&](Block& t) {
      t.assign(acc, bin("-", acc, bin("/", f(1.0), y)));
      t.assign(y, bin("+", y, f(1.0)));
    });
  });
  const Ex z = b.let(bin("/", f(1.0), bin("*", y, y)));
  const Ex series = bin("*", z, poly(b, z, {1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240}));
  const Ex positive = b.let(bin("-", bin("-", bin("+", acc, fcall("log", {y})), bin("/", f(0.5), y)), series));
  const Ex r = reduce_half(b, x);
  const Ex reflection = bin("/", bin("*", f(3.14159265358979324), cospi_reduced(b, r)), sinpi_reduced(b, r));
  Ex out = select(positive, bin("-", positive, reflection), neg);
  out = select(out, nan(), nonpositive_integer(b, x));
  // +-0: -+inf (the sign of zero decides)
  out = select(out, from_bits(bin("^", lit_u(0xff800000u), bin("&", bits(x), lit_u(0x80000000u)))),
               bin("==", magnitude(x), lit_u(0)));
  out = select(out, x, bin("==", bits(x), lit_u(0x7f800000u)));
  return select(out, x, is_nan(x));
}

// lgamma(2 + t) = t P(t) on 0 <= t < 1 (P fitted; lgamma is 0 at 1 and 2, and this keeps its
// relative accuracy there).
Ex lgamma_near_two(Block& b, const Ex& t) {
  return bin("*", t, poly(b, t, kLgamma2PlusT));
}

// lgamma: x >= 8 by Stirling's series to x^-5; 0 < x < 8 moved into [2, 3) (the product of
// the steps taken, whose logarithm is added or subtracted) and the fitted P there; x < 0 by
// reflection, lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x). Non-positive integers and
// +-inf give +inf, NaN stays NaN.
Ex lgamma_f32(Block& b, const Ex& x) {
  const Ex neg = b.let(bin("<", x, f(0.0)));
  const Ex y = b.let(select(x, bin("-", f(1.0), x), neg));
  // Stirling: (y - 1/2) log y - y + log(2 pi)/2 + 1/(12 y) - 1/(360 y^3) + 1/(1260 y^5)
  const Ex ly = b.let(fcall("log", {y}));
  const Ex iy = b.let(bin("/", f(1.0), y));
  const Ex iy2 = b.let(bin("*", iy, iy));
  const Ex corr = bin("*", iy, poly(b, iy2, {1.0 / 12, -1.0 / 360, 1.0 / 1260}));
  const Ex big = b.let(bin("+", fma(bin("-", y, f(0.5)), ly, bin("-", f(0.918938533204672742), y)), corr));
  // below 8: step into [2, 3), multiplying the factors passed
  const Ex z = b.mut(Ty::kF32, y, "gz");
  const Ex up = b.mut(Ty::kF32, f(1.0), "gu");    // product of the factors below 2
  const Ex down = b.mut(Ty::kF32, f(1.0), "gd");  // product of the factors from 3 up
  b.loop("gi", lit_i(0), lit_i(6), lit_i(1), [&](Block& in, const Ex&) {
    in.if_(bin("&&", bin(">=", z, f(3.0)), bin("<", z, f(8.0))), [&](Block& t) {
      t.assign(z, bin("-", z, f(1.0)));
      t.assign(down, bin("*", down, z));
    });
    in.if_(bin("<", z, f(2.0)), [&](Block& t) {
      t.assign(up, bin("*", up, z));
      t.assign(z, bin("+", z, f(1.0)));
    });
  });
  const Ex small = b.let(bin("-", bin("+", lgamma_near_two(b, bin("-", z, f(2.0))), fcall("log", {down})),
                             fcall("log", {up})));
  const Ex pos = b.let(select(small, big, bin(">=", y, f(8.0))));
  const Ex r = reduce_half(b, x);
  const Ex s = fcall("abs", {sinpi_reduced(b, r)});
  const Ex reflected = bin("-", fcall("log", {bin("/", f(3.14159265358979324), s)}), pos);
  Ex out = select(pos, reflected, neg);
  out = select(out, f(INFINITY), bin("||", nonpositive_integer(b, x), is_inf(x)));
  return select(out, x, is_nan(x));
}

// ---- modified Bessel functions ----------------------------------------------------------------

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
  const Ex z = b.let(bin("*", bin("*", ax, ax), f(0.25)));
  Ex small = bessel_i_series(b, z, nu);
  if (nu == 1) small = bin("*", bin("*", x, f(0.5)), small);
  small = b.let(small);
  Ex tail = b.let(bin("/", poly(b, b.let(bin("/", f(8.0), ax)), nu == 0 ? std::span<const double>(kI0eTail)
                                                                          : std::span<const double>(kI1eTail)),
                     fcall("sqrt", {ax})));
  if (nu == 1) tail = b.let(select(tail, un("-", tail), bin("<", x, f(0.0))));
  const Ex near = bin("<=", ax, f(8.0));
  Ex out = scaled ? select(tail, bin("*", small, exp_reduced(b, un("-", ax), f(0.0))), near)
                  : select(bin("*", tail, exp_reduced(b, ax, f(0.0))), small, near);
  if (!scaled) out = select(out, bin("*", tail, f(INFINITY)), is_inf(x));  // 0 * inf: NaN
  return select(out, x, is_nan(x));
}

// k0, k0e, k1, k1e: the series with their logarithms up to x = 1, then e^x K(x) sqrt x =
// P(1/x - 1/2); K(+-0) = inf, x < 0 gives NaN, K(inf) = 0.
Ex bessel_k_f32(Block& b, const Ex& x, int nu, bool scaled) {
  const Ex z = b.let(bin("*", bin("*", x, x), f(0.25)));
  const Ex lh = b.let(fcall("log", {bin("*", x, f(0.5))}));
  Ex small;
  if (nu == 0) {
    small = fma(un("-", bin("+", lh, f(kEuler))), bessel_i_series(b, z, 0), bessel_k_series(b, z, 0));
  } else {
    const Ex i1 = bin("*", bin("*", x, f(0.5)), bessel_i_series(b, z, 1));
    small = bin("-", fma(lh, i1, bin("/", f(1.0), x)), bin("*", bin("*", x, f(0.25)), bessel_k_series(b, z, 1)));
  }
  small = b.let(small);
  const Ex v = b.let(bin("-", bin("/", f(1.0), x), f(0.5)));
  const Ex tail = b.let(bin("/", poly(b, v, nu == 0 ? std::span<const double>(kK0eTail) : std::span<const double>(kK1eTail)),
                            fcall("sqrt", {x})));
  const Ex near = bin("<=", x, f(1.0));
  Ex out = scaled ? select(tail, bin("*", small, exp_reduced(b, x, f(0.0))), near)
                  : select(bin("*", tail, exp_reduced(b, un("-", x), f(0.0))), small, near);
  out = select(out, f(0.0), bin("==", bits(x), lit_u(0x7f800000u)));
  out = select(out, f(INFINITY), bin("==", magnitude(x), lit_u(0)));
  return select(out, nan(), bin("||", bin("<", x, f(0.0)), is_nan(x)));
}

// sin x and cos x for |x| <= 1e5: x - k pi/2 with pi/2 in four 8-bit parts (k pi/2's products
// exact for k < 2^16) and a fifth, then the Taylor series of sin and cos on |r| <= pi/4, swapped
// and negated by k mod 4. NaN, +-inf and larger arguments give sin 0, cos 1 (callers select
// their own results there).
struct SinCos {
  Ex s, c;
};
// sin r and cos r for |r| <= pi/4 (a little beyond is fine): Taylor to r^13 and r^14.
SinCos sincos_poly(Block& b, const Ex& r) {
  const Ex r2 = b.let(bin("*", r, r));
  const Ex sr = b.let(bin("*", r, poly(b, r2, {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800,
                                               1.0 / 6227020800.0})));
  const Ex cr = b.let(poly(b, r2, {1.0, -1.0 / 2, 1.0 / 24, -1.0 / 720, 1.0 / 40320, -1.0 / 3628800, 1.0 / 479001600,
                                   -1.0 / 87178291200.0}));
  return {sr, cr};
}

// sin and cos of k pi/2 + r from those of r (k an integral float).
SinCos rotate_quadrants(Block& b, const Ex& k, const SinCos& r) {
  const Ex q = b.let(bin("&", convert(Ty::kI32, k), lit_i(3)));
  const Ex odd = b.let(bin("==", bin("&", q, lit_i(1)), lit_i(1)));
  const Ex sp = b.let(select(r.s, r.c, odd)), cp = b.let(select(r.c, r.s, odd));
  // sin: +sin r, +cos r, -sin r, -cos r; cos: +cos r, -sin r, -cos r, +sin r
  const Ex s = b.let(select(sp, un("-", sp), bin(">=", q, lit_i(2))));
  const Ex c = b.let(select(cp, un("-", cp), bin("||", bin("==", q, lit_i(1)), bin("==", q, lit_i(2)))));
  return {s, c};
}

SinCos sincos_f32(Block& b, const Ex& x_in) {
  const Ex x = b.let(select(f(0.0), x_in, bin("<=", fcall("abs", {x_in}), f(1e5))));
  const Ex k = b.let(fcall("round", {bin("*", x, f(0.636619772367581343))}));
  Ex r = x;
  for (double part : {1.5703125, 0.000484466552734375, -6.407499313354492e-07, 9.89530235528946e-10,
                      2.5633440682570896e-12}) {
    r = b.let(bin("-", r, bin("*", k, f(part))));
  }
  return rotate_quadrants(b, k, sincos_poly(b, r));
}
Ex sin_f32(Block& b, const Ex& x) { return sincos_f32(b, x).s; }

// j0, j1, y0, y1: up to |x| = 8 fitted polynomials in u = x^2/32 - 1 (y0 and y1 beside their
// logarithm terms), beyond the modulus-phase form with P and Q fitted in 8/x:
// J = (P cos xi - Q sin xi) / sqrt(pi x / 2), Y = (P sin xi + Q cos xi) / sqrt(pi x / 2),
// xi = x - pi/4 (J0, Y0) or x - 3 pi/4 (J1, Y1), written with sin x and cos x. j0 and j1 are
// even and odd; y0 and y1 are NaN below 0 and -inf at +-0. At +-inf (and for NaN) all are
// NaN, as PyTorch's; beyond 1e5 the device's sin and cos.
Ex bessel_jy_f32(Block& b, const Ex& x, int nu, bool second_kind) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex u = b.let(fma(bin("*", x, x), f(1.0 / 32), f(-1.0)));
  Ex near;
  if (!second_kind) {
    near = nu == 0 ? poly(b, u, kJ0Near) : bin("*", x, poly(b, u, kJ1Near));
  } else {
    const Ex l = b.let(bin("*", fcall("log", {x}), f(0.636619772367581343)));  // 2/pi log x
    if (nu == 0) {
      near = fma(l, poly(b, u, kJ0Near), poly(b, u, kY0Near));
    } else {
      const Ex j1 = bin("*", x, poly(b, u, kJ1Near));
      near = bin("+", fma(l, j1, bin("/", f(-0.636619772367581343), x)), bin("*", x, poly(b, u, kY1Near)));
    }
  }
  near = b.let(near);
  const Ex t = b.let(bin("/", f(8.0), ax));
  const Ex v = b.let(bin("-", t, f(0.5)));
  const Ex p = b.let(poly(b, v, nu == 0 ? std::span<const double>(kJ0P) : std::span<const double>(kJ1P)));
  const Ex q = b.let(bin("*", t, poly(b, v, nu == 0 ? std::span<const double>(kJ0Q) : std::span<const double>(kJ1Q))));
  const SinCos sc = sincos_f32(b, ax);
  const Ex big = b.let(bin(">", ax, f(1e5)));
  const Ex sx = b.let(select(sc.s, fcall("sin", {ax}), big)), cx = b.let(select(sc.c, fcall("cos", {ax}), big));
  const Ex spc = b.let(bin("+", sx, cx)), smc = b.let(bin("-", sx, cx));
  // sqrt(2) cos xi and sqrt(2) sin xi: xi = x - pi/4: (c + s, s - c); x - 3 pi/4: (s - c, -(s + c))
  const Ex cxi = nu == 0 ? spc : smc;
  const Ex sxi = nu == 0 ? smc : un("-", spc);
  const Ex m = b.let(fcall("sqrt", {bin("*", ax, f(3.14159265358979324))}));
  Ex far = second_kind ? bin("+", bin("*", p, sxi), bin("*", q, cxi)) : bin("-", bin("*", p, cxi), bin("*", q, sxi));
  far = b.let(bin("/", far, m));
  if (nu == 1 && !second_kind) far = select(far, un("-", far), bin("<", x, f(0.0)));  // odd
  Ex out = select(far, near, bin("<=", ax, f(8.0)));
  if (second_kind) {
    out = select(out, f(-INFINITY), bin("==", magnitude(x), lit_u(0)));
    out = select(out, nan(), bin("<", x, f(0.0)));
  }
  out = select(out, nan(), is_inf(x));
  return select(out, x, is_nan(x));
}

// spherical_bessel_j0 = sin x / x: its Taylor series below 1/2, the reduced sin to 1e5, the
// device's sin beyond (where |sin x / x| <= 1e-5 whatever its error), 0 at +-inf.
Ex spherical_j0_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex x2 = b.let(bin("*", x, x));
  const Ex near = poly(b, x2, {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880});
  const Ex mid = bin("/", sin_f32(b, x), x);
  Ex out = select(mid, near, bin("<", ax, f(0.5)));
  out = select(out, bin("/", fcall("sin", {x}), x), bin(">", ax, f(1e5)));
  out = select(out, f(0.0), is_inf(x));
  return select(out, x, is_nan(x));
}

// trigamma with PyTorch's float32 evaluation, so that its poles agree: reflection below 1/2
// through sin of the rounded product pi x (sin(-pi) is not 0 in float32: trigamma(-1) is large
// but finite, trigamma(0) inf), six recurrence steps, a short asymptotic series.
Ex trigamma_f32(Block& b, const Ex& x) {
  const Ex reflect = b.let(bin("<", x, f(0.5)));
  const Ex px = b.let(bin("*", f(3.14159265358979324), x));
  const Ex sn = b.let(select(fcall("sin", {px}), sin_f32(b, px), bin("<=", fcall("abs", {px}), f(1e5))));
  const Ex result = b.mut(Ty::kF32, select(f(0.0), un("-", bin("/", f(9.86960440108935862), bin("*", sn, sn))), reflect), "tr");
  const Ex y = b.mut(Ty::kF32, select(x, bin("-", f(1.0), x), reflect), "ty");
  b.loop("ti", lit_i(0), lit_i(6), lit_i(1), [&](Block& in, const Ex&) {
    in.assign(result, bin("+", result, bin("/", f(1.0), bin("*", y, y))));
    in.assign(y, bin("+", y, f(1.0)));
  });
  const Ex ixx = b.let(bin("/", f(1.0), bin("*", y, y)));
  const Ex series = bin("+", bin("+", f(1.0), bin("/", f(1.0), bin("*", f(2.0), y))),
                        bin("*", ixx, poly(b, ixx, {1.0 / 6, -1.0 / 30, 1.0 / 42})));
  const Ex r = b.let(bin("+", result, bin("/", series, y)));
  return select(r, un("-", r), reflect);
}

// Hurwitz zeta(s, q) = sum_k (q + k)^-s by Euler-Maclaurin, as the CPU's (special.h): the
// direct sum up to q + N >= 10 (N >= 10), the tail's integral, half its first term and ten
// Bernoulli corrections; PyTorch's edge values checked in its order. q < 0 (integer s) sums
// term by term up to 10 as PyTorch does; below -65536 the result is NaN (the CPU's limit is
// -2^24: a GPU invocation must not walk millions of terms).
Ex zeta_f32(Block& b, const Ex& s, const Ex& q) {
  const Ex terms = b.let(select(lit_i(10), convert(Ty::kI32, fcall("ceil", {bin("-", f(10.0), q)})),
                                bin("&&", bin("<", q, f(0.0)), bin(">=", q, f(-65536.0)))));
  const Ex odd_s = b.let(bin("==", bin("%", s, f(2.0)), f(1.0)));
  // Neumaier's compensated sum: terms of both signs (q < 0) cancel, (-1/2)^-5 against
  // (1/2)^-5, and would leave the float32 rounding of the largest partial sum
  const Ex sum = b.mut(Ty::kF32, f(0.0), "zs");
  const Ex comp = b.mut(Ty::kF32, f(0.0), "zc");
  const Ex a = b.mut(Ty::kF32, q, "za");
  b.loop("zi", lit_i(0), terms, lit_i(1), [&](Block& in, const Ex&) {
    // (a)^-s, a negative base only with an integer s (the edge cases below take the rest)
    const Ex p0 = in.let(fcall("pow", {fcall("abs", {a}), un("-", s)}));
    const Ex p = in.let(select(p0, un("-", p0), bin("&&", bin("<", a, f(0.0)), odd_s)));
    const Ex t = in.let(bin("+", sum, p));
    const Ex lost = select(bin("+", bin("-", p, t), sum), bin("+", bin("-", sum, t), p),
                           bin(">=", fcall("abs", {sum}), fcall("abs", {p})));
    in.assign(comp, bin("+", comp, select(lost, f(0.0), is_inf(t))));  // (an infinite sum stays so)
    in.assign(sum, t);
    in.assign(a, bin("+", a, f(1.0)));
  });
  b.assign(sum, bin("+", sum, comp));
  const Ex as = b.let(fcall("pow", {a, un("-", s)}));
  const Ex total = b.mut(Ty::kF32, bin("+", sum, fma(bin("/", a, bin("-", s, f(1.0))), as, bin("*", f(0.5), as))), "zt");
  const Ex rising = b.mut(Ty::kF32, s, "zr");
  const Ex pw = b.mut(Ty::kF32, bin("/", as, a), "zp");
  static constexpr double kB2jOverFact[] = {
      1.0 / 12, -1.0 / 720, 1.0 / 30240, -1.0 / 1209600, 1.0 / 47900160, -691.0 / 1307674368000.0,
      1.0 / 74724249600.0, -3617.0 / 10670622842880000.0, 43867.0 / 5109094217170944000.0,
      -174611.0 / 802857662698291200000.0};
  for (int j = 0; j < 10; ++j) {
    b.assign(total, fma(bin("*", f(kB2jOverFact[j]), rising), pw, total));
    b.assign(rising, bin("*", rising, bin("*", bin("+", s, f(2.0 * j + 1)), bin("+", s, f(2.0 * j + 2)))));
    b.assign(pw, bin("/", pw, bin("*", a, a)));
  }
  Ex out = b.let(total);
  // PyTorch's order: q = inf, s = inf, q beyond the walk, NaN, then q <= 0, s < 1, s == 1
  out = select(out, select(select(nan(), f(INFINITY), bin("<", q, f(1.0))), f(1.0), bin("==", q, f(1.0))),
               bin("==", bits(s), lit_u(0x7f800000u)));
  out = select(out, nan(), bin("||", is_inf(q), bin("<", q, f(-65536.0))));
  out = select(out, nan(), bin("||", is_nan(s), is_nan(q)));
  const Ex q_nonpositive = bin("<=", q, f(0.0));
  out = select(out, nan(), bin("&&", q_nonpositive, bin("!=", s, fcall("floor", {s}))));
  out = select(out, f(INFINITY), bin("&&", q_nonpositive, bin("==", q, fcall("floor", {q}))));
  out = select(out, nan(), bin("<", s, f(1.0)));
  return select(out, f(INFINITY), bin("==", s, f(1.0)));
}

// polygamma(n, x) for a literal n >= 0: digamma, trigamma, else (-1)^(n+1) n! zeta(n+1, x).
Ex polygamma_f32(Block& b, int64_t n, const Ex& x) {
  if (n == 0) return digamma_f32(b, x);
  if (n == 1) return trigamma_f32(b, x);
  double factorial = 1.0;
  for (int64_t i = 2; i <= n; ++i) factorial *= static_cast<double>(i);
  const double sign = n % 2 == 0 ? -1.0 : 1.0;
  return bin("*", f(sign * factorial), zeta_f32(b, f(static_cast<double>(n + 1)), x));
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
  const Ex finite = bin("&&", bin(">", nt, f(-9.2e18)), bin("<", nt, f(9.2e18)));
  const Ex n = b.let(select(f(-1.0), fcall("trunc", {nt}), finite));
  const Ex ni = b.let(convert(Ty::kI32, select(select(n, f(1073741824.0), bin(">", n, f(1073741824.0))), f(-1.0),
                                               bin("<", n, f(0.0)))));
  return {b.let(bin(">=", n, f(0.0))), n, b.let(bin("==", bin("&", ni, lit_i(1)), lit_i(1)))};
}

// The recurrence r = step(k, p, q) for k = first .. last - 1 from (p0, q0), when `run`
// (at most kMaxRecurrence steps; NaN past that unless already NaN). Returns q.
template <class Step>
Ex recurrence(Block& b, const Ex& run, const Ex& first, const Ex& last_f, const Ex& p0, const Ex& q0, Step step) {
  const Ex count_f = b.let(bin("-", last_f, convert(Ty::kF32, first)));
  const Ex over = b.let(bin("&&", run, bin(">", count_f, f(kMaxRecurrence))));
  const Ex count = b.let(select(lit_i(0), convert(Ty::kI32, select(count_f, f(kMaxRecurrence), over)),
                                bin("&&", run, bin(">", count_f, f(0.0)))));
  const Ex p = b.mut(Ty::kF32, p0, "op"), q = b.mut(Ty::kF32, q0, "oq");
  b.loop("oi", lit_i(0), count, lit_i(1), [&](Block& in, const Ex& i) {
    in.if_(un("!", is_nan(q)), [&](Block& t) {  // NaN stays NaN (the CPU's early exit)
      const Ex k = t.let(convert(Ty::kF32, bin("+", first, i)));
      const Ex r = t.let(step(t, k, p, q));
      t.assign(p, q);
      t.assign(q, r);
    });
  });
  return select(q, nan(), bin("&&", over, un("!", is_nan(q))));
}

// (-1)^n v
Ex odd_neg(const Degree& d, const Ex& v) { return select(v, un("-", v), d.odd); }

// cos(a) and sin(a) of a float32 argument, reduced exactly to 1e5, the device's beyond
SinCos sincos_any(Block& b, const Ex& a) {
  const SinCos sc = sincos_f32(b, a);
  const Ex big = b.let(bin(">", fcall("abs", {a}), f(1e5)));
  return {b.let(select(sc.s, fcall("sin", {a}), big)), b.let(select(sc.c, fcall("cos", {a}), big))};
}

// acos x as 2 asin(sqrt((1 - |x|) / 2)) above 1/2 (1 - |x| exact there), pi/2 - asin(x)
// below, asin(z) = z P(z^2) fitted: not the device's acos (lavapipe's is 5e-4 off).
Ex acos_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex z = b.let(fcall("sqrt", {bin("*", bin("-", f(1.0), ax), f(0.5))}));
  const Ex half = b.let(bin("*", f(2.0), bin("*", z, poly(b, b.let(bin("*", z, z)), kAsinOverZ))));
  const Ex outer = select(half, bin("-", f(3.14159265358979324), half), bin("<", x, f(0.0)));
  const Ex inner = bin("-", f(1.57079632679489662), bin("*", x, poly(b, b.let(bin("*", x, x)), kAsinOverZ)));
  return b.let(select(select(outer, inner, bin("<=", ax, f(0.5))), nan(), bin(">", ax, f(1.0))));
}

// Chebyshev of kind 0..3 (T, U, V, W) at y with degree d; `limit`: the closed forms above it.
Ex chebyshev(Block& b, int kind, const Ex& y, const Degree& d, double limit) {
  const Ex n = d.n;
  const Ex ay = b.let(fcall("abs", {y}));
  const Ex one = b.let(bin("==", ay, f(1.0)));
  const Ex pos = bin(">", y, f(0.0));
  Ex at_one;
  switch (kind) {
    case 0: at_one = select(f(-1.0), f(1.0), bin("||", pos, un("!", d.odd))); break;
    case 1: at_one = select(odd_neg(d, bin("+", n, f(1.0))), bin("+", n, f(1.0)), pos); break;
    case 2: at_one = select(odd_neg(d, fma(f(2.0), n, f(1.0))), f(1.0), pos); break;
    default: at_one = select(odd_neg(d, f(1.0)), fma(f(2.0), n, f(1.0)), pos); break;
  }
  const Ex closed_ok = b.let(bin("&&", bin(">", n, f(limit)), bin("<", ay, f(1.0))));
  const Ex t = acos_f32(b, b.let(select(f(0.0), y, closed_ok)));
  Ex closed;
  switch (kind) {
    case 0: closed = sincos_any(b, b.let(bin("*", n, t))).c; break;
    case 1: closed = bin("/", sincos_any(b, b.let(bin("*", bin("+", n, f(1.0)), t))).s, sincos_any(b, t).s); break;
    case 2:
      closed = bin("/", sincos_any(b, b.let(bin("*", bin("+", n, f(0.5)), t))).c,
                   sincos_any(b, b.let(bin("/", t, f(2.0)))).c);
      break;
    default:
      closed = bin("/", sincos_any(b, b.let(bin("*", bin("+", n, f(0.5)), t))).s,
                   sincos_any(b, b.let(bin("/", t, f(2.0)))).s);
      break;
  }
  const Ex m = b.let(bin("+", y, y));
  const Ex q1 = b.let(kind == 0 ? y : kind == 1 ? m : kind == 2 ? bin("-", m, f(1.0)) : bin("+", m, f(1.0)));
  const Ex run = b.let(bin("&&", bin("&&", d.valid, un("!", one)), bin("&&", un("!", closed_ok), bin(">=", n, f(2.0)))));
  const Ex rec = recurrence(b, run, lit_i(2), bin("+", n, f(1.0)), f(1.0), q1,
                            [&](Block&, const Ex&, const Ex& p, const Ex& q) { return fma(m, q, un("-", p)); });
  Ex out = select(rec, q1, bin("==", n, f(1.0)));
  out = select(out, f(1.0), bin("==", n, f(0.0)));
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
      return chebyshev(b, kind, b.let(bin("-", bin("+", x, x), f(1.0))), d, kind == 3 ? 4 : 6);
    }
    default: break;
  }
  Ex q0, fallback = f(1.0), special = lit_b(false), special_value = f(0.0);
  std::function<Ex(Block&, const Ex&, const Ex&, const Ex&)> step;
  const Ex x2 = b.let(bin("+", x, x));
  switch (op) {
    case EwOp::k_hermite_polynomial_h:
      q0 = x2;
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) { return fma(x2, q, un("-", bin("*", bin("+", k, k), p))); };
      break;
    case EwOp::k_hermite_polynomial_he:
      q0 = x;
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) { return fma(x, q, un("-", bin("*", k, p))); };
      break;
    case EwOp::k_laguerre_polynomial_l:
      q0 = bin("-", f(1.0), x);
      special = bin("==", x, f(0.0));
      special_value = f(1.0);
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) {
        const Ex k1 = bin("+", k, f(1.0));
        return bin("/", fma(bin("+", k, bin("-", k1, x)), q, un("-", bin("*", k, p))), k1);
      };
      break;
    case EwOp::k_legendre_polynomial_p:
      q0 = x;
      special = bin("==", fcall("abs", {x}), f(1.0));
      special_value = select(odd_neg(d, f(1.0)), f(1.0), bin("||", bin(">", x, f(0.0)), bin("==", n, f(0.0))));
      step = [&](Block&, const Ex& k, const Ex& p, const Ex& q) {
        return bin("/", fma(bin("*", fma(f(2.0), k, f(1.0)), x), q, un("-", bin("*", k, p))), bin("+", k, f(1.0)));
      };
      break;
    default: throw std::logic_error("orthogonal_polynomial_f32: not a polynomial");
  }
  const Ex sp = b.let(special);
  const Ex run = b.let(bin("&&", bin("&&", d.valid, un("!", sp)), bin(">=", n, f(2.0))));
  const Ex q1 = b.let(q0);
  const Ex rec = recurrence(b, run, lit_i(1), n, f(1.0), q1, step);
  Ex out = select(rec, q1, bin("==", n, f(1.0)));
  out = select(out, fallback, bin("==", n, f(0.0)));
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
  const Ex t = b.let(bin("/", bin("-", x, a), a));
  const Ex t2 = b.let(bin("*", t, t));
  std::vector<double> c;  // log(1 + t) - t = t^2 (-1/2 + t/3 - t^2/4 ...), to t^24
  for (int k = 2; k <= 24; ++k) c.push_back((k % 2 == 0 ? -1.0 : 1.0) / k);
  const Ex series = bin("*", t2, poly(b, t, c));
  const Ex direct = bin("-", fcall("log", {bin("+", f(1.0), t)}), t);
  const Ex l1pmx = b.let(select(direct, series, bin("<", fcall("abs", {t}), f(0.5))));
  const Ex ia = b.let(bin("/", f(1.0), a));
  const Ex ia2 = b.let(bin("*", ia, ia));
  const Ex corr = bin("*", ia, poly(b, ia2, {1.0 / 12, -1.0 / 360, 1.0 / 1260}));
  const Ex large = bin("-", fma(a, l1pmx, fma(f(0.5), fcall("log", {a}), f(-0.918938533204672742))), corr);
  const Ex small = bin("-", bin("-", bin("*", a, fcall("log", {x})), x), lgamma_f32(b, a));
  const Ex factor = b.let(exp_reduced(b, b.let(select(small, large, bin(">", a, f(10.0)))), f(0.0)));
  // (NaN: 0, so that the conversion is defined; the edge values below take those)
  const Ex larger = b.let(select(fcall("max", {a, x}), f(0.0), bin("||", is_nan(a), is_nan(x))));
  const Ex steps = fma(f(8.0), fcall("sqrt", {larger}), f(32.0));
  const Ex limit = b.let(convert(Ty::kI32, select(steps, f(16384.0), bin(">", steps, f(16384.0)))));
  const Ex use_series = b.let(bin("<", x, bin("+", a, f(1.0))));
  // the series: sum_k x^k / (a (a+1) ... (a+k))
  const Ex term = b.mut(Ty::kF32, ia, "gt"), sum = b.mut(Ty::kF32, ia, "gs");
  b.loop("gk", lit_i(1), select(lit_i(0), limit, use_series), lit_i(1), [&](Block& in, const Ex& k) {
    in.if_(bin(">=", term, bin("*", sum, f(3e-8))), [&](Block& tb) {
      tb.assign(term, bin("*", term, bin("/", x, bin("+", a, convert(Ty::kF32, k)))));
      tb.assign(sum, bin("+", sum, term));
    });
  });
  // the continued fraction for Q (modified Lentz)
  const double tiny = 1e-30;
  const Ex bb = b.mut(Ty::kF32, bin("-", bin("+", x, f(1.0)), a), "gb");
  const Ex cc = b.mut(Ty::kF32, f(1.0 / tiny), "gc");
  const Ex dd = b.mut(Ty::kF32, bin("/", f(1.0), bb), "gd");
  const Ex h = b.mut(Ty::kF32, dd, "gh");
  const Ex done = b.mut(Ty::kBool, lit_b(false), "gz");
  b.loop("gi", lit_i(1), select(limit, lit_i(0), use_series), lit_i(1), [&](Block& in, const Ex& i) {
    in.if_(un("!", done), [&](Block& tb) {
      const Ex fi = tb.let(convert(Ty::kF32, i));
      const Ex an = tb.let(un("-", bin("*", fi, bin("-", fi, a))));
      tb.assign(bb, bin("+", bb, f(2.0)));
      const Ex d1 = tb.let(fma(an, dd, bb));
      const Ex d2 = tb.let(select(d1, f(tiny), bin("<", fcall("abs", {d1}), f(tiny))));
      const Ex c1 = tb.let(bin("+", bb, bin("/", an, cc)));
      tb.assign(cc, select(c1, f(tiny), bin("<", fcall("abs", {c1}), f(tiny))));
      tb.assign(dd, bin("/", f(1.0), d2));
      const Ex del = tb.let(bin("*", dd, cc));
      tb.assign(h, bin("*", h, del));
      tb.assign(done, bin("<", fcall("abs", {bin("-", del, f(1.0))}), f(3e-8)));
    });
  });
  const Ex p_series = b.let(bin("*", factor, sum));
  const Ex q_fraction = b.let(bin("*", factor, h));
  Ex out = upper ? select(q_fraction, bin("-", f(1.0), p_series), use_series)
                 : select(bin("-", f(1.0), q_fraction), p_series, use_series);
  // PyTorch's edge values, the first that applies wins (so reversed here)
  out = select(out, nan(), bin("||", is_nan(a), is_nan(x)));
  out = select(out, f(upper ? 0.0 : 1.0), is_inf(x));
  out = select(out, select(f(upper ? 1.0 : 0.0), nan(), is_inf(x)), is_inf(a));
  out = select(out, f(upper ? 1.0 : 0.0), bin("==", x, f(0.0)));
  out = select(out, select(nan(), f(upper ? 0.0 : 1.0), bin(">", x, f(0.0))), bin("==", a, f(0.0)));
  return select(out, nan(), bin("||", bin("<", a, f(0.0)), bin("<", x, f(0.0))));
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
  const Ex near = poly(b, b.let(bin("/", bin("+", x, f(0.25)), f(2.25))), kAiryNear);
  constexpr double kZeta2 = 1.88561808316412674, kZeta25 = 2.63523138347365150;
  // x > 2
  const Ex xr = b.let(select(f(2.0), x, bin(">", x, f(2.0))));
  const Ex sr = b.let(fcall("sqrt", {xr}));
  const Ex zr = b.let(bin("*", f(2.0 / 3.0), bin("*", xr, sr)));
  const Ex right = bin("/", bin("*", exp_reduced(b, un("-", zr), f(0.0)),
                                poly(b, b.let(bin("-", bin("/", f(kZeta2), zr), f(0.5))), kAiryRight)),
                       fcall("sqrt", {sr}));
  // x < -2.5: y^(3/2) = hi + lo
  const Ex y = b.let(select(f(2.5), un("-", x), bin("<", x, f(-2.5))));
  auto split = [&](const Ex& v) {
    const Ex hi = b.let(from_bits(bin("&", bits(v), lit_u(0xfffff000u))));
    return std::pair<Ex, Ex>{hi, b.let(bin("-", v, hi))};
  };
  const Ex s = b.let(fcall("sqrt", {y}));
  const auto [s_hi, s_lo] = split(s);
  const auto [y_hi, y_lo] = split(y);
  // y - s^2 (exact: each product of halves is), then sqrt y = s + (y - s^2) / 2s
  const Ex rem = b.let(bin("-", bin("-", bin("-", y, bin("*", s_hi, s_hi)), bin("*", f(2.0), bin("*", s_hi, s_lo))),
                           bin("*", s_lo, s_lo)));
  const Ex hi = b.let(bin("*", y, s));
  Ex lo = bin("+", bin("+", bin("+", bin("-", bin("*", y_hi, s_hi), hi), bin("*", y_hi, s_lo)), bin("*", y_lo, s_hi)),
               bin("*", y_lo, s_lo));
  lo = b.let(bin("+", lo, bin("*", y, bin("/", rem, bin("*", f(2.0), s)))));
  // theta - pi/4 = 2/3 (hi + lo) = k pi/2 + r, r = (2 hi - k 3pi/2 + 2 lo) / 3
  const Ex in_range = b.let(bin("<", hi, f(1.5e5)));
  const Ex k = b.let(fcall("round", {bin("*", select(f(0.0), hi, in_range), f(0.42441317439079285))}));
  Ex r3 = bin("*", f(2.0), hi);
  for (double part : {4.71875, -0.00634765625, -1.33514404296875e-05, -1.1932570487260818e-08,
                      7.690032638452138e-12}) {
    r3 = b.let(bin("-", r3, bin("*", k, f(part))));
  }
  const Ex r = b.let(bin("/", bin("+", r3, bin("*", f(2.0), lo)), f(3.0)));
  const SinCos sc = sincos_poly(b, r);
  // r + pi/4
  const SinCos shifted{b.let(bin("*", bin("+", sc.s, sc.c), f(0.707106781186547524))),
                       b.let(bin("*", bin("-", sc.c, sc.s), f(0.707106781186547524)))};
  const SinCos th = rotate_quadrants(b, k, shifted);
  const Ex zl = b.let(bin("*", f(2.0 / 3.0), hi));
  const Ex theta_f = b.let(bin("+", zl, f(0.785398163397448310)));
  const Ex sin_t = b.let(select(fcall("sin", {theta_f}), th.s, in_range));
  const Ex cos_t = b.let(select(fcall("cos", {theta_f}), th.c, in_range));
  const Ex t = b.let(bin("/", f(kZeta25), zl));
  const Ex v = b.let(bin("-", t, f(0.5)));
  const Ex left = bin("/", bin("-", bin("*", poly(b, v, kAiryLeftP), sin_t), bin("*", bin("*", t, poly(b, v, kAiryLeftQ)), cos_t)),
                      fcall("sqrt", {s}));
  Ex out = select(select(near, left, bin("<", x, f(-2.5))), right, bin(">", x, f(2.0)));
  return select(out, nan(), bin("||", is_nan(x), is_inf(x)));
}

// ---- the error-function family --------------------------------------------------------------

// erfcx(x) = e^(x^2) erfc(x) for x >= 0 as Q(t) / (1 + 2x), t = (x - 2) / (x + 2) mapping
// [0, inf) onto [-1, 1) (Q fitted; Q -> 2/sqrt(pi) as x -> inf, so no asymptotic branch).
Ex erfcx_nonnegative(Block& b, const Ex& x) {
  const Ex t = b.let(bin("/", bin("-", x, f(2.0)), bin("+", x, f(2.0))));
  const Ex q = poly(b, t, kErfcxQ);
  return b.let(bin("/", q, fma(f(2.0), x, f(1.0))));
}

// e^(+-x^2) with x^2 split into an exact head (x with its low 12 bits cleared, squared: 24
// bits) and a small tail, so that neither the rounding of x^2 (relative 6e-8, times x^2 in
// the result) nor the device's exp reaches the result. (Not fma(x, x, -s): WGSL lets fma
// round twice, and lavapipe's does.)
Ex exp_square(Block& b, const Ex& x, bool negative) {
  const Ex hi = b.let(from_bits(bin("&", bits(x), lit_u(0xfffff000u))));
  const Ex lo = b.let(bin("-", x, hi));
  const Ex head = b.let(bin("*", hi, hi));
  const Ex tail = b.let(bin("*", lo, bin("+", bin("*", f(2.0), hi), lo)));
  return negative ? exp_reduced(b, un("-", head), un("-", tail)) : exp_reduced(b, head, tail);
}

// erfcx: x < 0 as 2 e^(x^2) - erfcx(-x) (+inf once e^(x^2) overflows, as PyTorch).
Ex erfcx_f32(Block& b, const Ex& x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex pos = erfcx_nonnegative(b, ax);
  const Ex negative = bin("-", bin("*", f(2.0), exp_square(b, x, false)), pos);
  Ex out = select(pos, negative, bin("<", x, f(0.0)));
  out = select(out, f(0.0), bin("==", bits(x), lit_u(0x7f800000u)));
  out = select(out, f(INFINITY), bin("<", x, f(-9.5)));
  return select(out, x, is_nan(x));
}

// erfc: e^(-x^2) erfcx(|x|) for x >= 0.5 (relative accuracy in the tail), 1 - erf(x) below,
// 2 - erfc(-x) for x < -0.5.
Ex erfc_f32(Block& b, const Ex& x, const Ex& erf_x) {
  const Ex ax = b.let(fcall("abs", {x}));
  const Ex tail = b.let(bin("*", exp_square(b, ax, true), erfcx_nonnegative(b, ax)));
  Ex out = select(bin("-", f(1.0), erf_x), tail, bin(">=", x, f(0.5)));
  out = select(out, bin("-", f(2.0), tail), bin("<=", x, f(-0.5)));
  out = select(out, f(0.0), bin(">", x, f(10.5)));   // below the smallest float32
  out = select(out, f(2.0), bin("<", x, f(-10.5)));  // (and +-inf, whose tail is NaN)
  return select(out, x, is_nan(x));
}

// erfinv from y and 1 - |y| (exact, or computed exactly by the caller): w = -log((1 - |y|)
// (1 + |y|)); erfinv(y) = y P(w) for w < 5, y P(sqrt w) on [5, 16) and on [16, 90] (90: 1 - |y| = 1e-38).
Ex erfinv_core(Block& b, const Ex& y, const Ex& one_minus, const Ex& one_plus) {
  const Ex w = b.let(un("-", fcall("log", {bin("*", one_minus, one_plus)})));
  const Ex central = poly(b, b.let(bin("-", w, f(2.5))), kErfinvCentral);
  const Ex s = b.let(fcall("sqrt", {w}));
  const Ex tail = poly(b, b.let(bin("-", s, f(3.0))), kErfinvTail);
  const Ex far = poly(b, b.let(bin("-", s, f(6.75))), kErfinvFarTail);
  return b.let(bin("*", y, select(select(central, tail, bin(">=", w, f(5.0))), far, bin(">=", w, f(16.0)))));
}

Ex erfinv_f32(Block& b, const Ex& y) {
  const Ex ay = b.let(fcall("abs", {y}));
  Ex out = erfinv_core(b, y, b.let(bin("-", f(1.0), ay)), b.let(bin("+", f(1.0), ay)));
  out = select(out, y, bin("==", ay, f(0.0)));  // +-0
  out = select(out, from_bits(bin("|", lit_u(0x7f800000u), bin("&", bits(y), lit_u(0x80000000u)))),
               bin("==", ay, f(1.0)));
  return select(out, nan(), bin("||", bin(">", ay, f(1.0)), is_nan(y)));
}

// ndtri(p) = sqrt(2) erfinv(2p - 1), with 1 - |2p - 1| formed exactly: 2p below 1/2, 2 - 2p
// above, so tiny p (down to 1e-38) keeps its relative accuracy.
Ex ndtri_f32(Block& b, const Ex& p) {
  const Ex y = b.let(fma(f(2.0), p, f(-1.0)));
  const Ex lower = b.let(bin("<", p, f(0.5)));
  const Ex one_minus = select(bin("-", f(2.0), bin("*", f(2.0), p)), bin("*", f(2.0), p), lower);
  const Ex one_plus = select(bin("*", f(2.0), p), bin("-", f(2.0), bin("*", f(2.0), p)), lower);
  Ex out = bin("*", f(1.41421356237309505), erfinv_core(b, y, b.let(one_minus), b.let(one_plus)));
  out = select(out, f(0.0), bin("==", p, f(0.5)));
  out = select(out, f(-INFINITY), bin("==", p, f(0.0)));
  out = select(out, f(INFINITY), bin("==", p, f(1.0)));
  return select(out, nan(), bin("||", bin("||", bin("<", p, f(0.0)), bin(">", p, f(1.0))), is_nan(p)));
}

// ---- float utilities (on the bits) -------------------------------------------------------------

// The float's bits as an integer that orders like the values (-0 and +0 both 0).
namespace {
Ex ordered(Block& b, const Ex& x) {
  const Ex m = b.let(convert(Ty::kI32, magnitude(x)));
  return b.let(select(m, un("-", m), bin("!=", bin("&", bits(x), lit_u(0x80000000u)), lit_u(0))));
}
}  // namespace

// nextafter(a, c): the neighbour of a toward c; c when they are equal (so +-0 keeps c's
// sign), NaN when either is.
Ex nextafter_f32(Block& b, const Ex& a, const Ex& c) {
  const Ex ka = ordered(b, a), kc = ordered(b, c);
  const Ex k = b.let(select(bin("-", ka, lit_i(1)), bin("+", ka, lit_i(1)), bin("<", ka, kc)));
  // back to bits; from +-0 the first step is the smallest denormal with c's sign, and a
  // step onto 0 keeps a's sign
  const Ex magnitude_bits = convert(Ty::kU32, select(k, un("-", k), bin("<", k, lit_i(0))));
  Ex r = from_bits(bin("|", magnitude_bits, select(lit_u(0), lit_u(0x80000000u), bin("<", k, lit_i(0)))));
  r = select(r, from_bits(bin("&", bits(a), lit_u(0x80000000u))), bin("==", k, lit_i(0)));
  r = select(r, c, bin("==", ka, kc));
  return select(r, bin("+", a, c), bin("||", is_nan(a), is_nan(c)));
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
  const Ex biased = b.let(convert(Ty::kI32, bin("&", bin(">>", u, lit_u(23)), lit_u(0xffu))));
  const Ex frac = b.mut(Ty::kU32, bin("&", u, lit_u(0x7fffffu)), "ff");
  const Ex shift = b.mut(Ty::kI32, lit_i(0), "fs");
  b.if_(bin("==", biased, lit_i(0)), [&](Block& t) {  // denormal: move the leading 1 to bit 23
    for (int step : {16, 8, 4, 2, 1}) {
      t.if_(bin("==", bin(">>", frac, lit_u(static_cast<uint64_t>(24 - step))), lit_u(0)), [&](Block& s) {
        s.assign(frac, bin("<<", frac, lit_u(static_cast<uint64_t>(step))));
        s.assign(shift, bin("+", shift, lit_i(step)));
      });
    }
  });
  // normal: e = biased - 126; denormal: the leading 1 sat `shift` bits below bit 23, and the
  // value's exponent is -126 - shift + 1 ... written as 1 - 126 - shift (biased 0 acts as 1)
  const Ex e = select(bin("-", biased, lit_i(126)), bin("-", lit_i(-125), shift), bin("==", biased, lit_i(0)));
  return {b.let(bin("&", frac, lit_u(0x7fffffu))), b.let(e)};
}
Ex frexp_special(const Ex& x) { return bin("||", bin("==", magnitude(x), lit_u(0)), bin(">=", magnitude(x), lit_u(0x7f800000u))); }
}  // namespace

Ex frexp_mantissa_f32(Block& b, const Ex& x) {
  const Frexp p = frexp_parts(b, x);
  const Ex m = from_bits(bin("|", bin("|", bin("&", bits(x), lit_u(0x80000000u)), lit_u(126u << 23)), p.mantissa_bits));
  return select(m, x, frexp_special(x));
}

Ex frexp_exponent_f32(Block& b, const Ex& x) {
  const Frexp p = frexp_parts(b, x);
  return select(convert(Ty::kF32, p.exponent), f(0.0), frexp_special(x));
}

}  // namespace chroma::gpu

// ATen special functions (torch.special, gamma family, Bessel functions, orthogonal
// polynomials) and the float utilities hypot, ldexp, frexp, nextafter, signbit, angle,
// round(decimals). Each special function is one elementwise primitive whose scalar code lives
// in include/chroma/cpu/special.h; integer inputs compute in float32, as in PyTorch.
#include <cmath>
#include <string>

#include "import/aten.h"

namespace chroma {
namespace {

std::vector<Value> one(Value v) { return {v}; }

struct Named {
  const char* aten;  // full target
  EwOp op;
};

constexpr Named kUnarySpecial[] = {
    {"aten.i0.default", EwOp::k_i0},
    {"aten.special_i0e.default", EwOp::k_i0e},
    {"aten.special_i1.default", EwOp::k_i1},
    {"aten.special_i1e.default", EwOp::k_i1e},
    {"aten.special_modified_bessel_i0.default", EwOp::k_i0},
    {"aten.special_modified_bessel_i1.default", EwOp::k_i1},
    {"aten.special_modified_bessel_k0.default", EwOp::k_bessel_k0},
    {"aten.special_modified_bessel_k1.default", EwOp::k_bessel_k1},
    {"aten.special_scaled_modified_bessel_k0.default", EwOp::k_bessel_k0e},
    {"aten.special_scaled_modified_bessel_k1.default", EwOp::k_bessel_k1e},
    {"aten.special_bessel_j0.default", EwOp::k_bessel_j0},
    {"aten.special_bessel_j1.default", EwOp::k_bessel_j1},
    {"aten.special_bessel_y0.default", EwOp::k_bessel_y0},
    {"aten.special_bessel_y1.default", EwOp::k_bessel_y1},
    {"aten.special_spherical_bessel_j0.default", EwOp::k_spherical_bessel_j0},
    {"aten.special_airy_ai.default", EwOp::k_airy_ai},
    {"aten.lgamma.default", EwOp::k_lgamma},
    {"aten.digamma.default", EwOp::k_digamma},
    {"aten.special_digamma.default", EwOp::k_digamma},
    {"aten.erfinv.default", EwOp::k_erfinv},
    {"aten.special_ndtri.default", EwOp::k_ndtri},
    {"aten.special_erfcx.default", EwOp::k_erfcx},
    {"aten.signbit.default", EwOp::k_signbit},
    {"aten.angle.default", EwOp::k_angle},
};

// (x, n) polynomials: .default (two tensors), .x_scalar, .n_scalar.
constexpr Named kPolynomials[] = {
    {"aten.special_chebyshev_polynomial_t", EwOp::k_chebyshev_polynomial_t},
    {"aten.special_chebyshev_polynomial_u", EwOp::k_chebyshev_polynomial_u},
    {"aten.special_chebyshev_polynomial_v", EwOp::k_chebyshev_polynomial_v},
    {"aten.special_chebyshev_polynomial_w", EwOp::k_chebyshev_polynomial_w},
    {"aten.special_shifted_chebyshev_polynomial_t", EwOp::k_shifted_chebyshev_polynomial_t},
    {"aten.special_shifted_chebyshev_polynomial_u", EwOp::k_shifted_chebyshev_polynomial_u},
    {"aten.special_shifted_chebyshev_polynomial_v", EwOp::k_shifted_chebyshev_polynomial_v},
    {"aten.special_shifted_chebyshev_polynomial_w", EwOp::k_shifted_chebyshev_polynomial_w},
    {"aten.special_hermite_polynomial_h", EwOp::k_hermite_polynomial_h},
    {"aten.special_hermite_polynomial_he", EwOp::k_hermite_polynomial_he},
    {"aten.special_laguerre_polynomial_l", EwOp::k_laguerre_polynomial_l},
    {"aten.special_legendre_polynomial_p", EwOp::k_legendre_polynomial_p},
};

// Float-only binary functions (PyTorch has no integer kernels for them).
constexpr Named kBinaryFloat[] = {
    {"aten.igamma.default", EwOp::k_igamma},
    {"aten.igammac.default", EwOp::k_igammac},
    {"aten.hypot.default", EwOp::k_hypot},
    {"aten.nextafter.default", EwOp::k_nextafter},
};

Value binary_float(Call& c, EwOp op, Operand a, Operand b) {
  for (const Operand& o : {a, b}) {
    if (o.tensor.valid() && !is_float(c.b.type(o.tensor).dtype)) {
      c.fail(std::string(ew_info(op).name) + " needs floating-point tensors, got " + c.b.type(o.tensor).str());
    }
  }
  return c.b.ew(op, {a, b});
}

// polygamma(n, x): n! (-1)^(n+1) zeta(n+1, x) for n >= 2, digamma/trigamma below.
Value polygamma(Call& c) {
  const int64_t n = c.int_(0, "n");
  if (n < 0) c.fail("polygamma needs n >= 0, got " + std::to_string(n));
  return c.b.ew(EwOp::k_polygamma, {Operand::of(Scalar::of_int(n)), Operand::of(c.tensor(1, "self"))});
}

// mvlgamma(x, p) = p(p-1)/4 log(pi) + sum_{j<p} lgamma(x - j/2).
Value mvlgamma(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  const int64_t p = c.int_(1, "p");
  if (p < 1) c.fail("mvlgamma needs p >= 1, got " + std::to_string(p));
  if (!is_float(b.type(x).dtype)) x = b.cast(x, DType::kF32);
  Value sum = b.ew(EwOp::k_lgamma, x);
  for (int64_t j = 1; j < p; ++j) {
    sum = b.ew(EwOp::k_add, sum, b.ew(EwOp::k_lgamma, b.ew(EwOp::k_sub, x, Scalar::of_float(0.5 * static_cast<double>(j)))));
  }
  const double k = static_cast<double>(p) * static_cast<double>(p - 1) / 4.0 * std::log(M_PI);
  return b.ew(EwOp::k_add, sum, Scalar::of_float(k));
}

// ldexp(x, e) = x * 2^e. An integer exponent takes the type of a floating-point x (a bfloat16
// or float16 x stays half, as PyTorch gives; float32 for an integer x); a floating-point
// exponent is promoted with x.
Value ldexp(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self"), e = c.tensor(1, "other");
  const DType te = b.type(e).dtype, tx = b.type(x).dtype;
  Value p = b.ew(EwOp::k_exp2, b.cast(e, is_float(te) ? te : DType::kF32));
  const DType t = is_float(te) ? b.promote({Operand::of(x), Operand::of(p)}) : tx;
  return b.ew(EwOp::k_mul, {Operand::of(x), Operand::of(p)}, is_float(t) ? t : DType::kF32);
}

std::vector<Value> frexp(Call& c) {
  Value x = c.tensor(0, "self");
  if (!is_float(c.b.type(x).dtype)) c.fail("frexp only supports floating-point tensors, got " + c.b.type(x).str());
  Value m = c.b.ew(EwOp::k_frexp_mantissa, x);
  Value e = c.b.cast(c.b.ew(EwOp::k_frexp_exponent, x), DType::kI32);
  return {m, e};
}

// round(x, decimals): nearbyint(x * 10^d) / 10^d, or for d < 0 nearbyint(x / 10^-d) * 10^-d.
Value round_decimals(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  if (!is_float(b.type(x).dtype)) c.fail("round with decimals needs a floating-point tensor, got " + b.type(x).str());
  const int64_t d = c.int_or(1, "decimals", 0);
  if (d == 0) return b.ew(EwOp::k_round, x);
  const Scalar ten = Scalar::of_float(std::pow(10.0, static_cast<double>(d < 0 ? -d : d)));
  if (d > 0) return b.ew(EwOp::k_div, b.ew(EwOp::k_round, b.ew(EwOp::k_mul, x, ten)), ten);
  return b.ew(EwOp::k_mul, b.ew(EwOp::k_round, b.ew(EwOp::k_div, x, ten)), ten);
}

// log_ndtr(x) = log(Phi(x)): log(erfcx(-x/sqrt2)/2) - x^2/2 below -1, else log1p(-erfc(x/sqrt2)/2).
Value log_ndtr(Call& c) {
  Builder& b = c.b;
  Value x = c.tensor(0, "self");
  if (!is_float(b.type(x).dtype)) x = b.cast(x, DType::kF32);
  Value t = b.ew(EwOp::k_mul, x, Scalar::of_float(M_SQRT1_2));
  Value lo = b.ew(EwOp::k_log, b.ew(EwOp::k_mul, b.ew(EwOp::k_erfcx, b.ew(EwOp::k_neg, t)), Scalar::of_float(0.5)));
  lo = b.ew(EwOp::k_sub, lo, b.ew(EwOp::k_mul, t, t));
  Value hi = b.ew(EwOp::k_log1p, b.ew(EwOp::k_mul, b.ew(EwOp::k_erfc, t), Scalar::of_float(-0.5)));
  Value below = b.ew(EwOp::k_lt, x, Scalar::of_float(-1.0));
  return b.ew(EwOp::k_where, {Operand::of(below), Operand::of(lo), Operand::of(hi)});
}

}  // namespace

void register_aten_special(HandlerTable& t) {
  for (const Named& u : kUnarySpecial) {
    const EwOp op = u.op;
    t[u.aten] = [op](Call& c) { return one(c.b.ew(op, c.tensor(0, "self"))); };
  }
  for (const Named& p : kPolynomials) {
    const EwOp op = p.op;
    auto h = [op](Call& c) { return one(c.b.ew(op, {c.operand(0, "x"), c.operand(1, "n")})); };
    for (const char* ov : {".default", ".x_scalar", ".n_scalar"}) t[std::string(p.aten) + ov] = h;
  }
  for (const Named& f : kBinaryFloat) {
    const EwOp op = f.op;
    t[f.aten] = [op](Call& c) { return one(binary_float(c, op, c.operand(0, "self"), c.operand(1, "other"))); };
  }
  for (const char* ov : {"aten.special_zeta.default", "aten.special_zeta.self_scalar", "aten.special_zeta.other_scalar"}) {
    t[ov] = [](Call& c) { return one(c.b.ew(EwOp::k_zeta, {c.operand(0, "self"), c.operand(1, "other")})); };
  }
  t["aten.polygamma.default"] = [](Call& c) { return one(polygamma(c)); };
  t["aten.mvlgamma.default"] = [](Call& c) { return one(mvlgamma(c)); };
  t["aten.ldexp.Tensor"] = [](Call& c) { return one(ldexp(c)); };
  t["aten.frexp.Tensor"] = [](Call& c) { return frexp(c); };
  t["aten.round.decimals"] = [](Call& c) { return one(round_decimals(c)); };
  t["aten.special_log_ndtr.default"] = [](Call& c) { return one(log_ndtr(c)); };
}

}  // namespace chroma

// The lowered program's fused expression trees, inline in GPU kernels: every elementwise.def
// operation as kernel-IR arithmetic, with PyTorch's semantics where the dialects' builtins
// differ (NaN propagation through maximum/minimum, pow of negative bases, floor division and
// remainder rounding toward negative infinity, expm1/log1p near zero). NaN tests are bit
// tests (docs/gpu_generator.md, "Layers", C): WGSL lets an implementation
// assume no NaN in float comparisons.
#include "codegen/gpu/elementwise.h"

#include "codegen/gpu/special.h"

#include <cmath>
#include <limits>

namespace chroma::gpu {

namespace {

Ex bits(const Ex& x) { return bitcast(Ty::kU32, x); }
Ex is_nan(const Ex& x) { return gt(bits(x) & lit_u(0x7fffffffu), lit_u(0x7f800000u)); }
Ex is_inf(const Ex& x) { return eq(bits(x) & lit_u(0x7fffffffu), lit_u(0x7f800000u)); }
Ex f(double v) { return lit_f(v); }
Ex fcall(const char* fn, std::vector<Ex> a) { return call(fn, Ty::kF32, std::move(a)); }
Ex fma(Ex a, Ex b, Ex c) { return fcall("fma", {std::move(a), std::move(b), std::move(c)}); }

// x != 0 as a bool, for any compute type (NaN is true: a bit test, not a float comparison).
Ex truthy(const Ex& x) {
  if (x->ty == Ty::kBool) return x;
  if (x->ty == Ty::kF32) return ne(bits(x) & lit_u(0x7fffffffu), lit_u(0));
  return ne(x, lit(x->ty, 0));
}

// erf in float32: the same polynomial and branch points as the CPU's erf_f32 (scalar.h).
Ex erf_f32(Block& b, const Ex& x) {
  const Ex a = b.let(fcall("abs", {x}));
  const Ex s = b.let(a * a);
  Ex p = fma(f(-5.99085295e-4), s, f(4.99318028e-3));
  for (double c : {-2.67666169e-2, 1.12818159e-1, -3.76124948e-1, 1.28379151e-1}) p = fma(b.let(p), s, f(c));
  const Ex small = b.let(fma(b.let(p), a, a));
  const Ex t = b.let(select(a, f(4.0), gt(a, f(4.0))));
  Ex q = fma(f(1.95720786e-4), t, f(-3.04109394e-3));
  for (double c : {2.22184546e-2, -1.03914030e-1, 3.62797737e-1, -1.12766373e+0, -1.98554044e-4}) q = fma(b.let(q), t, f(c));
  const Ex big = b.let(f(1.0) - fcall("exp", {fma(-t, t, b.let(q))}));
  const Ex mag = b.let(select(big, small, lt(a, f(0.921875))));
  // with the sign of x
  const Ex r = bitcast(Ty::kF32, bits(mag) | (bits(x) & lit_u(0x80000000u)));
  return select(r, x, is_nan(x));
}

// a / b with IEEE results for a zero divisor (WGSL leaves x / 0 to the implementation; Mesa's
// lavapipe returns a finite value for 0 / 0): +-inf with the sign of a * b, NaN for 0 / 0.
Ex ieee_div(Block& bl, const Ex& a, const Ex& d) {
  const Ex sign = (bits(a) ^ bits(d)) & lit_u(0x80000000u);
  const Ex inf = bitcast(Ty::kF32, lit_u(0x7f800000u) | sign);
  const Ex zero_num = eq(bits(a) & lit_u(0x7fffffffu), lit_u(0));
  const Ex special = select(inf, lit_f(std::nan("")), lor(zero_num, is_nan(a)));
  return select(a / d, special, bl.let(eq(bits(d) & lit_u(0x7fffffffu), lit_u(0))));
}

Ex maximum_f(const Ex& a, const Ex& b, bool max) {
  const Ex pick = select(b, a, bin(max ? BinOp::kGt : BinOp::kLt, a, b));
  return select(pick, a + b, lor(is_nan(a), is_nan(b)));
}

// a ** b for float32 with C's pow semantics on negative bases and special values.
Ex pow_f(Block& bl, const Ex& a, const Ex& b, const Expr& exponent) {
  if (exponent.kind == Expr::kLiteral) {
    const double e = exponent.literal.as_double();
    if (e == 1) return a;
    if (e == 2) return a * a;
    if (e == 3) return bl.let(a * a) * a;
    if (e == -1) return f(1.0) / a;
    if (e == -2) return f(1.0) / (a * a);
    if (e == 0.5) return fcall("sqrt", {a});
  }
  const Ex r0 = bl.let(fcall("pow", {fcall("abs", {a}), b}));
  const Ex integral = bl.let(land(eq(b, fcall("floor", {b})), lt(fcall("abs", {b}), f(16777216.0))));
  const Ex odd = land(integral, ne(convert(Ty::kI32, b) & lit_i(1), lit_i(0)));
  const Ex neg = bl.let(lt(a, f(0.0)));
  Ex r = select(r0, -r0, land(neg, odd));
  r = select(r, f(std::nan("")), land(neg, lnot(integral)));
  r = select(r, f(1.0), lor(eq(b, f(0.0)), eq(a, f(1.0))));
  return r;
}

// Integer a ** b by squaring (a negative exponent gives 0 unless |a| == 1, as integer pow).
Ex pow_i(Block& bl, const Ex& a, const Ex& b) {
  const Ex r = bl.mut(Ty::kI32, lit_i(1), "pw");
  const Ex base = bl.mut(Ty::kI32, a, "pb");
  const Ex e = bl.mut(Ty::kI32, select(b, lit_i(0), lt(b, lit_i(0))), "pe");
  bl.loop("pi", lit_i(0), lit_i(32), lit_i(1), [&](Block& in, const Ex&) {
    in.if_(ne(e & lit_i(1), lit_i(0)), [&](Block& t) { t.assign(r, r * base); });
    in.assign(base, base * base);
    in.assign(e, e >> lit_i(1));
  });
  // negative exponents: 1 for a == 1, +-1 for a == -1, else 0
  const Ex negexp = lt(b, lit_i(0));
  Ex neg_result = select(lit_i(0), lit_i(1), eq(a, lit_i(1)));
  neg_result = select(neg_result, select(lit_i(-1), lit_i(1), eq(b & lit_i(1), lit_i(0))), eq(a, lit_i(-1)));
  return select(r, neg_result, negexp);
}

}  // namespace

Ty compute_type(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return Ty::kF32;
    case DType::kBool: return Ty::kBool;
    case DType::kI64:
    case DType::kI32:
    case DType::kI16:
    case DType::kI8:
    case DType::kU8: return Ty::kI32;
    case DType::kF64: break;
  }
  throw Unsupported("float64 has no GPU type (every GPU dialect computes in 32-bit types): compute in float32 "
                    "(model.float())");
}

Ex wrap_to(DType t, Ex v) {
  switch (t) {
    case DType::kU8: return v & lit_i(255);
    case DType::kI8: return v << lit_i(24) >> lit_i(24);
    case DType::kI16: return v << lit_i(16) >> lit_i(16);
    default: return v;
  }
}

Ex half_bits(Block& b, DType t, const Ex& v) {
  const Ex x = b.let(bitcast(Ty::kU32, v), "hb");
  const Ex is_nan = b.let(gt(x & lit_u(0x7fffffffu), lit_u(0x7f800000u)));
  if (t == DType::kBF16) {  // the upper half, rounded to nearest even; NaN kept quiet
    const Ex r = (x + lit_u(0x7fffu) + ((x >> lit_i(16)) & lit_u(1))) >> lit_i(16);
    return b.let(select(r, (x >> lit_i(16)) | lit_u(0x40u), is_nan));
  }
  const Ex sign = b.let((x >> lit_i(16)) & lit_u(0x8000u));
  const Ex man = b.let(x & lit_u(0x7fffffu));
  const Ex e = b.let(bitcast(Ty::kI32, (x >> lit_i(23)) & lit_u(0xffu)) - lit_i(112));  // binary16 exponent
  // normal: round the 13 dropped bits to nearest even (a carry into the exponent is right, up to infinity)
  const Ex m = man >> lit_i(13), rest = b.let(man & lit_u(0x1fffu));
  const Ex up = lor(gt(rest, lit_u(0x1000u)), land(eq(rest, lit_u(0x1000u)), eq(m & lit_u(1), lit_u(1))));
  const Ex normal = ((bitcast(Ty::kU32, max(e, lit_i(0))) << lit_i(10)) | m) + convert(Ty::kU32, up);
  // subnormal (e in [-10, 0]): the 24-bit significand shifted right by 14 - e, rounded
  const Ex sh = b.let(min(max(lit_i(14) - e, lit_i(14)), lit_i(24)));
  const Ex full = b.let(man | lit_u(0x800000u));
  const Ex sm = b.let(full >> sh);
  const Ex srest = b.let(full & ((lit_u(1) << sh) - lit_u(1)));
  const Ex shalf = b.let(lit_u(1) << (sh - lit_i(1)));
  const Ex sup = lor(gt(srest, shalf), land(eq(srest, shalf), eq(sm & lit_u(1), lit_u(1))));
  const Ex sub = sm + convert(Ty::kU32, sup);
  Ex h = select(lit_u(0), sub, ge(e, lit_i(-10)));   // below half the smallest subnormal: 0
  h = select(h, normal, ge(e, lit_i(1)));
  h = select(h, lit_u(0x7c00u), ge(e, lit_i(31)));     // overflow (and infinity): infinity
  h = select(h, lit_u(0x7e00u) | (man >> lit_i(13)), is_nan);
  return b.let(sign | h);
}

Ex half_value(Block& b, DType t, const Ex& bits) {
  if (t == DType::kBF16) return b.let(bitcast(Ty::kF32, (bits & lit_u(0xffffu)) << lit_i(16)));
  const Ex h = b.let(bits & lit_u(0xffffu), "hv");
  const Ex sign = b.let((h & lit_u(0x8000u)) << lit_i(16));
  const Ex exp = b.let((h >> lit_i(10)) & lit_u(0x1fu));
  const Ex man = b.let(h & lit_u(0x3ffu));
  const Ex normal = ((exp + lit_u(112)) << lit_i(23)) | (man << lit_i(13));
  // infinity; NaN, made quiet as the CPU does
  const Ex special = select(lit_u(0x7f800000u), lit_u(0x7fc00000u), ne(man, lit_u(0))) | (man << lit_i(13));
  const Ex sub = bitcast(Ty::kU32, convert(Ty::kF32, man) * lit_f(5.9604644775390625e-8));  // man * 2^-24, exact
  Ex r = select(normal, sub, eq(exp, lit_u(0)));
  r = select(r, special, eq(exp, lit_u(0x1fu)));
  return b.let(bitcast(Ty::kF32, sign | r));
}

Ex cast_value(Block& b, Ex v, DType from, DType to) {
  if (is_half(to) && to != from) {  // round to the type; from another half type through float32 (exact)
    const Ex f = compute_type(from) == Ty::kF32 ? v : cast_value(b, v, from, DType::kF32);
    return half_value(b, to, half_bits(b, to, f));
  }
  const Ty ft = compute_type(from), tt = compute_type(to);
  if (tt == Ty::kBool) return truthy(v);
  if (ft == Ty::kBool) return convert(tt, v);
  if (ft == Ty::kF32 && tt == Ty::kI32) {
    // float -> integer: truncation toward zero; narrow types wrap like a C cast through int.
    return wrap_to(to, convert(Ty::kI32, v));
  }
  return wrap_to(to, convert(tt, v));
}

namespace {

// What map_op throws for an operation no family implements.
Unsupported no_gpu_implementation(EwOp op) {
  return Unsupported("elementwise '" + std::string(ew_info(op).name) + "' has no GPU implementation yet");
}

void need_float(Ty t, const char* what) {
  if (t != Ty::kF32) throw Unsupported(std::string(what) + " of a non-float operand");
}

// Negation, absolute value, exponentials, logarithms, roots, trigonometric and hyperbolic
// functions and the sigmoid.
Ex elementary(Block& b, EwOp op, Ty t, const std::vector<Ex>& x, const std::vector<const Expr*>& operands) {
  const bool bo = t == Ty::kBool;
  const Ex& a = x[0];
  switch (op) {
    case EwOp::k_neg: return bo ? lnot(a) : -a;
    case EwOp::k_abs: return bo ? a : call("abs", t, {a});
    case EwOp::k_exp: need_float(t, "exp"); return fcall("exp", {a});
    case EwOp::k_exp2: need_float(t, "exp2"); return fcall("exp2", {a});
    case EwOp::k_expm1: {
      need_float(t, "expm1");
      const Ex u = b.let(fcall("exp", {a}));
      const Ex um1 = b.let(u - f(1.0));
      Ex r = um1 * a / fcall("log", {u});
      r = select(r, a, eq(u, f(1.0)));
      r = select(r, f(-1.0), eq(um1, f(-1.0)));
      return select(r, u, is_inf(u));
    }
    case EwOp::k_log: need_float(t, "log"); return fcall("log", {a});
    case EwOp::k_log2: need_float(t, "log2"); return fcall("log2", {a});
    case EwOp::k_log10: need_float(t, "log10"); return fcall("log2", {a}) * f(0.30102999566398120);
    case EwOp::k_log1p: {
      need_float(t, "log1p");
      const Ex u = b.let(f(1.0) + a);
      const Ex lu = b.let(fcall("log", {u}));
      Ex r = lu * a / (u - f(1.0));
      r = select(r, a, eq(u, f(1.0)));
      return select(r, lu, is_inf(u));
    }
    case EwOp::k_sqrt: need_float(t, "sqrt"); return fcall("sqrt", {a});
    case EwOp::k_rsqrt: need_float(t, "rsqrt"); return ieee_div(b, f(1.0), b.let(fcall("sqrt", {a})));
    case EwOp::k_reciprocal: need_float(t, "reciprocal"); return ieee_div(b, f(1.0), a);
    case EwOp::k_sin: need_float(t, "sin"); return fcall("sin", {a});
    case EwOp::k_cos: need_float(t, "cos"); return fcall("cos", {a});
    case EwOp::k_tan: need_float(t, "tan"); return fcall("tan", {a});
    case EwOp::k_asin: need_float(t, "asin"); return fcall("asin", {a});
    case EwOp::k_acos: need_float(t, "acos"); return fcall("acos", {a});
    case EwOp::k_atan: need_float(t, "atan"); return fcall("atan", {a});
    case EwOp::k_sinh: need_float(t, "sinh"); return fcall("sinh", {a});
    case EwOp::k_cosh: need_float(t, "cosh"); return fcall("cosh", {a});
    case EwOp::k_asinh: need_float(t, "asinh"); return fcall("asinh", {a});
    case EwOp::k_acosh: need_float(t, "acosh"); return fcall("acosh", {a});
    case EwOp::k_atanh: need_float(t, "atanh"); return fcall("atanh", {a});
    case EwOp::k_tanh: {
      // tanh(+-10) rounds to +-1 in float32 (from about 9.01 on; tanh(9) rounds to
      // 0.99999994, which left gelu(-1000) at -3e-5 instead of -0); clamping keeps a
      // sinh/cosh-based builtin finite.
      need_float(t, "tanh");
      const Ex c = fcall("tanh", {select(select(a, f(-10.0), lt(a, f(-10.0))), f(10.0), gt(a, f(10.0)))});
      return select(c, a, is_nan(a));
    }
    case EwOp::k_sigmoid: need_float(t, "sigmoid"); return f(1.0) / (f(1.0) + fcall("exp", {-a}));
    default: break;  // map_op routes only the operations above here
  }
  throw no_gpu_implementation(op);
}

// The float32 special functions (special.h): error functions, Bessel functions, orthogonal
// polynomials, gamma functions and their relatives, frexp and nextafter.
Ex special_functions(Block& b, EwOp op, Ty t, const std::vector<Ex>& x, const std::vector<const Expr*>& operands) {
  const Ex& a = x[0];
  switch (op) {
    case EwOp::k_erf: need_float(t, "erf"); return erf_f32(b, a);
    case EwOp::k_erfc: need_float(t, "erfc"); return erfc_f32(b, a, erf_f32(b, a));
    case EwOp::k_erfcx: need_float(t, "erfcx"); return erfcx_f32(b, a);
    case EwOp::k_erfinv: need_float(t, "erfinv"); return erfinv_f32(b, a);
    case EwOp::k_ndtri: need_float(t, "ndtri"); return ndtri_f32(b, a);
    case EwOp::k_i0: need_float(t, "i0"); return bessel_i_f32(b, a, 0, false);
    case EwOp::k_i0e: need_float(t, "i0e"); return bessel_i_f32(b, a, 0, true);
    case EwOp::k_i1: need_float(t, "i1"); return bessel_i_f32(b, a, 1, false);
    case EwOp::k_i1e: need_float(t, "i1e"); return bessel_i_f32(b, a, 1, true);
    case EwOp::k_bessel_k0: need_float(t, "modified_bessel_k0"); return bessel_k_f32(b, a, 0, false);
    case EwOp::k_bessel_k0e: need_float(t, "scaled_modified_bessel_k0"); return bessel_k_f32(b, a, 0, true);
    case EwOp::k_bessel_k1: need_float(t, "modified_bessel_k1"); return bessel_k_f32(b, a, 1, false);
    case EwOp::k_bessel_k1e: need_float(t, "scaled_modified_bessel_k1"); return bessel_k_f32(b, a, 1, true);
    case EwOp::k_bessel_j0: need_float(t, "bessel_j0"); return bessel_jy_f32(b, a, 0, false);
    case EwOp::k_bessel_j1: need_float(t, "bessel_j1"); return bessel_jy_f32(b, a, 1, false);
    case EwOp::k_bessel_y0: need_float(t, "bessel_y0"); return bessel_jy_f32(b, a, 0, true);
    case EwOp::k_bessel_y1: need_float(t, "bessel_y1"); return bessel_jy_f32(b, a, 1, true);
    case EwOp::k_spherical_bessel_j0: need_float(t, "spherical_bessel_j0"); return spherical_j0_f32(b, a);
    case EwOp::k_chebyshev_polynomial_t:
    case EwOp::k_chebyshev_polynomial_u:
    case EwOp::k_chebyshev_polynomial_v:
    case EwOp::k_chebyshev_polynomial_w:
    case EwOp::k_shifted_chebyshev_polynomial_t:
    case EwOp::k_shifted_chebyshev_polynomial_u:
    case EwOp::k_shifted_chebyshev_polynomial_v:
    case EwOp::k_shifted_chebyshev_polynomial_w:
    case EwOp::k_hermite_polynomial_h:
    case EwOp::k_hermite_polynomial_he:
    case EwOp::k_laguerre_polynomial_l:
    case EwOp::k_legendre_polynomial_p:
      need_float(t, "an orthogonal polynomial");
      return orthogonal_polynomial_f32(b, op, a, x[1]);
    case EwOp::k_igamma: need_float(t, "igamma"); return igamma_f32(b, a, x[1], false);
    case EwOp::k_igammac: need_float(t, "igammac"); return igamma_f32(b, a, x[1], true);
    case EwOp::k_airy_ai: need_float(t, "airy_ai"); return airy_ai_f32(b, a);
    case EwOp::k_zeta: need_float(t, "zeta"); return zeta_f32(b, a, x[1]);
    case EwOp::k_polygamma: {
      need_float(t, "polygamma");
      if (operands[0]->kind != Expr::kLiteral) throw Unsupported("polygamma with a tensor order n");
      return polygamma_f32(b, static_cast<int64_t>(operands[0]->literal.as_double()), x[1]);
    }
    case EwOp::k_lgamma: need_float(t, "lgamma"); return lgamma_f32(b, a);
    case EwOp::k_digamma: need_float(t, "digamma"); return digamma_f32(b, a);
    case EwOp::k_frexp_mantissa: need_float(t, "frexp"); return frexp_mantissa_f32(b, a);
    case EwOp::k_frexp_exponent: need_float(t, "frexp"); return frexp_exponent_f32(b, a);
    case EwOp::k_nextafter: need_float(t, "nextafter"); return nextafter_f32(b, a, x[1]);
    default: break;  // map_op routes only the operations above here
  }
  throw no_gpu_implementation(op);
}

// Rounding, sign and relu, logical and bitwise not, and the tests of a value (isnan, isinf,
// signbit, angle).
Ex rounding_and_tests(Block& b, EwOp op, Ty t, const std::vector<Ex>& x, const std::vector<const Expr*>& operands) {
  const bool fl = t == Ty::kF32, bo = t == Ty::kBool;
  const Ex& a = x[0];
  switch (op) {
    case EwOp::k_ceil: return fl ? fcall("ceil", {a}) : a;
    case EwOp::k_floor: return fl ? fcall("floor", {a}) : a;
    case EwOp::k_round: return fl ? fcall("round", {a}) : a;
    case EwOp::k_trunc: return fl ? fcall("trunc", {a}) : a;
    case EwOp::k_sign: {
      if (bo) return a;
      // sign(NaN) is 0, as PyTorch's
      return select(select(lit(t, 0), lit(t, -1), lt(a, lit(t, 0))), lit(t, 1), gt(a, lit(t, 0)));
    }
    case EwOp::k_relu:
      if (bo) return a;
      return select(a, lit(t, 0), lt(a, lit(t, 0)));
    case EwOp::k_logical_not: return lnot(truthy(a));
    case EwOp::k_bitwise_not: return bo ? lnot(a) : ~a;
    case EwOp::k_isnan: return fl ? is_nan(a) : lit_b(false);
    case EwOp::k_isinf: return fl ? is_inf(a) : lit_b(false);
    case EwOp::k_signbit: return fl ? ne(bits(a) >> lit_u(31), lit_u(0)) : bo ? lit_b(false) : lt(a, lit_i(0));
    case EwOp::k_angle: {
      need_float(t, "angle");
      return select(select(f(0.0), f(3.14159265358979323846), lt(a, f(0.0))), a, is_nan(a));
    }
    default: break;  // map_op routes only the operations above here
  }
  throw no_gpu_implementation(op);
}

// Binary arithmetic: the four operations, floor division and the remainders (rounding toward
// negative infinity as PyTorch does), pow, atan2, hypot and the NaN-propagating maximum and
// minimum.
Ex arithmetic(Block& b, EwOp op, Ty t, const std::vector<Ex>& x, const std::vector<const Expr*>& operands) {
  const bool fl = t == Ty::kF32, bo = t == Ty::kBool;
  const Ex& a = x[0];
  switch (op) {
    case EwOp::k_add: return bo ? lor(a, x[1]) : a + x[1];
    case EwOp::k_sub: return a - x[1];
    case EwOp::k_mul: return bo ? land(a, x[1]) : a * x[1];
    case EwOp::k_div: need_float(t, "div"); return ieee_div(b, a, x[1]);
    case EwOp::k_floor_divide: {
      if (bo) throw Unsupported("floor_divide of bool");
      const Ex& d = x[1];
      if (!fl) {
        const Ex r = b.let(a % d);
        const Ex adjust = land(ne(r, lit_i(0)), ne(lt(r, lit_i(0)), lt(d, lit_i(0))));
        return a / d - select(lit_i(0), lit_i(1), adjust);
      }
      // PyTorch's div_floor: (a - fmod(a, b)) / b, corrected toward negative infinity
      const Ex mod = b.let(a % d);
      const Ex fix = land(ne(mod, f(0.0)), ne(lt(d, f(0.0)), lt(mod, f(0.0))));
      const Ex div = b.let((a - mod) / d - select(f(0.0), f(1.0), fix));
      const Ex fd = b.let(fcall("floor", {div}));
      const Ex rounded = select(fd, fd + f(1.0), gt(div - fd, f(0.5)));
      const Ex zero = bitcast(Ty::kF32, bits(a / d) & lit_u(0x80000000u));
      const Ex r = select(zero, rounded, ne(div, f(0.0)));
      return select(r, a / d, eq(d, f(0.0)));
    }
    case EwOp::k_remainder: {
      if (bo) throw Unsupported("remainder of bool");
      const Ex& d = x[1];
      const Ex r = b.let(a % d);
      const Ex zero = lit(t, 0);
      const Ex fix = land(ne(r, zero), ne(lt(r, zero), lt(d, zero)));
      return select(r, r + d, fix);
    }
    case EwOp::k_fmod:
      if (bo) throw Unsupported("fmod of bool");
      return a % x[1];
    case EwOp::k_pow:
      if (bo) throw Unsupported("pow of bool");
      return fl ? pow_f(b, a, x[1], *operands[1]) : pow_i(b, a, x[1]);
    case EwOp::k_atan2: need_float(t, "atan2"); return fcall("atan2", {a, x[1]});
    case EwOp::k_hypot: {
      need_float(t, "hypot");
      const Ex m = b.let(max(fcall("abs", {a}), fcall("abs", {x[1]})));
      const Ex p = a / m, q = x[1] / m;
      Ex r = select(m * fcall("sqrt", {p * p + q * q}), f(0.0), eq(m, f(0.0)));
      r = select(r, a + x[1], lor(is_nan(a), is_nan(x[1])));
      return select(r, f(INFINITY), lor(is_inf(a), is_inf(x[1])));
    }
    case EwOp::k_maximum:
    case EwOp::k_minimum: {
      const bool mx = op == EwOp::k_maximum;
      if (bo) return bin(mx ? BinOp::kOr : BinOp::kAnd, a, x[1]);
      if (!fl) return call(mx ? "max" : "min", t, {a, x[1]});
      return maximum_f(a, x[1], mx);
    }
    default: break;  // map_op routes only the operations above here
  }
  throw no_gpu_implementation(op);
}

// Comparisons, logical and bitwise operations, shifts (PyTorch's results for shifts of 32 or
// more), gcd and where.
Ex comparison_and_bitwise(Block& b, EwOp op, Ty t, const std::vector<Ex>& x, const std::vector<const Expr*>& operands) {
  const bool bo = t == Ty::kBool;
  const Ex& a = x[0];
  switch (op) {
    case EwOp::k_eq: return eq(a, x[1]);
    case EwOp::k_ne: return ne(a, x[1]);
    case EwOp::k_lt:
    case EwOp::k_le:
    case EwOp::k_gt:
    case EwOp::k_ge: {
      static const BinOp ops[] = {BinOp::kLt, BinOp::kLe, BinOp::kGt, BinOp::kGe};
      const BinOp o = ops[static_cast<int>(op) - static_cast<int>(EwOp::k_lt)];
      if (bo) return bin(o, convert(Ty::kI32, a), convert(Ty::kI32, x[1]));
      return bin(o, a, x[1]);
    }
    case EwOp::k_logical_and: return land(truthy(a), truthy(x[1]));
    case EwOp::k_logical_or: return lor(truthy(a), truthy(x[1]));
    case EwOp::k_logical_xor: return ne(truthy(a), truthy(x[1]));
    case EwOp::k_bitwise_and: return bin(bo ? BinOp::kAnd : BinOp::kBitAnd, a, x[1]);
    case EwOp::k_bitwise_or: return bin(bo ? BinOp::kOr : BinOp::kBitOr, a, x[1]);
    case EwOp::k_bitwise_xor: return bin(bo ? BinOp::kNe : BinOp::kBitXor, a, x[1]);
    case EwOp::k_bitwise_left_shift:
    case EwOp::k_bitwise_right_shift: {
      if (t != Ty::kI32) throw Unsupported("shift of a non-integer operand");
      const bool left = op == EwOp::k_bitwise_left_shift;
      const Ex& s = x[1];
      const Ex in_range = land(ge(s, lit_i(0)), lt(s, lit_i(32)));
      const Ex shifted = bin(left ? BinOp::kShl : BinOp::kShr, a, select(lit_i(0), s, in_range));
      const Ex overflow = left ? lit_i(0) : select(lit_i(0), lit_i(-1), lt(a, lit_i(0)));
      return select(overflow, shifted, in_range);
    }
    case EwOp::k_gcd: {  // Euclid on magnitudes; 48 steps cover every pair of 32-bit values
      if (t != Ty::kI32) throw Unsupported("gcd of a non-integer operand");
      const Ex u = b.mut(Ty::kI32, call("abs", Ty::kI32, {a}), "gu");
      const Ex v = b.mut(Ty::kI32, call("abs", Ty::kI32, {x[1]}), "gv");
      b.loop("gi", lit_i(0), lit_i(48), lit_i(1), [&](Block& in, const Ex&) {
        in.if_(ne(v, lit_i(0)), [&](Block& t2) {
          const Ex r = t2.let(u % v);
          t2.assign(u, v);
          t2.assign(v, r);
        });
      });
      return u;
    }
    case EwOp::k_where: return select(x[2], x[1], truthy(a));
    default: break;  // map_op routes only the operations above here
  }
  throw no_gpu_implementation(op);
}

}  // namespace

// The operation's family; every operation is named here (no default: -Wswitch, -Werror in
// the test build, names an operation added to elementwise.def that no family implements), and
// each family's switch holds its own operations.
Ex map_op(Block& b, EwOp op, DType result, const std::vector<DType>& operand_types, const std::vector<Ex>& x,
          const std::vector<const Expr*>& operands) {
  const Ty t = x.empty() ? compute_type(result) : x[0]->ty;
  (void)operand_types;
  switch (op) {
    case EwOp::k_neg: case EwOp::k_abs: case EwOp::k_exp: case EwOp::k_exp2: case EwOp::k_expm1: case EwOp::k_log:
    case EwOp::k_log2: case EwOp::k_log10: case EwOp::k_log1p: case EwOp::k_sqrt: case EwOp::k_rsqrt:
    case EwOp::k_reciprocal: case EwOp::k_sin: case EwOp::k_cos: case EwOp::k_tan: case EwOp::k_asin:
    case EwOp::k_acos: case EwOp::k_atan: case EwOp::k_sinh: case EwOp::k_cosh: case EwOp::k_asinh:
    case EwOp::k_acosh: case EwOp::k_atanh: case EwOp::k_tanh: case EwOp::k_sigmoid:
      return elementary(b, op, t, x, operands);
    case EwOp::k_erf: case EwOp::k_erfc: case EwOp::k_erfcx: case EwOp::k_erfinv: case EwOp::k_ndtri: case EwOp::k_i0:
    case EwOp::k_i0e: case EwOp::k_i1: case EwOp::k_i1e: case EwOp::k_bessel_k0: case EwOp::k_bessel_k0e:
    case EwOp::k_bessel_k1: case EwOp::k_bessel_k1e: case EwOp::k_bessel_j0: case EwOp::k_bessel_j1:
    case EwOp::k_bessel_y0: case EwOp::k_bessel_y1: case EwOp::k_spherical_bessel_j0:
    case EwOp::k_chebyshev_polynomial_t: case EwOp::k_chebyshev_polynomial_u: case EwOp::k_chebyshev_polynomial_v:
    case EwOp::k_chebyshev_polynomial_w: case EwOp::k_shifted_chebyshev_polynomial_t:
    case EwOp::k_shifted_chebyshev_polynomial_u: case EwOp::k_shifted_chebyshev_polynomial_v:
    case EwOp::k_shifted_chebyshev_polynomial_w: case EwOp::k_hermite_polynomial_h:
    case EwOp::k_hermite_polynomial_he: case EwOp::k_laguerre_polynomial_l: case EwOp::k_legendre_polynomial_p:
    case EwOp::k_igamma: case EwOp::k_igammac: case EwOp::k_airy_ai: case EwOp::k_zeta: case EwOp::k_polygamma:
    case EwOp::k_lgamma: case EwOp::k_digamma: case EwOp::k_frexp_mantissa: case EwOp::k_frexp_exponent:
    case EwOp::k_nextafter:
      return special_functions(b, op, t, x, operands);
    case EwOp::k_ceil: case EwOp::k_floor: case EwOp::k_round: case EwOp::k_trunc: case EwOp::k_sign:
    case EwOp::k_relu: case EwOp::k_logical_not: case EwOp::k_bitwise_not: case EwOp::k_isnan: case EwOp::k_isinf:
    case EwOp::k_signbit: case EwOp::k_angle:
      return rounding_and_tests(b, op, t, x, operands);
    case EwOp::k_add: case EwOp::k_sub: case EwOp::k_mul: case EwOp::k_div: case EwOp::k_floor_divide:
    case EwOp::k_remainder: case EwOp::k_fmod: case EwOp::k_pow: case EwOp::k_atan2: case EwOp::k_hypot:
    case EwOp::k_maximum: case EwOp::k_minimum:
      return arithmetic(b, op, t, x, operands);
    case EwOp::k_eq: case EwOp::k_ne: case EwOp::k_lt: case EwOp::k_le: case EwOp::k_gt: case EwOp::k_ge:
    case EwOp::k_logical_and: case EwOp::k_logical_or: case EwOp::k_logical_xor: case EwOp::k_bitwise_and:
    case EwOp::k_bitwise_or: case EwOp::k_bitwise_xor: case EwOp::k_bitwise_left_shift:
    case EwOp::k_bitwise_right_shift: case EwOp::k_gcd: case EwOp::k_where:
      return comparison_and_bitwise(b, op, t, x, operands);
    case EwOp::kCount: break;
  }
  throw no_gpu_implementation(op);
}

}  // namespace chroma::gpu

// Helpers shared by the GPU generator's float32 special functions (special.cpp,
// special_bessel.cpp): bit tests, Horner's rule, e^s and sin/cos with exact argument
// reductions (defined in special.cpp).
#pragma once

#include <cmath>
#include <initializer_list>
#include <span>
#include <vector>

#include "codegen/gpu/kir.h"

namespace chroma::gpu::special_detail {

inline Ex bits(const Ex& x) { return bitcast(Ty::kU32, x); }
inline Ex from_bits(const Ex& u) { return bitcast(Ty::kF32, u); }
inline Ex f(double v) { return lit_f(v); }
inline Ex fcall(const char* fn, std::vector<Ex> a) { return call(fn, Ty::kF32, std::move(a)); }
inline Ex fma(Ex a, Ex b, Ex c) { return fcall("fma", {std::move(a), std::move(b), std::move(c)}); }
inline Ex magnitude(const Ex& x) { return bits(x) & lit_u(0x7fffffffu); }
inline Ex is_nan(const Ex& x) { return gt(magnitude(x), lit_u(0x7f800000u)); }
inline Ex is_inf(const Ex& x) { return eq(magnitude(x), lit_u(0x7f800000u)); }
inline Ex nan() { return f(std::nan("")); }

// c[0] + c[1] x + ... + c[n] x^n, by Horner's rule with fused multiply-adds.
inline Ex poly(Block& b, const Ex& x, std::span<const double> c) {
  const double* p = c.data() + c.size() - 1;
  Ex acc = f(*p);
  while (p != c.data()) acc = b.let(fma(acc, x, f(*--p)));
  return acc;
}
inline Ex poly(Block& b, const Ex& x, std::initializer_list<double> c) {
  return poly(b, x, std::span<const double>(c.begin(), c.size()));
}

// e^s for -110 <= s <= 100 to an ulp or two whatever the device's exp (WGSL allows exp an
// error of 3 + 2|s| ulp, and lavapipe's reaches 100 ulp near s = 70): s = k ln2 + r with ln2
// in two parts (k ln2_hi exact), e^r by its Taylor series to r^8 (|r| <= 0.35), then 2^k in
// two exact halves so that k = 128 and the denormal results stay representable; `tail` is a
// small correction added to r (the rounding error of s, when the caller has it).
Ex exp_reduced(Block& b, const Ex& s, const Ex& tail);

struct SinCos {
  Ex s, c;
};
// sin r and cos r for |r| <= pi/4 (a little beyond is fine): Taylor to r^13 and r^14.
SinCos sincos_poly(Block& b, const Ex& r);
// sin and cos of k pi/2 + r from those of r (k an integral float).
SinCos rotate_quadrants(Block& b, const Ex& k, const SinCos& r);
// sin x and cos x for |x| <= 1e5: x - k pi/2 with pi/2 in four 8-bit parts (k pi/2's products
// exact for k < 2^16) and a fifth, then the Taylor series of sin and cos on |r| <= pi/4, swapped
// and negated by k mod 4. NaN, +-inf and larger arguments give sin 0, cos 1 (callers select
// their own results there).
SinCos sincos_f32(Block& b, const Ex& x);
Ex sin_f32(Block& b, const Ex& x);

}  // namespace chroma::gpu::special_detail

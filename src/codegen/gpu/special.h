// Special functions in float32 as kernel-IR arithmetic (special.cpp): the elementwise ops
// whose CPU versions compute in float64 (chroma/cpu/special.h).
#pragma once

#include <cstdint>

#include "codegen/gpu/kir.h"
#include "ir/op.h"

namespace chroma::gpu {

Ex digamma_f32(Block& b, const Ex& x);
Ex lgamma_f32(Block& b, const Ex& x);
Ex trigamma_f32(Block& b, const Ex& x);
Ex zeta_f32(Block& b, const Ex& s, const Ex& q);
Ex polygamma_f32(Block& b, int64_t n, const Ex& x);  // n: the op's literal order
Ex igamma_f32(Block& b, const Ex& a, const Ex& x, bool upper);  // igamma (P), igammac (Q)
Ex erfcx_f32(Block& b, const Ex& x);
Ex erfc_f32(Block& b, const Ex& x, const Ex& erf_x);  // erf_x: erf(x), for |x| < 1/2
Ex erfinv_f32(Block& b, const Ex& y);
Ex ndtri_f32(Block& b, const Ex& p);
Ex bessel_i_f32(Block& b, const Ex& x, int nu, bool scaled);  // i0, i0e, i1, i1e
Ex bessel_k_f32(Block& b, const Ex& x, int nu, bool scaled);  // k0, k0e, k1, k1e
Ex bessel_jy_f32(Block& b, const Ex& x, int nu, bool second_kind);  // j0, j1, y0, y1
Ex airy_ai_f32(Block& b, const Ex& x);
Ex spherical_j0_f32(Block& b, const Ex& x);
Ex orthogonal_polynomial_f32(Block& b, EwOp op, const Ex& x, const Ex& n);  // the 12 polynomial ops
Ex nextafter_f32(Block& b, const Ex& a, const Ex& c);
Ex frexp_mantissa_f32(Block& b, const Ex& x);
Ex frexp_exponent_f32(Block& b, const Ex& x);

}  // namespace chroma::gpu

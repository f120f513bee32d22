// 16-bit floating-point storage types: IEEE binary16 (float16) and bfloat16.
//
// Chroma stores half tensors in 16 bits and computes with them as PyTorch's CPU does: every
// operation in float32, its result rounded to the tensor's type (the compiler's widen_half
// pass makes that explicit with casts, so kernels only ever convert). These two types are
// therefore storage only: a value converts to float exactly (`float(h)`) and from float with
// rounding to nearest, ties to even (`f16(x)`), NaN kept NaN (quiet) and overflow to infinity.
// The conversions are written with integer operations so that the compiler's constant folder
// and the generated code round identically on every machine.
#pragma once

#include <bit>
#include <cstdint>

namespace chroma {

namespace half_detail {

constexpr uint32_t f32_bits(float x) { return std::bit_cast<uint32_t>(x); }
constexpr float f32_from(uint32_t b) { return std::bit_cast<float>(b); }

// float32 -> binary16, round to nearest even.
constexpr uint16_t f32_to_f16(float x) {
  const uint32_t b = f32_bits(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t exp = (b >> 23) & 0xffu;
  uint32_t man = b & 0x7fffffu;
  if (exp == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));  // inf, NaN (quiet)
  const int e = static_cast<int>(exp) - 127 + 15;  // the binary16 exponent
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: infinity
  if (e <= 0) {  // subnormal or zero in binary16
    if (e < -10) return static_cast<uint16_t>(sign);  // below half the smallest subnormal: +-0
    man |= 0x800000u;  // the implicit bit
    const int shift = 14 - e;  // 14..24
    const uint32_t half = 1u << (shift - 1), rest = man & ((1u << shift) - 1);
    uint32_t m = man >> shift;
    if (rest > half || (rest == half && (m & 1u))) ++m;  // may carry into the smallest normal: correct
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t m = man >> 13;
  const uint32_t rest = man & 0x1fffu;
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | m;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) ++h;  // a carry into the exponent is correct (up to inf)
  return static_cast<uint16_t>(h);
}

// binary16 -> float32, exact (a signaling NaN comes out quiet, as the hardware's conversion does).
constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return f32_from(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0u));  // NaN made quiet
  if (exp == 0) {
    if (man == 0) return f32_from(sign);
    int e = -1;  // normalize the subnormal
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    return f32_from(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13));
  }
  return f32_from(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

// float32 -> bfloat16, round to nearest even (NaN kept quiet).
constexpr uint16_t f32_to_bf16(float x) {
  const uint32_t b = f32_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

constexpr float bf16_to_f32(uint16_t h) { return f32_from(static_cast<uint32_t>(h) << 16); }

// bf16_to_f32(f32_to_bf16(x)) in 32-bit lanes: the same bits, without narrowing to 16 bits
// and widening back (which vectorizes into shuffles; this into a few integer operations).
constexpr float round_to_bf16(float x) {
  const uint32_t b = f32_bits(x);
  const uint32_t nearest = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet = (b | 0x400000u) & 0xffff0000u;  // NaN: its upper half, made quiet
  return f32_from((b & 0x7fffffffu) > 0x7f800000u ? quiet : nearest);
}

}  // namespace half_detail

// With a compiler _Float16 (GCC 12+ and Clang on x86-64 and AArch64), the conversions are the
// hardware's (F16C / AVX512-FP16 vcvtps2ph and vcvtph2ps, vectorized in the kernels' loops);
// they round exactly as the integer code above (tests/cpp/test_half.cpp checks the two agree).
#if defined(__FLT16_MANT_DIG__)
#define CHROMA_HAS_FLOAT16 1
constexpr uint16_t to_f16_bits(float x) { return std::bit_cast<uint16_t>(static_cast<_Float16>(x)); }
constexpr float from_f16_bits(uint16_t b) { return static_cast<float>(std::bit_cast<_Float16>(b)); }
#else
constexpr uint16_t to_f16_bits(float x) { return half_detail::f32_to_f16(x); }
constexpr float from_f16_bits(uint16_t b) { return half_detail::f16_to_f32(b); }
#endif

// IEEE binary16.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  constexpr explicit f16(float x) : bits(to_f16_bits(x)) {}
  constexpr explicit operator float() const { return from_f16_bits(bits); }
  static constexpr f16 from_bits(uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
};

// bfloat16: the upper half of a float32.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  constexpr explicit bf16(float x) : bits(half_detail::f32_to_bf16(x)) {}
  constexpr explicit operator float() const { return half_detail::bf16_to_f32(bits); }
  static constexpr bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2);

template <class T> inline constexpr bool kIsHalf = false;
template <> inline constexpr bool kIsHalf<f16> = true;
template <> inline constexpr bool kIsHalf<bf16> = true;

}  // namespace chroma

// The half types' conversions (include/chroma/half.h), which the constant folder and the
// generated CPU code share: float16 against the compiler's own _Float16 conversion where it
// has one, bfloat16 against its definition (the nearest, ties to the even bits).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "chroma/half.h"

namespace {

using chroma::bf16;
using chroma::f16;

float bits_f(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Half, EveryFloat16RoundTripsThroughFloat32) {
  for (uint32_t b = 0; b < 65536; ++b) {
    EXPECT_EQ(std::bit_cast<uint32_t>(chroma::half_detail::f16_to_f32(static_cast<uint16_t>(b))),
              std::bit_cast<uint32_t>(static_cast<float>(f16::from_bits(static_cast<uint16_t>(b)))))
        << b;  // the integer code and the one in use agree on every value
    const float f = static_cast<float>(f16::from_bits(static_cast<uint16_t>(b)));
    const f16 back(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back.bits & 0x7c00u, 0x7c00u);
      EXPECT_NE(back.bits & 0x3ffu, 0u);
    } else {
      EXPECT_EQ(back.bits, b) << b;
    }
  }
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x3c00)), 1.0f);
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x0001)), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(static_cast<float>(f16::from_bits(0x7bff)), 65504.0f);
}

TEST(Half, Float16RoundsToNearestEven) {
  EXPECT_EQ(f16(65519.0f).bits, 0x7bffu);  // below the midpoint to infinity
  EXPECT_EQ(f16(65520.0f).bits, 0x7c00u);  // the midpoint: rounds to even, infinity
  EXPECT_EQ(f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00u);  // a tie: to the even 1.0
  EXPECT_EQ(f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02u);  // a tie: to the even neighbour above
  EXPECT_EQ(f16(std::ldexp(1.0f, -25)).bits, 0x0000u);  // half the smallest subnormal: to even, 0
  EXPECT_EQ(f16(std::ldexp(1.5f, -25)).bits, 0x0001u);
  EXPECT_EQ(f16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(f16(bits_f(0x7fc00000u)).bits & 0x7e00u, 0x7e00u);  // NaN stays a quiet NaN
#if defined(__FLT16_MANT_DIG__)
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits_f(rng());
    const _Float16 h = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    if (std::isnan(x)) continue;
    ASSERT_EQ(chroma::half_detail::f32_to_f16(x), want) << x;  // the integer code (GPU kernels, no _Float16)
    ASSERT_EQ(f16(x).bits, want) << x;
  }
#endif
}

TEST(Half, Bfloat16IsTheNearestUpperHalf) {
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t b = rng();
    const float x = bits_f(b);
    const bf16 h(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(h)));
      continue;
    }
    const uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;  // the two candidates
    const double dl = std::fabs(static_cast<double>(x) - static_cast<double>(bits_f(lo)));
    // (past the largest finite value the next candidate is infinity, at 2^128 for rounding)
    const double vh = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x) : bits_f(hi);
    const double dh = std::fabs(vh - static_cast<double>(x));
    const uint32_t want = dl < dh ? lo : dh < dl ? hi : (((lo >> 16) & 1u) ? hi : lo);
    ASSERT_EQ(static_cast<uint32_t>(h.bits) << 16, want) << x;
  }
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80u);
  EXPECT_EQ(static_cast<float>(bf16::from_bits(0x3f80)), 1.0f);
}

// round_to_bf16 (the kernels' rounding in 32-bit lanes) is the conversion there and back, bit
// for bit: every sign and exponent with random mantissas, NaNs (quiet or not, any payload),
// infinities, the largest finite values (which round to infinity) and the ties.
TEST(Half, RoundingToBfloat16In32BitsIsTheRoundTrip) {
  std::mt19937 rng(12);
  auto check = [](uint32_t b) {
    const float x = bits_f(b);
    const uint32_t want = static_cast<uint32_t>(bf16(x).bits) << 16;
    ASSERT_EQ(std::bit_cast<uint32_t>(chroma::half_detail::round_to_bf16(x)), want) << std::hex << b;
  };
  for (uint32_t top = 0; top < 0x200u; ++top) {  // sign and exponent
    for (int i = 0; i < 2000; ++i) check((top << 23) | (rng() & 0x7fffffu));
    check(top << 23);
    check((top << 23) | 0x7fffffu);
    check((top << 23) | 0x8000u);   // a tie, even upper half
    check((top << 23) | 0x18000u);  // a tie, odd upper half
  }
  for (uint32_t b : {0x7f800001u, 0x7fc00000u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7f7fffffu, 0xff7fffffu}) check(b);
}

}  // namespace

// Accuracy and special values of the float transcendental helpers in chroma/cpu/scalar.h
// (exp_, expm1_, log_, log1p_, tanh_, sigmoid, erf_), against double-precision libm.
//
// The sweeps visit every 251st float bit pattern (about 17 million inputs, all signs and
// exponents) and check the maximum error in ulps of the exact result. The bounds leave a
// little room above the maxima measured over all 2^32 inputs (see scalar.h).
#include "chroma/cpu/scalar.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace {

namespace s = chroma::scalar;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One ulp of the float nearest to v (subnormal spacing below FLT_MIN).
double ulp_of(double v) {
  v = std::fabs(v);
  if (v < static_cast<double>(std::numeric_limits<float>::min())) return std::ldexp(1.0, -149);
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, e - 24);
}

struct SweepResult {
  double max_ulp = 0;
  float worst = 0;
  uint64_t special_mismatches = 0;
  float first_mismatch = 0;
};

// Compares f(x) with ref(double(x)) for every `stride`-th float bit pattern. Where the exact
// result is NaN or outside the float range, f must return NaN or the rounded infinity.
template <class F, class R> SweepResult sweep(F f, R ref, uint64_t stride = 251) {
  SweepResult out;
  for (uint64_t i = 0; i < (uint64_t{1} << 32); i += stride) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(i));
    const float got = f(x);
    const double want = ref(static_cast<double>(x));
    bool ok = true;
    if (std::isnan(want)) {
      ok = std::isnan(got);
    } else if (std::fabs(want) > static_cast<double>(std::numeric_limits<float>::max())) {
      ok = got == static_cast<float>(want);
    } else if (!std::isfinite(got)) {
      ok = false;
    } else {
      const double err = std::fabs(static_cast<double>(got) - want) / ulp_of(want);
      if (err > out.max_ulp) {
        out.max_ulp = err;
        out.worst = x;
      }
    }
    if (!ok && out.special_mismatches++ == 0) out.first_mismatch = x;
  }
  return out;
}

#define EXPECT_SWEEP(fn, ref, bound)                                                         \
  do {                                                                                       \
    const SweepResult r = sweep([](float x) { return fn(x); }, [](double x) { return ref; }); \
    EXPECT_LE(r.max_ulp, bound) << "worst input " << r.worst;                                \
    EXPECT_EQ(r.special_mismatches, 0u) << "first at input " << r.first_mismatch;            \
  } while (0)

TEST(ScalarMath, ExpAccuracy) { EXPECT_SWEEP(s::exp_, std::exp(x), 1.05); }
TEST(ScalarMath, Expm1Accuracy) { EXPECT_SWEEP(s::expm1_, std::expm1(x), 1.5); }
TEST(ScalarMath, LogAccuracy) { EXPECT_SWEEP(s::log_, std::log(x), 1.0); }
TEST(ScalarMath, Log1pAccuracy) { EXPECT_SWEEP(s::log1p_, std::log1p(x), 1.5); }
TEST(ScalarMath, TanhAccuracy) { EXPECT_SWEEP(s::tanh_, std::tanh(x), 1.5); }
TEST(ScalarMath, SigmoidAccuracy) { EXPECT_SWEEP(s::sigmoid, 1.0 / (1.0 + std::exp(-x)), 2.5); }
TEST(ScalarMath, ErfAccuracy) { EXPECT_SWEEP(s::erf_, std::erf(x), 1.25); }

bool same(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(ScalarMath, ExpSpecialValues) {
  EXPECT_TRUE(std::isnan(s::exp_(kNaN)));
  EXPECT_EQ(s::exp_(kInf), kInf);
  EXPECT_TRUE(same(s::exp_(-kInf), 0.0f));
  EXPECT_EQ(s::exp_(0.0f), 1.0f);
  EXPECT_EQ(s::exp_(-0.0f), 1.0f);
  EXPECT_EQ(s::exp_(88.8f), kInf);
  EXPECT_EQ(s::exp_(1000.0f), kInf);
  EXPECT_TRUE(same(s::exp_(-104.0f), 0.0f));
  EXPECT_TRUE(same(s::exp_(-1000.0f), 0.0f));
  // Gradual underflow: exp(-100) = 3.72e-44 is subnormal.
  EXPECT_EQ(s::exp_(-100.0f), static_cast<float>(std::exp(-100.0)));
  EXPECT_GT(s::exp_(88.7f), 3.0e38f);
}

TEST(ScalarMath, Expm1SpecialValues) {
  EXPECT_TRUE(std::isnan(s::expm1_(kNaN)));
  EXPECT_EQ(s::expm1_(kInf), kInf);
  EXPECT_EQ(s::expm1_(-kInf), -1.0f);
  EXPECT_TRUE(same(s::expm1_(0.0f), 0.0f));
  EXPECT_TRUE(same(s::expm1_(-0.0f), -0.0f));
  EXPECT_EQ(s::expm1_(1e-30f), 1e-30f);
  EXPECT_EQ(s::expm1_(-50.0f), -1.0f);
  EXPECT_EQ(s::expm1_(89.0f), kInf);
}

TEST(ScalarMath, LogSpecialValues) {
  EXPECT_TRUE(std::isnan(s::log_(kNaN)));
  EXPECT_TRUE(std::isnan(s::log_(-1.0f)));
  EXPECT_TRUE(std::isnan(s::log_(-kInf)));
  EXPECT_TRUE(std::isnan(s::log_(-1e-40f)));
  EXPECT_EQ(s::log_(0.0f), -kInf);
  EXPECT_EQ(s::log_(-0.0f), -kInf);
  EXPECT_EQ(s::log_(kInf), kInf);
  EXPECT_TRUE(same(s::log_(1.0f), 0.0f));
  const float min_sub = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(s::log_(min_sub), static_cast<float>(std::log(static_cast<double>(min_sub))));
}

TEST(ScalarMath, Log1pSpecialValues) {
  EXPECT_TRUE(std::isnan(s::log1p_(kNaN)));
  EXPECT_TRUE(std::isnan(s::log1p_(-2.0f)));
  EXPECT_EQ(s::log1p_(-1.0f), -kInf);
  EXPECT_EQ(s::log1p_(kInf), kInf);
  EXPECT_TRUE(same(s::log1p_(0.0f), 0.0f));
  EXPECT_TRUE(same(s::log1p_(-0.0f), -0.0f));
  EXPECT_EQ(s::log1p_(1e-30f), 1e-30f);
}

TEST(ScalarMath, TanhSpecialValues) {
  EXPECT_TRUE(std::isnan(s::tanh_(kNaN)));
  EXPECT_EQ(s::tanh_(kInf), 1.0f);
  EXPECT_EQ(s::tanh_(-kInf), -1.0f);
  EXPECT_EQ(s::tanh_(20.0f), 1.0f);
  EXPECT_EQ(s::tanh_(-20.0f), -1.0f);
  EXPECT_TRUE(same(s::tanh_(0.0f), 0.0f));
  EXPECT_TRUE(same(s::tanh_(-0.0f), -0.0f));
  EXPECT_EQ(s::tanh_(1e-30f), 1e-30f);
}

TEST(ScalarMath, SigmoidSpecialValues) {
  EXPECT_TRUE(std::isnan(s::sigmoid(kNaN)));
  EXPECT_EQ(s::sigmoid(kInf), 1.0f);
  EXPECT_TRUE(same(s::sigmoid(-kInf), 0.0f));
  EXPECT_EQ(s::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(s::sigmoid(100.0f), 1.0f);
  EXPECT_GT(s::sigmoid(-95.0f), 0.0f);  // subnormal, not flushed
}

TEST(ScalarMath, ErfSpecialValues) {
  EXPECT_TRUE(std::isnan(s::erf_(kNaN)));
  EXPECT_EQ(s::erf_(kInf), 1.0f);
  EXPECT_EQ(s::erf_(-kInf), -1.0f);
  EXPECT_EQ(s::erf_(10.0f), 1.0f);
  EXPECT_EQ(s::erf_(-10.0f), -1.0f);
  EXPECT_TRUE(same(s::erf_(0.0f), 0.0f));
  EXPECT_TRUE(same(s::erf_(-0.0f), -0.0f));
  // Odd function, bit for bit.
  for (float x : {1e-20f, 0.3f, 0.921875f, 1.5f, 3.9f}) EXPECT_TRUE(same(s::erf_(-x), -s::erf_(x))) << x;
}

// double (and anything else) keeps the libm functions.
TEST(ScalarMath, DoubleUsesLibm) {
  for (double x : {-3.7, -0.2, 0.0, 1e-9, 0.5, 2.25, 40.0}) {
    EXPECT_EQ(s::exp_(x), std::exp(x));
    EXPECT_EQ(s::expm1_(x), std::expm1(x));
    EXPECT_EQ(s::tanh_(x), std::tanh(x));
    EXPECT_EQ(s::erf_(x), std::erf(x));
    EXPECT_EQ(s::sigmoid(x), 1.0 / (1.0 + std::exp(-x)));
    if (x > 0) {
      EXPECT_EQ(s::log_(x), std::log(x));
    }
    if (x > -1) {
      EXPECT_EQ(s::log1p_(x), std::log1p(x));
    }
  }
}

TEST(ScalarMath, MaximumMinimumPropagateNaN) {
  EXPECT_TRUE(std::isnan(s::maximum(kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(s::maximum(1.0f, kNaN)));
  EXPECT_TRUE(std::isnan(s::minimum(kNaN, 1.0f)));
  EXPECT_TRUE(std::isnan(s::minimum(1.0f, kNaN)));
  EXPECT_EQ(s::maximum(2.0f, -3.0f), 2.0f);
  EXPECT_EQ(s::minimum(2.0f, -3.0f), -3.0f);
  EXPECT_EQ(s::maximum(-kInf, 3.0f), 3.0f);
  EXPECT_EQ(s::maximum(int64_t{4}, int64_t{-9}), 4);
  EXPECT_EQ(s::minimum(int64_t{4}, int64_t{-9}), -9);
}

}  // namespace

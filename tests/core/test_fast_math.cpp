// tests/core/test_fast_math.cpp — the float exp, tanh and erf of core/math.hpp against the
// double library functions, over their whole working range and at its edges.
//
// These formulas replace libm in every element-wise loop (NOTE [Fast float math]), on the
// CPU and the GPU alike, so their error bounds are what every activation, softmax and
// loss inherits.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "trainmem/core/math.hpp"

namespace math = trainmem::math;

namespace {
constexpr float kExpHi = 88.3762626647949f, kExpLo = -87.3365447505531f;

/// Worst error of f against the double reference over n + 1 evenly spaced points of [a, b].
template <class F, class Ref>
double worst_error(F f, Ref ref, float a, float b, int n, bool relative) {
  double worst = 0.0;
  for (int i = 0; i <= n; ++i) {
    const float x = a + (b - a) * static_cast<float>(i) / static_cast<float>(n);
    const double want = ref(static_cast<double>(x)), got = f(x);
    const double err = std::abs(got - want) / (relative ? std::abs(want) : 1.0);
    worst = std::max(worst, err);
  }
  return worst;
}
}  // namespace

TEST_CASE("fast math: float exp is within 2e-7 relative of exp over its whole finite range", "[core][math]") {
  const auto f = [](float x) { return math::exp(x); };
  const auto ref = [](double x) { return std::exp(x); };
  CHECK(worst_error(f, ref, kExpLo, kExpHi, 2'000'000, true) < 2e-7);
  CHECK(worst_error(f, ref, -1.0f, 1.0f, 200'000, true) < 2e-7);  // where softmax's largest terms lie
  // Both ends: 2^n reaches 2^127 and 2^-126, which one power-of-two factor alone cannot hold.
  CHECK(std::abs(math::exp(kExpHi) / std::exp(static_cast<double>(kExpHi)) - 1.0) < 2e-7);
  CHECK(std::abs(math::exp(kExpLo) / std::exp(static_cast<double>(kExpLo)) - 1.0) < 2e-7);
  CHECK(std::isfinite(math::exp(kExpHi)));
}

TEST_CASE("fast math: float exp saturates outside its range and passes NaN through", "[core][math]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(math::exp(std::nextafter(kExpHi, inf)) == inf);
  CHECK(math::exp(1000.0f) == inf);
  CHECK(math::exp(3e9f) == inf);  // beyond where x log2(e) fits a float's integer bits
  CHECK(math::exp(inf) == inf);
  CHECK(math::exp(std::nextafter(kExpLo, -inf)) == 0.0f);
  CHECK(math::exp(-3e9f) == 0.0f);
  CHECK(math::exp(-inf) == 0.0f);
  CHECK(std::isnan(math::exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(math::exp(0.0f) == 1.0f);
  CHECK(math::exp(-0.0f) == 1.0f);
}

TEST_CASE("fast math: float tanh and erf are within 5e-7 of the library functions", "[core][math]") {
  const auto tanh_f = [](float x) { return math::tanh(x); };
  const auto tanh_ref = [](double x) { return std::tanh(x); };
  const auto erf_f = [](float x) { return math::erf(x); };
  const auto erf_ref = [](double x) { return std::erf(x); };
  CHECK(worst_error(tanh_f, tanh_ref, -12.0f, 12.0f, 1'000'000, false) < 5e-7);
  CHECK(worst_error(erf_f, erf_ref, -6.0f, 6.0f, 1'000'000, false) < 5e-7);
  CHECK(math::tanh(1e-5f) == 1e-5f);  // below 4e-4 tanh returns x itself
  CHECK(math::tanh(100.0f) == 1.0f);
  CHECK(math::erf(-100.0f) == -1.0f);
}

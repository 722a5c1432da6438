// tests/core/test_tensor_to_full.cpp — Tensor::to (the one cast) and Tensor::full (the one filled tensor).
//
// Every expected value is an IEEE bit pattern worked out by hand from the formats
// (bf16: 8 exponent, 7 mantissa bits; f16: 5 and 10), never one the code produced:
// the cases sit on and next to rounding ties, at the overflow threshold and in the
// subnormals, where a cast that rounds twice or truncates gives a different pattern.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using testing::ErrorContains;

namespace {

/// An f32 tensor holding exactly these bit patterns.
T f32_from_bits(B& be, const std::vector<std::uint32_t>& bits) {
  T t = T::empty(Shape{static_cast<std::int64_t>(bits.size())}, DType::F32, MemCategory::Temporary, be);
  be.upload(t.data(), bits.data(), t.bytes());
  return t;
}

/// The raw 16-bit patterns of a 16-bit tensor.
std::vector<std::uint16_t> bits16(const T& t) {
  REQUIRE(size_of(t.dtype()) == 2);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
  t.backend().download(out.data(), t.data(), t.bytes());
  return out;
}

}  // namespace

TEST_CASE("Tensor::to: f32 -> bf16 rounds to nearest, ties to even", "[core][tensor][cast]") {
  B be;
  struct Case {
    std::uint32_t f32;
    std::uint16_t bf16;
  };
  const std::vector<Case> cases = {
      {0x3F800000u, 0x3F80u},  // 1: exact
      {0x3F808000u, 0x3F80u},  // 1 + 2^-8: halfway between 0x3F80 and 0x3F81, ties to the even 0x3F80
      {0x3F818000u, 0x3F82u},  // halfway between 0x3F81 and 0x3F82: the even one is above
      {0x3F808001u, 0x3F81u},  // one f32 ulp above the tie: up
      {0x3F807FFFu, 0x3F80u},  // one f32 ulp below the tie: down
      {0xBF808000u, 0xBF80u},  // the negative tie, to even
      {0x7F7F7FFFu, 0x7F7Fu},  // just below halfway to 2^128: the largest bf16
      {0x7F7FFFFFu, 0x7F80u},  // f32 max is above that halfway point: +inf
      {0xFF7FFFFFu, 0xFF80u},  // -f32 max: -inf
      {0x7F800000u, 0x7F80u},  // +inf stays
      {0x00008000u, 0x0000u},  // subnormal tie at half the smallest bf16 subnormal: to even 0
      {0x00018000u, 0x0002u},  // subnormal tie above an odd pattern: up to 0x0002
      {0x80000001u, 0x8000u},  // the smallest negative f32 subnormal: -0
  };
  std::vector<std::uint32_t> inputs;
  for (const Case& c : cases) inputs.push_back(c.f32);
  inputs.push_back(0x7FC00000u);  // a quiet NaN

  const T source = f32_from_bits(be, inputs);
  const std::int64_t parameters_before = be.memory().live(MemCategory::Parameter);
  const T cast = source.to(DType::BF16, MemCategory::Parameter);
  CHECK(cast.dtype() == DType::BF16);
  CHECK(cast.shape() == source.shape());
  CHECK_FALSE(cast.same_storage(source));
  CHECK(cast.category() == MemCategory::Parameter);
  CHECK(be.memory().live(MemCategory::Parameter) - parameters_before == static_cast<std::int64_t>(inputs.size() * 2));

  const std::vector<std::uint16_t> got = bits16(cast);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO("f32 bits 0x" << std::hex << cases[i].f32);
    CHECK(got[i] == cases[i].bf16);
  }
  const std::uint16_t nan = got.back();
  CHECK((nan & 0x7F80u) == 0x7F80u);
  CHECK((nan & 0x007Fu) != 0);  // still a NaN, not an infinity
}

TEST_CASE("Tensor::to: f32 -> f16 overflows to inf and rounds into the subnormals", "[core][tensor][cast]") {
  B be;
  // The largest f16 is 65504 (0x7BFF, an odd pattern); 65520 is halfway to 2^16, so it
  // and everything above round to inf.
  const std::vector<float> values = {65504.0f,
                                     std::nextafter(65520.0f, 0.0f),
                                     65520.0f,
                                     1e6f,
                                     -1e6f,
                                     std::ldexp(1.0f, -14),          // smallest normal f16
                                     std::ldexp(1.0f, -24),          // smallest subnormal
                                     std::ldexp(1.0f, -25),          // half of it: a tie, to even 0
                                     std::ldexp(3.0f, -25),          // 1.5 of it: a tie, to even 0x0002
                                     std::ldexp(1.0f, -25) * 1.01f,  // just above the tie: up to 0x0001
                                     1.0f + std::ldexp(1.0f, -11)};  // halfway above 1: to even 0x3C00
  const std::vector<std::uint16_t> expected = {0x7BFFu, 0x7BFFu, 0x7C00u, 0x7C00u, 0xFC00u, 0x0400u,
                                               0x0001u, 0x0000u, 0x0002u, 0x0001u, 0x3C00u};
  const T source =
      T::from_host(Shape{static_cast<std::int64_t>(values.size())}, values, DType::F32, MemCategory::Temporary, be);
  const std::vector<std::uint16_t> got = bits16(source.to(DType::F16));
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("value " << values[i]);
    CHECK(got[i] == expected[i]);
  }
}

TEST_CASE("Tensor::to: f64 -> 16 bits rounds once, and widening is exact", "[core][tensor][cast]") {
  B be;
  // 1 + 2^-8 + 2^-40 is just above the bf16 tie 1 + 2^-8, and 1 + 2^-11 + 2^-40 just above
  // the f16 tie 1 + 2^-11. Through f32 the 2^-40 would be rounded away first and the tie
  // then go to even (down); rounded once from f64 both go up.
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
  const double above_f16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  const T wide = T::from_host(Shape{2}, std::vector<double>{above_bf16_tie, above_f16_tie}, DType::F64,
                              MemCategory::Temporary, be);
  CHECK(bits16(wide.to(DType::BF16))[0] == 0x3F81u);
  CHECK(bits16(wide.to(DType::F16))[1] == 0x3C01u);

  // Widening: every 16-bit value is exact in f32 and f64.
  const T bf16 = wide.to(DType::BF16);
  CHECK(bf16.to(DType::F32).to_host<double>()[0] == 1.0 + std::ldexp(1.0, -7));
  CHECK(bf16.to(DType::F64).to_host<double>()[0] == 1.0 + std::ldexp(1.0, -7));
  const T f16 = wide.to(DType::F16);
  CHECK(f16.to(DType::F64).to_host<double>()[1] == 1.0 + std::ldexp(1.0, -10));
  // f32 -> f64 -> f32 gives the f32 back.
  const std::vector<float> f32_values = {0.1f, -3.5e-40f, 1e30f};
  const T f32 = T::from_host(Shape{3}, f32_values, DType::F32, MemCategory::Temporary, be);
  CHECK(f32.to(DType::F64).to(DType::F32).to_host<float>() == f32_values);
}

TEST_CASE("Tensor::to: the same dtype is the tensor itself, no copy", "[core][tensor][cast]") {
  B be;
  const T t = T::from_host(Shape{4}, std::vector<double>{1, 2, 3, 4}, DType::BF16, MemCategory::Temporary, be);
  const std::int64_t allocations = be.memory().allocations();
  const T same = t.to(DType::BF16, MemCategory::Parameter);
  CHECK(same.same_storage(t));
  CHECK(same.category() == MemCategory::Temporary);  // unchanged: no new tensor was made
  CHECK(be.memory().allocations() == allocations);
  const T ids = T::from_host(Shape{2}, std::vector<double>{5, 6}, DType::I32, MemCategory::Temporary, be);
  CHECK(ids.to(DType::I32).same_storage(ids));
}

TEST_CASE("Tensor::to: bad input names what was wrong", "[core][tensor][cast]") {
  B be;
  const T ids = T::from_host(Shape{3}, std::vector<double>{0, 1, 2}, DType::I32, MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(ids.to(DType::F32), Error, ErrorContains("Tensor::to: cannot cast [3] i32 to f32"));
  const T values = T::zeros(Shape{2, 2}, DType::BF16, MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(values.to(DType::I32), Error, ErrorContains("cannot cast [2, 2] bf16 to i32"));
  CHECK_THROWS_MATCHES(T().to(DType::F32), Error, ErrorContains("Tensor::to: tensor is undefined"));
}

TEST_CASE("Tensor::full: every element holds the value rounded once", "[core][tensor][full]") {
  B be;
  SECTION("f32 and f64") {
    const T f32 = T::full(Shape{2, 3}, 0.1, DType::F32, MemCategory::Temporary, be);
    CHECK(f32.shape() == Shape{2, 3});
    CHECK(f32.to_host<float>() == std::vector<float>(6, 0.1f));
    CHECK(T::full(Shape{5}, 0.1, DType::F64, MemCategory::Temporary, be).to_host<double>() ==
          std::vector<double>(5, 0.1));
  }
  SECTION("bf16 and f16 from the double, not through f32") {
    // As in the cast test: just above a tie in f64, a tie after rounding to f32.
    const T bf16 =
        T::full(Shape{3}, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), DType::BF16, MemCategory::Temporary, be);
    CHECK(bits16(bf16) == std::vector<std::uint16_t>(3, 0x3F81u));
    const T f16 =
        T::full(Shape{3}, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), DType::F16, MemCategory::Temporary, be);
    CHECK(bits16(f16) == std::vector<std::uint16_t>(3, 0x3C01u));
    CHECK(bits16(T::full(Shape{2}, 0.1, DType::BF16, MemCategory::Temporary, be)) ==
          std::vector<std::uint16_t>(2, 0x3DCDu));  // 0.1 = 1.1001100|11... x 2^-4: rounds up
    CHECK(bits16(T::full(Shape{2}, 65520.0, DType::F16, MemCategory::Temporary, be)) ==
          std::vector<std::uint16_t>(2, 0x7C00u));  // beyond f16's range: inf
  }
  SECTION("non-finite floating values are values") {
    const auto inf = std::numeric_limits<double>::infinity();
    CHECK(std::isinf(T::full(Shape{1}, -inf, DType::F32, MemCategory::Temporary, be).to_host<double>()[0]));
    CHECK(std::isnan(T::full(Shape{1}, std::nan(""), DType::BF16, MemCategory::Temporary, be).to_host<double>()[0]));
  }
  SECTION("i32 whole numbers, to both ends of the range") {
    CHECK(T::full(Shape{4}, -3.0, DType::I32, MemCategory::Temporary, be).to_host<double>() ==
          std::vector<double>(4, -3.0));
    std::int32_t low = 0, high = 0;
    be.download(&low, T::full(Shape{}, -2147483648.0, DType::I32, MemCategory::Temporary, be).data(), 4);
    be.download(&high, T::full(Shape{}, 2147483647.0, DType::I32, MemCategory::Temporary, be).data(), 4);
    CHECK(low == std::numeric_limits<std::int32_t>::min());
    CHECK(high == std::numeric_limits<std::int32_t>::max());
  }
  SECTION("empty and scalar shapes") {
    CHECK(T::full(Shape{0, 3}, 7.0, DType::F32, MemCategory::Temporary, be).numel() == 0);
    CHECK(T::full(Shape{0}, 7.0, DType::I32, MemCategory::Temporary, be).numel() == 0);
    const T scalar = T::full(Shape{}, 7.0, DType::F16, MemCategory::Temporary, be);
    CHECK(scalar.shape().rank() == 0);
    CHECK(scalar.to_host<double>() == std::vector<double>{7.0});
  }
}

TEST_CASE("Tensor::full: bytes are counted in the category asked for", "[core][tensor][full][memory]") {
  B be;
  {
    const T state = T::full(Shape{4, 5}, 1.0, DType::F32, MemCategory::OptimizerState, be);
    const T counter = T::full(Shape{3}, 2.0, DType::I32, MemCategory::OptimizerState, be);
    const T half = T::full(Shape{6}, 2.0, DType::BF16, MemCategory::Gradient, be);
    CHECK(state.category() == MemCategory::OptimizerState);
    CHECK(be.memory().live(MemCategory::OptimizerState) == 4 * 5 * 4 + 3 * 4);
    CHECK(be.memory().live(MemCategory::Gradient) == 6 * 2);
    CHECK(be.memory().live(MemCategory::Temporary) == 0);
  }
  CHECK(be.memory().live_total() == 0);
}

TEST_CASE("Tensor::full: a value an i32 cannot hold is an error, before anything is allocated",
          "[core][tensor][full]") {
  B be;
  const auto inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_MATCHES(T::full(Shape{2}, std::nan(""), DType::I32, MemCategory::Temporary, be), Error,
                       ErrorContains("Tensor::full: value nan is not an i32"));
  CHECK_THROWS_MATCHES(T::full(Shape{2}, inf, DType::I32, MemCategory::Temporary, be), Error,
                       ErrorContains("Tensor::full: value inf is not an i32"));
  CHECK_THROWS_MATCHES(T::full(Shape{2}, 1.5, DType::I32, MemCategory::Temporary, be), Error,
                       ErrorContains("Tensor::full: value 1.5 is not an i32"));
  CHECK_THROWS_MATCHES(T::full(Shape{2}, 2147483648.0, DType::I32, MemCategory::Temporary, be), Error,
                       ErrorContains("is not an i32"));
  CHECK_THROWS_MATCHES(T::full(Shape{2}, -2147483649.0, DType::I32, MemCategory::Temporary, be), Error,
                       ErrorContains("is not an i32"));
  CHECK(be.memory().allocations() == 0);
}

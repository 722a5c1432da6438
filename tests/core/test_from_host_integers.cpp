// tests/core/test_from_host_integers.cpp — integer ids and labels upload as i32 exactly.
//
// The reference is the integers themselves: 16777217 = 2^24 + 1 is the first integer a
// float cannot hold (it rounds to 2^24), so any float on the way would change it.
#include <catch2/catch.hpp>
#include <cstdint>
#include <span>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

TEST_CASE("Tensor::from_host takes int32 and int64 vectors as i32, with no float round trip", "[core][from_host]") {
  using namespace trainmem;
  using Backend = cpu::Backend;
  using T = Tensor<Backend>;
  const std::vector<std::int32_t> ids = {0, 16777217, -16777219, 2147483647, -2147483647 - 1, 7};
  const std::vector<double> want(ids.begin(), ids.end());

  SECTION("std::vector<std::int32_t> and std::span<const std::int32_t> default to i32") {
    const T a = T::from_host(Shape{2, 3}, ids);
    CHECK(a.dtype() == DType::I32);
    CHECK(a.to_host<double>() == want);
    const T b = T::from_host(Shape{6}, std::span<const std::int32_t>(ids));
    CHECK(b.dtype() == DType::I32);
    CHECK(b.to_host<double>() == want);
    CHECK(T::from_host(Shape{6}, ids, DType::I32).to_host<double>() == want);
  }
  SECTION("int64 values are narrowed to i32 with a range check") {
    const std::vector<std::int64_t> wide(ids.begin(), ids.end());
    const T a = T::from_host(Shape{6}, wide);
    CHECK(a.dtype() == DType::I32);
    CHECK(a.to_host<double>() == want);
    const std::vector<std::int64_t> too_big = {1, 2147483648LL};
    CHECK_THROWS_MATCHES(T::from_host(Shape{2}, too_big), Error,
                         testing::ErrorContains("value 2147483648 at index 1 does not fit in i32"));
    const std::vector<std::int64_t> too_small = {-2147483649LL};
    CHECK_THROWS_MATCHES(T::from_host(Shape{1}, too_small), Error, testing::ErrorContains("does not fit in i32"));
    CHECK_THROWS_MATCHES(T::from_host(Shape{3}, wide), Error, testing::ErrorContains("needs 3 values, got 6"));
  }
  SECTION("integers into a floating dtype convert each value") {
    const std::vector<std::int32_t> small = {1, -2, 3};
    const T f = T::from_host(Shape{3}, small, DType::F64);
    CHECK(f.dtype() == DType::F64);
    CHECK(f.to_host<double>() == std::vector<double>{1.0, -2.0, 3.0});
  }
  SECTION("ids from a vector feed an embedding lookup") {
    Tape<Backend> tape;
    const std::vector<std::int32_t> tokens = {2, 0, 1};
    const Var<Backend> table = tape.input(T::from_host(Shape{3, 2}, std::vector<double>{0, 1, 10, 11, 20, 21}));
    const auto rows = embedding(table, tape.input(T::from_host(Shape{3}, tokens))).value().to_host<double>();
    CHECK(rows == std::vector<double>{20, 21, 0, 1, 10, 11});
  }
}

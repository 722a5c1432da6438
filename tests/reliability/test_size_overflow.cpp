// tests/reliability/test_size_overflow.cpp — element and byte counts that do not fit.
//
// A shape whose element count, or a tensor whose byte count, exceeds what the index
// types hold must be refused before anything is allocated: a wrapped count gives a
// small block that the next kernel writes far past.
#include <catch2/catch.hpp>

#include <cstdint>

#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::Shape;
using tmem::testing::ErrorContains;

TEST_CASE("size overflow: a shape whose element count overflows int64 is an error", "[reliability][overflow]") {
  CHECK_THROWS_MATCHES(Shape({std::int64_t{1} << 62, 4, 1}), tmem::Error, ErrorContains("elements"));
  CHECK_THROWS_AS(Shape({std::int64_t{1} << 32, std::int64_t{1} << 32}), tmem::Error);
  CHECK_THROWS_AS(Shape(std::vector<std::int64_t>{std::int64_t{1} << 40, std::int64_t{1} << 30}), tmem::Error);
  // A zero extent makes any product 0: not an overflow.
  CHECK(Shape({std::int64_t{1} << 62, 0, std::int64_t{1} << 62}).numel() == 0);
  CHECK(Shape({std::int64_t{1} << 31, std::int64_t{1} << 31}).numel() == std::int64_t{1} << 62);
}

TEST_CASE("size overflow: a tensor whose byte count overflows size_t is an error, and allocates nothing",
          "[reliability][overflow]") {
  B be;
  CHECK_THROWS_MATCHES(
      tmem::Tensor<B>::zeros(Shape{std::int64_t{1} << 61}, DType::F64, tmem::MemCategory::Temporary, be), tmem::Error,
      ErrorContains("bytes"));
  CHECK_THROWS_AS(tmem::Tensor<B>::empty(Shape{std::int64_t{1} << 62}, DType::F32, tmem::MemCategory::Temporary, be),
                  tmem::Error);
  CHECK(be.memory().allocations() == 0);
  CHECK(be.memory().live_total() == 0);
}

// tests/autograd/test_var_item.cpp — Var::item(): a one-element Var's value as a double.
//
// References: closed-form sums of known values, exact in every floating dtype used
// (multiples of 1/8), and the shape the error must name.
#include <catch2/catch.hpp>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

TEST_CASE("Var::item returns the single element in any floating dtype, and names the shape otherwise",
          "[autograd][item]") {
  using namespace trainmem;
  using Backend = cpu::Backend;
  const std::vector<double> values = {0.5, -1.25, 2.0, 0.125};  // sum 1.375, mean 0.34375
  for (const DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    INFO(dtype);
    Tape<Backend> tape;
    const Var<Backend> x = tape.input(Tensor<Backend>::from_host(Shape{2, 2}, values, dtype), true);
    CHECK(sum(x).item() == 1.375);
    CHECK(mean(x).item() == 0.34375);
    CHECK(reshape(sum(x), Shape{1, 1}).item() == 1.375);  // one element, any rank
    CHECK_THROWS_MATCHES(x.item(), Error, testing::ErrorContains("Var::item"));
    CHECK_THROWS_MATCHES(x.item(), Error, testing::ErrorContains("has shape [2, 2] (4 elements)"));
  }
  Tape<Backend> tape;
  const Var<Backend> named = tape.input(Tensor<Backend>::zeros(Shape{3}, DType::F32), false, "logits");
  CHECK_THROWS_MATCHES(named.item(), Error, testing::ErrorContains("'logits' has shape [3]"));
  const Var<Backend> empty = tape.input(Tensor<Backend>::zeros(Shape{0}, DType::F32));
  CHECK_THROWS_MATCHES(empty.item(), Error, testing::ErrorContains("(0 elements)"));
}

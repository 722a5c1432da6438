// tests/reliability/test_zero_size.cpp — tensors with a zero extent.
//
// An extent of 0 is legal (an empty batch, a head of size 0); an op on such a tensor
// either returns the empty result of the shape its rule gives, or throws a
// trainmem::Error that says why. Integer division by a zero extent (SIGFPE) and
// memcpy from a null pointer are the failures this file pins down. (sum of an empty
// tensor is itself an error, so backward here starts from a seed of the output's shape.)
#include <catch2/catch.hpp>

#include <vector>

#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::Shape;
using T = tmem::Tensor<B>;
using tmem::testing::ErrorContains;

namespace {
T zeros(Shape shape, B& be, DType dtype = DType::F32) {
  return T::zeros(std::move(shape), dtype, tmem::MemCategory::Temporary, be);
}
}  // namespace

TEST_CASE("zero size: Shape's rows of a zero extent need no division", "[reliability][zero_size]") {
  CHECK(Shape{0, 3}.rows() == 0);
  CHECK(Shape{3, 0}.rows() == 3);
  CHECK(Shape{2, 0, 4}.rows() == 0);
  CHECK(Shape{2, 3, 0}.rows() == 6);
  CHECK(Shape{0}.rows() == 1);
  CHECK(Shape{3, 0}.numel() == 0);
}

TEST_CASE("zero size: to_host and from_host of an empty tensor", "[reliability][zero_size]") {
  B be;
  const T empty = T::from_host(Shape{0, 4}, std::vector<double>{}, DType::F32, tmem::MemCategory::Temporary, be);
  CHECK(empty.to_host<double>().empty());
  CHECK(empty.clone().numel() == 0);
  CHECK(zeros(Shape{3, 0}, be, DType::BF16).to_host<float>().empty());
}

TEST_CASE("zero size: softmax, layer_norm, add with bias, transpose and causal_mask give empty results",
          "[reliability][zero_size]") {
  B be;
  tmem::Tape<B> tape(be);
  for (const Shape& shape : {Shape{0, 5}, Shape{3, 0}}) {
    CAPTURE(shape);
    auto x = tape.input(zeros(shape, be), true);
    auto y = tmem::softmax(x);
    CHECK(y.shape() == shape);
    auto ly = tmem::log_softmax(x);
    CHECK(ly.shape() == shape);
    tape.backward(y, zeros(y.shape(), be));
    CHECK(x.grad().shape() == shape);
    tape.clear();
  }
  {  // layer_norm over a last extent of 0, and over 0 rows
    auto x0 = tape.input(zeros(Shape{4, 0}, be), true);
    auto g0 = tape.input(zeros(Shape{0}, be), true), b0 = tape.input(zeros(Shape{0}, be), true);
    CHECK(tmem::layer_norm(x0, g0, b0).shape() == Shape{4, 0});
    auto x1 = tape.input(zeros(Shape{0, 3}, be), true);
    auto g1 = tape.input(zeros(Shape{3}, be), true), b1 = tape.input(zeros(Shape{3}, be), true);
    auto y1 = tmem::layer_norm(x1, g1, b1);
    CHECK(y1.shape() == Shape{0, 3});
    tape.backward(y1, zeros(y1.shape(), be));
    CHECK(g1.grad().to_host<double>() == std::vector<double>(3, 0.0));  // no row contributes
    tape.clear();
  }
  {  // add with a bias row: [0, 4] + [4] and [3, 0] + [0]
    auto a = tape.input(zeros(Shape{0, 4}, be), true);
    auto bias = tape.input(zeros(Shape{4}, be), true);
    auto y = tmem::add(a, bias);
    CHECK(y.shape() == Shape{0, 4});
    tape.backward(y, zeros(y.shape(), be));
    CHECK(bias.grad().to_host<double>() == std::vector<double>(4, 0.0));
    tape.clear();
    auto a2 = tape.input(zeros(Shape{3, 0}, be), true);
    auto bias2 = tape.input(zeros(Shape{0}, be), true);
    auto y2 = tmem::add(a2, bias2);
    CHECK(y2.shape() == Shape{3, 0});
    tape.backward(y2, zeros(y2.shape(), be));
    CHECK(bias2.grad().shape() == Shape{0});
    tape.clear();
  }
  {
    auto x = tape.input(zeros(Shape{0, 3}, be), true);
    auto t = tmem::transpose(x);
    CHECK(t.shape() == Shape{3, 0});
    tape.backward(t, zeros(t.shape(), be));
    CHECK(x.grad().shape() == Shape{0, 3});
    CHECK(tmem::transpose(tape.input(zeros(Shape{2, 0, 3}, be))).shape() == Shape{2, 3, 0});
    tape.clear();
  }
  {
    auto s = tape.input(zeros(Shape{2, 0, 0}, be), true);
    auto m = tmem::causal_mask(s);
    CHECK(m.shape() == Shape{2, 0, 0});
    tape.backward(m, zeros(m.shape(), be));
    CHECK(tmem::causal_mask(tape.input(zeros(Shape{0, 3, 3}, be))).shape() == Shape{0, 3, 3});
  }
}

TEST_CASE("zero size: cross_entropy with no classes or an empty batch is an error, not NaN",
          "[reliability][zero_size]") {
  B be;
  tmem::Tape<B> tape(be);
  const T labels2 = T::from_host(Shape{2}, std::vector<double>{0, 0}, DType::I32, tmem::MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(tmem::cross_entropy(tape.input(zeros(Shape{2, 0}, be), true), labels2), tmem::Error,
                       ErrorContains("cross_entropy"));
  const T labels0 = T::from_host(Shape{0}, std::vector<double>{}, DType::I32, tmem::MemCategory::Temporary, be);
  CHECK_THROWS_MATCHES(tmem::cross_entropy(tape.input(zeros(Shape{0, 3}, be), true), labels0), tmem::Error,
                       ErrorContains("empty batch"));
}

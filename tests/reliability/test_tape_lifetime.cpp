// tests/reliability/test_tape_lifetime.cpp — a Var used after its tape was cleared or destroyed.
//
// A Var points into its tape (the node that made it). After tape.clear() that node is
// gone, and after the tape's destruction so is the tape: the next use must throw an
// error that says which of the two happened, never read freed memory or silently add
// a stale contribution to a gradient.
#include <catch2/catch.hpp>

#include <memory>
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
T f64(Shape shape, std::vector<double> values, B& be) {
  return T::from_host(std::move(shape), values, DType::F64, tmem::MemCategory::Temporary, be);
}
}  // namespace

TEST_CASE("tape lifetime: a Var made before tape.clear() is an error at its next use", "[reliability][tape]") {
  B be;
  auto w = tmem::Var<B>::parameter(f64(Shape{2}, {1.0, 2.0}, be), "w");
  tmem::Tape<B> tape(be);
  auto x = tape.input(f64(Shape{2}, {3.0, 3.0}, be));
  auto y = tmem::mul(w, x);  // dy/dw = 3
  tape.clear();
  // Using y (whose node was freed by clear) in a new graph.
  CHECK_THROWS_MATCHES(tmem::sum(tmem::mul(y, tape.input(f64(Shape{2}, {1.0, 1.0}, be)))), tmem::Error,
                       ErrorContains("cleared"));
  CHECK_THROWS_MATCHES(tape.backward(tmem::sum(y)), tmem::Error, ErrorContains("cleared"));
  CHECK_THROWS_MATCHES(y.backward(f64(Shape{2}, {1.0, 1.0}, be)), tmem::Error, ErrorContains("cleared"));
  CHECK_THROWS_MATCHES(tmem::relu(x), tmem::Error, ErrorContains("cleared"));
  // Nothing reached w, and a fresh graph on the same tape works: d sum(w * x)/dw = x = 3.
  CHECK_FALSE(w.grad().defined());
  tape.backward(tmem::sum(tmem::mul(w, tape.input(f64(Shape{2}, {3.0, 3.0}, be)))));
  CHECK(w.grad().to_host<double>() == std::vector<double>{3.0, 3.0});
}

TEST_CASE("tape lifetime: a Var whose tape was destroyed is an error at its next use", "[reliability][tape]") {
  B be;
  auto w = tmem::Var<B>::parameter(f64(Shape{2}, {1.0, 2.0}, be), "w");
  tmem::Var<B> y, x;
  {
    auto tape = std::make_unique<tmem::Tape<B>>(be);
    x = tape->input(f64(Shape{2}, {3.0, 3.0}, be));
    y = tmem::mul(w, x);
  }
  CHECK_THROWS_MATCHES(tmem::sum(y), tmem::Error, ErrorContains("destroyed"));
  CHECK_THROWS_MATCHES(y.backward(f64(Shape{2}, {1.0, 1.0}, be)), tmem::Error, ErrorContains("destroyed"));
  CHECK_THROWS_MATCHES(y.tape(), tmem::Error, ErrorContains("destroyed"));
  CHECK_THROWS_MATCHES(tmem::relu(x), tmem::Error, ErrorContains("destroyed"));
  // The values themselves are still readable: a Var owns its tensor.
  CHECK(y.value().to_host<double>() == std::vector<double>{3.0, 6.0});
  CHECK_FALSE(w.grad().defined());
}

// tests/reliability/test_tape_lifetime.cpp — a Var used after its tape was cleared or destroyed.
//
// A Var points into its tape (the node that made it). After tape.clear() that node is
// gone, and after the tape's destruction so is the tape: the next use must throw an
// error that says which of the two happened, never read freed memory or silently add
// a stale contribution to a gradient.
#include <catch2/catch.hpp>

#include <functional>
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

TEST_CASE("tape lifetime: tape.clear() from a grad-ready hook during backward is refused, the tape stays usable",
          "[reliability][tape]") {
  // The hook of w1 runs while backward still walks the tape (w2's node is below it):
  // clearing there would free the nodes the walk is on. It is an Error instead, and
  // backward ends as a failed backward does (NOTE [A backward that fails]).
  B be;
  auto w1 = tmem::Var<B>::parameter(f64(Shape{2}, {1.0, 2.0}, be), "w1");
  auto w2 = tmem::Var<B>::parameter(f64(Shape{2}, {0.5, 0.25}, be), "w2");
  tmem::Tape<B> tape(be);
  int fired = 0;
  w1.set_grad_ready_hook([&] {
    ++fired;
    tape.clear();
  });
  auto x = tape.input(f64(Shape{2}, {3.0, 3.0}, be));
  auto h = tmem::mul(w2, x);                // w2's node: recorded first, runs last
  auto loss = tmem::sum(tmem::mul(w1, h));  // w1's last contribution comes first
  CHECK_THROWS_MATCHES(tape.backward(loss), tmem::Error, ErrorContains("tape.clear() called during backward"));
  CHECK(fired == 1);
  CHECK(w1.grad_incomplete());
  CHECK(w2.grad_incomplete());
  // Outside backward clear() works, and a fresh step gives the closed form: d sum(w1 * w2 * x)/dw1 = w2 * x.
  tape.clear();
  w1.set_grad_ready_hook({});
  w1.zero_grad();
  w2.zero_grad();
  tape.backward(tmem::sum(tmem::mul(w1, tmem::mul(w2, tape.input(f64(Shape{2}, {3.0, 3.0}, be))))));
  CHECK(w1.grad().to_host<double>() == std::vector<double>{1.5, 0.75});
  CHECK(w2.grad().to_host<double>() == std::vector<double>{3.0, 6.0});
}

TEST_CASE("tape lifetime: an op recorded onto the tape, or a second backward of it, from a grad-ready hook is refused",
          "[reliability][tape]") {
  // Either would change the node list the walk is on (NOTE [The tape during backward]); under
  // NoGradGuard the hook may compute, as data parallelism's hooks do.
  B be;
  auto w1 = tmem::Var<B>::parameter(f64(Shape{2}, {1.0, 2.0}, be), "w1");
  auto w2 = tmem::Var<B>::parameter(f64(Shape{2}, {0.5, 0.25}, be), "w2");
  std::function<void(tmem::Tape<B>&, const tmem::Var<B>&, const tmem::Var<B>&)> action;
  const auto step = [&] {  // backward of sum(w1 * w2 * x) on a fresh tape, with a second root beside it
    w1.zero_grad();
    w2.zero_grad();
    tmem::Tape<B> tape(be);
    auto x = tape.input(f64(Shape{2}, {3.0, 3.0}, be));
    auto other = tmem::sum(tmem::mul(w2, x));
    w1.set_grad_ready_hook([&] { action(tape, x, other); });
    auto loss = tmem::sum(tmem::mul(w1, tmem::mul(w2, x)));
    try {
      tape.backward(loss);
    } catch (...) {
      w1.set_grad_ready_hook({});
      throw;
    }
    w1.set_grad_ready_hook({});
  };
  action = [&](tmem::Tape<B>&, const tmem::Var<B>& x, const tmem::Var<B>&) { tmem::mul(w2, x); };
  CHECK_THROWS_MATCHES(step(), tmem::Error, ErrorContains("recorded onto the tape while its backward"));
  CHECK(w1.grad_incomplete());
  action = [&](tmem::Tape<B>& tape, const tmem::Var<B>&, const tmem::Var<B>& other) { tape.backward(other, {}, true); };
  CHECK_THROWS_MATCHES(step(), tmem::Error, ErrorContains("while a backward of this tape runs"));
  std::vector<double> seen;
  action = [&](tmem::Tape<B>&, const tmem::Var<B>& x, const tmem::Var<B>&) {
    tmem::NoGradGuard no_grad;
    seen = tmem::mul(w1, x).value().to_host<double>();  // not recorded: allowed
  };
  step();
  CHECK(seen == std::vector<double>{3.0, 6.0});
  CHECK(w1.grad().to_host<double>() == std::vector<double>{1.5, 0.75});  // d sum(w1 * w2 * x)/dw1 = w2 * x
  CHECK_FALSE(w1.grad_incomplete());
}

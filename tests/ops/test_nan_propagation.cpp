// tests/ops/test_nan_propagation.cpp — a NaN input gives a NaN output, as in PyTorch.
//
// The reference is IEEE arithmetic and PyTorch's documented results: torch.relu(nan) = nan
// (relu is clamp_min(x, 0), and clamp propagates NaN), relu's gradient at a NaN output is
// grad * (result > 0) = 0 (threshold_backward), and sigmoid, tanh, gelu, exp, log, softmax
// and cross-entropy of a row holding a NaN are NaN. An activation that turned NaN into a
// number would hide a diverged forward behind a finite loss.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Var<B> nan_input(Tape<B>& tape, std::vector<double> values, DType dtype, Shape shape = {}) {
  if (shape.rank() == 0) shape = Shape{static_cast<std::int64_t>(values.size())};
  return tape.input(Tensor<B>::from_host(shape, values, dtype), true);
}

}  // namespace

TEST_CASE("relu(NaN) is NaN in every dtype, its gradient there is 0, as PyTorch's", "[ops][nan]") {
  for (DType dtype : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    Tape<B> tape;
    auto x = nan_input(tape, {kNaN, -2.0, 3.0, kInf, -kInf, 0.0}, dtype);
    auto y = relu(x);
    const auto out = y.value().to_host<double>();
    CHECK(std::isnan(out[0]));
    CHECK(out[1] == 0.0);
    CHECK(out[2] == 3.0);
    CHECK(out[3] == kInf);
    CHECK(out[4] == 0.0);
    CHECK(out[5] == 0.0);
    tape.backward(sum(y));
    CHECK(x.grad().to_host<double>() == std::vector<double>{0.0, 0.0, 1.0, 1.0, 0.0, 0.0});
  }
}

TEST_CASE("a NaN input reaches the loss through a relu network", "[ops][nan]") {
  // The reported case: a finite loss while backward filled the weights' gradients with NaN.
  Tape<B> tape;
  nn::Init init(3);
  nn::Linear<B> fc1(4, 8, init), fc2(8, 3, init);
  auto x =
      tape.input(Tensor<B>::from_host(Shape{2, 4}, std::vector<double>{0.5, kNaN, -0.25, 1.0, 0.1, 0.2, 0.3, 0.4}));
  auto labels = Tensor<B>::from_host(Shape{2}, std::vector<double>{1.0, 2.0}, DType::I32);
  auto loss = cross_entropy(fc2(relu(fc1(x))), labels);
  CHECK(std::isnan(loss.value().to_host<double>()[0]));
}

TEST_CASE("the other activations and the row reductions keep a NaN", "[ops][nan]") {
  const std::vector<std::pair<std::string, std::function<Var<B>(const Var<B>&)>>> unary = {
      {"sigmoid", [](const Var<B>& x) { return sigmoid(x); }},
      {"tanh", [](const Var<B>& x) { return trainmem::tanh(x); }},
      {"gelu tanh", [](const Var<B>& x) { return gelu(x, GeluApproximation::Tanh); }},
      {"gelu erf", [](const Var<B>& x) { return gelu(x, GeluApproximation::Erf); }},
      {"exp", [](const Var<B>& x) { return trainmem::exp(x); }},
      {"log", [](const Var<B>& x) { return trainmem::log(x); }},
      {"softmax", [](const Var<B>& x) { return softmax(x); }},
      {"log_softmax", [](const Var<B>& x) { return log_softmax(x); }},
  };
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const auto& [name, op] : unary) {
      CAPTURE(dtype, name);
      Tape<B> tape;
      // Row 0 holds the NaN (first, middle and last columns in turn); row 1 is finite.
      for (std::int64_t at = 0; at < 3; ++at) {
        std::vector<double> values = {0.5, 1.5, 2.5, 0.25, 0.75, 1.25};
        values[static_cast<std::size_t>(at)] = kNaN;
        const auto out = op(nan_input(tape, values, dtype, Shape{2, 3})).value().to_host<double>();
        const bool row_wise = name == "softmax" || name == "log_softmax";
        for (std::int64_t c = 0; c < 3; ++c) {
          const bool nan_expected = row_wise || c == at;
          CHECK(std::isnan(out[static_cast<std::size_t>(c)]) == nan_expected);
          CHECK(std::isfinite(out[static_cast<std::size_t>(3 + c)]));
        }
      }
    }
  }
  Tape<B> tape;
  auto logits = nan_input(tape, {0.5, 1.5, kNaN, 0.25, 0.75, 1.25}, DType::F32, Shape{2, 3});
  auto labels = Tensor<B>::from_host(Shape{2}, std::vector<double>{0.0, 1.0}, DType::I32);
  CHECK(std::isnan(cross_entropy(logits, labels).value().to_host<double>()[0]));
}

// tests/amp/test_scaled_grads.cpp — gradients of a scaled loss are not stepped until divided.
//
// The model is loss = sum(x w) for x [2, 3] and w [3, 2], so dloss/dw[k, j] = sum_i x[i, k]
// (the column sums of x, exact in f16: 2, 1 and -0.5), and SGD's step is w - lr g. With
// the loss scaled by S = 1024, optimizer.step() instead of scaler.step() used to apply
// S g: the masters moved 1024 times too far without a word.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/amp/master_weights.hpp>
#include <trainmem/autocast/autocast.hpp>
#include <trainmem/optim/clip_grad_norm.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

const std::vector<double> kScaledW0 = {0.5, 0.25, -0.5, 1.0, 0.75, -0.25};  // w [3, 2], row-major
const std::vector<double> kColumnSums = {2.0, 1.0, -0.5};                   // of x below
constexpr double kLr = 0.125;
constexpr double kScale = 1024.0;

struct ScaledModel {
  tmem::Var<B> w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{3, 2}, kScaledW0), "w");
  tmem::amp::MasterWeights<B> masters;
  tmem::optim::SGD<B> sgd;
  tmem::amp::GradScaler<B> scaler;

  explicit ScaledModel(DType dtype, bool scale_bf16 = false)
      : masters({w}, {.model_dtype = dtype}),
        sgd({w}, {.lr = kLr}),
        scaler(dtype, {.init_scale = kScale, .scale_bf16 = scale_bf16}) {
    masters.attach(sgd);
  }
  tmem::Var<B> loss(tmem::Tape<B>& tape) const {
    tmem::amp::Autocast guard(w.dtype());
    const auto x = tmem::Tensor<B>::from_host(tmem::Shape{2, 3}, std::vector<double>{0.5, -1, 0.25, 1.5, 2, -0.75});
    return tmem::sum(tmem::matmul(tape.input(x), w));
  }
  /// scaler.scale(loss).backward() over `micro_batches` tapes (gradient accumulation).
  void scaled_backward(int micro_batches = 1) const {
    for (int m = 0; m < micro_batches; ++m) {
      tmem::Tape<B> tape;
      scaler.scale(loss(tape)).backward();
    }
  }
  std::vector<double> master() const { return masters.master(0).to_host<double>(); }
};

/// w - lr * micro_batches * (column sums), the step on the true gradients.
std::vector<double> stepped_once(int micro_batches = 1, double lr = kLr) {
  std::vector<double> out = kScaledW0;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] -= lr * micro_batches * kColumnSums[i / 2];
  return out;
}

}  // namespace

TEST_CASE("optimizer.step() on the gradients of a scaled loss is refused, scaler.step applies them",
          "[amp][scaler][scaled_grads]") {
  for (DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(dtype);
    ScaledModel model(dtype, /*scale_bf16=*/true);
    model.scaled_backward();
    CHECK(model.w.grad_scaled());
    CHECK(model.w.grad().to_host<double>()[0] == kScale * kColumnSums[0]);
    CHECK_THROWS_MATCHES(model.sgd.step(), tmem::Error,
                         tmem::testing::ErrorContains("the gradient of 'w' is still multiplied by the loss scale"));
    CHECK(model.master() == kScaledW0);  // refused before anything changed
    CHECK(model.sgd.steps() == 0);

    CHECK(model.scaler.step(model.sgd));  // divides inside the update
    CHECK(model.master() == stepped_once());
    // Still the scaled gradients (the update divided them on the way): a second plain step is refused too.
    CHECK(model.w.grad_scaled());
    CHECK_THROWS_AS(model.sgd.step(), tmem::Error);
    model.scaler.update();
    model.sgd.zero_grad();
    CHECK_FALSE(model.w.grad_scaled());
  }
}

TEST_CASE("unscale_, clip and step, accumulation over micro-batches, a disabled scaler marks nothing",
          "[amp][scaler][scaled_grads]") {
  SECTION("unscale_ divides the gradients and clears the mark, so a plain step may follow") {
    ScaledModel model(DType::F16);
    model.scaled_backward();
    model.scaler.unscale_(model.sgd);
    CHECK_FALSE(model.w.grad_scaled());
    const double norm = tmem::optim::clip_grad_norm(model.sgd, 100.0);  // no clipping at this norm
    CHECK(norm == Approx(std::sqrt(2.0 * (4.0 + 1.0 + 0.25))));
    model.sgd.step();
    CHECK(model.master() == stepped_once());
  }
  SECTION("two scaled micro-batches: still refused, then scaler.step applies their sum") {
    ScaledModel model(DType::F16);
    model.scaled_backward(2);
    CHECK(model.w.grad().to_host<double>()[0] == 2 * kScale * kColumnSums[0]);
    CHECK_THROWS_AS(model.sgd.step(), tmem::Error);
    CHECK(model.scaler.step(model.sgd));
    CHECK(model.master() == stepped_once(2));
  }
  SECTION("a scaled loss divided further (loss / micro-batches) is still scaled") {
    ScaledModel model(DType::F16);
    tmem::Tape<B> tape;
    tape.backward(tmem::scale(model.scaler.scale(model.loss(tape)), 0.5));
    CHECK(model.w.grad_scaled());
    CHECK_THROWS_AS(model.sgd.step(), tmem::Error);
  }
  SECTION("bf16 with the scaler disabled (its default): the loss is not scaled, the step is plain") {
    ScaledModel model(DType::BF16);
    CHECK_FALSE(model.scaler.is_enabled());
    model.scaled_backward();
    CHECK_FALSE(model.w.grad_scaled());
    model.sgd.step();
    CHECK(model.master() == stepped_once());
  }
  SECTION("a plain backward after zero_grad is stepped as before") {
    ScaledModel model(DType::F16);
    model.scaled_backward();
    model.sgd.zero_grad();
    tmem::Tape<B> tape;
    model.loss(tape).backward();
    CHECK_FALSE(model.w.grad_scaled());
    model.sgd.step();
    CHECK(model.master() == stepped_once());
  }
}

TEST_CASE("allow_scaled_grads: a caller that divides by the scale itself may step scaled gradients",
          "[amp][scaler][scaled_grads]") {
  ScaledModel model(DType::F16);
  model.scaled_backward();
  model.sgd.allow_scaled_grads();
  CHECK(model.sgd.scaled_grads_allowed());
  model.sgd.step(1.0 / kScale);
  CHECK(model.master() == stepped_once());
}

// tests/amp/test_copy_overflow.cpp — a finite master whose 16-bit model copy overflows is an error.
//
// f16's largest finite value is 65504 (values from 65520 up round to inf); bf16's is
// 0x7F7F = 3.3895e38 (from 0x7F7F8000 = 3.3962e38 up rounds to inf). The references are
// those published limits and SGD's update written out (w - lr g), in f64.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/amp/master_weights.hpp>
#include <trainmem/amp/train_step.hpp>
#include <trainmem/optim/adamw.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

tmem::Var<B> overflow_parameter(std::vector<double> values, const char* name) {
  const auto n = static_cast<std::int64_t>(values.size());
  return tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{n}, values), name);
}

void overflow_grad(const tmem::Var<B>& p, std::vector<double> values) {
  p.set_grad(tmem::Tensor<B>::from_host(p.shape(), values, DType::F32, tmem::MemCategory::Gradient));
}

}  // namespace

TEST_CASE("an update that pushes an f16 master past 65504 is an error, and the step is whole",
          "[amp][master][overflow]") {
  auto big = overflow_parameter({65000.0, 1.0, -65000.0, 2.0}, "big");
  auto small = overflow_parameter({0.5, -0.5}, "small");
  tmem::amp::MasterWeights<B> masters({big, small}, {.model_dtype = DType::F16});
  tmem::optim::SGD<B> sgd({big, small}, {.lr = 1.0});
  masters.attach(sgd);
  overflow_grad(big, {-1000.0, 0.25, 1000.0, 0.0});  // masters: 66000, 0.75, -66000, 2
  overflow_grad(small, {0.25, 0.25});

  CHECK_THROWS_MATCHES(sgd.step(), tmem::Error,
                       tmem::testing::ErrorContains("'big': 2 of 4 elements of its f16 copy overflowed to inf"));
  // The step was taken in full (every parameter, in f32), as a device that reports the
  // overflow later would have taken it; only the copies of 66000 are inf.
  CHECK(masters.master(0).to_host<double>() == std::vector<double>{66000.0, 0.75, -66000.0, 2.0});
  CHECK(masters.master(1).to_host<double>() == std::vector<double>{0.25, -0.75});
  const auto copy = big.value().to_host<double>();
  CHECK(copy[0] == std::numeric_limits<double>::infinity());
  CHECK(copy[1] == 0.75);
  CHECK(copy[2] == -std::numeric_limits<double>::infinity());
  CHECK(small.value().to_host<double>() == std::vector<double>{0.25, -0.75});

  // Each step that writes an inf copy says so; one that brings the master back does not.
  overflow_grad(big, {100.0, 0.0, 0.0, 0.0});  // 65900: still beyond f16
  overflow_grad(small, {0.0, 0.0});
  CHECK_THROWS_MATCHES(sgd.step(), tmem::Error, tmem::testing::ErrorContains("'big': 2 of 4 elements"));
  overflow_grad(big, {1000.0, 0.0, -1000.0, 0.0});  // 64900 and -65000: finite in f16
  CHECK_NOTHROW(sgd.step());
  CHECK(big.value().to_host<double>() == std::vector<double>{64896.0, 0.75, -64992.0, 2.0});  // f16 spacing 32
}

TEST_CASE("a copy overflow is found in every update pass: AdamW, bf16, under a loss scaler",
          "[amp][master][overflow]") {
  SECTION("AdamW, f16: the first step moves each weight by lr") {
    auto w = overflow_parameter({65500.0, 3.0}, "w");
    tmem::amp::MasterWeights<B> masters({w}, {.model_dtype = DType::F16});
    tmem::optim::AdamW<B> adamw({w}, {.lr = 100.0, .weight_decay = 0.0});
    masters.attach(adamw);
    overflow_grad(w, {-1.0, 1.0});  // m_hat / sqrt(v_hat) = sign(g): 65600 and -97
    CHECK_THROWS_MATCHES(adamw.step(), tmem::Error, tmem::testing::ErrorContains("'w': 1 of 2 elements"));
    CHECK(masters.master(0).to_host<double>()[0] == Approx(65600.0));
  }
  SECTION("bf16: only within an ulp of f32's largest") {
    auto w = overflow_parameter({3.0e38, 1.0}, "w");
    tmem::amp::MasterWeights<B> masters({w}, {.model_dtype = DType::BF16});
    tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
    masters.attach(sgd);
    overflow_grad(w, {-0.3e38, 0.0});  // 3.3e38: bf16's largest finite is 3.3895e38
    CHECK_NOTHROW(sgd.step());
    overflow_grad(w, {-0.098e38, 0.0});  // 3.398e38: finite in f32, inf in bf16
    CHECK_THROWS_MATCHES(sgd.step(), tmem::Error,
                         tmem::testing::ErrorContains("'w': 1 of 2 elements of its bf16 copy overflowed to inf"));
  }
  SECTION("bf16 with stochastic rounding: f32's largest rounds up to inf with probability 1 - 2^-16") {
    const double w0 = static_cast<double>(3.0e38f), top = static_cast<double>(std::numeric_limits<float>::max());
    auto w = overflow_parameter(std::vector<double>(64, w0), "w");
    tmem::amp::MasterWeights<B> masters({w}, {.model_dtype = DType::BF16, .rounding = tmem::RoundingMode::Stochastic});
    tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
    masters.attach(sgd);
    overflow_grad(w, std::vector<double>(64, w0 - top));  // exact in f32: the master becomes f32's largest
    CHECK_THROWS_MATCHES(sgd.step(), tmem::Error, tmem::testing::ErrorContains("of 64 elements of its bf16 copy"));
    CHECK(masters.master(0).to_host<double>() == std::vector<double>(64, top));
  }
  SECTION("f16 under GradScaler::step: the scaled gradient is divided, then the copy overflows") {
    auto w = overflow_parameter({65000.0, 1.0}, "w");
    tmem::amp::MasterWeights<B> masters({w}, {.model_dtype = DType::F16});
    tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
    masters.attach(sgd);
    tmem::amp::GradScaler<B> scaler({.init_scale = 1024.0});
    overflow_grad(w, {-1000.0 * 1024.0, 0.0});  // as backward of a loss scaled by 1024 leaves it
    CHECK_THROWS_MATCHES(scaler.step(sgd), tmem::Error, tmem::testing::ErrorContains("'w': 1 of 2 elements"));
    CHECK(masters.master(0).to_host<double>() == std::vector<double>{66000.0, 1.0});
    CHECK_NOTHROW(scaler.update());  // the step was taken: it counts for the scale's rule
  }
  SECTION("TrainStep f16: the error comes after a finished step, and the next step runs") {
    auto w = overflow_parameter({65000.0, 1.0}, "w");
    tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
    tmem::amp::TrainStep<B> train(sgd, {.precision = DType::F16, .scaler = {.init_scale = 1.0}});
    const auto step = [&](double x0) {  // loss = w . x: the gradient is x
      tmem::Tape<B> tape;
      return train.run([&] {
        return tmem::sum(tmem::mul(
            w, tape.input(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{x0, 0.0}, DType::F16))));
      });
    };
    CHECK_THROWS_MATCHES(step(-1000.0), tmem::Error, tmem::testing::ErrorContains("'w': 1 of 2 elements"));
    CHECK(train.master_weights()->master(0).to_host<double>() == std::vector<double>{66000.0, 1.0});
    CHECK(step(2000.0).stepped);  // 64000: finite again
    CHECK(w.value().to_host<double>() == std::vector<double>{64000.0, 1.0});
  }
  SECTION("a master that is already inf or NaN is not an overflow of the copy") {
    auto w = overflow_parameter({1.0, 2.0}, "w");
    tmem::amp::MasterWeights<B> masters({w}, {.model_dtype = DType::F16});
    tmem::optim::SGD<B> sgd({w}, {.lr = 1.0});
    masters.attach(sgd);
    overflow_grad(w, {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()});
    CHECK_NOTHROW(sgd.step());  // non-finite gradients are the loss scaler's to catch
    CHECK(std::isinf(masters.master(0).to_host<double>()[0]));
  }
}

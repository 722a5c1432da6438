// tests/reliability/test_loss_scale_bounds.cpp — the loss scale stays in [min normal f32, max f32].
//
// A scale that reaches 0 or inf in f32 turns the optimizer's division into NaN or
// skips every later step. Each case here drives the scaler to the edge of f32's range
// and checks against closed forms: 2^-126 is the smallest normal f32, (2 - 2^-23) 2^127
// the largest.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <trainmem/amp/grad_scaler.hpp>
#include <trainmem/amp/master_weights.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

constexpr double kMinNormal = 0x1p-126;
constexpr double kMaxF32 = 3.4028234663852886e38;

/// One f16 weight vector with f32 masters; loss = sum(w x), so the gradient is x.
struct OneLayer {
  B backend;
  tmem::Var<B> w =
      tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{4}, std::vector<double>{0.5, -0.25, 1.0, 2.0},
                                                         DType::F16, tmem::MemCategory::Parameter, backend),
                              "w");
  tmem::amp::MasterWeights<B> masters{{w}, {.model_dtype = DType::F16}};
  tmem::optim::SGD<B> sgd{{w}, {.lr = 0.1}};
  OneLayer() { masters.attach(sgd); }

  /// Backward of scaler.scale(sum(w * x)); x = inf makes the gradient overflow.
  void backward(tmem::amp::GradScaler<B>& scaler, double x_value) {
    tmem::Tape<B> tape(backend);
    auto x = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{4}, std::vector<double>(4, x_value), DType::F16,
                                                   tmem::MemCategory::Temporary, backend));
    auto loss = tmem::sum(tmem::mul(w, x));
    scaler.scale(loss).backward();
  }
  std::vector<double> values() const { return w.value().to_host<double>(); }
};

bool all_finite(const std::vector<double>& v) {
  for (double x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

TEST_CASE("loss scale: a configured scale outside f32's normal range is an error", "[reliability][scaler]") {
  using tmem::testing::ErrorContains;
  CHECK_THROWS_MATCHES(tmem::amp::GradScaler<B>(DType::F16, {.init_scale = 1e-50}), tmem::Error,
                       ErrorContains("init_scale"));
  CHECK_THROWS_MATCHES(tmem::amp::GradScaler<B>(DType::F16, {.init_scale = 1e39}), tmem::Error,
                       ErrorContains("init_scale"));
  CHECK_THROWS_AS(tmem::amp::GradScaler<B>(DType::F16, {.min_scale = 1e-40}), tmem::Error);  // subnormal in f32
  CHECK_THROWS_AS(tmem::amp::GradScaler<B>(DType::F16, {.max_scale = 1e39}), tmem::Error);
  CHECK_NOTHROW(tmem::amp::GradScaler<B>(DType::F16, {.init_scale = kMinNormal}));
  CHECK_NOTHROW(tmem::amp::GradScaler<B>(DType::F16, {.init_scale = kMaxF32}));

  tmem::amp::GradScaler<B> scaler(DType::F16, {});
  CHECK_THROWS_AS(scaler.update(1e-50), tmem::Error);
  CHECK_THROWS_AS(scaler.update(1e39), tmem::Error);
}

TEST_CASE("loss scale: a loaded scale outside f32's normal range is an error", "[reliability][scaler]") {
  tmem::amp::GradScaler<B> scaler(DType::F16, {});
  for (double bad : {1e39, 1e-50, 1e-40}) {
    tmem::amp::GradScalerState state = scaler.state();
    state.scale = bad;
    CAPTURE(bad);
    CHECK_THROWS_MATCHES(scaler.load_state(state), tmem::Error, tmem::testing::ErrorContains("scale"));
    CHECK_THROWS_AS(tmem::amp::GradScalerState::from_string(state.to_string()), tmem::Error);
  }
  CHECK(scaler.get_scale() == 65536.0);
}

TEST_CASE("loss scale: 200 overflows in a row floor at the smallest normal f32, the next clean step is finite",
          "[reliability][scaler]") {
  OneLayer m;
  tmem::amp::GradScaler<B> scaler(DType::F16, {}, m.backend);
  const double inf = std::numeric_limits<double>::infinity();
  for (int step = 0; step < 200; ++step) {
    m.backward(scaler, inf);
    REQUIRE_FALSE(scaler.step(m.sgd));
    scaler.update();
    m.sgd.zero_grad();
    REQUIRE(scaler.get_scale() >= kMinNormal);
  }
  CHECK(scaler.get_scale() == kMinNormal);
  // A clean step: the gradient x * 2^-126 flushes to 0 in f16, so SGD divides 0 by the
  // scale and leaves every weight as it was (a scale of 0 would make that 0/0 = NaN).
  const std::vector<double> before = m.values();
  m.backward(scaler, 1.0);
  CHECK(scaler.step(m.sgd));
  scaler.update();
  const std::vector<double> after = m.values();
  REQUIRE(all_finite(after));
  CHECK(after == before);
  REQUIRE(all_finite(m.masters.master(0).to_host<double>()));
}

TEST_CASE("loss scale: the rule floors a backoff at the smallest normal f32 even with min_scale 0",
          "[reliability][scaler]") {
  tmem::ScaleUpdateArgs args;
  args.min_scale = 0.0f;
  float scale = static_cast<float>(kMinNormal);
  std::int32_t tracker = 0, hysteresis_left = 1;
  tmem::update_scale_state(scale, tracker, hysteresis_left, true, args);
  CHECK(static_cast<double>(scale) == kMinNormal);
}

TEST_CASE("loss scale: a growth tracker at INT32_MAX grows the scale without signed overflow",
          "[reliability][scaler]") {
  tmem::ScaleUpdateArgs args;  // interval 2000
  float scale = 1024.0f;
  std::int32_t tracker = std::numeric_limits<std::int32_t>::max(), hysteresis_left = 1;
  tmem::update_scale_state(scale, tracker, hysteresis_left, false, args);
  CHECK(scale == 2048.0f);
  CHECK(tracker == 0);
}

TEST_CASE("loss scale: a scale tensor overwritten with inf, NaN or 0 never reaches an update",
          "[reliability][scaler]") {
  for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 0.0}) {
    CAPTURE(bad);
    OneLayer m;
    tmem::amp::GradScaler<B> scaler(DType::F16, {}, m.backend);
    m.backward(scaler, 1.0);
    scaler.scale_tensor().copy_from(tmem::Tensor<B>::from_host(tmem::Shape{}, std::vector<double>{bad}, DType::F32,
                                                               tmem::MemCategory::Temporary, m.backend));
    const std::vector<double> before = m.values();
    const auto master_before = m.masters.master(0).to_host<double>();
    CHECK_THROWS_AS(scaler.step(m.sgd), tmem::Error);
    CHECK(m.values() == before);
    CHECK(m.masters.master(0).to_host<double>() == master_before);
  }
}

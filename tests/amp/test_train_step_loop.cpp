// tests/amp/test_train_step_loop.cpp — amp::TrainStep's loop (micro-batches, clipping, an
// LR schedule) against the same loop written with the pieces.
//
// Reference: the hand-written loop a user writes without TrainStep: the optimizer's lr set
// from LrSchedule::lr(step) for the loop's step (skipped steps included), two micro-batches
// each recorded on a new tape with the loss times 1/2, autocast and f32 masters by hand,
// scaler.scale(loss).backward(), scaler.unscale_, optim::clip_grad_norm, scaler.step,
// scaler.update, zero_grad. Compared bit for bit: losses, norms, rates, stepped flags,
// parameters, masters and the loss scale, in f32, bf16 and f16 (with a poisoned step that
// the scaler skips); and a run saved part way and resumed in new objects.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "error_matchers.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace train_step_loop {

constexpr int kSteps = 6, kMicro = 2, kPoisonedStep = 2;
constexpr double kClip = 0.25;

tmem::optim::LrSchedule schedule() { return tmem::optim::LrSchedule::warmup_cosine(2e-2, 2, kSteps, 1e-3); }

/// Two-layer classifier with two fixed micro-batches; each instance starts from the same weights.
struct Model {
  static constexpr std::int64_t kBatch = 4, kIn = 5, kHidden = 7, kClasses = 3;

  Model()
      : w1(param(tmem::Shape{kHidden, kIn}, 1, "w1")),
        b1(param(tmem::Shape{kHidden}, 2, "b1")),
        w2(param(tmem::Shape{kClasses, kHidden}, 3, "w2")),
        b2(param(tmem::Shape{kClasses}, 4, "b2")),
        x{tmem::testing::random_tensor<B>(tmem::Shape{kBatch, kIn}, 10, -2.0, 2.0, DType::F32),
          tmem::testing::random_tensor<B>(tmem::Shape{kBatch, kIn}, 11, -2.0, 2.0, DType::F32)},
        labels{tmem::testing::int_tensor<B>(tmem::Shape{kBatch}, {0, 2, 1, 1}),
               tmem::testing::int_tensor<B>(tmem::Shape{kBatch}, {2, 0, 0, 1})} {}

  static tmem::Var<B> param(tmem::Shape shape, std::uint64_t seed, const char* name) {
    return tmem::Var<B>::parameter(tmem::testing::random_tensor<B>(std::move(shape), seed, -1.0, 1.0, DType::F32),
                                   name);
  }
  std::vector<tmem::Var<B>> params() const { return {w1, b1, w2, b2}; }

  /// Micro-batch `micro`'s loss; `poison` adds sum(w2 * inf) somewhere, so w2's gradient holds an inf.
  tmem::Var<B> loss(tmem::Tape<B>& tape, int micro, bool poison) const {
    const auto h = tmem::relu(tmem::linear(tape.input(x[micro]), w1, b1));
    tmem::Var<B> loss = tmem::cross_entropy(tmem::linear(h, w2, b2), labels[micro]);
    if (!poison) return loss;
    std::vector<double> factor(static_cast<std::size_t>(w2.numel()), 0.0);
    factor[4] = std::numeric_limits<double>::infinity();
    return tmem::add(loss, tmem::sum(tmem::mul(w2, tape.input(tmem::Tensor<B>::from_host(w2.shape(), factor)))));
  }

  tmem::Var<B> w1, b1, w2, b2;
  tmem::Tensor<B> x[kMicro], labels[kMicro];
};

std::vector<std::uint32_t> bits(const std::vector<tmem::Var<B>>& params) {
  std::vector<std::uint32_t> out;
  for (const auto& p : params)
    for (float v : p.value().to_host<float>()) out.push_back(std::bit_cast<std::uint32_t>(v));
  return out;
}
std::vector<std::uint32_t> bits(const std::vector<tmem::Tensor<B>>& tensors) {
  std::vector<std::uint32_t> out;
  for (const auto& t : tensors)
    for (float v : t.to_host<float>()) out.push_back(std::bit_cast<std::uint32_t>(v));
  return out;
}
std::uint64_t bits(double v) { return std::bit_cast<std::uint64_t>(v); }

tmem::amp::GradScalerOptions scaler_options() { return {.init_scale = 1024.0, .growth_interval = 2}; }

/// What one step of either loop reports.
struct Step {
  double loss = 0.0, lr = 0.0, norm = 0.0;
  bool stepped = true;
};

/// The loop with the pieces.
struct HandLoop {
  explicit HandLoop(DType dtype)
      : dtype(dtype), optimizer(model.params(), {.lr = 1.0, .weight_decay = 0.1}), scaler(dtype, scaler_options()) {
    if (tmem::is_16bit(dtype)) {
      masters.emplace(model.params(), tmem::amp::MasterWeightsOptions{.model_dtype = dtype});
      masters->attach(optimizer);
    }
  }

  Step step(int k, bool poison) {
    Step out;
    out.lr = optimizer.options().lr = schedule().lr(k);
    float loss_sum = 0.0f;
    for (int micro = 0; micro < kMicro; ++micro) {
      tmem::Tape<B> tape;
      tmem::Var<B> loss;
      {
        tmem::amp::Autocast autocast(tmem::is_16bit(dtype) ? dtype : DType::BF16, tmem::is_16bit(dtype));
        loss = model.loss(tape, micro, poison && micro == 1);
      }
      loss = tmem::scale(loss, 1.0 / kMicro);
      const float value = loss.value().to_host<float>()[0];
      loss_sum = micro == 0 ? value : loss_sum + value;
      scaler.scale(loss).backward();
    }
    out.loss = loss_sum;
    scaler.unscale_(optimizer);
    out.norm = tmem::optim::clip_grad_norm(optimizer, kClip);
    out.stepped = scaler.step(optimizer);
    scaler.update();
    optimizer.zero_grad();
    return out;
  }

  DType dtype;
  Model model;
  tmem::optim::AdamW<B> optimizer;
  std::optional<tmem::amp::MasterWeights<B>> masters;
  tmem::amp::GradScaler<B> scaler;
};

/// The same loop through TrainStep::run.
struct Helped {
  explicit Helped(DType dtype)
      : optimizer(model.params(), {.lr = 1.0, .weight_decay = 0.1}),
        train(optimizer, {.precision = dtype,
                          .scaler = scaler_options(),
                          .micro_batches = kMicro,
                          .clip_grad_norm = kClip,
                          .schedule = schedule()}) {}

  Step step(bool poison) {
    const tmem::amp::StepReport<B> report =
        train.run([&](int micro) { return model.loss(tape, micro, poison && micro == 1); });
    REQUIRE(report.grad_norm.has_value());
    return {report.loss_value(), report.lr, *report.grad_norm, report.stepped};
  }

  Model model;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> train;
  tmem::Tape<B> tape;  // one tape: run() clears it after each micro-batch's backward
};

void check_same(const Step& hand, const Step& helped) {
  CHECK(hand.stepped == helped.stepped);
  CHECK(bits(hand.loss) == bits(helped.loss));
  CHECK(bits(hand.lr) == bits(helped.lr));
  CHECK(bits(hand.norm) == bits(helped.norm));
}

std::vector<tmem::Tensor<B>> masters_of(const HandLoop& hand) {
  return hand.masters ? hand.masters->masters() : std::vector<tmem::Tensor<B>>{};
}
std::vector<tmem::Tensor<B>> masters_of(const Helped& helped) {
  return helped.train.master_weights() ? helped.train.master_weights()->masters() : std::vector<tmem::Tensor<B>>{};
}

TEST_CASE("TrainStep with 2 micro-batches, clipping and warm-up + cosine: the hand-written loop, bit for bit",
          "[amp][train_step]") {
  const DType dtype = GENERATE(DType::F32, DType::BF16, DType::F16);
  CAPTURE(dtype);
  HandLoop hand(dtype);
  Helped helped(dtype);
  const bool scaling = dtype == DType::F16;
  REQUIRE(helped.train.scaler().is_enabled() == scaling);

  int clipped = 0;
  for (int k = 0; k < kSteps; ++k) {
    CAPTURE(k);
    const bool poison = scaling && k == kPoisonedStep;
    const Step by_hand = hand.step(k, poison);
    const Step by_train = helped.step(poison);
    check_same(by_hand, by_train);
    CHECK(by_train.stepped == !poison);
    CHECK(by_train.lr == schedule().lr(k));  // a skipped step advances the schedule too
    if (by_train.stepped && by_train.norm > kClip) ++clipped;
    CHECK(bits(helped.model.params()) == bits(hand.model.params()));
    CHECK(bits(masters_of(helped)) == bits(masters_of(hand)));
    CHECK(helped.train.scale() == hand.scaler.get_scale());
    for (const auto& p : helped.model.params()) CHECK_FALSE(p.grad().defined());
  }
  CHECK(clipped >= 2);  // the clipping was not a no-op
  CHECK(helped.train.step_count() == kSteps);
  CHECK(helped.train.skipped_steps() == (scaling ? 1 : 0));
  CHECK(bits(helped.model.params()) != bits(Model().params()));
}

TEST_CASE("TrainStep's phases with the loss divided by hand: the same step as run()", "[amp][train_step]") {
  const DType dtype = GENERATE(DType::F32, DType::F16);
  CAPTURE(dtype);
  Helped by_run(dtype), by_phases(dtype);
  for (int k = 0; k < kSteps; ++k) {
    const Step ran = by_run.step(false);
    for (int micro = 0; micro < kMicro; ++micro) {
      tmem::Tape<B> tape;
      const tmem::Var<B> loss = by_phases.train.forward([&] { return by_phases.model.loss(tape, micro, false); });
      by_phases.train.backward(tmem::scale(loss, 1.0 / kMicro));
    }
    CHECK(by_phases.train.update());
    CHECK(bits(*by_phases.train.last_grad_norm()) == bits(ran.norm));
    CHECK(bits(by_phases.train.last_lr()) == bits(ran.lr));
  }
  CHECK(bits(by_phases.model.params()) == bits(by_run.model.params()));
}

TEST_CASE("TrainStep saved part way and resumed in new objects: the uninterrupted run, bit for bit",
          "[amp][train_step][state]") {
  const DType dtype = GENERATE(DType::BF16, DType::F16);
  CAPTURE(dtype);
  const auto path =
      std::filesystem::temp_directory_path() / ("trainmem_train_step_loop_" + std::to_string(::getpid()) + ".tmstate");
  const auto poisoned = [&](int k) { return dtype == DType::F16 && k == kPoisonedStep; };

  Helped whole(dtype);
  for (int k = 0; k < kSteps; ++k) whole.step(poisoned(k));

  std::vector<Step> resumed_steps;
  {
    Helped first(dtype);
    for (int k = 0; k < kSteps / 2; ++k) first.step(poisoned(k));
    tmem::save(path, {{"w1", first.model.w1},
                      {"b1", first.model.b1},
                      {"w2", first.model.w2},
                      {"b2", first.model.b2},
                      {"optimizer", first.optimizer},
                      {"train", first.train}});
  }
  Helped second(dtype);
  tmem::load(path, {{"w1", second.model.w1},
                    {"b1", second.model.b1},
                    {"w2", second.model.w2},
                    {"b2", second.model.b2},
                    {"optimizer", second.optimizer},
                    {"train", second.train}});
  std::filesystem::remove(path);
  CHECK(second.train.step_count() == kSteps / 2);
  CHECK(second.train.skipped_steps() == (dtype == DType::F16 ? 1 : 0));
  for (int k = kSteps / 2; k < kSteps; ++k) {
    const Step s = second.step(poisoned(k));
    CHECK(bits(s.lr) == bits(schedule().lr(k)));  // the schedule goes on from the saved step
  }
  CHECK(bits(second.model.params()) == bits(whole.model.params()));
  CHECK(bits(masters_of(second)) == bits(masters_of(whole)));
  CHECK(second.train.scale() == whole.train.scale());
}

TEST_CASE("TrainStep: micro_batches below 1 or a negative or non-finite clip norm is refused",
          "[amp][train_step][errors]") {
  Model model;
  tmem::optim::SGD<B> optimizer(model.params(), {.lr = 0.1});
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(optimizer, {.micro_batches = 0}), tmem::Error,
                       tmem::testing::ErrorContains("amp::TrainStep: micro_batches must be >= 1, got 0"));
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(optimizer, {.clip_grad_norm = -1.0}), tmem::Error,
                       tmem::testing::ErrorContains("amp::TrainStep: clip_grad_norm must be finite and >= 0"));
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(optimizer, {.clip_grad_norm = std::numeric_limits<double>::infinity()}),
                       tmem::Error,
                       tmem::testing::ErrorContains("amp::TrainStep: clip_grad_norm must be finite and >= 0"));
}

}  // namespace train_step_loop

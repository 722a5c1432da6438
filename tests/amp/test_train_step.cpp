// tests/amp/test_train_step.cpp — amp::TrainStep against the steps written out by hand.
//
// References: for f32 and bf16 the same model trained by the hand-written step the
// helper replaces (autocast, master weights, backward, optimizer step, zeroed
// gradients), compared bit for bit; for f16 the loss-scale rule in closed form
// (growth x2 after `growth_interval` clean steps, backoff x0.5 on an overflow).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "error_matchers.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

/// Two-layer classifier on a fixed batch; each instance starts from the same weights.
struct Model {
  static constexpr std::int64_t kBatch = 6, kIn = 5, kHidden = 7, kClasses = 3;

  Model()
      : w1(param(tmem::Shape{kHidden, kIn}, 1, "w1")),
        b1(param(tmem::Shape{kHidden}, 2, "b1")),
        w2(param(tmem::Shape{kClasses, kHidden}, 3, "w2")),
        b2(param(tmem::Shape{kClasses}, 4, "b2")),
        x(tmem::testing::random_tensor<B>(tmem::Shape{kBatch, kIn}, 10, -1.0, 1.0, DType::F32)),
        labels(tmem::testing::int_tensor<B>(tmem::Shape{kBatch}, {0, 2, 1, 1, 0, 2})) {}

  static tmem::Var<B> param(tmem::Shape shape, std::uint64_t seed, const char* name) {
    tmem::Tensor<B> value = tmem::testing::random_tensor<B>(std::move(shape), seed, -0.5, 0.5, DType::F32);
    return tmem::Var<B>::parameter(value, name);
  }
  std::vector<tmem::Var<B>> params() const { return {w1, b1, w2, b2}; }

  tmem::Var<B> loss(tmem::Tape<B>& tape) const {
    const auto h = tmem::relu(tmem::linear(tape.input(x), w1, b1));
    return tmem::cross_entropy(tmem::linear(h, w2, b2), labels);
  }

  tmem::Var<B> w1, b1, w2, b2;
  tmem::Tensor<B> x, labels;
};

/// Every parameter's value bits (model copies: 16-bit values widen to f32 exactly).
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

constexpr int kSteps = 4;

/// The step TrainStep replaces, written out: a forward under bf16 autocast, backward,
/// the optimizer step, zeroed gradients.
void hand_bf16_step(const Model& model, tmem::optim::Optimizer<B>& optimizer) {
  tmem::Tape<B> tape;
  tmem::Var<B> loss;
  {
    tmem::amp::Autocast autocast(DType::BF16);
    loss = model.loss(tape);
  }
  tape.backward(loss);
  optimizer.step();
  optimizer.zero_grad();
}

}  // namespace

TEST_CASE("TrainStep f32: the same parameters, bit for bit, as the hand-written step", "[amp][train_step]") {
  Model by_hand, helped;
  tmem::optim::AdamW<B> hand_optimizer(by_hand.params(), {.lr = 1e-2, .weight_decay = 0.1});
  tmem::optim::AdamW<B> optimizer(helped.params(), {.lr = 1e-2, .weight_decay = 0.1});
  tmem::amp::TrainStep<B> train(optimizer);
  REQUIRE_FALSE(train.scaler().is_enabled());
  REQUIRE_FALSE(train.master_weights().has_value());

  for (int step = 0; step < kSteps; ++step) {
    double hand_loss = 0.0;
    {
      tmem::Tape<B> tape;
      const tmem::Var<B> loss = by_hand.loss(tape);
      hand_loss = loss.value().to_host<double>()[0];
      tape.backward(loss);
      hand_optimizer.step();
      hand_optimizer.zero_grad();
    }
    tmem::Tape<B> tape;
    const tmem::amp::StepReport<B> report = train.run([&] { return helped.loss(tape); });
    CHECK(report.stepped);
    CHECK(std::bit_cast<std::uint64_t>(report.loss_value()) == std::bit_cast<std::uint64_t>(hand_loss));
    for (const auto& p : helped.params()) CHECK_FALSE(p.grad().defined());  // zeroed for the next step
  }
  CHECK(bits(helped.params()) == bits(by_hand.params()));
  CHECK(bits(helped.params()) != bits(Model().params()));  // and the steps did move them
  CHECK(train.scale() == 1.0);
  CHECK(train.skipped_steps() == 0);
}

TEST_CASE("TrainStep bf16: the hand-written bf16 step with f32 master weights, bit for bit", "[amp][train_step]") {
  Model by_hand, helped;
  tmem::optim::AdamW<B> hand_optimizer(by_hand.params(), {.lr = 1e-2});
  tmem::amp::MasterWeights<B> hand_masters(by_hand.params(), {.model_dtype = DType::BF16});
  hand_masters.attach(hand_optimizer);
  tmem::optim::AdamW<B> optimizer(helped.params(), {.lr = 1e-2});
  tmem::amp::TrainStep<B> train(optimizer, {.precision = DType::BF16});
  REQUIRE(train.master_weights().has_value());
  REQUIRE_FALSE(train.scaler().is_enabled());  // bf16 has f32's exponent range
  for (const auto& p : helped.params()) CHECK(p.dtype() == DType::BF16);

  for (int step = 0; step < kSteps; ++step) {
    hand_bf16_step(by_hand, hand_optimizer);
    tmem::Tape<B> tape;
    CHECK(train.run([&] { return helped.loss(tape); }).stepped);
  }
  CHECK(bits(helped.params()) == bits(by_hand.params()));                          // bf16 model copies
  CHECK(bits(train.master_weights()->masters()) == bits(hand_masters.masters()));  // f32 masters
  CHECK(bits(train.master_weights()->masters()) != bits(Model().params()));
}

TEST_CASE("TrainStep bf16 without master weights: f32 parameters, autocast forward only", "[amp][train_step]") {
  Model by_hand, helped;
  tmem::optim::SGD<B> hand_optimizer(by_hand.params(), {.lr = 0.1});
  tmem::optim::SGD<B> optimizer(helped.params(), {.lr = 0.1});
  tmem::amp::TrainStep<B> train(optimizer, {.precision = DType::BF16, .master_weights = false});
  CHECK_FALSE(train.master_weights().has_value());
  for (int step = 0; step < kSteps; ++step) {
    hand_bf16_step(by_hand, hand_optimizer);
    tmem::Tape<B> tape;
    train.run([&] { return helped.loss(tape); });
  }
  for (const auto& p : helped.params()) CHECK(p.dtype() == DType::F32);
  CHECK(bits(helped.params()) == bits(by_hand.params()));
}

TEST_CASE("TrainStep f16: an inf gradient skips the step and backs the scale off, clean steps grow it",
          "[amp][train_step]") {
  constexpr double kInit = 1024.0;
  Model model;
  tmem::optim::AdamW<B> optimizer(model.params(), {.lr = 1e-2});
  tmem::amp::TrainStep<B> train(optimizer,
                                {.precision = DType::F16, .scaler = {.init_scale = kInit, .growth_interval = 2}});
  REQUIRE(train.scaler().is_enabled());
  for (const auto& p : model.params()) CHECK(p.dtype() == DType::F16);

  // A forward whose loss is finite or, with `poison`, multiplies w2 by inf somewhere:
  // w2's gradient then holds an inf (and the loss is not finite).
  const auto run = [&](bool poison) {
    tmem::Tape<B> tape;
    return train.run([&] {
      tmem::Var<B> loss = model.loss(tape);
      if (!poison) return loss;
      std::vector<double> factor(static_cast<std::size_t>(model.w2.numel()), 0.0);
      factor[4] = std::numeric_limits<double>::infinity();
      const auto inf = tape.input(tmem::Tensor<B>::from_host(model.w2.shape(), factor, DType::F32));
      return tmem::add(loss, tmem::sum(tmem::mul(model.w2, inf)));
    });
  };
  const auto master_bits = [&] { return bits(train.master_weights()->masters()); };

  // Clean step 1: steps; the scale is kept (1 of growth_interval = 2 clean steps).
  auto before = master_bits();
  auto report = run(false);
  CHECK(report.stepped);
  CHECK(std::isfinite(report.loss_value()));
  CHECK(master_bits() != before);
  CHECK(train.scale() == kInit);
  CHECK(train.scaler().growth_tracker() == 1);

  // Clean step 2: steps; the second clean step in a row doubles the scale.
  report = run(false);
  CHECK(report.stepped);
  CHECK(train.scale() == 2.0 * kInit);
  CHECK(train.scaler().growth_tracker() == 0);

  // Overflow: no parameter, master or model copy changes; the scale halves.
  before = master_bits();
  const auto model_before = bits(model.params());
  report = run(true);
  CHECK_FALSE(report.stepped);
  CHECK_FALSE(std::isfinite(report.loss_value()));
  CHECK(master_bits() == before);
  CHECK(bits(model.params()) == model_before);
  CHECK(train.scale() == kInit);
  CHECK(train.skipped_steps() == 1);
  for (const auto& p : model.params()) CHECK_FALSE(p.grad().defined());  // zeroed after a skip too

  // And training goes on from there.
  report = run(false);
  CHECK(report.stepped);
  CHECK(master_bits() != before);
  CHECK(train.scale() == kInit);
  CHECK(train.skipped_steps() == 1);
}

TEST_CASE("TrainStep: a precision other than f32, bf16 or f16 is refused", "[amp][train_step]") {
  Model model;
  tmem::optim::SGD<B> optimizer(model.params(), {.lr = 0.1});
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(optimizer, {.precision = DType::F64}), tmem::Error,
                       tmem::testing::ErrorContains("amp::TrainStep: the precision must be f32, bf16 or f16, got f64"));
  for (const auto& p : model.params()) CHECK(p.dtype() == DType::F32);  // nothing was converted
}

TEST_CASE("TrainStep: a second one over the same optimizer, or one after a step, changes nothing",
          "[amp][train_step][errors]") {
  Model model;
  tmem::optim::AdamW<B> optimizer(model.params(), {.lr = 0.01});
  tmem::amp::TrainStep<B> train(optimizer, {.precision = DType::BF16});
  tmem::Tape<B> tape;
  REQUIRE(train.run([&] { return model.loss(tape); }).stepped);
  const auto masters = bits(train.master_weights()->masters());
  const auto copies = bits(model.params());
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(optimizer, {.precision = DType::BF16}), tmem::Error,
                       tmem::testing::ErrorContains("'w1' has a master already"));
  CHECK(bits(train.master_weights()->masters()) == masters);  // not replaced by bf16-rounded ones
  CHECK(bits(model.params()) == copies);
  for (std::size_t i = 0; i < optimizer.entries().size(); ++i)
    CHECK(optimizer.entries()[i].master.same_storage(train.master_weights()->master(i)));

  // An f32 optimizer that has stepped: its parameters stay f32.
  Model other;
  tmem::optim::SGD<B> stepped(other.params(), {.lr = 0.1});
  {
    tmem::Tape<B> tape;
    tape.backward(other.loss(tape));
  }
  stepped.step();
  CHECK_THROWS_MATCHES(tmem::amp::TrainStep<B>(stepped, {.precision = DType::F16}), tmem::Error,
                       tmem::testing::ErrorContains("'w1' has been stepped already"));
  for (const auto& p : other.params()) CHECK(p.dtype() == DType::F32);
}

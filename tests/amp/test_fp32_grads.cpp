// tests/amp/test_fp32_grads.cpp — gradients of 16-bit model copies summed in f32
// (MasterWeightsOptions::fp32_grads, Megatron's "main grad").
//
// The reference is summing by hand: each micro-batch's gradient computed alone (a fresh
// backward of a model with 16-bit gradients), widened to f32 on the host and added in f32
// in the order the micro-batches ran. The f32-summed .grad must be that sum bit for bit;
// the default 16-bit .grad, which rounds at every add, must not be.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include <trainmem/amp/master_weights.hpp>
#include <trainmem/amp/train_step.hpp>
#include <trainmem/optim/adamw.hpp>
#include <trainmem/optim/clip_grad_norm.hpp>
#include <trainmem/trainmem.hpp>

#include "error_matchers.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::MemCategory;

namespace {

constexpr std::int64_t kIn = 24, kHidden = 40, kOut = 8, kRows = 16;
constexpr int kMicroBatches = 4;

/// 24-40-8 MLP with tanh, f32 at first; `masters` makes it 16-bit copies of f32 masters.
struct Net {
  explicit Net(DType model_dtype = DType::BF16, bool fp32_grads = false)
      : init(11), fc1(kIn, kHidden, init, true, DType::F32, "fc1"), fc2(kHidden, kOut, init, true, DType::F32, "fc2") {
    masters = std::make_unique<tmem::amp::MasterWeights<B>>(
        params(), tmem::amp::MasterWeightsOptions{.model_dtype = model_dtype, .fp32_grads = fp32_grads});
  }
  std::vector<tmem::Var<B>> params() const {
    std::vector<tmem::Var<B>> ps = fc1.parameters();
    for (const auto& p : fc2.parameters()) ps.push_back(p);
    return ps;
  }
  std::int64_t numel() const {
    std::int64_t n = 0;
    for (const auto& p : params()) n += p.numel();
    return n;
  }
  /// Loss of micro-batch k: cross-entropy against closed-form labels, under autocast.
  tmem::Var<B> loss(tmem::Tape<B>& tape, int k, DType autocast) const {
    std::vector<double> x;
    std::vector<std::int32_t> y;
    for (std::int64_t i = 0; i < kRows * kIn; ++i) x.push_back(std::sin(0.37 * static_cast<double>(i) + 1.3 * k));
    for (std::int64_t r = 0; r < kRows; ++r) y.push_back(static_cast<std::int32_t>((3 * r + k) % kOut));
    auto input = tape.input(tmem::Tensor<B>::from_host({kRows, kIn}, x));
    const auto labels = tmem::Tensor<B>::from_host({kRows}, y, DType::I32);
    tmem::amp::Autocast guard(autocast);
    return tmem::cross_entropy(fc2(tmem::tanh(fc1(input))), labels);
  }
  void backward(int k, DType autocast = DType::BF16) const {
    tmem::Tape<B> tape;
    tape.backward(loss(tape, k, autocast));
  }
  /// Every parameter's .grad widened to f32 on the host, in parameter order.
  std::vector<std::vector<float>> grads() const {
    std::vector<std::vector<float>> out;
    for (const auto& p : params()) out.push_back(p.grad().to_host<float>());
    return out;
  }

  tmem::nn::Init init;
  tmem::nn::Linear<B> fc1, fc2;
  std::unique_ptr<tmem::amp::MasterWeights<B>> masters;
};

/// The hand sum: micro-batch k's 16-bit gradient computed alone, widened, added in f32 in order.
std::vector<std::vector<float>> hand_sum(DType model_dtype, DType autocast) {
  Net alone(model_dtype, false);
  std::vector<std::vector<float>> sum;
  for (int k = 0; k < kMicroBatches; ++k) {
    for (const auto& p : alone.params()) p.zero_grad();
    alone.backward(k, autocast);
    for (const auto& p : alone.params()) REQUIRE(p.grad().dtype() == model_dtype);
    const auto g = alone.grads();  // 16-bit values, exact in f32
    if (k == 0) {
      sum = g;
      continue;
    }
    for (std::size_t i = 0; i < sum.size(); ++i)
      for (std::size_t j = 0; j < sum[i].size(); ++j) sum[i][j] += g[i][j];  // f32 adds, in order
  }
  return sum;
}

std::vector<tmem::Tensor<B>> as_tensors(const Net& net, const std::vector<std::vector<float>>& values) {
  std::vector<tmem::Tensor<B>> out;
  const auto ps = net.params();
  for (std::size_t i = 0; i < ps.size(); ++i)
    out.push_back(tmem::Tensor<B>::from_host(ps[i].shape(), std::vector<double>(values[i].begin(), values[i].end()),
                                             DType::F32, MemCategory::Gradient));
  return out;
}

}  // namespace

TEST_CASE("fp32_grads: 4 BF16 micro-batches sum to the f32 hand sum bit for bit, a 16-bit .grad does not",
          "[amp][master][fp32_grads]") {
  const auto reference = hand_sum(DType::BF16, DType::BF16);
  auto& stats = B::default_instance().memory();

  Net bf16_sum(DType::BF16, false);
  for (int k = 0; k < kMicroBatches; ++k) bf16_sum.backward(k);
  for (const auto& p : bf16_sum.params()) CHECK(p.grad().dtype() == DType::BF16);
  CHECK(bf16_sum.grads() != reference);  // rounded to bf16 at every add

  Net f32_sum(DType::BF16, true);
  for (const auto& p : f32_sum.params()) {
    CHECK(p.dtype() == DType::BF16);
    CHECK(p.grad_in_f32());
    CHECK(p.grad_dtype() == DType::F32);
  }
  const std::int64_t gradients_before = stats.live(MemCategory::Gradient);
  for (int k = 0; k < kMicroBatches; ++k) f32_sum.backward(k);
  for (const auto& p : f32_sum.params()) {
    CHECK(p.grad().dtype() == DType::F32);
    CHECK(p.grad().category() == MemCategory::Gradient);
  }
  CHECK(f32_sum.grads() == reference);
  // The f32 gradient's bytes are MemoryStats' Gradient bytes: 4 per weight, no 16-bit one beside it.
  CHECK(stats.live(MemCategory::Gradient) - gradients_before == 4 * f32_sum.numel());
  // zero_grad frees it and keeps the setting: the next step sums in f32 again.
  for (const auto& p : f32_sum.params()) p.zero_grad();
  CHECK(stats.live(MemCategory::Gradient) == gradients_before);
  for (int k = 0; k < kMicroBatches; ++k) f32_sum.backward(k);
  CHECK(f32_sum.grads() == reference);
}

TEST_CASE("fp32_grads: an f16 model's 4 micro-batches are the f32 hand sum too", "[amp][master][fp32_grads]") {
  const auto reference = hand_sum(DType::F16, DType::F16);
  Net f16_sum(DType::F16, false), f32_sum(DType::F16, true);
  for (int k = 0; k < kMicroBatches; ++k) {
    f16_sum.backward(k, DType::F16);
    f32_sum.backward(k, DType::F16);
  }
  CHECK(f16_sum.grads() != reference);
  CHECK(f32_sum.grads() == reference);
}

TEST_CASE("fp32_grads: clipping and AdamW read the f32 sum (bitwise a step on the hand sum set by hand)",
          "[amp][master][fp32_grads]") {
  const auto reference = hand_sum(DType::BF16, DType::BF16);
  Net accumulated(DType::BF16, true), by_hand(DType::BF16, false);
  tmem::optim::AdamW<B> opt_a(accumulated.params(), {.lr = 1e-2, .weight_decay = 1e-2});
  tmem::optim::AdamW<B> opt_h(by_hand.params(), {.lr = 1e-2, .weight_decay = 1e-2});
  accumulated.masters->attach(opt_a);
  by_hand.masters->attach(opt_h);
  for (int k = 0; k < kMicroBatches; ++k) accumulated.backward(k);
  const auto sums = as_tensors(by_hand, reference);
  for (std::size_t i = 0; i < sums.size(); ++i) by_hand.params()[i].set_grad(sums[i]);
  const double norm_a = tmem::optim::clip_grad_norm(accumulated.params(), 0.05);
  const double norm_h = tmem::optim::clip_grad_norm(by_hand.params(), 0.05);
  CHECK(norm_a == norm_h);
  CHECK(norm_a > 0.05);  // it clipped
  opt_a.step();
  opt_h.step();
  for (std::size_t i = 0; i < accumulated.params().size(); ++i) {
    CHECK(accumulated.masters->master(i).to_host<float>() == by_hand.masters->master(i).to_host<float>());
    CHECK(accumulated.params()[i].value().to_host<float>() == by_hand.params()[i].value().to_host<float>());
  }
  // And the 16-bit sum would have stepped elsewhere.
  Net rounded(DType::BF16, false);
  tmem::optim::AdamW<B> opt_r(rounded.params(), {.lr = 1e-2, .weight_decay = 1e-2});
  rounded.masters->attach(opt_r);
  for (int k = 0; k < kMicroBatches; ++k) rounded.backward(k);
  tmem::optim::clip_grad_norm(rounded.params(), 0.05);
  opt_r.step();
  bool differs = false;
  for (std::size_t i = 0; i < rounded.params().size(); ++i)
    differs = differs || rounded.masters->master(i).to_host<float>() != by_hand.masters->master(i).to_host<float>();
  CHECK(differs);
}

TEST_CASE("fp32_grads under f16 with a GradScaler: unscale_ divides the f32 sum in place and checks it",
          "[amp][master][fp32_grads]") {
  Net net(DType::F16, true);
  tmem::optim::AdamW<B> opt(net.params(), {.lr = 1e-3});
  net.masters->attach(opt);
  tmem::amp::GradScaler<B> scaler;  // 65536, a power of two: dividing is exact
  for (int k = 0; k < kMicroBatches; ++k) {
    tmem::Tape<B> tape;
    scaler.scale(net.loss(tape, k, DType::F16)).backward();
  }
  const auto scaled = net.grads();
  std::vector<const void*> storage;
  for (const auto& p : net.params()) {
    CHECK(p.grad().dtype() == DType::F32);
    CHECK(p.grad_scaled());
    storage.push_back(p.grad().data());
  }
  scaler.unscale_(opt);
  const auto unscaled = net.grads();
  for (std::size_t i = 0; i < storage.size(); ++i) {
    CHECK(net.params()[i].grad().data() == storage[i]);  // the same f32 tensor: no copy made
    CHECK_FALSE(net.params()[i].grad_scaled());
    for (std::size_t j = 0; j < scaled[i].size(); ++j) REQUIRE(unscaled[i][j] == scaled[i][j] / 65536.0f);
  }
  CHECK(scaler.step(opt));  // finite: it steps
  scaler.update();

  // An inf in an f32 gradient is found, and the step skipped.
  opt.zero_grad();
  for (int k = 0; k < 2; ++k) {
    tmem::Tape<B> tape;
    scaler.scale(net.loss(tape, k, DType::F16)).backward();
  }
  std::vector<double> poisoned = net.params()[0].grad().to_host<double>();
  poisoned[3] = INFINITY;
  net.params()[0].grad().copy_from(tmem::Tensor<B>::from_host(net.params()[0].shape(), poisoned));
  const auto master_before = net.masters->master(0).to_host<float>();
  CHECK_FALSE(scaler.step(opt));
  CHECK(net.masters->master(0).to_host<float>() == master_before);
}

TEST_CASE("TrainStepOptions::fp32_grads reaches the master weights", "[amp][train_step][fp32_grads]") {
  for (const bool fp32_grads : {false, true}) {
    tmem::nn::Init init(5);
    tmem::nn::Linear<B> fc(kIn, kOut, init, true, DType::F32, "fc");
    tmem::optim::AdamW<B> opt(fc.parameters(), {.lr = 1e-3});
    tmem::amp::TrainStep<B> train(opt, {.precision = DType::BF16, .fp32_grads = fp32_grads});
    std::vector<double> x(static_cast<std::size_t>(kRows * kIn));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.2 * static_cast<double>(i));
    tmem::Tape<B> tape;
    auto input = tape.input(tmem::Tensor<B>::from_host({kRows, kIn}, x));
    train.backward(train.forward([&] { return tmem::mean(fc(input)); }));
    for (const auto& p : fc.parameters()) {
      CHECK(p.dtype() == DType::BF16);
      CHECK(p.grad().dtype() == (fp32_grads ? DType::F32 : DType::BF16));
    }
    CHECK(train.update());
  }
}

TEST_CASE("Var::set_grad_in_f32 refuses a leaf holding a gradient and an f64 leaf", "[autograd][fp32_grads]") {
  auto w = tmem::Var<B>::parameter(
      tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1.0, 2.0, 3.0}, DType::BF16), "w");
  w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1.0, 1.0, 1.0}, DType::BF16,
                                        MemCategory::Gradient));
  CHECK_THROWS_WITH(w.set_grad_in_f32(true),
                    Catch::Contains("'w' holds a bf16 gradient already") && Catch::Contains("call zero_grad()"));
  w.zero_grad();
  w.set_grad_in_f32(true);
  CHECK(w.grad_in_f32());
  auto d = tmem::Var<B>::parameter(
      tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1.0, 2.0, 3.0}, DType::F64), "d");
  CHECK_THROWS_WITH(d.set_grad_in_f32(true), Catch::Contains("'d' is f64"));
  // A leaf that is its own root: backward seeds it, summed in f32 as well.
  tmem::Tape<B> tape;
  auto leaf =
      tape.input(tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{0.5, 0.25}, DType::BF16), true, "leaf");
  leaf.set_grad_in_f32(true);
  tape.backward(leaf, tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.0, 3.0}, DType::BF16), true);
  tape.backward(leaf,
                tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.0 / 256, 1.0 / 256}, DType::BF16));
  CHECK(leaf.grad().dtype() == DType::F32);
  const std::vector<double> want{1.0 + 1.0 / 256, 3.0 + 1.0 / 256};  // not bf16 values: bf16 sums give 1 and 3
  CHECK(leaf.grad().to_host<double>() == want);
}

// tests/checkpoint/test_fp8_recompute.cpp — FP8 delayed scaling under checkpoint recompute.
//
// Reference: the same model trained by the plain FP8 step (no region), from the same
// weights, data and dropout streams. Every schedule (full, selective, nested regions,
// checkpoint_sequential, the planner's segment modes) must give that step's gradients,
// weights, masters, moments, amax histories and scales bit for bit, step after step, so
// scales that moved with the history are covered too, not only the first step's 1.0.
// With f16 and the loss scaler, a step poisoned with inf is skipped, and the skipped
// step leaves everything but the loss scale bitwise as it was.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint_schedule.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

namespace fp8_recompute_test {
namespace {

constexpr std::int64_t kBatch = 8, kWidth = 16, kHidden = 32, kClasses = 5;
constexpr int kBlocks = 4, kMicro = 2;

/// Residual blocks x + dropout(down(gelu(up(norm(x))))), then a linear head; every
/// parameter named, as Fp8Scaling keys its state by name.
struct Fp8Chain {
  explicit Fp8Chain(float dropout_p) : p(dropout_p) {
    nn::Init init(31);
    for (int i = 0; i < kBlocks; ++i) {
      up.emplace_back(kWidth, kHidden, init, true, DType::F32, "up" + std::to_string(i));
      down.emplace_back(kHidden, kWidth, init, true, DType::F32, "down" + std::to_string(i));
      norm.emplace_back(kWidth, 1e-5, DType::F32, "norm" + std::to_string(i));
    }
    head.emplace(kWidth, kClasses, init, true, DType::F32, "head");
    for (int i = 0; i < kBlocks; ++i)
      stages.push_back([this, i](const Var<B>& x) { return add(x, dropout(down[i](gelu(up[i](norm[i](x)))), p)); });
    for (int i = 0; i < kBlocks; ++i)
      for (const auto* m : std::initializer_list<const nn::Module<B>*>{&up[i], &down[i], &norm[i]})
        for (const auto& v : m->parameters()) params.push_back(v);
    for (const auto& v : head->parameters()) params.push_back(v);
  }
  Fp8Chain(const Fp8Chain&) = delete;
  Fp8Chain& operator=(const Fp8Chain&) = delete;

  float p;
  std::vector<nn::Linear<B>> up, down;
  std::vector<nn::LayerNorm<B>> norm;
  std::optional<nn::Linear<B>> head;
  std::vector<Layer<B>> stages;
  std::vector<Var<B>> params;
};

using testing::each_block;
using testing::run_plain;
using testing::Schedule;

Schedule segments(std::vector<Segment> list) {
  return [list](Tape<B>&, const std::vector<Layer<B>>& layers, const Var<B>& x) {
    return ChainRunner<B>(layers, list)(x);
  };
}

/// The input of (step, micro-batch): smooth values of magnitude up to `gain`, so the
/// amax of the inputs changes from step to step; `poison` puts an inf in it.
Tensor<B> batch(int step, int micro, bool poison = false) {
  std::vector<float> v(static_cast<std::size_t>(kBatch * kWidth));
  const double gain = 1.0 + 0.5 * step + 0.25 * micro;
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(gain * std::sin(0.37 * static_cast<double>(i) + 0.9 * step + 0.3 * micro));
  if (poison) v[3] = std::numeric_limits<float>::infinity();
  return Tensor<B>::from_host({kBatch, kWidth}, v);
}
Tensor<B> labels(int step, int micro) {
  std::vector<std::int32_t> y(static_cast<std::size_t>(kBatch));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>((i * 3 + step + micro) % kClasses);
  return Tensor<B>::from_host({kBatch}, y, DType::I32);
}

/// The bits of floats (a NaN gradient of a skipped step equals itself here).
std::vector<std::uint32_t> bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> out;
  for (float v : values) out.push_back(std::bit_cast<std::uint32_t>(v));
  return out;
}

/// Every bit of a StateDict's entries, for equality checks.
std::vector<std::byte> bytes_of(const StateDict& state) {
  std::vector<std::byte> out;
  for (const auto& [name, entry] : state) out.insert(out.end(), entry.bytes.begin(), entry.bytes.end());
  return out;
}

/// What a step leaves: each micro-batch's loss, the accumulated gradients before the
/// update, and after it the weights, optimizer state (moments) and TrainStep state
/// (masters, scaler, FP8 histories and scales).
struct StepRecord {
  std::vector<std::vector<std::uint32_t>> grads;
  std::vector<std::uint32_t> losses;
  std::vector<std::byte> weights, optimizer, train;
  bool stepped = true;
  bool operator==(const StepRecord&) const = default;
};

struct RunSettings {
  DType precision = DType::BF16;
  int steps = 4;
  int poisoned_step = -1;  // this step's first micro-batch holds an inf (f16: skipped)
  float dropout = 0.2f;
};

std::vector<StepRecord> train(const Schedule& schedule, const RunSettings& s) {
  Fp8Chain chain(s.dropout);
  optim::AdamW<B> optimizer(chain.params, {.lr = 1e-2, .weight_decay = 0.01});
  amp::TrainStepOptions options{.precision = s.precision};
  options.fp8 = amp::DelayedScaling{.history_length = 3};
  options.scaler.init_scale = 1024.0;
  amp::TrainStep<B> step(optimizer, options);
  std::vector<StepRecord> records;
  for (int k = 0; k < s.steps; ++k) {
    StepRecord r;
    for (int micro = 0; micro < kMicro; ++micro) {
      Tape<B> tape;
      tape.manual_seed(100 + static_cast<std::uint64_t>(k * kMicro + micro));
      Var<B> loss = step.forward([&] {
        const Var<B> x = tape.input(batch(k, micro, k == s.poisoned_step && micro == 0));
        return scale(cross_entropy((*chain.head)(schedule(tape, chain.stages, x)), labels(k, micro)), 1.0 / kMicro);
      });
      r.losses.push_back(bits(loss.value().to_host<float>())[0]);
      step.backward(loss);
    }
    for (const auto& p : chain.params) r.grads.push_back(bits(p.grad().to_host<float>()));
    r.stepped = step.update();
    for (const auto& p : chain.params) {
      const auto v = p.value().to_host<float>();
      for (float f : v) {
        const auto b = std::bit_cast<std::array<std::byte, 4>>(f);
        r.weights.insert(r.weights.end(), b.begin(), b.end());
      }
    }
    r.optimizer = bytes_of(state_of(optimizer));
    r.train = bytes_of(step.state().sub("fp8"));
    const std::vector<std::byte> masters = bytes_of(step.state().sub("masters"));
    r.train.insert(r.train.end(), masters.begin(), masters.end());
    records.push_back(std::move(r));
  }
  return records;
}

std::vector<std::pair<const char*, Schedule>> schedules() {
  CheckpointOptions selective;
  selective.policy = policy::save_matmuls();
  return {
      {"every block", each_block()},
      {"every block, bitwise-checked",
       each_block(CheckpointOptions{policy::recompute_all(), DeterminismCheck::Bitwise})},
      {"selective", each_block(selective)},
      {"checkpoint_sequential (sqrt N)",
       [](Tape<B>& t, const auto& l, const Var<B>& x) { return checkpoint_sequential(t, l, x); }},
      {"nested",
       [](Tape<B>& t, const auto& l, const Var<B>& x) {
         return checkpoint(
             t,
             [&](const Var<B>& h) {
               Var<B> y = h;
               for (const auto& layer : l) y = checkpoint(t, layer, y);
               return y;
             },
             x);
       }},
      {"planner segments: recompute, selective, nested",
       segments({{0, 1, StageMode::Recompute}, {1, 2, StageMode::Selective}, {2, 4, StageMode::Nested}})},
      {"planner segments: keep, save-attention, offload, recompute", segments({{0, 1, StageMode::Keep},
                                                                               {1, 2, StageMode::SaveAttention},
                                                                               {2, 3, StageMode::Offload},
                                                                               {3, 4, StageMode::Recompute}})},
  };
}

}  // namespace

TEST_CASE("checkpointed FP8 steps are bitwise the plain FP8 step under every schedule (bf16, dropout)",
          "[checkpoint][fp8]") {
  const RunSettings settings{.precision = DType::BF16, .steps = 4};
  const auto reference = train(run_plain, settings);
  // The scales moved: the runs compare steps under scales other than the first step's 1.0.
  REQUIRE(reference.front().train != reference.back().train);
  for (const auto& [name, schedule] : schedules()) {
    INFO("schedule: " << name);
    const auto before = checkpoint_stats().recomputes;
    const auto run = train(schedule, settings);
    CHECK(checkpoint_stats().recomputes > before);
    REQUIRE(run.size() == reference.size());
    for (std::size_t k = 0; k < run.size(); ++k) {
      INFO("step " << k);
      CHECK(run[k].losses == reference[k].losses);
      CHECK(run[k].grads == reference[k].grads);
      CHECK(run[k].weights == reference[k].weights);
      CHECK(run[k].optimizer == reference[k].optimizer);
      CHECK(run[k].train == reference[k].train);
    }
  }
}

TEST_CASE("across an f16 loss-scale skip: checkpointed = plain, and the skipped step changes nothing",
          "[checkpoint][fp8]") {
  const RunSettings settings{.precision = DType::F16, .steps = 4, .poisoned_step = 2};
  const auto reference = train(run_plain, settings);
  REQUIRE(reference[1].stepped);
  REQUIRE_FALSE(reference[2].stepped);
  REQUIRE(reference[3].stepped);
  // The skipped step leaves weights, masters, moments, amax histories and scales bitwise.
  CHECK(reference[2].weights == reference[1].weights);
  CHECK(reference[2].optimizer == reference[1].optimizer);
  CHECK(reference[2].train == reference[1].train);
  for (const auto& [name, schedule] : schedules()) {
    INFO("schedule: " << name);
    const auto run = train(schedule, settings);
    REQUIRE(run.size() == reference.size());
    for (std::size_t k = 0; k < run.size(); ++k) {
      INFO("step " << k);
      CHECK(run[k].stepped == reference[k].stepped);
      CHECK(run[k].grads == reference[k].grads);
      CHECK(run[k].weights == reference[k].weights);
      CHECK(run[k].optimizer == reference[k].optimizer);
      CHECK(run[k].train == reference[k].train);
    }
  }
}

namespace {

/// One forward and backward of `fn` on a fixed input under `scaling`, with
/// `between` run after the forward and before the backward; the gradients.
template <class Fn>
std::vector<std::vector<float>> grads_with(Fp8Chain& chain, amp::Fp8Scaling<B>& scaling, Fn fn,
                                           const std::function<void()>& between) {
  for (const auto& p : chain.params) p.zero_grad();
  Tape<B> tape;
  tape.manual_seed(5);
  Var<B> loss;
  {
    amp::Fp8Autocast guard(scaling);
    loss = cross_entropy((*chain.head)(fn(tape, chain.stages, tape.input(batch(1, 0)))), labels(1, 0));
  }
  between();
  tape.backward(loss);
  std::vector<std::vector<float>> grads;
  for (const auto& p : chain.params) grads.push_back(p.grad().to_host<float>());
  return grads;
}

}  // namespace

TEST_CASE("a recompute after a scale update quantizes with the scales its forward used", "[checkpoint][fp8]") {
  // Scales change between a forward and its backward (an update run in between): the
  // plain step's backward uses the forward's quantized tensors; a region's recompute
  // must quantize with the forward's generation too, not the current one.
  Fp8Chain chain(0.0f);
  const auto run = [&](const Schedule& schedule) {
    amp::Fp8Scaling<B> scaling(chain.params, {.history_length = 2});
    // One observed step, so the next update moves every scale away from 1.
    grads_with(chain, scaling, run_plain, [] {});
    scaling.update(true);
    const auto scale_before = scaling.scales()->scale.to_host<float>();
    auto grads = grads_with(chain, scaling, schedule, [&] {
      scaling.update(true);  // between forward and backward
    });
    CHECK(scaling.scales()->scale.to_host<float>() != scale_before);
    return grads;
  };
  const auto reference = run(run_plain);
  CHECK(run(each_block()) == reference);
  CHECK(run(segments({{0, 2, StageMode::Nested}, {2, 4, StageMode::Selective}})) == reference);
}

TEST_CASE("a recompute records no amax", "[checkpoint][fp8]") {
  Fp8Chain chain(0.1f);
  amp::Fp8Scaling<B> scaling(chain.params, {.history_length = 2});
  // Plain: each of the 9 linears records its input and (made once) its weight in forward,
  // and its output gradient in backward.
  grads_with(chain, scaling, run_plain, [] {});
  const std::uint64_t plain_records = scaling.amax_records();
  CHECK(plain_records == 3 * 9);
  const auto amax_plain = scaling.amax_slot(0).to_host<float>();
  scaling.update(true);
  const std::uint64_t before = scaling.amax_records();
  const auto recomputes = checkpoint_stats().recomputes;
  std::uint64_t after_forward = 0;
  grads_with(chain, scaling, each_block(), [&] { after_forward = scaling.amax_records(); });
  CHECK(checkpoint_stats().recomputes > recomputes);
  CHECK(after_forward - before == 2 * 9);              // the forward's inputs and (new generation) weights
  CHECK(scaling.amax_records() - after_forward == 9);  // backward: the gradients only, no recompute
}

}  // namespace fp8_recompute_test

// tests/distributed/test_fully_sharded_planner.cpp — ZeRO-3 units under the checkpoint
// planner, in one process.
//
// The planner runs a stage's mode as a region around the stage, so around a unit's
// forward (NOTE [A region around a unit] in dist/fully_sharded.hpp). The references are
// closed forms and the same model run plainly: every schedule trains to bitwise the plain
// run's weights; a one-unit region gathers nothing beyond forward's and backward's gather
// per unit (2 a unit a step), a region over k units one more per inner unit (k - 1); the
// gathered high-water mark is (1 + prefetch depth) units plainly, one unit more under a
// multi-unit region. The planner's hold (keep the gathered weights through backward) is
// priced by the profile at exactly its unit's gathered bytes on the whole-step channel and
// nothing on the saved channel; predicted peaks are never below the measured ones (2%),
// and above them by at most two units where a plan holds (NOTE [Held stages]).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/distributed/communicator.hpp"
#include "trainmem/distributed/fully_sharded.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using testing::ErrorContains;

namespace {

constexpr std::int64_t kUnits = 4, kWidth = 16, kRows = 8;

/// Four ZeRO-3 units of tanh(tanh(Linear(16, 16))) in f32, one rank; each unit one stage
/// (the inner tanh's output is what a region around the unit drops).
struct ShardedChain {
  ShardedChain() {
    std::vector<std::vector<Var<B>>> units;
    for (std::int64_t k = 0; k < kUnits; ++k) {
      layers.push_back(
          std::make_unique<nn::Linear<B>>(kWidth, kWidth, init, true, DType::F32, "layer" + std::to_string(k)));
      units.push_back(layers.back()->parameters());
    }
    model = std::make_unique<dist::FullyShardedModel<B>>(one, std::move(units),
                                                         dist::FullyShardedOptions{.model_dtype = DType::F32},
                                                         optim::AdamWOptions{.lr = 1e-2, .weight_decay = 1e-2});
    for (std::int64_t k = 0; k < kUnits; ++k)
      stages.push_back([this, k](const Var<B>& x) {
        return model->forward(
            *x.tape(), static_cast<std::size_t>(k),
            [this, k](const Var<B>& in) { return tanh(tanh((*layers[static_cast<std::size_t>(k)])(in))); }, x);
      });
  }

  /// One training step with the stages run by `run`; returns the gathers it made.
  std::int64_t step(const ChainRunner<B>& run, int s = 0) {
    const std::int64_t before = model->gathers();
    model->zero_grad();
    Tape<B> tape;
    std::vector<double> x, labels;
    for (std::int64_t i = 0; i < kRows * kWidth; ++i) x.push_back(0.8 * std::sin(0.37 * static_cast<double>(i) + s));
    for (std::int64_t r = 0; r < kRows; ++r) labels.push_back(static_cast<double>((3 * r + s) % kWidth));
    const Var<B> y = run(tape.input(Tensor<B>::from_host(Shape{kRows, kWidth}, x)));
    run.backward(cross_entropy(y, Tensor<B>::from_host(Shape{kRows}, labels, DType::I32)));
    model->micro_batch_done();
    model->step();
    return model->gathers() - before;
  }

  nn::Init init{11};
  std::vector<std::unique_ptr<nn::Linear<B>>> layers;
  dist::SingleProcess<B> one;
  std::unique_ptr<dist::FullyShardedModel<B>> model;
  std::vector<Layer<B>> stages;
};

std::vector<Segment> one_stage_each(StageMode mode, bool hold = false) {
  std::vector<Segment> out;
  for (std::int64_t k = 0; k < kUnits; ++k) out.push_back({k, k + 1, mode, hold});
  return out;
}

struct Trained {
  std::vector<double> weights;
  std::int64_t gathers_per_step = 0;  // of the last step
  std::int64_t gathered_peak = 0;
  std::int64_t saved_peak = 0;  // saved activations' high-water mark in the last step
};

/// Three steps under `segments` (with the chain's StageHold), from the same start.
Trained train(const std::vector<Segment>& segments) {
  ShardedChain chain;
  const ChainRunner<B> run(chain.stages, segments, chain.model->stage_hold());
  Trained out;
  MemoryStats& memory = B::default_instance().memory();
  for (int s = 0; s < 3; ++s) {
    chain.model->reset_gathered_peak();
    memory.reset_peak();
    out.gathers_per_step = chain.step(run, s);
  }
  out.saved_peak = memory.peak(MemCategory::SavedActivation);
  out.gathered_peak = chain.model->gathered_peak();
  out.weights = chain.model->full_weights();
  return out;
}

}  // namespace

TEST_CASE(
    "dist: ZeRO-3 units under the planner's regions around them train bitwise as plain ones, gathering as "
    "the design says",
    "[dist][planner]") {
  const std::int64_t unit = (kWidth * kWidth + kWidth) * 4;  // one unit's gathered f32 weights
  const Trained plain = train({{0, kUnits, StageMode::Keep}});
  CHECK(plain.gathers_per_step == 2 * kUnits);
  CHECK(plain.gathered_peak == 2 * unit);  // the unit computing and the one prefetched
  SECTION("one-unit regions recompute on backward's gather: no gather of their own") {
    for (const StageMode mode : {StageMode::Recompute, StageMode::Selective, StageMode::SaveAttention}) {
      INFO(name_of(mode));
      const Trained t = train(one_stage_each(mode));
      CHECK(t.weights == plain.weights);
      CHECK(t.gathers_per_step == 2 * kUnits);
      CHECK(t.gathered_peak == 2 * unit);
      if (mode != StageMode::Selective)          // keeps the matmul's output, as many bytes as the tanh's
        CHECK(t.saved_peak < plain.saved_peak);  // the region drops what the unit's ops save
    }
  }
  SECTION("a region over several units gathers each inner unit once more, and holds at most one unit more") {
    const Trained two = train({{0, 2, StageMode::Recompute}, {2, 3, StageMode::Keep}, {3, 4, StageMode::Selective}});
    CHECK(two.weights == plain.weights);
    CHECK(two.gathers_per_step == 2 * kUnits + 1);
    CHECK(two.gathered_peak <= 3 * unit);
    const Trained all = train({{0, kUnits, StageMode::Recompute}});
    CHECK(all.weights == plain.weights);
    CHECK(all.saved_peak < plain.saved_peak);
    CHECK(all.gathers_per_step == 2 * kUnits + (kUnits - 1));
    CHECK(all.gathered_peak <= 3 * unit);
    const Trained nested = train({{0, kUnits, StageMode::Nested}});
    CHECK(nested.weights == plain.weights);
  }
  SECTION("held units gather once a step and keep every unit gathered through backward") {
    const Trained held = train(one_stage_each(StageMode::Keep, true));
    CHECK(held.weights == plain.weights);
    CHECK(held.gathers_per_step == kUnits);
    CHECK(held.gathered_peak == kUnits * unit);
    const Trained held_regions = train(one_stage_each(StageMode::Recompute, true));
    CHECK(held_regions.weights == plain.weights);
    CHECK(held_regions.gathers_per_step == kUnits);
  }
}

TEST_CASE(
    "dist: the planner prices ZeRO-3's keep-gathered choice at its unit's bytes, and its plans meet their "
    "predicted peaks",
    "[dist][planner]") {
  ShardedChain chain;
  PlannerOptions options;
  options.hold = chain.model->stage_hold();
  options.model = "four 16-wide units";
  Planner<B> planner(
      chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, options);
  const ChainProfile& p = planner.profile();
  REQUIRE(p.held.size() == static_cast<std::size_t>(kUnits));
  for (std::int64_t k = 0; k < kUnits; ++k) {
    INFO("stage " << k);
    const std::int64_t unit = chain.model->unit_bytes(static_cast<std::size_t>(k));
    const StageCosts& held = p.held[static_cast<std::size_t>(k)];
    const StageCosts& plain = p.stages[static_cast<std::size_t>(k)];
    for (const StageMode mode : {StageMode::Keep, StageMode::Recompute, StageMode::Selective}) {
      const auto m = static_cast<std::size_t>(mode);
      CHECK(held.kept[m][0] - plain.kept[m][0] == unit);   // held from forward to backward
      CHECK(held.kept[m][1] == plain.kept[m][1]);          // no saved activation
      CHECK(held.bwd_peak[m][0] >= plain.bwd_peak[m][0]);  // backward windows are not credited
      CHECK(held.bwd_change[m][0] >= plain.bwd_change[m][0]);
    }
    CHECK_FALSE(chain.model->keep_gathered(static_cast<std::size_t>(k)));  // the profile leaves no hold on
  }
  // Holding every stage: the plain step plus each unit held from its forward to its backward.
  // Backward windows are not credited (NOTE [Held stages]): a held stage's peak may be
  // over-predicted by its unit and the next one's, never under-predicted.
  const std::int64_t largest_unit = chain.model->unit_bytes(0);
  const PlanPrediction all_held = predict(p, one_stage_each(StageMode::Keep, true));
  const StepMeasurement held_step = planner.measure(one_stage_each(StageMode::Keep, true));
  CHECK(all_held.peak[0] >= held_step.peak[0]);
  CHECK(all_held.peak[0] <= held_step.peak[0] + 2 * largest_unit);
  CHECK(all_held.peak[1] == held_step.peak[1]);

  const std::int64_t least = planner.smallest_budget(MemChannel::Total);
  int held_plans = 0;
  for (const Budget budget : {Budget::whole_step(all_held.peak[0]), Budget::whole_step(least),
                              Budget::whole_step((least + p.plain_peak[0]) / 2)}) {
    const CheckpointPlan<B> plan = planner.plan(budget);
    const StepMeasurement m = planner.measure(plan);
    INFO(plan.str() << plan.compare(m));
    bool holds = false;
    for (const Segment& s : plan.segments()) holds = holds || s.hold;
    held_plans += holds ? 1 : 0;
    const double slack = 0.02 * static_cast<double>(m.peak[0]);
    CHECK(static_cast<double>(plan.prediction().peak[0]) >= static_cast<double>(m.peak[0]) - slack);
    CHECK(static_cast<double>(plan.prediction().peak[0]) <=
          static_cast<double>(m.peak[0] + (holds ? 2 * largest_unit : 0)) + slack);
    CHECK(std::abs(static_cast<double>(plan.prediction().peak[1] - m.peak[1])) <=
          0.02 * static_cast<double>(m.peak[1]));
    CHECK(m.peak[0] <= budget.bytes + budget.bytes / 50);
  }
  INFO("plans that hold: " << held_plans);  // the times decide; a one-rank gather is a small copy
}

TEST_CASE("dist: a held segment needs a StageHold to run, to load and to be priced", "[dist][planner][errors]") {
  ShardedChain chain;
  CHECK_THROWS_MATCHES(ChainRunner<B>(chain.stages, one_stage_each(StageMode::Keep, true)), Error,
                       ErrorContains("segment 0 holds its stages, and the runner has no StageHold"));
  ChainProfile unheld;
  unheld.stages.resize(static_cast<std::size_t>(kUnits));
  CHECK_THROWS_MATCHES(predict(unheld, one_stage_each(StageMode::Keep, true)), Error,
                       ErrorContains("holds its stages, and the profile was made without a StageHold"));
  CHECK_THROWS_MATCHES(chain.model->stage_hold({0, 1, 7, -1}), Error,
                       ErrorContains("stage 2 runs unit 7 of 4 (-1 for a stage of no unit)"));

  // A plan that holds: saved with "hold": true on its held segments, loaded only with a StageHold.
  PlannerOptions options;
  options.hold = chain.model->stage_hold();
  ChainProfile profile = unheld;
  profile.held = profile.stages;
  const std::vector<Segment> segments = {{0, 2, StageMode::Recompute, true}, {2, 4, StageMode::Keep}};
  const CheckpointPlan<B> plan(chain.stages, segments, predict(profile, segments), Budget::whole_step(1 << 20), profile,
                               "", options.hold);
  const std::string json = plan.to_json();
  CHECK(json.find("\"mode\": \"recompute\", \"kept_bytes\": 0, \"ms\": 0, \"hold\": true}") != std::string::npos);
  const CheckpointPlan<B> loaded = CheckpointPlan<B>::from_json(chain.stages, json, options);
  CHECK(loaded.record() == plan.record());
  CHECK(loaded.str().find("holding gathered weights") != std::string::npos);
  CHECK_THROWS_MATCHES(CheckpointPlan<B>::from_json(chain.stages, json), Error,
                       ErrorContains("field 'segments[0].hold' is true, and PlannerOptions::hold is not set"));
  // The runner of the loaded plan holds the stages it says and no others.
  {
    NoGradGuard no_grad;
    Tape<B> tape;
    loaded.runner()(tape.input(Tensor<B>::zeros(Shape{1, kWidth}, DType::F32)));
  }
  CHECK(chain.model->keep_gathered(0));
  CHECK(chain.model->keep_gathered(1));
  CHECK_FALSE(chain.model->keep_gathered(2));
  CHECK_FALSE(chain.model->keep_gathered(3));
}

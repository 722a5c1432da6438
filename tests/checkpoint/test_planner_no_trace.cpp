// tests/checkpoint/test_planner_no_trace.cpp — the planner profiles the user's real training
// step (optimizer.step() included) and leaves no trace: parameters, f32 masters, optimizer
// state (moments, step counts, stochastic-rounding stream), the loss scaler, the tape's
// random stream and the gradients are bitwise what they were, and training after planning
// gives bitwise the losses of the same model never planned.
//
// The run: three stages (two with dropout), bf16 (stochastic rounding of the model copies,
// a loss scaler with scale_bf16) or f16 (a scaler started high enough to overflow, growth
// every 2 steps) autocast over f32 masters, AdamW. Its step zeroes the gradients at its
// end (amp::TrainStep's way) or at its start (PyTorch's way: the gradients stay between
// steps and are state the planner must put back too).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "test_data.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

namespace {

constexpr std::int64_t kBatch = 8, kIn = 12, kHidden = 16, kClasses = 5;

struct Net : nn::Module<B> {
  explicit Net(nn::Init& init)
      : nn::Module<B>("Net"), fc1(kIn, kHidden, init), fc2(kHidden, kHidden, init), fc3(kHidden, kClasses, init) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  nn::Linear<B> fc1, fc2, fc3;
};

/// The net as a chain of three stages, dropout in the first two.
std::vector<Layer<B>> stages_of(const Net& net) {
  const Net* n = &net;
  return {[n](const Var<B>& x) { return dropout(relu(n->fc1(x)), 0.25f); },
          [n](const Var<B>& h) { return dropout(relu(n->fc2(h)), 0.25f); }, [n](const Var<B>& h) { return n->fc3(h); }};
}

/// Everything one run holds; two runs made with the same arguments are identical.
struct Run {
  Run(DType dtype, bool zero_first)
      : dtype(dtype),
        zero_first(zero_first),
        masters(net.parameters(),
                {.model_dtype = dtype,
                 .rounding = dtype == DType::BF16 ? RoundingMode::Stochastic : RoundingMode::NearestEven,
                 .seed = 11}),
        optimizer(net.parameters(), {.lr = 3e-2, .weight_decay = 0.1}),
        scaler(dtype, {.init_scale = dtype == DType::F16 ? 1048576.0 : 1024.0,
                       .growth_interval = 2,
                       .hysteresis = 2,
                       .scale_bf16 = true}) {
    masters.attach(optimizer);
    tape.manual_seed(1234);
    stages = stages_of(net);
  }

  /// Inputs and labels of step k (a pure function of k).
  static std::pair<Tensor<B>, Tensor<B>> batch(std::int64_t k) {
    testing::SplitMix64 rng(99 + static_cast<std::uint64_t>(k));
    std::vector<double> x(kBatch * kIn), y(kBatch);
    for (double& v : x) v = 2.0 * rng.uniform() - 1.0;
    for (double& v : y) v = static_cast<double>(rng.next() % kClasses);
    return {Tensor<B>::from_host(Shape{kBatch, kIn}, x), Tensor<B>::from_host(Shape{kBatch}, y, DType::I32)};
  }

  /// One training step on batch k with the stages run by `run`; returns the loss's bits.
  std::uint32_t step(const ChainRunner<B>& run, std::int64_t k) {
    if (zero_first) optimizer.zero_grad();
    const auto [x, y] = batch(k);
    Var<B> loss;
    {
      amp::Autocast guard(dtype);
      loss = cross_entropy(run(tape.input(x)), y);
    }
    run.backward_with([&] { scaler.scale(loss).backward(); });
    scaler.step(optimizer);
    scaler.update();
    if (!zero_first) optimizer.zero_grad();
    const float value = loss.value().to_host<float>()[0];
    tape.clear();
    std::uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
  }
  std::uint32_t step(std::int64_t k) { return step(ChainRunner<B>(stages, {{0, 3, StageMode::Keep}}), k); }

  /// Everything planning must leave as it was: every state, and each gradient (or its absence) with its marks.
  StateDict everything() const {
    StateDict s;
    s.insert("model", state_of(net));
    s.insert("masters", state_of(masters));
    s.insert("optimizer", state_of(optimizer));
    s.insert("scaler", state_of(scaler));
    s.insert("rng", state_of(tape));
    for (const auto& p : net.parameters()) {
      const std::string g = "grad." + p.name();
      if (p.grad().defined()) s.insert(g, state_of(p.grad()));
      s.set_i64(g + ".marks", (p.grad().defined() ? 1 : 0) + (p.grad_scaled() ? 2 : 0) + (p.grad_incomplete() ? 4 : 0));
    }
    return s;
  }

  DType dtype;
  bool zero_first;
  nn::Init init{7};
  Net net{init};
  amp::MasterWeights<B> masters;
  optim::AdamW<B> optimizer;
  amp::GradScaler<B> scaler;
  Tape<B> tape;
  std::vector<Layer<B>> stages;
};

/// The names of the entries where `a` and `b` differ ("" when none).
std::string differences(const StateDict& a, const StateDict& b) {
  std::string out;
  for (const auto& [name, entry] : a)
    if (!b.contains(name) || !(b.at(name) == entry)) out += name + " ";
  for (const auto& [name, entry] : b)
    if (!a.contains(name)) out += name + " (new) ";
  return out;
}

/// The options every planner here is made with: one profiled step per mode, and `run`'s
/// state restored after profiling.
PlannerOptions planner_options(Run& run) {
  PlannerOptions o;
  o.profile_reps = 1;
  o.restore = {run.net, run.masters, run.optimizer, run.scaler, run.tape};
  return o;
}

}  // namespace

TEST_CASE("planning leaves parameters, masters, optimizer, scaler, RNG and gradients bitwise as they were",
          "[checkpoint][planner]") {
  const DType dtype = GENERATE(DType::BF16, DType::F16);
  const bool zero_first = GENERATE(false, true);
  const int trained = GENERATE(0, 2);  // planned before training, or after 2 steps
  CAPTURE(dtype, zero_first, trained);
  Run run(dtype, zero_first);
  for (int k = 0; k < trained; ++k) run.step(k);
  const StateDict before = run.everything();

  int steps = 0;
  Planner<B> planner(
      run.stages,
      [&](const ChainRunner<B>& r) {
        ++steps;
        run.step(r, 0);
      },
      planner_options(run));
  CHECK(steps >= 5);  // a warm-up and one step per mode, each with optimizer.step()
  CHECK(differences(before, run.everything()) == "");

  // measure() runs planned steps: it too leaves no trace.
  const CheckpointPlan<B> plan = planner.plan(Budget::whole_step(planner.smallest_budget(MemChannel::Total)));
  planner.measure(plan);
  CHECK(differences(before, run.everything()) == "");
}

TEST_CASE("a step that throws part way through the profile still leaves no trace", "[checkpoint][planner]") {
  Run run(DType::F16, false);
  run.step(0);
  const StateDict before = run.everything();
  int steps = 0;
  const auto make = [&] {
    return Planner<B>(
        run.stages,
        [&](const ChainRunner<B>& r) {
          run.step(r, 0);
          if (++steps == 3) throw std::runtime_error("the user's step gave up");
        },
        planner_options(run));
  };
  CHECK_THROWS_WITH(make(), "the user's step gave up");
  CHECK(steps == 3);
  CHECK(differences(before, run.everything()) == "");
}

TEST_CASE("training after planning is bitwise the training of the same model never planned", "[checkpoint][planner]") {
  const DType dtype = GENERATE(DType::BF16, DType::F16);
  CAPTURE(dtype);
  Run planned(dtype, false), never(dtype, false);
  const Planner<B> planner(
      planned.stages, [&](const ChainRunner<B>& r) { planned.step(r, 0); }, planner_options(planned));
  const CheckpointPlan<B> plan = planner.plan(Budget::whole_step(planner.smallest_budget(MemChannel::Total)));
  planner.measure(plan);

  std::vector<std::uint32_t> planned_losses, never_losses;
  for (std::int64_t k = 0; k < 6; ++k) {
    planned_losses.push_back(planned.step(plan.runner(), k));
    never_losses.push_back(never.step(ChainRunner<B>(never.stages, plan.segments()), k));
  }
  CHECK(planned_losses == never_losses);
  CHECK(differences(planned.everything(), never.everything()) == "");
}

TEST_CASE("restoring after the profile changes none of its byte counts", "[checkpoint][planner]") {
  // The snapshot is host memory and the restore comes after the last profiled step, so
  // the profile restored is the profile of the same run not restored, byte for byte.
  // Each run alone, so that neither profile sees the other run's bytes.
  const auto profile = [](bool restore) {
    Run run(DType::F16, false);
    PlannerOptions options = planner_options(run);
    if (!restore) options = {1, {}};
    const Planner<B> planner(
        run.stages, [&](const ChainRunner<B>& r) { run.step(r, 0); }, options);
    return planner.profile();
  };
  const ChainProfile a = profile(true), b = profile(false);
  CHECK(a.model_state == b.model_state);
  CHECK(a.plain_peak == b.plain_peak);
  CHECK(a.start_live == b.start_live);
  CHECK(a.outside_peak == b.outside_peak);
  REQUIRE(a.size() == b.size());
  for (std::int64_t k = 0; k < a.size(); ++k) {
    const StageCosts& x = a.stages[static_cast<std::size_t>(k)];
    const StageCosts& y = b.stages[static_cast<std::size_t>(k)];
    CHECK(x.kept == y.kept);
    CHECK(x.fwd_peak == y.fwd_peak);
    CHECK(x.bwd_peak == y.bwd_peak);
    CHECK(x.bwd_change == y.bwd_change);
  }
}

TEST_CASE("a step written with amp::TrainStep is put back through the TrainStep's state", "[checkpoint][planner]") {
  const DType dtype = GENERATE(DType::BF16, DType::F16);
  CAPTURE(dtype);
  nn::Init init{7};
  Net net{init};
  optim::AdamW<B> optimizer(net.parameters(), {.lr = 3e-2, .weight_decay = 0.1});
  amp::TrainStep<B> precision(optimizer,
                              {.precision = dtype, .scaler = {.init_scale = 1048576.0, .growth_interval = 2}});
  Tape<B> tape;
  tape.manual_seed(5);
  const std::vector<Layer<B>> stages = stages_of(net);
  const auto [x, y] = Run::batch(0);
  const auto everything = [&] {
    StateDict s;
    s.insert("model", state_of(net));
    s.insert("optimizer", state_of(optimizer));
    s.insert("precision", state_of(precision));
    s.insert("rng", state_of(tape));
    return s;
  };
  const StateDict before = everything();
  std::int64_t skipped = 0;
  const Planner<B> planner(stages,
                           [&](const ChainRunner<B>& run) {
                             const Var<B> loss =
                                 precision.forward([&] { return cross_entropy(run(tape.input(x)), y); });
                             run.backward_with([&] { precision.backward(loss); });
                             precision.update();
                             tape.clear();
                             skipped = std::max(skipped, precision.skipped_steps());
                           },
                           {.profile_reps = 1, .restore = {net, optimizer, precision, tape}});
  if (dtype == DType::F16) CHECK(skipped > 0);  // the scale started high: the profile skipped steps
  CHECK(differences(before, everything()) == "");
  CHECK(precision.skipped_steps() == 0);

  StateDict extra = state_of(precision);
  extra.set_i64("epoch", 3);
  CHECK_THROWS_WITH(load_state(precision, extra), Catch::Contains("'epoch'"));
}

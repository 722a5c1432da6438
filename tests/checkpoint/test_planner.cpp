// Checkpoint planner: the dynamic program finds the optimum that enumerating every
// schedule finds; an impossible budget names the smallest possible one; a planned step's
// gradients are bitwise the plain step's; the predicted peak is the measured one (2%).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "common/chain_models.hpp"
#include "trainmem/checkpoint/planner.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;

namespace {

/// A chain profile with random integer costs (bytes small enough that the solver works in
/// whole bytes, so it must be exact).
ChainProfile random_profile(std::int64_t n, std::mt19937_64& rng, bool with_offload) {
  std::uniform_int_distribution<std::int64_t> small(0, 12), mid(0, 40);
  std::uniform_real_distribution<double> ms(0.5, 10.0);
  ChainProfile p;
  p.measured.fill(true);
  p.measured[static_cast<std::size_t>(StageMode::Offload)] = with_offload;
  p.stages.resize(static_cast<std::size_t>(n));
  for (auto& s : p.stages) {
    s.output_bytes = 1 + small(rng);
    for (int m = 0; m < kStageModes; ++m) {
      s.fwd_ms[m] = ms(rng);
      s.bwd_ms[m] = ms(rng) * (m == 0 ? 1.0 : 1.5);
      for (int c = 0; c < kMemChannels; ++c) {
        s.kept[m][c] = m == 1 ? s.output_bytes : s.output_bytes + mid(rng) / (m == 0 ? 1 : m);
        s.fwd_peak[m][c] = s.kept[m][c] + small(rng);
        s.bwd_peak[m][c] = mid(rng) + small(rng);
        s.bwd_change[m][c] = -s.kept[m][c] + small(rng) / 3;
      }
    }
  }
  for (int c = 0; c < kMemChannels; ++c) {
    p.start_live[c] = 50 + small(rng);
    p.loss_fwd_peak[c] = small(rng);
    p.loss_live[c] = small(rng);
    p.loss_bwd_peak[c] = small(rng);
    p.backward_rest[c] = small(rng);
    p.outside_peak[c] = p.start_live[c] + small(rng);
  }
  p.outside_ms = 1.0;
  return p;
}

/// Every schedule of stages [0, n): Keep, Selective, SaveAttention or (with_offload)
/// Offload per stage, a Recompute region of any length, or a Nested region of two stages
/// or more; with_hold: each segment held or not.
void enumerate(std::int64_t begin, std::int64_t n, bool with_offload, std::vector<Segment>& prefix,
               const std::function<void(const std::vector<Segment>&)>& visit, bool with_hold = false) {
  if (begin == n) {
    visit(prefix);
    return;
  }
  const auto go = [&](Segment s) {
    for (const bool hold : {false, true}) {
      if (hold && !with_hold) continue;
      s.hold = hold;
      prefix.push_back(s);
      enumerate(s.end, n, with_offload, prefix, visit, with_hold);
      prefix.pop_back();
    }
  };
  for (const StageMode one : {StageMode::Keep, StageMode::Selective, StageMode::SaveAttention, StageMode::Offload}) {
    if (one == StageMode::Offload && !with_offload) continue;
    go({begin, begin + 1, one});
  }
  for (std::int64_t end = begin + 1; end <= n; ++end) {
    go({begin, end, StageMode::Recompute});
    if (end - begin >= 2) go({begin, end, StageMode::Nested});
  }
}

/// `p` with a StageHold's prices: each stage holds `extra` bytes more from forward to
/// backward in every mode (freed in backward) and its backward changes by a random time.
ChainProfile with_holds(ChainProfile p, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> extra(1, 15), peak(-6, 6);
  std::uniform_real_distribution<double> faster(-3.0, 1.0);
  p.held = p.stages;
  for (StageCosts& s : p.held) {
    const std::int64_t bytes = extra(rng), bwd_peak = peak(rng);
    const double ms = faster(rng);
    for (int m = 0; m < kStageModes; ++m) {
      s.bwd_ms[m] = std::max(0.0, s.bwd_ms[m] + ms);
      s.kept[m][0] += bytes;  // the whole-step channel only: what is held is no activation
      s.bwd_peak[m][0] += bwd_peak;
      s.bwd_change[m][0] -= bytes;
    }
  }
  return p;
}

SolverOptions exact_solver() {
  SolverOptions o;
  o.buckets = 1 << 20;  // whole bytes
  o.work_limit = 1e12;
  return o;
}

/// Gradients of every parameter after one backward under `run`, as raw floats.
template <class Model>
std::vector<std::vector<float>> gradients(const Model& model, const ChainRunner<B>& run) {
  for (auto& p : model.params) p.zero_grad();
  model.step(run, 0.0);
  std::vector<std::vector<float>> g;
  for (auto& p : model.params) g.push_back(p.grad().template to_host<float>());
  return g;
}

/// Planned steps at several budgets: measured peaks within 2% of the predicted ones.
template <class Model>
void check_predictions(const Model& model) {
  Planner<B> planner(model.stages, [&model](const ChainRunner<B>& run) { model.step(run); });
  const ChainProfile& p = planner.profile();
  const std::int64_t plain_saved = p.plain_peak[1];
  std::vector<Budget> budgets = {Budget::saved_activations(plain_saved),
                                 Budget::saved_activations(plain_saved / 2),
                                 Budget::saved_activations(plain_saved / 4),
                                 Budget::saved_activations(planner.smallest_budget(MemChannel::Saved)),
                                 Budget::whole_step((p.plain_peak[0] + planner.smallest_budget(MemChannel::Total)) / 2),
                                 Budget::whole_step(planner.smallest_budget(MemChannel::Total))};
  for (const Budget& budget : budgets) {
    const CheckpointPlan<B> plan = planner.plan(budget);
    const StepMeasurement m = planner.measure(plan);
    INFO(plan.str() << plan.compare(m));
    for (int c = 0; c < kMemChannels; ++c)
      CHECK(std::abs(static_cast<double>(plan.prediction().peak[c] - m.peak[c])) <=
            0.02 * static_cast<double>(m.peak[c]));
    CHECK(m.peak[static_cast<int>(budget.channel)] <= budget.bytes + budget.bytes / 50);
  }
}

}  // namespace

TEST_CASE("the planner's dynamic program finds the optimum of all schedules (random chains, N <= 10)",
          "[checkpoint][planner]") {
  std::mt19937_64 rng(20261201);
  for (std::int64_t n = 1; n <= 9; ++n) {
    for (int trial = 0; trial < (n <= 6 ? 4 : 1); ++trial) {
      // Offload in every other chain (a backend with host memory to offload to), n = 9 without
      // it (the enumeration's size); without it, no plan may name it.
      const bool with_offload = (n + trial) % 2 == 0;
      const ChainProfile p = random_profile(n, rng, with_offload);
      for (int c = 0; c < kMemChannels; ++c) {
        // All schedules' predictions, once.
        std::vector<PlanPrediction> all;
        std::vector<Segment> prefix;
        enumerate(0, n, with_offload, prefix, [&](const std::vector<Segment>& s) { all.push_back(predict(p, s)); });
        std::int64_t least = std::numeric_limits<std::int64_t>::max(), most = 0;
        for (const auto& a : all) least = std::min(least, a.peak[c]), most = std::max(most, a.peak[c]);
        CHECK(smallest_budget(p, static_cast<MemChannel>(c), exact_solver()) == least);
        for (std::int64_t budget : {least - 1, least, (least + most) / 2, (3 * least + most) / 4, most}) {
          double best = std::numeric_limits<double>::infinity();
          for (const auto& a : all)
            if (a.peak[c] <= budget) best = std::min(best, a.ms);
          const PlanSolution s = solve_chain(p, static_cast<MemChannel>(c), budget, exact_solver());
          INFO("n " << n << " channel " << c << " budget " << budget << " (least " << least << ")");
          REQUIRE(s.feasible == std::isfinite(best));
          if (!s.feasible) continue;
          CHECK(s.prediction.peak[c] <= budget);
          CHECK(s.prediction.ms == Approx(best).epsilon(1e-12));
          if (!with_offload)
            for (const Segment& segment : s.segments) CHECK(segment.mode != StageMode::Offload);
        }
      }
    }
  }
}

TEST_CASE(
    "with a StageHold the dynamic program finds the optimum of all schedules, each segment held or not "
    "(random chains, N <= 6)",
    "[checkpoint][planner]") {
  std::mt19937_64 rng(20261206);
  int holding_plans = 0;
  for (std::int64_t n = 1; n <= 6; ++n) {
    for (int trial = 0; trial < 3; ++trial) {
      const ChainProfile p = with_holds(random_profile(n, rng, false), rng);
      for (int c = 0; c < kMemChannels; ++c) {
        std::vector<PlanPrediction> all;
        std::vector<Segment> prefix;
        enumerate(
            0, n, false, prefix, [&](const std::vector<Segment>& s) { all.push_back(predict(p, s)); }, true);
        std::int64_t least = std::numeric_limits<std::int64_t>::max(), most = 0;
        for (const auto& a : all) least = std::min(least, a.peak[c]), most = std::max(most, a.peak[c]);
        CHECK(smallest_budget(p, static_cast<MemChannel>(c), exact_solver()) == least);
        for (std::int64_t budget : {least, (least + most) / 2, (3 * least + most) / 4, most}) {
          double best = std::numeric_limits<double>::infinity();
          for (const auto& a : all)
            if (a.peak[c] <= budget) best = std::min(best, a.ms);
          const PlanSolution s = solve_chain(p, static_cast<MemChannel>(c), budget, exact_solver());
          INFO("n " << n << " channel " << c << " budget " << budget << " (least " << least << ")");
          REQUIRE(s.feasible);
          CHECK(s.prediction.peak[c] <= budget);
          CHECK(s.prediction.ms == Approx(best).epsilon(1e-12));
          for (const Segment& segment : s.segments) holding_plans += segment.hold ? 1 : 0;
          // Without holds allowed, the plan is the best unheld one.
          SolverOptions no_hold = exact_solver();
          no_hold.allow_hold = false;
          for (const Segment& segment : solve_chain(p, static_cast<MemChannel>(c), budget, no_hold).segments)
            CHECK_FALSE(segment.hold);
        }
      }
    }
  }
  CHECK(holding_plans > 0);  // the random prices make holding worth it somewhere
}

TEST_CASE("an impossible budget throws an error naming the smallest feasible budget and the model state",
          "[checkpoint][planner][errors]") {
  examples::ResidualMlpChain<B> chain(6, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const std::int64_t least = planner.smallest_budget(MemChannel::Total);
  CHECK(least >= planner.profile().model_state);
  CHECK(least < planner.profile().plain_peak[0]);
  REQUIRE_THROWS_AS(planner.plan(Budget::whole_step(least - 4096)), Error);
  REQUIRE_THROWS_WITH(planner.plan(Budget::whole_step(least - 4096)),
                      Catch::Contains("smallest that fits is " + std::to_string(least) + " bytes") &&
                          Catch::Contains(std::to_string(planner.profile().model_state) + " bytes") &&
                          Catch::Contains("model state"));
  CHECK_NOTHROW(planner.plan(Budget::whole_step(least)));
}

TEST_CASE("a planned step's gradients are bitwise those of the plain step", "[checkpoint][planner]") {
  examples::ResidualMlpChain<B> chain(8, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const auto n = static_cast<std::int64_t>(chain.stages.size());
  const auto reference = gradients(chain, ChainRunner<B>(chain.stages, {{0, n, StageMode::Keep}}));
  const std::int64_t plain = planner.profile().plain_peak[1];
  for (std::int64_t budget : {plain / 2, plain / 4, planner.smallest_budget(MemChannel::Saved)}) {
    const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(budget));
    INFO(plan.str());
    bool any_region = false;
    for (const Segment& s : plan.segments()) any_region = any_region || s.mode != StageMode::Keep;
    CHECK(any_region);
    CHECK(gradients(chain, plan.runner()) == reference);
  }
  // A hand-made mixed schedule too, with a selective region over two stages.
  const std::vector<Segment> mixed = {{0, 3, StageMode::Recompute},
                                      {3, 4, StageMode::Selective},
                                      {4, 6, StageMode::Selective},
                                      {6, 8, StageMode::Keep}};  // 4-6: selective over two stages
  CHECK(gradients(chain, ChainRunner<B>(chain.stages, mixed)) == reference);
  // Nested regions: inner stages are regions of their own, inside the recompute too.
  const std::vector<Segment> nested = {{0, 1, StageMode::Keep}, {1, 4, StageMode::Nested}, {4, 8, StageMode::Nested}};
  CHECK(gradients(chain, ChainRunner<B>(chain.stages, nested)) == reference);
}

TEST_CASE("a schedule that does not cover the chain in order is an Error naming the segment",
          "[checkpoint][planner][errors]") {
  examples::ResidualMlpChain<B> chain(6, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const auto reference = gradients(chain, ChainRunner<B>(chain.stages, {{0, 6, StageMode::Keep}}));
  using M = StageMode;
  const std::vector<std::pair<std::vector<Segment>, std::string>> bad = {
      {{{0, 3, M::Keep}}, "cover stages [0, 3) of 6"},                                  // stops short
      {{{0, 3, M::Keep}, {4, 6, M::Recompute}}, "segment 1 covers stages [4, 6)"},      // a gap
      {{{0, 4, M::Recompute}, {3, 6, M::Keep}}, "segment 1 covers stages [3, 6)"},      // an overlap
      {{{0, 2, M::Keep}, {2, 2, M::Recompute}, {2, 6, M::Keep}}, "segment 1 covers"},   // an empty one
      {{{0, 7, M::Recompute}}, "segment 0 covers stages [0, 7), expected a nonempty"},  // past the end
      {{{1, 6, M::Keep}}, "expected a nonempty range from stage 0"},                    // not from 0
      {{}, "cover stages [0, 0) of 6"}};                                                // nothing
  for (const auto& [segments, message] : bad) {
    INFO(message);
    CHECK_THROWS_WITH(ChainRunner<B>(chain.stages, segments),
                      Catch::Contains("ChainRunner") && Catch::Contains(message));
    CHECK_THROWS_WITH(predict(planner.profile(), segments), Catch::Contains("predict") && Catch::Contains(message));
    CHECK_THROWS_AS(planner.measure(segments), Error);
  }
  // Solver settings it cannot use are refused before anything is profiled.
  const auto planner_with = [&chain](SolverOptions solver) {
    return Planner<B>(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, solver});
  };
  SolverOptions no_buckets;
  no_buckets.buckets = 0;
  CHECK_THROWS_WITH(planner_with(no_buckets), Catch::Contains("SolverOptions::buckets must be at least 1, got 0"));
  for (const double limit : {0.0, -1.0, std::nan("")}) {
    SolverOptions o;
    o.work_limit = limit;
    CHECK_THROWS_WITH(planner_with(o), Catch::Contains("SolverOptions::work_limit must be a positive number"));
    CHECK_THROWS_WITH(solve_chain(planner.profile(), MemChannel::Saved, planner.profile().plain_peak[1], o),
                      Catch::Contains("SolverOptions::work_limit"));
  }
  // A budget of INT64_MAX ("no limit") plans as the largest budget does; one of INT64_MIN is refused.
  const CheckpointPlan<B> unlimited = planner.plan(Budget::saved_activations(std::numeric_limits<std::int64_t>::max()));
  CHECK(unlimited.segments() == planner.plan(Budget::saved_activations(std::int64_t{1} << 62)).segments());
  CHECK_THROWS_WITH(planner.plan(Budget::whole_step(std::numeric_limits<std::int64_t>::min())),
                    Catch::Contains("no schedule of the 6 stages fits"));
  // Nothing ran: the model and the planner go on as before.
  CHECK(gradients(chain, planner.plan(Budget::saved_activations(planner.profile().plain_peak[1] / 2)).runner()) ==
        reference);
}

TEST_CASE(
    "a SaveAttention region keeps just attention's output and log-sum-exp, and its gradients are the plain "
    "step's bit for bit",
    "[checkpoint][planner]") {
  const std::int64_t batch = 8, tokens = 32, dim = 32, heads = 4;
  examples::TransformerStack<B> stack(8, dim, heads, 2 * dim, 64, batch, tokens);
  Planner<B> planner(stack.stages, [&stack](const ChainRunner<B>& run) { stack.step(run); }, {1, {}});
  const auto n = static_cast<std::int64_t>(stack.stages.size());
  const auto mode = [](StageMode m) { return static_cast<std::size_t>(m); };
  // Attention's output [batch * heads, tokens, dim / heads] and log-sum-exp [batch * heads, tokens], f32.
  const std::int64_t attention_outputs = (batch * tokens * dim + batch * heads * tokens) * 4;
  for (std::int64_t k = 1; k + 1 < n; ++k) {
    const StageCosts& s = planner.profile().stages[static_cast<std::size_t>(k)];
    INFO("block stage " << k);
    CHECK(s.kept[mode(StageMode::SaveAttention)][1] - s.kept[mode(StageMode::Recompute)][1] == attention_outputs);
    CHECK(s.kept[mode(StageMode::SaveAttention)][1] < s.kept[mode(StageMode::Selective)][1]);
  }
  std::vector<Segment> schedule = {{0, 1, StageMode::Keep}};
  for (std::int64_t k = 1; k + 1 < n; ++k) schedule.push_back({k, k + 1, StageMode::SaveAttention});
  schedule.push_back({n - 1, n, StageMode::Keep});
  const auto reference = gradients(stack, ChainRunner<B>(stack.stages, {{0, n, StageMode::Keep}}));
  CHECK(gradients(stack, ChainRunner<B>(stack.stages, schedule)) == reference);
  const PlanPrediction predicted = predict(planner.profile(), schedule);
  const StepMeasurement m = planner.measure(schedule);
  for (int c = 0; c < kMemChannels; ++c)
    CHECK(std::abs(static_cast<double>(predicted.peak[c] - m.peak[c])) <= 0.02 * static_cast<double>(m.peak[c]));
}

TEST_CASE("without attention a SaveAttention region is a Recompute one: same costs, and no plan names it",
          "[checkpoint][planner]") {
  examples::ResidualMlpChain<B> chain(8, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const auto attention = static_cast<std::size_t>(StageMode::SaveAttention);
  const auto recompute = static_cast<std::size_t>(StageMode::Recompute);
  for (const StageCosts& s : planner.profile().stages) {
    CHECK(s.kept[attention] == s.kept[recompute]);
    CHECK(s.bwd_ms[attention] == s.bwd_ms[recompute]);
    CHECK(s.bwd_peak[attention] == s.bwd_peak[recompute]);
  }
  const std::int64_t plain = planner.profile().plain_peak[1];
  for (std::int64_t budget : {plain / 2, plain / 4, planner.smallest_budget(MemChannel::Saved)}) {
    const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(budget));
    for (const Segment& s : plan.segments()) CHECK(s.mode != StageMode::SaveAttention);
  }
}

TEST_CASE("a Nested segment's predicted peak and kept bytes are the measured ones (2%), below a Recompute one's",
          "[checkpoint][planner]") {
  examples::TransformerStack<B> stack(8, 32, 4, 64, 64, 8, 32);
  Planner<B> planner(stack.stages, [&stack](const ChainRunner<B>& run) { stack.step(run); }, {1, {}});
  const auto n = static_cast<std::int64_t>(stack.stages.size());
  std::array<std::int64_t, 2> measured_saved{};
  // Nested over 2 to 8 stages: the model counts one boundary per inner stage, and the
  // inner regions' inputs are not held by their saves (the outer region drops them).
  for (std::int64_t e = 3; e <= n - 1; ++e) {
    const std::vector<Segment> schedule = {{0, 1, StageMode::Keep}, {1, e, StageMode::Nested}, {e, n, StageMode::Keep}};
    const PlanPrediction predicted = predict(planner.profile(), schedule);
    const StepMeasurement m = planner.measure(schedule);
    INFO("nested over stages 1.." << e - 1 << ": predicted " << predicted.peak[1] << ", measured " << m.peak[1]);
    CHECK(std::abs(static_cast<double>(predicted.peak[1] - m.peak[1])) <= 0.02 * static_cast<double>(m.peak[1]));
  }
  for (const StageMode mode : {StageMode::Recompute, StageMode::Nested}) {
    const std::vector<Segment> schedule = {{0, 1, StageMode::Keep}, {1, n - 1, mode}, {n - 1, n, StageMode::Keep}};
    const PlanPrediction predicted = predict(planner.profile(), schedule);
    const StepMeasurement m = planner.measure(schedule);
    INFO(name_of(mode) << ": predicted " << predicted.peak[0] << " / " << predicted.peak[1] << ", measured "
                       << m.peak[0] << " / " << m.peak[1]);
    for (int c = 0; c < kMemChannels; ++c)
      CHECK(std::abs(static_cast<double>(predicted.peak[c] - m.peak[c])) <= 0.02 * static_cast<double>(m.peak[c]));
    measured_saved[mode == StageMode::Nested ? 1 : 0] = m.peak[1];
  }
  // One long region recomputed whole holds all its stages' activations; nested, one stage's.
  CHECK(measured_saved[1] < measured_saved[0]);
}

TEST_CASE("predicted peaks are within 2% of the measured ones: residual MLP chain", "[checkpoint][planner]") {
  examples::ResidualMlpChain<B> chain(16, 64, 256, 128);
  check_predictions(chain);
}

TEST_CASE("predicted peaks are within 2% of the measured ones: transformer stack", "[checkpoint][planner]") {
  SECTION("a stage per block") {
    examples::TransformerStack<B> stack(8, 32, 4, 64, 64, 8, 32);
    check_predictions(stack);
  }
  SECTION("a stage per half block (attention, MLP): cuts inside the blocks") {
    examples::TransformerStack<B> stack(8, 32, 4, 64, 64, 8, 32, 7, true);
    check_predictions(stack);
  }
}

TEST_CASE("under bf16 autocast a plan predicts its peaks within 2% and its gradients are the plain step's bit for bit",
          "[checkpoint][planner][amp]") {
  examples::TransformerStack<B> stack(8, 32, 4, 64, 64, 8, 32, 7, true);
  stack.autocast = DType::BF16;
  check_predictions(stack);
  Planner<B> planner(stack.stages, [&stack](const ChainRunner<B>& run) { stack.step(run); }, {1, {}});
  const auto n = static_cast<std::int64_t>(stack.stages.size());
  const auto reference = gradients(stack, ChainRunner<B>(stack.stages, {{0, n, StageMode::Keep}}));
  const std::int64_t plain = planner.profile().plain_peak[1];
  for (std::int64_t budget : {plain / 2, plain / 4, planner.smallest_budget(MemChannel::Saved)}) {
    const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(budget));
    INFO(plan.str());
    CHECK(gradients(stack, plan.runner()) == reference);
  }
  // The recompute runs in bf16 as the forward did: the same schedule in F32 gives other gradients.
  stack.autocast = DType::F32;
  CHECK(gradients(stack, ChainRunner<B>(stack.stages, {{0, n, StageMode::Keep}})) != reference);
}

TEST_CASE(
    "with bf16 model copies whose gradients are summed in f32 (fp32_grads) the profile counts the f32 gradient and "
    "plans predict their peaks within 2%",
    "[checkpoint][planner][amp][fp32_grads]") {
  // The model state the planner measures: bf16 copies, f32 masters, and gradients of 2 or 4 bytes.
  const auto model_state = [](bool fp32_grads, std::int64_t& numel) {
    examples::TransformerStack<B> stack(8, 32, 4, 64, 64, 8, 32, 7, true);
    stack.autocast = DType::BF16;
    amp::MasterWeights<B> masters(stack.params, {.model_dtype = DType::BF16, .fp32_grads = fp32_grads});
    numel = 0;
    for (const auto& p : stack.params) numel += p.numel();
    Planner<B> planner(stack.stages, [&stack](const ChainRunner<B>& run) { stack.step(run); });
    for (const auto& p : stack.params) REQUIRE(p.grad().dtype() == (fp32_grads ? DType::F32 : DType::BF16));
    if (fp32_grads) check_predictions(stack);
    return planner.profile().model_state;
  };
  std::int64_t numel = 0;
  const std::int64_t bf16_grads = model_state(false, numel);
  const std::int64_t f32_grads = model_state(true, numel);
  CHECK(f32_grads - bf16_grads == 2 * numel);
}

TEST_CASE("on the CPU Offload is never measured nor planned, an Offload region keeps as plain stages do",
          "[checkpoint][planner]") {
  examples::ResidualMlpChain<B> chain(8, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const ChainProfile& p = planner.profile();
  CHECK_FALSE(p.measured[static_cast<std::size_t>(StageMode::Offload)]);
  CHECK(p.measured[static_cast<std::size_t>(StageMode::SaveAttention)]);
  const std::int64_t plain = p.plain_peak[1];
  for (std::int64_t budget : {plain / 2, plain / 4, planner.smallest_budget(MemChannel::Saved)}) {
    const CheckpointPlan<B> plan = planner.plan(Budget::saved_activations(budget));
    for (const Segment& s : plan.segments()) CHECK(s.mode != StageMode::Offload);
  }
  const auto n = static_cast<std::int64_t>(chain.stages.size());
  const std::vector<Segment> offloaded = {{0, 1, StageMode::Keep}, {1, 2, StageMode::Offload}, {2, n, StageMode::Keep}};
  REQUIRE_THROWS_WITH(predict(p, offloaded), Catch::Contains("no offload measurement"));
  // Run anyway, the region's policy asks to offload everything; with nowhere to offload
  // to it keeps everything instead: the plain step's saved bytes and gradients.
  const auto reference = gradients(chain, ChainRunner<B>(chain.stages, {{0, n, StageMode::Keep}}));
  CHECK(gradients(chain, ChainRunner<B>(chain.stages, offloaded)) == reference);
  const StepMeasurement kept = planner.measure({{0, n, StageMode::Keep}});
  const StepMeasurement offload = planner.measure(offloaded);
  CHECK(offload.peak[1] >= kept.peak[1]);  // the region also keeps its input
  CHECK(offload.peak[1] <= kept.peak[1] + p.stages[0].output_bytes);
}

TEST_CASE("Offload is chosen where its transfers hide behind compute, and not where they cost more than a recompute",
          "[checkpoint][planner]") {
  // A measured CPU profile, given the Offload costs a GPU's would have: on the device an
  // offloaded stage keeps what a recompute region keeps (its input), in backward it holds
  // what a plain stage holds (everything comes back), and its times are a plain stage's
  // plus whatever part of the transfer its compute does not hide.
  examples::ResidualMlpChain<B> chain(8, 16, 64, 32);
  Planner<B> planner(chain.stages, [&chain](const ChainRunner<B>& run) { chain.step(run); }, {1, {}});
  const auto with_offload = [&](double unhidden_ms) {
    ChainProfile p = planner.profile();
    const auto keep = static_cast<std::size_t>(StageMode::Keep),
               recompute = static_cast<std::size_t>(StageMode::Recompute),
               offload = static_cast<std::size_t>(StageMode::Offload);
    p.measured[offload] = true;
    for (StageCosts& s : p.stages) {
      s.kept[offload] = s.kept[recompute];
      s.fwd_peak[offload] = s.fwd_peak[keep];
      s.bwd_peak[offload] = s.bwd_peak[keep];
      s.bwd_change[offload] = s.bwd_change[keep];
      for (int c = 0; c < kMemChannels; ++c)  // it ends where a plain stage ends, from less kept
        s.bwd_change[offload][c] += s.kept[keep][c] - s.kept[recompute][c];
      s.fwd_ms[offload] = s.fwd_ms[keep] + unhidden_ms;
      s.bwd_ms[offload] = s.bwd_ms[keep] + unhidden_ms;
    }
    return p;
  };
  const std::int64_t budget = planner.profile().plain_peak[1] / 4;
  const PlanSolution without = solve_chain(planner.profile(), MemChannel::Saved, budget);
  REQUIRE(without.feasible);
  const auto offloaded_stages = [](const PlanSolution& s) {
    std::int64_t n = 0;
    for (const Segment& segment : s.segments) n += segment.mode == StageMode::Offload ? 1 : 0;
    return n;
  };
  // Transfers hidden: offloading costs nothing, so the plan offloads and is faster than any
  // plan that must recompute.
  const ChainProfile hidden = with_offload(0.0);
  const PlanSolution free_copies = solve_chain(hidden, MemChannel::Saved, budget);
  REQUIRE(free_copies.feasible);
  CHECK(offloaded_stages(free_copies) > 0);
  CHECK(free_copies.prediction.ms < without.prediction.ms);
  CHECK(free_copies.prediction.peak[1] <= budget);
  // Transfers that take longer than recomputing any stage: the plan of the profile without
  // offload, unchanged.
  double slowest_recompute = 0.0;
  for (const StageCosts& s : planner.profile().stages) slowest_recompute = std::max(slowest_recompute, s.bwd_ms[1]);
  const PlanSolution slow_link = solve_chain(with_offload(slowest_recompute), MemChannel::Saved, budget);
  REQUIRE(slow_link.feasible);
  CHECK(offloaded_stages(slow_link) == 0);
  CHECK(slow_link.segments == without.segments);
  // And a step planned with offload runs (on the CPU an Offload region keeps instead).
  const auto n = static_cast<std::int64_t>(chain.stages.size());
  const auto reference = gradients(chain, ChainRunner<B>(chain.stages, {{0, n, StageMode::Keep}}));
  CHECK(gradients(chain, ChainRunner<B>(chain.stages, free_copies.segments)) == reference);
}

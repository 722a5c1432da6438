// planner — the checkpoint planner against hand schedules at fixed byte budgets.
//
// Models: the residual MLP chain of checkpoint_schedules at N = 64 and 256, and a
// transformer stack (embedding, B blocks, LayerNorm + vocabulary head) with a stage per
// block ("transformer") or per half block, attention and MLP ("transformer_halves").
// Budgets are fractions (0.5, 0.25, 0.1) of the plain step's peak saved-activation bytes,
// plus the smallest budget any schedule meets. Hand schedules, over the stages: none,
// every stage ("every_block"), every-k (each k), sqrt N, selective (save_matmuls per
// stage), selective + every-k, and for the transformers save_attention per stage
// (policy::save_attention: keeps fused attention's outputs only). Every schedule
// and every plan runs round-robin `reps` times in the same run (median step time; each
// ratio is the median over rounds of the two steps' ratio within a round, see
// paired_ratio; "none_again", the plain step a second time, shows the run's noise). A
// row per (budget, schedule) says whether its measured peak saved bytes fit the budget;
// it also gives the model's time ratio for that schedule (pred: the profile's
// prediction, so the model's error shows row by row) and the minor page faults per step
// (a step whose buffers the allocator's cache no longer holds pays for fresh pages: the
// machine, not the schedule). The planner also reports its predicted peak and its solve
// time, and the solve time of a 1024-stage chain (the model's profile repeated). Each
// budget also prints the profile's lower bound on any schedule's time
// (added_ms_lower_bound): how close to plain these stages allow. With --micro-batches, each
// transformer is planned again for steps that accumulate gradients over that many
// micro-batches (PlannerOptions::micro_batches), at whole-step budgets (the plain step's
// peak, halfway to the smallest, the smallest), and the plan's predicted whole-step peak
// is set against the measured one ("micro_batch_peaks"; bytes, exact and repeatable).
//
//   planner [--json planner.json] [--reps 7] [--models mlp64,mlp256,transformer,transformer_halves]
//           [--width 128] [--hidden 512] [--batch 128] [--blocks 8] [--profile] [--profile-reps 3]
//           [--precision f32|bf16|f16] [--micro-batches 1,2,4]
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/chain_models.hpp"
#include "trainmem/trainmem.hpp"

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using Segments = std::vector<tmem::Segment>;

namespace {

/// The median over rounds of a[r] / b[r]: the time of one schedule against another's, from
/// steps run back to back in the same round. The shared machines here switch between a
/// fast and a slow state for seconds at a time (the MLPs' plain step runs 50 or 80 ms,
/// whole rounds at once); a ratio of two medians mixes rounds of both states whenever the
/// switch falls among them, a ratio within a round does not.
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (std::size_t r = 0; r < a.size() && r < b.size(); ++r) ratios.push_back(a[r] / b[r]);
  return benchmarks::median(ratios);
}

struct Config {
  std::string json_path = "planner.json";
  int reps = 7;
  int profile_reps = 3;
  std::vector<std::string> models{"mlp64", "mlp256", "transformer", "transformer_halves"};
  std::int64_t width = 128, hidden = 512, batch = 128;
  int blocks = 8;
  bool print_profile = false;
  bool op_times = false;
  std::int64_t dim = 128, heads = 4, tokens = 64, seq_batch = 8, vocab = 256;
  std::string precision = "f32";   // f32, or bf16 / f16: the forward under autocast (mixed precision)
  std::vector<int> micro_batches;  // transformers: also plan steps of this many micro-batches
};

/// `segments` contiguous regions of `mode` (sizes differ by at most one), the last one
/// plain: what checkpoint_sequential runs.
Segments sequential(std::int64_t n, std::int64_t segments, tmem::StageMode mode) {
  Segments out;
  std::int64_t begin = 0;
  for (std::int64_t s = 0; s < segments; ++s) {
    const std::int64_t end = begin + n / segments + (s < n % segments ? 1 : 0);
    out.push_back({begin, end, s + 1 < segments ? mode : tmem::StageMode::Keep});
    begin = end;
  }
  return out;
}

/// A lower bound on the time any schedule adds to the plain step to keep at most `budget`
/// saved bytes at the start of backward (when every stage's kept bytes are live at once,
/// so no schedule's peak is lower): each stage may drop up to all it keeps, fractionally,
/// at its cheapest measured rate (ms per byte) of a one-stage recompute region, a
/// one-stage selective or save-attention region, or being rerun whole inside a longer
/// region (its forward).
/// Whole stages and the recompute's transient bytes only make the real cost higher.
double added_ms_lower_bound(const tmem::ChainProfile& p, std::int64_t budget) {
  struct Rate {
    double ms_per_byte;
    double bytes;
  };
  std::vector<Rate> rates;
  double kept = 0.0;
  for (const tmem::StageCosts& st : p.stages) {
    const auto k = static_cast<double>(st.kept[0][1]);
    kept += k;
    if (k <= 0.0) continue;
    double best = st.fwd_ms[0] / k;  // rerun whole inside a longer region: drops all it keeps
    for (int m : {1, 2, 3}) {
      const auto dropped = static_cast<double>(st.kept[0][1] - st.kept[m][1]);
      if (dropped > 0.0) best = std::min(best, std::max(0.0, st.bwd_ms[m] - st.bwd_ms[0]) / dropped);
    }
    rates.push_back({best, k});
  }
  std::sort(rates.begin(), rates.end(), [](const Rate& a, const Rate& b) { return a.ms_per_byte < b.ms_per_byte; });
  double to_drop = kept - static_cast<double>(budget), added = 0.0;
  for (const Rate& r : rates) {
    if (to_drop <= 0.0) break;
    const double d = std::min(to_drop, r.bytes);
    added += d * r.ms_per_byte;
    to_drop -= d;
  }
  return added;
}

std::vector<std::pair<std::string, Segments>> hand_schedules(std::int64_t n, bool with_attention) {
  using M = tmem::StageMode;
  std::vector<std::pair<std::string, Segments>> out;
  out.push_back({"none", {{0, n, M::Keep}}});
  // The same plain step once more: its ratio to "none" is the run's noise floor (an A/A
  // control; on a shared machine it is seldom 1.000).
  out.push_back({"none_again", {{0, n, M::Keep}}});
  Segments each, selective, attention;
  for (std::int64_t k = 0; k < n; ++k) {
    each.push_back({k, k + 1, M::Recompute});
    selective.push_back({k, k + 1, M::Selective});
    attention.push_back({k, k + 1, M::SaveAttention});
  }
  out.push_back({"every_block", each});
  for (std::int64_t k = 2; k <= n / 2; k *= 2)
    out.push_back({"every_" + std::to_string(k), sequential(n, n / k, M::Recompute)});
  out.push_back({"sqrt_n", sequential(n, tmem::sqrt_segments(n), M::Recompute)});
  out.push_back({"selective", selective});
  for (std::int64_t k = 2; k <= 8 && k <= n / 2; k *= 2)
    out.push_back({"selective_every_" + std::to_string(k), sequential(n, n / k, M::Selective)});
  if (with_attention) out.push_back({"save_attention", attention});  // elsewhere it is every_block
  return out;
}

/// Forward time of each op of one transformer block (median of `reps`), for the op-level
/// bound (benchmarks/planner/op_bound.py): the block runs as a checkpoint region whose
/// policy keeps everything and notes the clock each time it is asked, which is as each op
/// finishes, so the gap between two asks is one op (its kernels and its recording).
nlohmann::json block_op_times(const examples::TransformerStack<B>& stack, std::int64_t block_stage, int reps) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::string> names;
  std::vector<std::size_t> bytes;
  std::vector<std::vector<double>> ms;
  for (int r = 0; r < reps + 1; ++r) {  // the first round warms up
    std::size_t k = 0;
    Clock::time_point last;
    tmem::CheckpointOptions o;
    o.policy = [&](const tmem::OpSummary& s) {
      const Clock::time_point now = Clock::now();
      if (k > 0 && r > 0) {  // op 0 is the probe that starts the clock
        if (ms.size() < k) names.emplace_back(s.op.name), bytes.push_back(s.bytes), ms.emplace_back();
        ms[k - 1].push_back(std::chrono::duration<double, std::milli>(now - last).count());
      }
      ++k;
      last = Clock::now();
      return tmem::kMustSave;
    };
    for (auto& p : stack.params) p.zero_grad();
    tmem::Tape<B> tape;
    const tmem::amp::Autocast mixed(stack.autocast, stack.autocast != tmem::DType::F32);  // as the step runs
    auto h = tape.input(stack.input);
    for (std::int64_t i = 0; i < block_stage; ++i) h = stack.stages[static_cast<std::size_t>(i)](h);
    const auto& block = stack.stages[static_cast<std::size_t>(block_stage)];
    h = tmem::checkpoint(
        tape, o, [&](const tmem::Var<B>& x) { return block(tmem::scale(x, 1.0)); }, h);
  }
  // A recompute that needs only z runs feed_forward's first product: timed alone, unrecorded.
  std::vector<double> first_linear;
  {
    tmem::NoGradGuard no_grad;
    const tmem::amp::Autocast mixed(stack.autocast, stack.autocast != tmem::DType::F32);
    tmem::nn::Init init(1);
    const tmem::nn::Linear<B> up(stack.dim_, 4 * stack.dim_, init);
    tmem::Tape<B> tape;
    const auto x =
        tape.input(tmem::Tensor<B>::zeros(tmem::Shape{stack.batch_ * stack.tokens_, stack.dim_}, tmem::DType::F32));
    for (int r = 0; r < reps + 1; ++r) {
      const auto t = Clock::now();
      const auto z = up(x);
      if (r > 0) first_linear.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    }
  }
  nlohmann::json out = nlohmann::json::array();
  std::printf("  forward of block stage %lld, op by op (median of %d):\n", static_cast<long long>(block_stage), reps);
  for (std::size_t i = 0; i < ms.size(); ++i) {
    const double med = benchmarks::median(ms[i]);
    std::printf("    %2zu  %-30s %9zu B  %7.4f ms\n", i, names[i].c_str(), bytes[i], med);
    out.push_back({{"op", names[i]}, {"output_bytes", bytes[i]}, {"ms", med}});
  }
  const double fc1 = benchmarks::median(first_linear);
  std::printf("        feed_forward's first linear alone         %7.4f ms\n", fc1);
  out.push_back({{"op", "feed_forward.first_linear"}, {"output_bytes", 0}, {"ms", fc1}});
  return out;
}

template <class Model>
void run_model(const std::string& name, const Model& model, const Config& c, nlohmann::json& rows,
               nlohmann::json& solves, nlohmann::json& bounds, nlohmann::json& profiles) {
  const tmem::ChainStep<B> step = [&model](const tmem::ChainRunner<B>& run) { model.step(run); };
  const auto n = static_cast<std::int64_t>(model.stages.size());
  const benchmarks::Stopwatch profile_watch;
  tmem::Planner<B> planner(model.stages, step, {c.profile_reps, {}});
  const double profile_s = profile_watch.seconds();
  const tmem::ChainProfile& profile = planner.profile();
  const std::int64_t plain_saved = profile.plain_peak[1];

  struct Budget {
    double fraction;  // < 0: the smallest feasible
    std::int64_t bytes;
  };
  std::vector<Budget> budgets;
  for (double f : {0.5, 0.25, 0.1})
    budgets.push_back({f, static_cast<std::int64_t>(f * static_cast<double>(plain_saved))});
  const std::int64_t least = planner.smallest_budget(tmem::MemChannel::Saved);
  budgets.push_back({static_cast<double>(least) / static_cast<double>(plain_saved), least});

  // Plans (or none where a budget is below the smallest).
  struct Entry {
    std::string schedule;
    Segments segments;
    std::int64_t predicted_saved = 0, predicted_total = 0;
    double predicted_ms = 0.0;
    std::vector<double> ms;
    std::vector<double> faults;  // minor page faults per step (the allocator's cache missed)
    tmem::StepMeasurement peak;
    int budget = -1;  // planner entries: which budget
    double solve_ms = 0.0;
  };
  std::vector<Entry> entries;
  const auto attention = static_cast<std::size_t>(tmem::StageMode::SaveAttention);
  const auto recompute = static_cast<std::size_t>(tmem::StageMode::Recompute);
  const bool with_attention =
      std::any_of(profile.stages.begin(), profile.stages.end(),
                  [&](const tmem::StageCosts& st) { return st.kept[attention] != st.kept[recompute]; });
  for (auto& [schedule, segments] : hand_schedules(n, with_attention)) {
    const tmem::PlanPrediction p = tmem::predict(profile, segments);
    entries.push_back({schedule, segments, p.peak[1], p.peak[0], p.ms, {}, {}, {}, -1, 0.0});
  }
  std::printf(
      "\n%s: %lld stages, profiled in %.1f s; plain step: peak saved %lld B, whole step %lld B, model state %lld B\n",
      name.c_str(), static_cast<long long>(n), profile_s, static_cast<long long>(plain_saved),
      static_cast<long long>(profile.plain_peak[0]), static_cast<long long>(profile.model_state));
  nlohmann::json stage_costs = nlohmann::json::array();
  for (const tmem::StageCosts& st : profile.stages)
    stage_costs.push_back({{"fwd_ms", st.fwd_ms},
                           {"bwd_ms", st.bwd_ms},
                           {"kept_saved_bytes", {st.kept[0][1], st.kept[1][1], st.kept[2][1], st.kept[3][1]}}});
  profiles[name] = {{"modes", {"keep", "recompute", "selective", "save_attention"}},
                    {"plain_ms", profile.plain_ms},
                    {"plain_peak_saved_bytes", plain_saved},
                    {"stages", stage_costs}};
  if (c.print_profile) {
    // The measured costs the plans come from: per stage, forward and backward time and
    // the saved bytes it leaves kept, plain / one-stage recompute region / selective region /
    // save-attention region.
    std::printf(
        "  stage   fwd ms keep/recomp/select/attn   bwd ms keep/recomp/select/attn   kept saved B "
        "keep/recompute/selective/save_attention\n");
    for (std::int64_t s = 0; s < n; ++s) {
      const tmem::StageCosts& st = profile.stages[static_cast<std::size_t>(s)];
      std::printf("  %5lld  %6.2f %6.2f %6.2f %6.2f      %6.2f %6.2f %6.2f %6.2f      %9lld %9lld %9lld %9lld\n",
                  static_cast<long long>(s), st.fwd_ms[0], st.fwd_ms[1], st.fwd_ms[2], st.fwd_ms[3], st.bwd_ms[0],
                  st.bwd_ms[1], st.bwd_ms[2], st.bwd_ms[3], static_cast<long long>(st.kept[0][1]),
                  static_cast<long long>(st.kept[1][1]), static_cast<long long>(st.kept[2][1]),
                  static_cast<long long>(st.kept[3][1]));
    }
  }
  for (std::size_t b = 0; b < budgets.size(); ++b) {
    const benchmarks::Stopwatch solve_watch;
    try {
      const tmem::CheckpointPlan<B> plan = planner.plan(tmem::Budget::saved_activations(budgets[b].bytes));
      const double solve_ms = solve_watch.ms();
      std::printf("%s", plan.str().c_str());
      entries.push_back({"planner",
                         plan.segments(),
                         plan.prediction().peak[1],
                         plan.prediction().peak[0],
                         plan.prediction().ms,
                         {},
                         {},
                         {},
                         static_cast<int>(b),
                         solve_ms});
      solves.push_back({{"model", name}, {"stages", n}, {"budget_bytes", budgets[b].bytes}, {"solve_ms", solve_ms}});
    } catch (const tmem::Error& e) {
      std::printf("budget %.3f: %s\n", budgets[b].fraction, e.what());
    }
  }

  // Round-robin measurement: a warm-up step each, then `reps` rounds. Page faults are
  // counted per step: a step whose buffers the allocator's cache no longer holds pays
  // for fresh pages, which is the machine, not the schedule.
  const auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_minflt);
  };
  for (auto& e : entries) planner.measure(e.segments);
  for (int r = 0; r < c.reps; ++r)
    for (auto& e : entries) {
      const double faults_before = minor_faults();
      const tmem::StepMeasurement m = planner.measure(e.segments);
      e.faults.push_back(minor_faults() - faults_before);
      e.ms.push_back(m.ms);
      e.peak = m;
    }
  const std::vector<double>& none_ms = entries.front().ms;
  // t/none: measured, this run (paired_ratio); pred: the model's time ratio (profile), so its error shows per schedule.
  std::printf("%-12s %-9s %-20s %14s %14s %14s %10s %8s %8s %7s %5s\n", "model", "budget", "schedule", "peak saved B",
              "predicted B", "peak total B", "step ms", "t/none", "pred", "faults", "fits");
  for (std::size_t b = 0; b < budgets.size(); ++b) {
    for (const auto& e : entries) {
      if (e.budget >= 0 && e.budget != static_cast<int>(b)) continue;
      const double ms = benchmarks::median(e.ms);
      const bool fits = e.peak.peak[1] <= budgets[b].bytes;
      char label[32];
      std::snprintf(label, sizeof label, b + 1 == budgets.size() ? "min %.3f" : "%.3f", budgets[b].fraction);
      const double faults = benchmarks::median(e.faults);
      std::printf("%-12s %-9s %-20s %14lld %14lld %14lld %10.2f %8.3f %8.3f %7.0f %5s\n", name.c_str(), label,
                  e.schedule.c_str(), static_cast<long long>(e.peak.peak[1]), static_cast<long long>(e.predicted_saved),
                  static_cast<long long>(e.peak.peak[0]), ms, paired_ratio(e.ms, none_ms),
                  e.predicted_ms / entries.front().predicted_ms, faults, fits ? "yes" : "no");
      rows.push_back({{"model", name},
                      {"stages", n},
                      {"budget_bytes", budgets[b].bytes},
                      {"budget_fraction", budgets[b].fraction},
                      {"budget_is_smallest", b + 1 == budgets.size()},
                      {"schedule", e.schedule},
                      {"peak_saved_bytes", e.peak.peak[1]},
                      {"peak_total_bytes", e.peak.peak[0]},
                      {"predicted_peak_bytes", e.predicted_saved},
                      {"predicted_peak_total_bytes", e.predicted_total},
                      {"step_ms", ms},
                      {"step_ms_all", e.ms},
                      {"time_ratio_vs_none", paired_ratio(e.ms, none_ms)},
                      {"time_ratio_of_medians_vs_none", ms / benchmarks::median(none_ms)},
                      {"predicted_step_ms", e.predicted_ms},
                      {"minor_page_faults_per_step", faults},
                      {"predicted_time_ratio_vs_none", e.predicted_ms / entries.front().predicted_ms},
                      {"fits", fits}});
      if (e.schedule == "planner") rows.back()["solve_ms"] = e.solve_ms;
    }
    // Planner against the fastest hand schedule that fits (fastest by its ratio to none).
    const Entry* planned = nullptr;
    const Entry* best_hand = nullptr;
    double best_hand_ratio = 0.0;
    for (const auto& e : entries) {
      if (e.budget == static_cast<int>(b)) planned = &e;
      if (e.budget >= 0 || e.schedule == "none_again" || e.peak.peak[1] > budgets[b].bytes) continue;
      const double ratio = paired_ratio(e.ms, none_ms);
      if (!best_hand || ratio < best_hand_ratio) best_hand = &e, best_hand_ratio = ratio;
    }
    if (planned)
      std::printf("  budget %.3f: planner %.2f ms vs fastest fitting hand schedule %s %s\n", budgets[b].fraction,
                  benchmarks::median(planned->ms), best_hand ? best_hand->schedule.c_str() : "(none fits)",
                  best_hand ? (std::to_string(paired_ratio(planned->ms, best_hand->ms)) + "x").c_str() : "");
    // How close to plain any schedule could come, by the profile (see added_ms_lower_bound).
    const double bound = 1.0 + added_ms_lower_bound(profile, budgets[b].bytes) / profile.plain_ms;
    std::printf("  budget %.3f: no schedule of these stages adds less than %.3fx the plain step (profile bound)\n",
                budgets[b].fraction, bound);
    bounds.push_back({{"model", name}, {"budget_fraction", budgets[b].fraction}, {"time_ratio_lower_bound", bound}});
  }

  // Solve time on a 1024-stage chain: this profile's stages repeated.
  if (n >= 8) {
    tmem::ChainProfile big = profile;
    big.stages.clear();
    while (big.stages.size() < 1024)
      big.stages.push_back(profile.stages[1 + big.stages.size() % static_cast<std::size_t>(n - 2)]);
    const tmem::PlanPrediction plain_big = tmem::predict(big, {{0, 1024, tmem::StageMode::Keep}});
    for (double f : {0.5, 0.25, 0.1}) {
      const auto budget = static_cast<std::int64_t>(f * static_cast<double>(plain_big.peak[1]));
      const benchmarks::Stopwatch solve_watch;
      const tmem::PlanSolution s = tmem::solve_chain(big, tmem::MemChannel::Saved, budget);
      const double ms = solve_watch.ms();
      // The plan's quality, by the model: predicted time against the plain chain's, and
      // how much of the budget the predicted peak uses.
      const double time_ratio = s.feasible ? s.prediction.ms / plain_big.ms : 0.0;
      const double budget_used =
          s.feasible ? static_cast<double>(s.prediction.peak[1]) / static_cast<double>(budget) : 0.0;
      std::printf(
          "  solve, 1024 stages of %s at %.2f of plain saved: %.1f ms (%s, %zu segments; predicted %.3fx the plain "
          "step, %.1f%% of the budget)\n",
          name.c_str(), f, ms, s.feasible ? "feasible" : "infeasible", s.segments.size(), time_ratio,
          100.0 * budget_used);
      solves.push_back({{"model", name + " x1024"},
                        {"stages", 1024},
                        {"budget_fraction", f},
                        {"solve_ms", ms},
                        {"feasible", s.feasible},
                        {"predicted_time_ratio_vs_none", time_ratio},
                        {"predicted_budget_used", budget_used}});
    }
  }
}

/// The whole step's predicted peak against the measured one for steps of each of
/// c.micro_batches micro-batches, at whole-step budgets: the plain step's peak, halfway
/// from it to the smallest budget any schedule meets, and that smallest. Beside it, what
/// the same step measures under the plan for the same budget made for one micro-batch
/// (what planning without PlannerOptions::micro_batches gave).
void micro_batch_rows(const std::string& name, const examples::TransformerStack<B>& model, const Config& c,
                      nlohmann::json& out) {
  std::printf("\n%s: whole-step peak of a step of k micro-batches, predicted against measured\n", name.c_str());
  std::printf("%-18s %5s %-9s %14s %14s %14s %9s %5s %16s %5s\n", "model", "k", "budget", "budget B", "predicted B",
              "measured B", "error", "fits", "as if k = 1: B", "fits");
  tmem::PlannerOptions one;
  one.profile_reps = c.profile_reps;
  const tmem::Planner<B> planner_one(
      model.stages, [&model](const tmem::ChainRunner<B>& run) { model.step(run, 0.0, 1); }, one);
  for (const int k : c.micro_batches) {
    tmem::PlannerOptions options;
    options.profile_reps = c.profile_reps;
    options.micro_batches = k;
    const auto step_k = [&model, k](const tmem::ChainRunner<B>& run) { model.step(run, 0.0, k); };
    const tmem::Planner<B> planner(model.stages, step_k, options);
    const std::int64_t plain = planner.profile().plain_peak[0];
    const std::int64_t least = planner.smallest_budget(tmem::MemChannel::Total);
    const std::pair<const char*, std::int64_t> budgets[] = {
        {"plain", plain}, {"halfway", (plain + least) / 2}, {"smallest", least}};
    for (const auto& [label, bytes] : budgets) {
      const tmem::CheckpointPlan<B> plan = planner.plan(tmem::Budget::whole_step(bytes));
      planner.measure(plan);  // warm-up
      const tmem::StepMeasurement m = planner.measure(plan);
      const std::int64_t predicted = plan.prediction().peak[0];
      const double error = static_cast<double>(predicted - m.peak[0]) / static_cast<double>(m.peak[0]);
      const bool fits = m.peak[0] <= bytes;
      // The step of k micro-batches under the plan for the same budget made for one (which
      // that budget always fits: one micro-batch never needs more).
      const tmem::CheckpointPlan<B> plan_one = planner_one.plan(tmem::Budget::whole_step(bytes));
      plan_one.step(step_k);  // warm-up
      const std::int64_t as_one = plan_one.step(step_k).peak[0];
      std::printf("%-18s %5d %-9s %14lld %14lld %14lld %+8.3f%% %5s %16lld %5s\n", name.c_str(), k, label,
                  static_cast<long long>(bytes), static_cast<long long>(predicted), static_cast<long long>(m.peak[0]),
                  100.0 * error, fits ? "yes" : "no", static_cast<long long>(as_one), as_one <= bytes ? "yes" : "no");
      out.push_back({{"model", name},
                     {"micro_batches", k},
                     {"budget", label},
                     {"budget_bytes", bytes},
                     {"plain_peak_total_bytes", plain},
                     {"predicted_peak_total_bytes", predicted},
                     {"measured_peak_total_bytes", m.peak[0]},
                     {"relative_error", error},
                     {"segments", plan.segments().size()},
                     {"fits", fits},
                     {"planned_for_one_measured_peak_total_bytes", as_one},
                     {"planned_for_one_fits", as_one <= bytes}});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"trainmem: the checkpoint planner against hand schedules at byte budgets"};
  app.add_option("--json", c.json_path, "where to write the JSON results");
  app.add_option("--reps", c.reps, "timed steps per schedule (median reported)");
  app.add_option("--profile-reps", c.profile_reps, "profiled steps per mode");
  app.add_option("--models", c.models, "mlp64, mlp256, transformer, transformer_halves")->delimiter(',');
  app.add_option("--width", c.width, "MLP chain: block width");
  app.add_option("--hidden", c.hidden, "MLP chain: hidden width");
  app.add_option("--batch", c.batch, "MLP chain: rows per batch");
  app.add_flag("--profile", c.print_profile, "print each model's measured stage costs");
  app.add_flag("--op-times", c.op_times,
               "transformer: also time one block's forward op by op (for benchmarks/planner/op_bound.py)");
  app.add_option("--blocks", c.blocks, "transformer: blocks");
  app.add_option("--dim", c.dim, "transformer: width");
  app.add_option("--tokens", c.tokens, "transformer: sequence length");
  app.add_option("--seq-batch", c.seq_batch, "transformer: sequences per batch");
  app.add_option("--micro-batches", c.micro_batches,
                 "transformers: also plan steps of these many micro-batches and compare whole-step peaks")
      ->delimiter(',');
  app.add_option("--precision", c.precision, "f32, or bf16 / f16: each step's forward under autocast to it")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  CLI11_PARSE(app, argc, argv);
  const tmem::DType autocast = c.precision == "bf16"  ? tmem::DType::BF16
                               : c.precision == "f16" ? tmem::DType::F16
                                                      : tmem::DType::F32;
  const int threads = tmem::num_threads();
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, threads);
  benchmarks::check_writable(c.json_path, provenance);
  std::printf("%s", provenance.text().c_str());
  std::printf(
      "checkpoint planner vs hand schedules, %s, %d threads, median of %d steps, budgets on saved activations\n",
      c.precision == "f32" ? "f32" : (c.precision + " autocast, f32 parameters").c_str(), threads, c.reps);
  nlohmann::json rows = nlohmann::json::array(), solves = nlohmann::json::array(), bounds = nlohmann::json::array(),
                 profiles = nlohmann::json::object(), op_times = nlohmann::json::object(),
                 micro_batch_peaks = nlohmann::json::array();
  for (const std::string& m : c.models) {
    if (m == "mlp64" || m == "mlp256") {
      examples::ResidualMlpChain<B> chain(m == "mlp64" ? 64 : 256, c.width, c.hidden, c.batch);
      chain.autocast = autocast;
      run_model(m, chain, c, rows, solves, bounds, profiles);
    } else if (m == "transformer" || m == "transformer_halves") {
      examples::TransformerStack<B> stack(c.blocks, c.dim, c.heads, 4 * c.dim, c.vocab, c.seq_batch, c.tokens, 7,
                                          m == "transformer_halves");
      stack.autocast = autocast;
      if (c.op_times && m == "transformer") op_times[m] = block_op_times(stack, 1, 4 * c.reps);  // next to the profile
      run_model(m, stack, c, rows, solves, bounds, profiles);
      if (!c.micro_batches.empty()) micro_batch_rows(m, stack, c, micro_batch_peaks);
    } else {
      std::fprintf(stderr, "planner: unknown model '%s'\n", m.c_str());
      return 1;
    }
  }
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  const nlohmann::json out = {{"benchmark", "planner"},
                              {"provenance", nlohmann::json::parse(provenance.json())},
                              {"date", date},
                              {"threads", threads},
                              {"precision", c.precision},
                              {"reps", c.reps},
                              {"mlp", {{"width", c.width}, {"hidden", c.hidden}, {"batch", c.batch}}},
                              {"transformer",
                               {{"blocks", c.blocks},
                                {"dim", c.dim},
                                {"heads", c.heads},
                                {"tokens", c.tokens},
                                {"batch", c.seq_batch},
                                {"vocab", c.vocab}}},
                              {"results", rows},
                              {"solves", solves},
                              {"time_ratio_lower_bounds", bounds},
                              {"profiles", profiles},
                              {"block_op_ms", op_times},
                              {"micro_batches", c.micro_batches},
                              {"micro_batch_peaks", micro_batch_peaks}};
  std::ofstream(c.json_path) << out.dump(2) << "\n";
  std::printf("\nwrote %s\n", c.json_path.c_str());
  return 0;
}

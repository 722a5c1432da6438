// trainmem/checkpoint/planner.hpp — give a byte budget, get the fastest checkpoint schedule
// of a chain of stages that fits it, run through ordinary regions.
//
//   tmem::Planner<B> planner(stages, step, {.restore = {model, masters, optimizer, scaler, tape}});
//   auto plan = planner.plan(tmem::Budget::whole_step(64 << 20));
//   std::printf("%s", plan.str().c_str());
//   step(plan.runner());                                    // a planned step
//   planner.step(plan);                                     // ... measured, its peak checked
//   plan.save("plan.json");                                 // later, in another process:
//   auto fixed = tmem::CheckpointPlan<B>::load(stages, "plan.json", options);  // no profiling
//
// The step is the user's training step written against a ChainRunner (run(x) where the
// stages run, run.backward(loss) where tape.backward would be). The planner profiles it
// in every mode (planner_profile.hpp), models each schedule's peak and time
// (planner_solver.hpp) and picks by dynamic program the fastest whose predicted peak is
// within the budget; a budget no schedule meets is a trainmem::Error naming the smallest
// one that is, and how much of it is model state. Budgets name the whole step's peak
// (parameters, gradients, masters and optimizer state are measured and fixed; only the
// activations move) or the saved activations' peak alone. Where the backend can offload
// to pinned host memory (CUDA), offloading a stage is one more choice, taken where its
// measured time, transfers included, beats recomputing; the CPU has nowhere to offload
// to, so there it is never one.
//
// NOTE [Profiling leaves no trace]
// The step profiled is the step trained, optimizer.step() and all: profiling runs it
// 1 + modes x profile_reps times (13 on the CPU at the default 3 reps; 3 more with a
// StageHold, whose held step is one more mode), and measure()
// runs it too. `PlannerOptions::restore` names what those steps must leave as they found
// it: the objects a resumed run loads (trainmem::save's list: the model, masters,
// optimizer, scaler, the tape or generator, a StateDict of the caller's own such as an LR
// schedule's step). The planner takes a Snapshot of them (state/snapshot.hpp: host copies
// of their states and their parameters' gradients) before its first step and restores it
// after its last, also when a step throws; the thread's cast cache is then cleared (the
// restored parameters' versions moved, so their 16-bit copies would be remade anyway). So
// after planning, parameters, masters, optimizer state (moments, step counts, the
// stochastic-rounding stream), the scaler, the random streams and the gradients are
// bitwise what they were, and training continues as if no plan had been made.
// The restore comes once, after the last profiled step, not between steps: the profile
// measures steady steps (its warm-up allocates the optimizer's state, casts and buffers
// that every later step finds), and restoring a never-stepped optimizer between steps
// would make each one a first step. The weights move between the profiled steps as in
// training; a step's bytes do not depend on them. The snapshot is host memory, which no
// backend allocator counts, taken before the warm-up: the profile's byte counts are those
// of the same profile without it. measure() with `restore` runs the plan twice, a warm-up
// (the profile's steady state) and the measured step, then restores. Without `restore`
// every profiled step, and measure()'s, is a training step of whatever the step updates.
//
// NOTE [Checking the budget]
// A plan is made for the step profiled; a step that runs more micro-batches than
// PlannerOptions::micro_batches, other inputs, or other work peaks elsewhere. A measured
// step (Planner::measure(plan), Planner::step(plan), CheckpointPlan::step) compares its
// peak on the budget's channel with budget x (1 + BudgetCheck::tolerance): above it,
// BudgetCheck::on_over_budget gets an OverBudget (budget, peak, prediction, the plan and
// a one-line message: the library prints nothing, the hook may) and, with
// BudgetCheck::strict, the step ends in a trainmem::Error carrying that message. The
// step has run by then (its update included). A step run as step(plan.runner()) is not
// measured, so not checked. Measuring resets the backend's MemoryStats peak window.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trainmem/autocast/cast_cache.hpp"
#include "trainmem/checkpoint/plan_file.hpp"
#include "trainmem/checkpoint/planner_profile.hpp"
#include "trainmem/checkpoint/planner_solver.hpp"
#include "trainmem/state/snapshot.hpp"

namespace trainmem {

/// \brief What a measured step whose peak went over its plan's budget reports (BudgetCheck).
struct OverBudget {
  Budget budget;               // the plan's
  std::int64_t peak = 0;       // the step's measured peak on the budget's channel
  std::int64_t predicted = 0;  // the plan's predicted peak on that channel
  double tolerance = 0.0;      // BudgetCheck::tolerance
  std::string plan;            // the plan, as CheckpointPlan::str() prints it
  std::string message;         // all of the above in one line, for a log
};

/// \brief What a measured step does when its peak exceeds its plan's budget by more than
/// `tolerance` (NOTE [Checking the budget]).
struct BudgetCheck {
  double tolerance = 0.02;                                  // a fraction of the budget
  std::function<void(const OverBudget&)> on_over_budget{};  // called first, e.g. to print a warning
  bool strict = false;                                      // then: a trainmem::Error
};

/// \brief Settings of a planner.
struct PlannerOptions {
  int profile_reps = 3;  // profiled steps per mode (times are their medians)
  SolverOptions solver{};
  /// What profiling and measure() leave bitwise as they found it (NOTE [Profiling leaves
  /// no trace]): the objects a resumed run loads (anything state_of accepts). They must
  /// outlive the planner. Empty: every profiled step is a real training step.
  std::vector<SnapshotRef> restore{};
  /// Micro-batches the step accumulates gradients over: it calls run(x) and
  /// run.backward(loss) this many times before its optimizer step (NOTE [Micro-batches]
  /// in planner_profile.hpp).
  int micro_batches = 1;
  /// What measure(plan), Planner::step and CheckpointPlan::step do when a step's peak goes
  /// over the plan's budget.
  BudgetCheck budget_check{};
  /// The user's name for the model (its architecture, sizes, batch shape): a saved plan
  /// records it and loads only where it is the same (NOTE [Saved plans] in plan_file.hpp).
  std::string model{};
  /// A choice per stage beside its mode, priced by one more profiled step a round and taken
  /// where it is faster within the budget (checkpoint/stage_hold.hpp; ZeRO-3's
  /// FullyShardedModel::stage_hold keeps a unit's gathered weights through its backward).
  /// A plan that holds needs it to run, and a loaded one too (its `options`).
  StageHold hold{};
};

namespace detail {
/// One step of `step` under `run`, its peaks and time measured.
template <class B>
StepMeasurement measured_step(B& backend, const ChainStep<B>& step, const ChainRunner<B>& run) {
  MemoryStats& stats = backend.memory();
  backend.synchronize();
  stats.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  step(run);
  backend.synchronize();  // the step's queued work is part of its time
  StepMeasurement m;
  m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  m.peak = {stats.peak_device(), stats.peak(MemCategory::SavedActivation)};
  return m;
}
}  // namespace detail

/// \brief A chosen schedule with its prediction; runs through checkpoint regions. Saved
/// as JSON and loaded in another process, it runs there without profiling (NOTE [Saved
/// plans] in plan_file.hpp).
template <class B>
class CheckpointPlan {
 public:
  CheckpointPlan(const std::vector<Layer<B>>& stages, std::vector<Segment> segments, PlanPrediction prediction,
                 Budget budget, const ChainProfile& profile, std::string model = {}, StageHold hold = {})
      : stages_(&stages), hold_(std::move(hold)) {
    record_.model = std::move(model);
    record_.stages = static_cast<std::int64_t>(stages.size());
    record_.micro_batches = profile.micro_batches;
    record_.budget = budget;
    record_.segments = merge(std::move(segments));
    for (const Segment& s : record_.segments) {
      const SegmentCost cost = segment_cost(profile, 1, s);
      record_.segment_kept.push_back(cost.kept);
      record_.segment_ms.push_back(cost.ms);
    }
    record_.prediction = prediction;
    record_.model_state = profile.model_state;
    record_.plain = {profile.plain_peak, profile.plain_ms};
  }
  /// The plan keeps a pointer to `stages` (its runners run them): a temporary would dangle.
  CheckpointPlan(const std::vector<Layer<B>>&& stages, std::vector<Segment> segments, PlanPrediction prediction,
                 Budget budget, const ChainProfile& profile, std::string model = {}, StageHold hold = {}) = delete;

  /// The plan saved in `path` (save()), for `stages`; nothing is profiled. Refused with a
  /// trainmem::Error naming the field where the file is not a plan of this version, or is
  /// for another model: other than stages.size() stages, `options.model` and
  /// `options.micro_batches` micro-batches a step (NOTE [Saved plans] in plan_file.hpp),
  /// or holds stages and `options.hold` is not set.
  static CheckpointPlan load(const std::vector<Layer<B>>& stages, const std::string& path,
                             const PlannerOptions& options = {}) {
    std::ifstream in(path, std::ios::binary);
    detail::check(static_cast<bool>(in), "checkpoint plan ", path, ": cannot open the file");
    std::ostringstream text;
    text << in.rdbuf();
    return from_json(stages, text.str(), options, path);
  }
  static CheckpointPlan load(const std::vector<Layer<B>>&& stages, const std::string& path,
                             const PlannerOptions& options = {}) = delete;
  /// load() from JSON text; `source` names it in an Error.
  static CheckpointPlan from_json(const std::vector<Layer<B>>& stages, std::string_view text,
                                  const PlannerOptions& options = {}, const std::string& source = "plan") {
    PlanRecord r = PlanRecord::from_json(text, source);
    const std::string who = "checkpoint plan " + source;
    const auto n = static_cast<std::int64_t>(stages.size());
    detail::check(r.stages == n, who, ": field 'stages' is ", r.stages, " but the chain has ", n,
                  " stages: the plan is for another model");
    detail::check(r.model == options.model, who, ": field 'model' is '", r.model, "' but PlannerOptions::model is '",
                  options.model, "': the plan is for another model");
    detail::check(r.micro_batches == options.micro_batches, who, ": field 'micro_batches' is ", r.micro_batches,
                  " but PlannerOptions::micro_batches is ", options.micro_batches,
                  ": the plan's peak is for steps of that many micro-batches");
    for (std::size_t i = 0; i < r.segments.size(); ++i) {
      detail::check(HasOffload<B> || r.segments[i].mode != StageMode::Offload, who, ": field 'segments[", i,
                    "].mode' is 'offload', and this backend has no host memory to offload to");
      detail::check(!r.segments[i].hold || static_cast<bool>(options.hold), who, ": field 'segments[", i,
                    "].hold' is true, and PlannerOptions::hold is not set (nothing to hold the stages with)");
    }
    return CheckpointPlan(stages, std::move(r), options.hold);
  }
  static CheckpointPlan from_json(const std::vector<Layer<B>>&& stages, std::string_view text,
                                  const PlannerOptions& options = {}, const std::string& source = "plan") = delete;

  /// The plan as JSON (PlanRecord::to_json).
  std::string to_json() const { return record_.to_json(); }
  /// Writes to_json() to `path`.
  void save(const std::string& path) const {
    const std::string text = to_json();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    detail::check(static_cast<bool>(out), "checkpoint plan ", path, ": cannot open the file for writing");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    detail::check(static_cast<bool>(out), "checkpoint plan ", path, ": writing the file failed");
  }

  /// Everything the plan holds (what save() writes).
  const PlanRecord& record() const { return record_; }
  const std::vector<Segment>& segments() const { return record_.segments; }
  const PlanPrediction& prediction() const { return record_.prediction; }
  const Budget& budget() const { return record_.budget; }
  ChainRunner<B> runner() const { return ChainRunner<B>(*stages_, record_.segments, hold_); }

  /// Whether `m` is within the budget: its peak on the budget's channel at most
  /// budget x (1 + check.tolerance). If not, check.on_over_budget hears of it and, under
  /// check.strict, a trainmem::Error says so (NOTE [Checking the budget]).
  bool check(const StepMeasurement& m, const BudgetCheck& check) const {
    const int c = static_cast<int>(record_.budget.channel);
    const double limit = static_cast<double>(record_.budget.bytes) * (1.0 + check.tolerance);
    if (static_cast<double>(m.peak[c]) <= limit) return true;
    OverBudget over{record_.budget, m.peak[c], record_.prediction.peak[c], check.tolerance, str(), {}};
    over.message = detail::concat(
        "checkpoint plan: the step's ", detail::channel_name(record_.budget.channel), " peak was ", m.peak[c],
        " bytes (", format_bytes(m.peak[c]), "), over its budget of ", record_.budget.bytes, " bytes (",
        format_bytes(record_.budget.bytes), ") by ",
        100.0 * (static_cast<double>(m.peak[c]) / static_cast<double>(record_.budget.bytes) - 1.0),
        "%, more than the tolerance of ", 100.0 * check.tolerance, "%; the plan predicted ", over.predicted,
        " bytes for steps of ", record_.micro_batches,
        " micro-batches (a step of more micro-batches, or of other work than the step profiled, is not the step "
        "planned)");
    if (check.on_over_budget) check.on_over_budget(over);
    detail::check(!check.strict, over.message);
    return false;
  }

  /// Runs one training step `step` under the plan, measures its peaks and time, and checks
  /// them against the budget (check()). The step trains, as any step does.
  StepMeasurement step(const ChainStep<B>& step, const BudgetCheck& budget_check = {},
                       B& backend = B::default_instance()) const {
    const StepMeasurement m = detail::measured_step(backend, step, runner());
    check(m, budget_check);
    return m;
  }

  /// One line per run of equal segments: stages, decision, bytes kept, predicted time.
  std::string str() const {
    const std::vector<Segment>& segments = record_.segments;
    std::string out;
    char line[320];
    const std::string micro =
        record_.micro_batches > 1
            ? detail::concat(", ", record_.micro_batches, " micro-batches a step (segment times per micro-batch)")
            : std::string();
    std::snprintf(line, sizeof line, "checkpoint plan for %zu stages, budget %s %s (model state %s)%s:\n",
                  stages_->size(), detail::channel_name(record_.budget.channel),
                  format_bytes(record_.budget.bytes).c_str(), format_bytes(record_.model_state).c_str(), micro.c_str());
    out += line;
    for (std::size_t i = 0; i < segments.size();) {
      std::size_t e = i + 1;
      const std::int64_t len = segments[i].end - segments[i].begin;
      while (e < segments.size() && segments[e].mode == segments[i].mode && segments[e].hold == segments[i].hold &&
             segments[e].end - segments[e].begin == len)
        ++e;
      std::int64_t kept = 0;
      double ms = 0.0;
      for (std::size_t k = i; k < e; ++k) kept += record_.segment_kept[k], ms += record_.segment_ms[k];
      std::string what = segments[i].mode == StageMode::Keep
                             ? std::string("keep everything")
                             : std::to_string(e - i) + (e - i == 1 ? " region" : " regions") + " of " +
                                   std::to_string(len) + (len == 1 ? " stage, " : " stages, ") +
                                   name_of(segments[i].mode);
      if (segments[i].hold) what += ", holding " + (hold_.name.empty() ? std::string("held") : hold_.name);
      std::snprintf(line, sizeof line, "  stages %4lld-%-4lld  %-40s keeps %12s  %9.2f ms\n",
                    static_cast<long long>(segments[i].begin), static_cast<long long>(segments[e - 1].end - 1),
                    what.c_str(), format_bytes(kept).c_str(), ms);
      out += line;
      i = e;
    }
    const PlanPrediction& p = record_.prediction;
    const StepMeasurement& plain = record_.plain;
    std::snprintf(line, sizeof line,
                  "predicted: whole step %s, saved activations %s, step %.2f ms (plain step: %s, %s, %.2f ms)\n",
                  format_bytes(p.peak[0]).c_str(), format_bytes(p.peak[1]).c_str(), p.ms,
                  format_bytes(plain.peak[0]).c_str(), format_bytes(plain.peak[1]).c_str(), plain.ms);
    out += line;
    return out;
  }

  /// Predicted against measured, one line.
  std::string compare(const StepMeasurement& m) const {
    const PlanPrediction& p = record_.prediction;
    char line[320];
    const auto rel = [](double a, double b) { return b == 0 ? 0.0 : 100.0 * (a - b) / b; };
    std::snprintf(line, sizeof line,
                  "measured: whole step %s (predicted %s, %+.2f%%), saved activations %s (predicted %s, %+.2f%%), "
                  "step %.2f ms (predicted %.2f ms)\n",
                  format_bytes(m.peak[0]).c_str(), format_bytes(p.peak[0]).c_str(),
                  rel(static_cast<double>(p.peak[0]), static_cast<double>(m.peak[0])), format_bytes(m.peak[1]).c_str(),
                  format_bytes(p.peak[1]).c_str(), rel(static_cast<double>(p.peak[1]), static_cast<double>(m.peak[1])),
                  m.ms, p.ms);
    return line;
  }

 private:
  CheckpointPlan(const std::vector<Layer<B>>& stages, PlanRecord record, StageHold hold)
      : stages_(&stages), record_(std::move(record)), hold_(std::move(hold)) {}

  /// Consecutive Keep stages become one Keep segment (what runs is the same).
  static std::vector<Segment> merge(std::vector<Segment> segments) {
    std::vector<Segment> out;
    for (const Segment& s : segments) {
      if (!out.empty() && s.mode == StageMode::Keep && out.back().mode == StageMode::Keep && out.back().hold == s.hold)
        out.back().end = s.end;
      else out.push_back(s);
    }
    return out;
  }

  const std::vector<Layer<B>>* stages_;
  PlanRecord record_;
  StageHold hold_;
};

/// \brief Profiles a chain once, then plans it for any budget.
template <class B>
class Planner {
 public:
  /// Profiles `step` (each mode the backend has x options.profile_reps real training steps, plus a
  /// warm-up), then puts options.restore's objects back as they were. `stages` must outlive
  /// the planner and its plans.
  Planner(const std::vector<Layer<B>>& stages, ChainStep<B> step, PlannerOptions options = {},
          B& backend = B::default_instance())
      : stages_(&stages),
        step_(std::move(step)),
        options_(checked(std::move(options))),
        backend_(&backend),
        profile_(leaving_no_trace([&] {
          return profile_chain(stages, step_, backend, options_.profile_reps, options_.micro_batches, options_.hold);
        })) {}
  /// The planner keeps a pointer to `stages` for its plans, so a temporary (`Planner
  /// planner(model.stages(), ...)` with stages() returning by value) would dangle: not allowed.
  Planner(const std::vector<Layer<B>>&& stages, ChainStep<B> step, PlannerOptions options = {},
          B& backend = B::default_instance()) = delete;

  const ChainProfile& profile() const { return profile_; }
  const std::vector<Layer<B>>& stages() const { return *stages_; }
  const PlannerOptions& options() const { return options_; }

  /// The fastest schedule whose predicted peak fits `budget`; throws trainmem::Error when none does.
  CheckpointPlan<B> plan(Budget budget) const {
    const PlanSolution s = solve_chain(profile_, budget.channel, budget.bytes, options_.solver);
    if (!s.feasible) {
      const std::int64_t least = smallest_budget(budget.channel);
      const std::int64_t state = budget.channel == MemChannel::Total ? profile_.model_state : 0;
      throw Error(detail::concat("checkpoint planner: no schedule of the ", stages_->size(), " stages fits a ",
                                 detail::channel_name(budget.channel), " budget of ", budget.bytes, " bytes (",
                                 format_bytes(budget.bytes), "); the smallest that fits is ", least, " bytes (",
                                 format_bytes(least), "), of which ", state, " bytes (", format_bytes(state),
                                 ") are model state (parameters, gradients, master weights, optimizer state)"));
    }
    return CheckpointPlan<B>(*stages_, s.segments, s.prediction, budget, profile_, options_.model, options_.hold);
  }

  /// The smallest predicted peak any schedule reaches on `channel`.
  std::int64_t smallest_budget(MemChannel channel) const {
    return trainmem::smallest_budget(profile_, channel, options_.solver);
  }

  /// Runs one step under `segments` and measures its peaks and time. With options.restore,
  /// a warm-up step under `segments` comes first (the steady state the profile measured)
  /// and the objects are put back afterwards.
  StepMeasurement measure(const std::vector<Segment>& segments) const {
    return leaving_no_trace([&] {
      if (!options_.restore.empty()) step_(ChainRunner<B>(*stages_, segments, options_.hold));
      return detail::measured_step(*backend_, step_, ChainRunner<B>(*stages_, segments, options_.hold));
    });
  }
  /// measure(plan.segments()), checked against the plan's budget (options.budget_check).
  StepMeasurement measure(const CheckpointPlan<B>& plan) const {
    const StepMeasurement m = measure(plan.segments());
    plan.check(m, options_.budget_check);
    return m;
  }

  /// One training step under `plan` (nothing restored: it trains), measured and checked
  /// against the plan's budget (options.budget_check): CheckpointPlan::step with this
  /// planner's step.
  StepMeasurement step(const CheckpointPlan<B>& plan) const {
    return plan.step(step_, options_.budget_check, *backend_);
  }

 private:
  /// The options, refused before the profile runs if the solver could not use them.
  static PlannerOptions checked(PlannerOptions options) {
    detail::check_solver_options(options.solver);
    detail::check(options.micro_batches >= 1,
                  "checkpoint planner: PlannerOptions::micro_batches must be at least 1, got ", options.micro_batches);
    detail::check(options.budget_check.tolerance >= 0.0,
                  "checkpoint planner: BudgetCheck::tolerance must be a fraction >= 0, got ",
                  options.budget_check.tolerance);
    return options;
  }

  /// `steps()`, with options_.restore's objects put back afterwards (also when it throws)
  /// and the thread's cast cache cleared.
  template <class F>
  auto leaving_no_trace(F&& steps) const {
    if (options_.restore.empty()) return steps();
    const Snapshot before(options_.restore);
    const auto restore = [&before] {
      before.restore();
      amp::CastCache<B>::instance().clear();
    };
    try {
      auto result = steps();
      restore();
      return result;
    } catch (...) {
      restore();
      throw;
    }
  }

  const std::vector<Layer<B>>* stages_;
  ChainStep<B> step_;
  PlannerOptions options_;
  B* backend_;
  ChainProfile profile_;
};

}  // namespace trainmem

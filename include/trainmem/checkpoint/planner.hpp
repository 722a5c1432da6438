// trainmem/checkpoint/planner.hpp — give a byte budget, get the fastest checkpoint schedule
// of a chain of stages that fits it, run through ordinary regions.
//
//   tmem::Planner<B> planner(stages, step, {.restore = {model, masters, optimizer, scaler, tape}});
//   auto plan = planner.plan(tmem::Budget::whole_step(64 << 20));
//   std::printf("%s", plan.str().c_str());
//   step(plan.runner());                                    // a planned step
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
// 1 + modes x profile_reps times (13 on the CPU at the default 3 reps), and measure()
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
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/autocast/cast_cache.hpp"
#include "trainmem/checkpoint/planner_profile.hpp"
#include "trainmem/checkpoint/planner_solver.hpp"
#include "trainmem/state/snapshot.hpp"

namespace trainmem {

/// \brief A byte budget: the whole step's peak on the device, or the peak of saved activations.
struct Budget {
  MemChannel channel = MemChannel::Total;
  std::int64_t bytes = 0;
  static Budget whole_step(std::int64_t bytes) { return {MemChannel::Total, bytes}; }
  static Budget saved_activations(std::int64_t bytes) { return {MemChannel::Saved, bytes}; }
};

namespace detail {
inline const char* channel_name(MemChannel c) { return c == MemChannel::Total ? "whole step" : "saved activations"; }
}  // namespace detail

/// \brief Peak bytes and time of one step, measured.
struct StepMeasurement {
  std::array<std::int64_t, kMemChannels> peak{};
  double ms = 0.0;
};

/// \brief A chosen schedule with its prediction; runs through checkpoint regions.
template <class B>
class CheckpointPlan {
 public:
  CheckpointPlan(const std::vector<Layer<B>>& stages, std::vector<Segment> segments, PlanPrediction prediction,
                 Budget budget, const ChainProfile& profile)
      : stages_(&stages), segments_(merge(std::move(segments))), prediction_(prediction), budget_(budget) {
    for (const Segment& s : segments_) costs_.push_back(segment_cost(profile, 1, s));
    model_state_ = profile.model_state;
    plain_ = {profile.plain_peak, profile.plain_ms};
  }
  /// The plan keeps a pointer to `stages` (its runners run them): a temporary would dangle.
  CheckpointPlan(const std::vector<Layer<B>>&& stages, std::vector<Segment> segments, PlanPrediction prediction,
                 Budget budget, const ChainProfile& profile) = delete;

  const std::vector<Segment>& segments() const { return segments_; }
  const PlanPrediction& prediction() const { return prediction_; }
  const Budget& budget() const { return budget_; }
  ChainRunner<B> runner() const { return ChainRunner<B>(*stages_, segments_); }

  /// One line per run of equal segments: stages, decision, bytes kept, predicted time.
  std::string str() const {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "checkpoint plan for %zu stages, budget %s %s (model state %s):\n",
                  stages_->size(), detail::channel_name(budget_.channel), format_bytes(budget_.bytes).c_str(),
                  format_bytes(model_state_).c_str());
    out += line;
    for (std::size_t i = 0; i < segments_.size();) {
      std::size_t e = i + 1;
      const std::int64_t len = segments_[i].end - segments_[i].begin;
      while (e < segments_.size() && segments_[e].mode == segments_[i].mode &&
             segments_[e].end - segments_[e].begin == len)
        ++e;
      std::int64_t kept = 0;
      double ms = 0.0;
      for (std::size_t k = i; k < e; ++k) kept += costs_[k].kept, ms += costs_[k].ms;
      std::string what = segments_[i].mode == StageMode::Keep
                             ? std::string("keep everything")
                             : std::to_string(e - i) + (e - i == 1 ? " region" : " regions") + " of " +
                                   std::to_string(len) + (len == 1 ? " stage, " : " stages, ") +
                                   name_of(segments_[i].mode);
      std::snprintf(line, sizeof line, "  stages %4lld-%-4lld  %-40s keeps %12s  %9.2f ms\n",
                    static_cast<long long>(segments_[i].begin), static_cast<long long>(segments_[e - 1].end - 1),
                    what.c_str(), format_bytes(kept).c_str(), ms);
      out += line;
      i = e;
    }
    std::snprintf(line, sizeof line,
                  "predicted: whole step %s, saved activations %s, step %.2f ms (plain step: %s, %s, %.2f ms)\n",
                  format_bytes(prediction_.peak[0]).c_str(), format_bytes(prediction_.peak[1]).c_str(), prediction_.ms,
                  format_bytes(plain_.peak[0]).c_str(), format_bytes(plain_.peak[1]).c_str(), plain_.ms);
    out += line;
    return out;
  }

  /// Predicted against measured, one line.
  std::string compare(const StepMeasurement& m) const {
    char line[320];
    const auto rel = [](double a, double b) { return b == 0 ? 0.0 : 100.0 * (a - b) / b; };
    std::snprintf(line, sizeof line,
                  "measured: whole step %s (predicted %s, %+.2f%%), saved activations %s (predicted %s, %+.2f%%), "
                  "step %.2f ms (predicted %.2f ms)\n",
                  format_bytes(m.peak[0]).c_str(), format_bytes(prediction_.peak[0]).c_str(),
                  rel(static_cast<double>(prediction_.peak[0]), static_cast<double>(m.peak[0])),
                  format_bytes(m.peak[1]).c_str(), format_bytes(prediction_.peak[1]).c_str(),
                  rel(static_cast<double>(prediction_.peak[1]), static_cast<double>(m.peak[1])), m.ms, prediction_.ms);
    return line;
  }

 private:
  /// Consecutive Keep stages become one Keep segment (what runs is the same).
  static std::vector<Segment> merge(std::vector<Segment> segments) {
    std::vector<Segment> out;
    for (const Segment& s : segments) {
      if (!out.empty() && s.mode == StageMode::Keep && out.back().mode == StageMode::Keep) out.back().end = s.end;
      else out.push_back(s);
    }
    return out;
  }

  const std::vector<Layer<B>>* stages_;
  std::vector<Segment> segments_;
  std::vector<SegmentCost> costs_;  // saved-activation channel
  PlanPrediction prediction_;
  Budget budget_;
  std::int64_t model_state_ = 0;
  StepMeasurement plain_;
};

/// \brief Settings of a planner.
struct PlannerOptions {
  int profile_reps = 3;  // profiled steps per mode (times are their medians)
  SolverOptions solver{};
  /// What profiling and measure() leave bitwise as they found it (NOTE [Profiling leaves
  /// no trace]): the objects a resumed run loads (anything state_of accepts). They must
  /// outlive the planner. Empty: every profiled step is a real training step.
  std::vector<SnapshotRef> restore{};
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
        profile_(leaving_no_trace([&] { return profile_chain(stages, step_, backend, options_.profile_reps); })) {}
  /// The planner keeps a pointer to `stages` for its plans, so a temporary (`Planner
  /// planner(model.stages(), ...)` with stages() returning by value) would dangle: not allowed.
  Planner(const std::vector<Layer<B>>&& stages, ChainStep<B> step, PlannerOptions options = {},
          B& backend = B::default_instance()) = delete;

  const ChainProfile& profile() const { return profile_; }

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
    return CheckpointPlan<B>(*stages_, s.segments, s.prediction, budget, profile_);
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
      if (!options_.restore.empty()) step_(ChainRunner<B>(*stages_, segments));
      return measured_step(segments);
    });
  }
  StepMeasurement measure(const CheckpointPlan<B>& plan) const { return measure(plan.segments()); }

 private:
  /// The options, refused before the profile runs if the solver could not use them.
  static PlannerOptions checked(PlannerOptions options) {
    detail::check_solver_options(options.solver);
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

  /// One step under `segments`, its peaks and time measured.
  StepMeasurement measured_step(const std::vector<Segment>& segments) const {
    MemoryStats& stats = backend_->memory();
    backend_->synchronize();
    stats.reset_peak();
    const auto start = std::chrono::steady_clock::now();
    step_(ChainRunner<B>(*stages_, segments));
    backend_->synchronize();  // the step's queued work is part of its time
    StepMeasurement m;
    m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    m.peak = {stats.peak_device(), stats.peak(MemCategory::SavedActivation)};
    return m;
  }

  const std::vector<Layer<B>>* stages_;
  ChainStep<B> step_;
  PlannerOptions options_;
  B* backend_;
  ChainProfile profile_;
};

}  // namespace trainmem

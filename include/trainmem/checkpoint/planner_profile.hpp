// trainmem/checkpoint/planner_profile.hpp — what each stage of a chain costs, measured
// in one real training step per way of running it.
//
// NOTE [Profiling a chain in context]
// A stage's bytes depend on its neighbours (who keeps the tensor between two stages,
// when the gradients of later stages appear), so stages are not profiled one by one in
// isolation: the user's own step runs whole, once with every stage plain (Keep), once
// with every stage its own full-recompute region (Recompute), once with every stage its
// own save_matmuls region (Selective), once with every stage its own save_attention
// region (SaveAttention) and, on a backend with somewhere to offload to, once with every
// stage its own offload_all region (Offload). A ChainRunner marks MemoryStats (live and
// window peak of the device total and of saved activations) and the clock between stages
// in forward, and a probe op after each stage does the same in backward (its backward is
// the identity and fires when the stage's output gradient is ready); each mark first
// waits for the backend's queued work (a GPU's kernels and copies), so a window's time
// is that stage's own, its transfers included. Each stage thus
// gets, per mode: forward and backward time, the live change over its forward (what it
// leaves kept), its forward and backward peaks above the live bytes at their starts,
// and the live change over its backward. Probes run only in profiling; a planned step
// runs the stages through ordinary regions and nothing else.
//
// NOTE [Held stages]
// With a StageHold (checkpoint/stage_hold.hpp) the profile runs one more step per round:
// every stage plain and held. A stage's hold price is that step's costs minus the plain
// step's, stage by stage: the bytes its forward leaves kept (for ZeRO-3 exactly the
// unit's gathered weights), its forward peak, its forward and backward times; and
// ChainProfile::held is every mode's costs plus that price (a hold costs the same on top
// of any mode: what it keeps is no activation the mode decides about). Measured, not
// assumed: the bytes are what MemoryStats saw, the times include what the backend overlapped.
// Backward windows are not credited with the bytes a hold saves there. What a held stage
// saves in backward falls in its neighbour's window: with ZeRO-3's prefetch, stage k+1's
// backward gathers unit k ahead, which a held unit k already is. In the all-held step that
// saving shows in stage k+1's window, but it is stage k's hold that makes it, so a plan
// holding k+1 and not k would be credited wrongly (measured: a whole-step peak predicted
// 3.6% low). The price therefore takes a backward window's peak and change as at least
// the plain step's, and a held stage's peak is over-predicted by at most its own bytes and
// those of the stage after it, never under-predicted. After the profile every stage's hold is off.
//
// NOTE [Micro-batches]
// A step that accumulates gradients over k micro-batches runs the chain k times before
// its optimizer step (ChainProfile::micro_batches, PlannerOptions::micro_batches): it
// calls run(x) and run.backward(loss) once per micro-batch. The first micro-batch's
// backward allocates the gradients; every later one runs its forward and backward with
// all of them live (its backward adds into them), so a later micro-batch peaks higher by
// about the gradients' bytes. The profile marks every micro-batch and takes the stages'
// bytes from the last one (the steady one, gradients live from its start), their times
// as medians over all micro-batches and rounds; the first micro-batch's costs are kept
// beside them (ChainProfile::first_micro_batch), and a schedule's predicted peak is the
// larger of the two (planner_solver.hpp). Everything between the micro-batches (tearing
// down a micro-batch's tape) and after the last (the optimizer) is part of the step
// outside the chain.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/policy.hpp"
#include "trainmem/checkpoint/region.hpp"
#include "trainmem/checkpoint/sequential.hpp"
#include "trainmem/checkpoint/stage_hold.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/ops/op_recorder.hpp"

namespace trainmem {

/// How a segment of the chain runs: plain, as one full-recompute region, as one region
/// under policy::save_matmuls (keeps matmul outputs, recomputes the rest), as one region
/// under policy::save_attention (keeps attention's outputs only: between Selective and
/// Recompute in bytes and time), as one region under policy::offload_all (Offload: every
/// activation goes to pinned host memory and comes back for backward, nothing is
/// recomputed; only where the backend has host memory to offload to, HasOffload), or as
/// one full-recompute region whose stages but the last are regions of their own (Nested:
/// its recompute keeps only the inner stages' inputs, and each inner stage is recomputed
/// once more for its own backward; NOTE [Nested segments] in planner_solver.hpp).
enum class StageMode : std::uint8_t {
  Keep = 0,
  Recompute = 1,
  Selective = 2,
  SaveAttention = 3,
  Offload = 4,
  Nested = 5
};
/// Modes a profile measures (Nested's costs follow from Keep's and Recompute's).
inline constexpr int kStageModes = 5;

/// Whether a mode is a one-stage region under a selective policy (Selective, SaveAttention).
inline bool is_selective(StageMode m) { return m == StageMode::Selective || m == StageMode::SaveAttention; }
/// Whether the planner plans a mode over one stage only (the selective modes and Offload).
inline bool is_one_stage(StageMode m) { return is_selective(m) || m == StageMode::Offload; }

inline const char* name_of(StageMode m) {
  switch (m) {
    case StageMode::Keep: return "keep";
    case StageMode::Recompute: return "recompute";
    case StageMode::Selective: return "selective";
    case StageMode::SaveAttention: return "save attention";
    case StageMode::Offload: return "offload";
    case StageMode::Nested: return "nested";
  }
  return "?";
}

/// Stages [begin, end) run in `mode` (a Keep segment is the same as Keep stages one by
/// one), holding what the planner's StageHold names when `hold` is set.
struct Segment {
  std::int64_t begin = 0, end = 0;
  StageMode mode = StageMode::Keep;
  bool hold = false;
  bool operator==(const Segment&) const = default;
};

namespace detail {
/// Checks that `segments` cover stages [0, n) in order, each a nonempty range that starts
/// where the one before it ended; `who` names the caller in the Error.
inline void check_tiling(const char* who, std::int64_t n, const std::vector<Segment>& segments) {
  std::int64_t next = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    check(s.begin == next && s.end > s.begin && s.end <= n, who, ": segment ", i, " covers stages [", s.begin, ", ",
          s.end, "), expected a nonempty range from stage ", next, " within the ", n,
          " stages (the segments cover the stages in order, each starting where the one before it ended)");
    next = s.end;
  }
  check(next == n, who, ": the segments cover stages [0, ", next, ") of ", n, "; they must cover every stage");
}
}  // namespace detail

/// The two byte counts a budget may name: everything live on the device (pinned host
/// copies of offloaded activations are not), or saved activations only.
enum class MemChannel : std::uint8_t { Total = 0, Saved = 1 };
inline constexpr int kMemChannels = 2;

/// \brief Measured costs of one stage, per mode and channel.
struct StageCosts {
  std::array<double, kStageModes> fwd_ms{}, bwd_ms{};
  // [mode][channel]: live change over the forward (kept until backward), peak of the
  // forward above its start, peak of the backward above its start, live change over backward.
  std::array<std::array<std::int64_t, kMemChannels>, kStageModes> kept{}, fwd_peak{}, bwd_peak{}, bwd_change{};
  std::int64_t output_bytes = 0;  // the stage's output (the next stage's input)
};

/// \brief What the planner knows about a chain and the step around it.
struct ChainProfile {
  std::vector<StageCosts> stages;
  std::array<std::int64_t, kMemChannels> start_live{};     // live when the chain starts
  std::array<std::int64_t, kMemChannels> loss_fwd_peak{};  // after the chain, above its end
  std::array<std::int64_t, kMemChannels> loss_live{};      // live added between chain end and backward
  std::array<std::int64_t, kMemChannels> loss_bwd_peak{};  // above live at backward start, before the last stage
  std::array<std::int64_t, kMemChannels> backward_rest{};  // live at the last stage's backward start minus chain end
  std::array<std::int64_t, kMemChannels> outside_peak{};   // absolute: before the chain, after backward (optimizer)
  std::array<std::int64_t, kMemChannels> plain_peak{};     // the plain step's measured peak
  // Modes the profile ran: all but Offload everywhere, Offload where the backend offloads.
  std::array<bool, kStageModes> measured{true, true, true, true, false};
  std::int64_t model_state = 0;  // parameters + gradients + master weights + optimizer state, at most
  double outside_ms = 0.0;       // time of the step outside the stages (all its micro-batches)
  double plain_ms = 0.0;         // the plain step's measured time (all its micro-batches)
  // Micro-batches a step runs the chain for (NOTE [Micro-batches]): the costs above are
  // the last micro-batch's, a stage's times are per micro-batch.
  int micro_batches = 1;
  // With micro_batches > 1: the first micro-batch's costs (its gradients appear during its
  // backward), a profile of one micro-batch; empty otherwise.
  std::vector<ChainProfile> first_micro_batch;
  // Profiled with a StageHold: each stage's costs, every mode, with the stage held
  // (NOTE [Held stages]); empty otherwise.
  std::vector<StageCosts> held;

  /// The stages' costs unheld or held.
  const std::vector<StageCosts>& costs(bool hold) const { return hold ? held : stages; }

  std::int64_t size() const { return static_cast<std::int64_t>(stages.size()); }
};

namespace detail {

inline constexpr OpInfo kPlannerProbeOp{"planner probe", OpKind::Shape, AutocastCategory::Unchanged};

/// Identity op whose backward calls `on_backward` (the stage's output gradient is ready).
template <class B>
Var<B> planner_probe(const Var<B>& x, std::function<void()> on_backward) {
  OpRecorder<B> rec(kPlannerProbeOp, {x}, 0.0);
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] { return Outputs<B>{tx}; });
  return rec.finish(out[0], [on_backward = std::move(on_backward)](const Grads<B>& g) {
    on_backward();
    return Grads<B>{g[0]};
  });
}

/// \brief Marks of clock and MemoryStats through one profiled step.
struct ProfileRecorder {
  struct Mark {
    double ms;
    std::array<std::int64_t, kMemChannels> live, peak;  // peak: over the window that this mark closes
    std::int64_t state_peak;                            // model-state categories' peaks in that window
  };
  MemoryStats* stats = nullptr;
  std::function<void()> synchronize;  // waits for the backend's queued work
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  std::vector<Mark> marks;
  std::vector<std::int64_t> output_bytes;
  std::vector<bool> output_saved;  // the stage itself keeps its output (e.g. ReLU saves its result)

  void mark() {
    synchronize();
    Mark m;
    m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - origin).count();
    m.live = {stats->live_device(), stats->live(MemCategory::SavedActivation)};
    m.peak = {stats->peak_device(), stats->peak(MemCategory::SavedActivation)};
    m.state_peak = stats->peak(MemCategory::Parameter) + stats->peak(MemCategory::Gradient) +
                   stats->peak(MemCategory::MasterWeight) + stats->peak(MemCategory::OptimizerState);
    stats->reset_peak();
    marks.push_back(m);
  }
};

}  // namespace detail

/// \brief Runs a chain of stages under a list of segments: what a step function calls
/// where it would run the stages, and (for the planner's probes) `backward(loss)`
/// where it would call tape.backward(loss).
template <class B>
class ChainRunner {
 public:
  /// `hold` turns each segment's StageHold on or off for its stages before running them;
  /// a segment with `hold` set needs one.
  ChainRunner(const std::vector<Layer<B>>& stages, std::vector<Segment> segments, StageHold hold = {},
              detail::ProfileRecorder* recorder = nullptr)
      : stages_(&stages), segments_(std::move(segments)), hold_(std::move(hold)), recorder_(recorder) {
    detail::check_tiling("ChainRunner", static_cast<std::int64_t>(stages.size()), segments_);
    for (std::size_t i = 0; i < segments_.size(); ++i)
      detail::check(!segments_[i].hold || static_cast<bool>(hold_), "ChainRunner: segment ", i,
                    " holds its stages, and the runner has no StageHold to hold with");
  }
  /// The runner keeps a pointer to `stages`, so a temporary (`ChainRunner run(model.stages(),
  /// ...)` with stages() returning by value) would dangle at the first call: not allowed.
  ChainRunner(const std::vector<Layer<B>>&& stages, std::vector<Segment> segments, StageHold hold = {},
              detail::ProfileRecorder* recorder = nullptr) = delete;

  /// The stages on x, segment by segment (every mode but Keep runs as a region).
  Var<B> operator()(const Var<B>& x) const {
    detail::check(x.tape() != nullptr, "ChainRunner: the chain's input must be on a tape (tape.input)");
    Tape<B>& tape = *x.tape();
    if (recorder_ != nullptr) recorder_->mark();
    const std::vector<Layer<B>>* stages = stages_;
    Var<B> h = x;
    for (const Segment& s : segments_) {
      if (hold_)
        for (std::int64_t k = s.begin; k < s.end; ++k) hold_.set(k, s.hold);
      auto run = [stages, begin = s.begin, end = s.end, nested = s.mode == StageMode::Nested](const Var<B>& input) {
        Var<B> y = input;
        for (std::int64_t i = begin; i < end; ++i) {
          const Layer<B>& stage = (*stages)[static_cast<std::size_t>(i)];
          y = nested && i + 1 < end ? checkpoint(*y.tape(), stage, y) : stage(y);
        }
        return y;
      };
      if (s.mode == StageMode::Keep) {
        h = run(h);
      } else {
        CheckpointOptions options;
        if (s.mode == StageMode::Selective) options.policy = policy::save_matmuls();
        if (s.mode == StageMode::SaveAttention) options.policy = policy::save_attention();
        if (s.mode == StageMode::Offload) options.policy = policy::offload_all();
        h = checkpoint(tape, options, run, h);
      }
      if (recorder_ != nullptr) {
        if (recorder_->output_bytes.size() < stages_->size()) {
          recorder_->output_bytes.push_back(static_cast<std::int64_t>(h.value().bytes()));
          recorder_->output_saved.push_back(h.value().category() == MemCategory::SavedActivation);
        }
        recorder_->mark();
        if (h.requires_grad()) {
          detail::ProfileRecorder* r = recorder_;
          h = detail::planner_probe(h, [r] { r->mark(); });
        }
      }
    }
    return h;
  }

  /// tape.backward(loss) (the planner's profile marks its start and end).
  void backward(const Var<B>& loss) const {
    detail::check(loss.tape() != nullptr, "ChainRunner::backward: the loss is not on a tape");
    backward_with([&loss] { loss.tape()->backward(loss); });
  }
  /// Runs `run_backward` (a backward of the user's own, e.g. through a loss scaler) as the backward.
  template <class F>
  void backward_with(F&& run_backward) const {
    if (recorder_ != nullptr) recorder_->mark();
    std::forward<F>(run_backward)();
    if (recorder_ != nullptr) recorder_->mark();
  }

  const std::vector<Segment>& segments() const { return segments_; }

 private:
  const std::vector<Layer<B>>* stages_;
  std::vector<Segment> segments_;
  StageHold hold_;
  detail::ProfileRecorder* recorder_;
};

/// A training step written against a ChainRunner: runs `run(x)` once on its chain input
/// and `run.backward(loss)` once instead of tape.backward(loss), or each once per
/// micro-batch when it accumulates gradients over several (NOTE [Micro-batches]).
template <class B>
using ChainStep = std::function<void(const ChainRunner<B>&)>;

namespace detail {

/// One profiled step in `mode` (every stage its own segment).
template <class B>
std::vector<ProfileRecorder::Mark> profiled_step(const std::vector<Layer<B>>& stages, const ChainStep<B>& step,
                                                 B& backend, StageMode mode, const StageHold& hold, bool held,
                                                 int micro_batches, std::vector<std::int64_t>& output_bytes,
                                                 std::vector<bool>& output_saved) {
  std::vector<Segment> segments;
  const auto n = static_cast<std::int64_t>(stages.size());
  for (std::int64_t k = 0; k < n; ++k) segments.push_back({k, k + 1, mode, held});
  MemoryStats& stats = backend.memory();
  ProfileRecorder recorder;
  recorder.stats = &stats;
  recorder.synchronize = [&backend] { backend.synchronize(); };
  const auto expected = static_cast<std::size_t>(micro_batches * (2 * n + 3) + 2);
  recorder.marks.reserve(expected);
  ChainRunner<B> runner(stages, segments, hold, &recorder);
  backend.synchronize();
  stats.reset_peak();
  recorder.mark();
  step(runner);
  recorder.mark();
  check(recorder.marks.size() == expected, "checkpoint planner: the profiled step made ", recorder.marks.size(),
        " marks, expected ", expected, " for ", n, " stages and ", micro_batches,
        " micro-batches (PlannerOptions::micro_batches): the step must call run(x) once on the chain's input and "
        "run.backward(loss) once per micro-batch, and every stage's output must require grad");
  output_bytes = recorder.output_bytes;
  if (mode == StageMode::Keep && !held) output_saved = recorder.output_saved;
  return recorder.marks;
}

}  // namespace detail

/// Profiles `stages` through `step`: one unmeasured warm-up step (allocates what every
/// later step finds: optimizer state, casts, pinned buffers), then `reps` rounds of one
/// step per mode, round-robin (Offload only where the backend has HasOffload); a time is
/// the median over the rounds (a plan is judged by its median step, and the least of a
/// few rounds understates a stage by however lucky its quietest round was) and, for a
/// stage, over the step's `micro_batches` micro-batches; bytes come from the last round
/// (they are exact and repeat) and its last micro-batch, the first micro-batch's beside
/// them (NOTE [Micro-batches]). With `hold`, each round also runs the plain step with every
/// stage held (NOTE [Held stages]). Each profiled step is a real training step; a Planner
/// with `restore` puts the state back after the last one (NOTE [Profiling leaves no
/// trace] in planner.hpp).
template <class B>
ChainProfile profile_chain(const std::vector<Layer<B>>& stages, const ChainStep<B>& step, B& backend, int reps = 3,
                           int micro_batches = 1, const StageHold& hold = {}) {
  using Mark = detail::ProfileRecorder::Mark;
  const auto n = static_cast<std::int64_t>(stages.size());
  detail::check(n > 0, "profile_chain: no stages");
  detail::check(reps >= 1, "profile_chain: reps must be >= 1, got ", reps);
  detail::check(micro_batches >= 1, "profile_chain: micro_batches must be >= 1, got ", micro_batches);
  step(ChainRunner<B>(stages, {{0, n, StageMode::Keep}}, hold));  // warm-up
  if constexpr (HasOffload<B>) {  // and the pinned buffers an Offload step takes from its cache
    std::vector<Segment> offloaded;
    for (std::int64_t k = 0; k < n; ++k) offloaded.push_back({k, k + 1, StageMode::Offload});
    step(ChainRunner<B>(stages, offloaded, hold));
  }
  std::array<bool, kStageModes> measured = ChainProfile{}.measured;
  measured[static_cast<std::size_t>(StageMode::Offload)] = HasOffload<B>;
  std::array<std::vector<std::vector<Mark>>, kStageModes> runs;
  std::vector<std::int64_t> output_bytes;
  std::vector<bool> output_saved;
  std::vector<std::vector<Mark>> held_runs;  // every stage plain and held (NOTE [Held stages])
  for (int r = 0; r < reps; ++r) {
    for (int m = 0; m < kStageModes; ++m)
      if (measured[static_cast<std::size_t>(m)])
        runs[m].push_back(detail::profiled_step(stages, step, backend, static_cast<StageMode>(m), hold, false,
                                                micro_batches, output_bytes, output_saved));
    if (hold)
      held_runs.push_back(detail::profiled_step(stages, step, backend, StageMode::Keep, hold, true, micro_batches,
                                                output_bytes, output_saved));
  }
  if (hold)
    for (std::int64_t k = 0; k < n; ++k) hold.set(k, false);  // as before the profile

  // Mark indices: 0 step start; micro-batch i's marks from base(i) = 1 + i(2n+3) on:
  // +0 chain start, +1+k after stage k, +n+1 backward call, +n+2+(n-1-k) stage k's output
  // gradient ready, +2n+2 backward return; the step's end last.
  const auto per_batch = static_cast<std::size_t>(2 * n + 3);
  const auto base = [per_batch](int i) { return 1 + static_cast<std::size_t>(i) * per_batch; };
  const std::size_t last = base(micro_batches);
  const auto bwd_index = [n](std::int64_t k) { return static_cast<std::size_t>(n + 2 + (n - 1 - k)); };
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  };
  const auto span_ms = [&](int m, std::size_t a, std::size_t b) {  // the median over the rounds
    std::vector<double> v;
    for (const auto& marks : runs[m]) v.push_back(marks[b].ms - marks[a].ms);
    return median(v);
  };
  // A window of every micro-batch (offsets from base): the median over rounds and micro-batches.
  const auto batch_span_ms = [&](const std::vector<std::vector<Mark>>& rounds, std::size_t a, std::size_t b) {
    std::vector<double> v;
    for (const auto& marks : rounds)
      for (int i = 0; i < micro_batches; ++i) v.push_back(marks[base(i) + b].ms - marks[base(i) + a].ms);
    return median(v);
  };
  // Stage k's costs in slot m of s, from the rounds of one mode and micro-batch i's bytes.
  const auto stage_costs = [&](const std::vector<std::vector<Mark>>& rounds, int i, std::int64_t k, int m,
                               StageCosts& s) {
    const std::vector<Mark>& mk = rounds.back();
    const std::size_t b = base(i);
    const auto f0 = static_cast<std::size_t>(k), f1 = f0 + 1, b0 = bwd_index(k), b1 = b0 + 1;
    s.fwd_ms[m] = batch_span_ms(rounds, f0, f1);
    s.bwd_ms[m] = batch_span_ms(rounds, b0, b1);
    for (int c = 0; c < kMemChannels; ++c) {
      s.kept[m][c] = mk[b + f1].live[c] - mk[b + f0].live[c];
      s.fwd_peak[m][c] = mk[b + f1].peak[c] - mk[b + f0].live[c];
      s.bwd_peak[m][c] = mk[b + b1].peak[c] - mk[b + b0].live[c];
      s.bwd_change[m][c] = mk[b + b1].live[c] - mk[b + b0].live[c];
    }
    s.output_bytes = output_bytes[static_cast<std::size_t>(k)];
  };
  // The costs with micro-batch i's bytes (times are every micro-batch's).
  const auto costs_of = [&](int i) {
    const std::size_t b = base(i);
    ChainProfile p;
    p.measured = measured;
    p.stages.resize(static_cast<std::size_t>(n));
    for (int m = 0; m < kStageModes; ++m) {
      if (!measured[static_cast<std::size_t>(m)]) continue;  // never planned: solve_chain skips it
      for (std::int64_t k = 0; k < n; ++k) stage_costs(runs[m], i, k, m, p.stages[static_cast<std::size_t>(k)]);
    }
    // A hold's price, stage by stage: the held plain step's costs minus the plain step's.
    std::vector<StageCosts> hold_price;
    if (hold) {
      hold_price.resize(static_cast<std::size_t>(n));
      for (std::int64_t k = 0; k < n; ++k) {
        StageCosts& d = hold_price[static_cast<std::size_t>(k)];
        const StageCosts& plain = p.stages[static_cast<std::size_t>(k)];
        stage_costs(held_runs, i, k, 0, d);
        d.fwd_ms[0] -= plain.fwd_ms[0];
        d.bwd_ms[0] -= plain.bwd_ms[0];
        for (int c = 0; c < kMemChannels; ++c) {
          d.kept[0][c] -= plain.kept[0][c];
          d.fwd_peak[0][c] -= plain.fwd_peak[0][c];
          // No backward window is credited with bytes (NOTE [Held stages]).
          d.bwd_peak[0][c] = std::max<std::int64_t>(0, d.bwd_peak[0][c] - plain.bwd_peak[0][c]);
          d.bwd_change[0][c] = std::max<std::int64_t>(0, d.bwd_change[0][c] - plain.bwd_change[0][c]);
        }
      }
    }
    // A stage without fused attention keeps under save_attention just what it keeps under
    // recompute_all: it is that mode there, so it takes Recompute's costs, and the solver
    // (which keeps the lower mode on a tie) never names it for such a stage.
    const auto save_attention = static_cast<std::size_t>(StageMode::SaveAttention);
    const auto recompute = static_cast<std::size_t>(StageMode::Recompute);
    for (StageCosts& s : p.stages) {
      if (s.kept[save_attention] != s.kept[recompute]) continue;
      s.fwd_ms[save_attention] = s.fwd_ms[recompute];
      s.bwd_ms[save_attention] = s.bwd_ms[recompute];
      s.fwd_peak[save_attention] = s.fwd_peak[recompute];
      s.bwd_peak[save_attention] = s.bwd_peak[recompute];
      s.bwd_change[save_attention] = s.bwd_change[recompute];
    }
    // A plain stage that keeps its own output (ReLU) tags the next stage's input as saved;
    // a region after it would count that tensor again, a plain stage after a region would
    // not count it at all. So the saved channel books that tensor to the next stage, as
    // every mode of the next stage then counts it (a region keeps its input; a plain stage
    // saves it, as matmuls and norms do); the backward of the stage that made it still
    // frees it, so what the next stage's backward leaves behind grows by it (safe: at
    // most one tensor too many while the stage before runs backward).
    for (std::int64_t k = 0; k + 1 < n; ++k) {
      if (!output_saved[static_cast<std::size_t>(k)]) continue;
      const std::int64_t o = output_bytes[static_cast<std::size_t>(k)];
      StageCosts& s = p.stages[static_cast<std::size_t>(k)];
      StageCosts& next = p.stages[static_cast<std::size_t>(k + 1)];
      s.kept[0][1] -= o;
      next.kept[0][1] += o;
      next.fwd_peak[0][1] += o;
    }
    if (hold) {  // every mode held: its costs plus the hold's price
      p.held = p.stages;
      for (std::int64_t k = 0; k < n; ++k) {
        StageCosts& h = p.held[static_cast<std::size_t>(k)];
        const StageCosts& d = hold_price[static_cast<std::size_t>(k)];
        for (int m = 0; m < kStageModes; ++m) {
          h.fwd_ms[m] = std::max(0.0, h.fwd_ms[m] + d.fwd_ms[0]);
          h.bwd_ms[m] = std::max(0.0, h.bwd_ms[m] + d.bwd_ms[0]);
          for (int c = 0; c < kMemChannels; ++c) {
            h.kept[m][c] += d.kept[0][c];
            h.fwd_peak[m][c] += d.fwd_peak[0][c];
            h.bwd_peak[m][c] += d.bwd_peak[0][c];
            h.bwd_change[m][c] += d.bwd_change[0][c];
          }
        }
      }
    }
    const std::vector<Mark>& mk = runs[0].back();
    const std::size_t chain_end = b + static_cast<std::size_t>(n), bwd_call = chain_end + 1;
    const std::size_t bwd_return = b + per_batch - 1;
    for (int c = 0; c < kMemChannels; ++c) {
      p.start_live[c] = mk[b].live[c];
      p.loss_fwd_peak[c] = mk[bwd_call].peak[c] - mk[chain_end].live[c];
      p.loss_live[c] = mk[bwd_call].live[c] - mk[chain_end].live[c];
      p.loss_bwd_peak[c] = mk[bwd_call + 1].peak[c] - mk[bwd_call].live[c];
      p.backward_rest[c] = mk[bwd_call + 1].live[c] - mk[chain_end].live[c];
      // Before the chain (the window up to its start) and after its backward (up to the
      // next micro-batch's chain, or the step's end: the optimizer).
      p.outside_peak[c] = std::max(mk[b].peak[c], mk[bwd_return + 1].peak[c]);
      std::int64_t peak = 0;
      for (std::size_t x = b; x <= bwd_return + 1; ++x) peak = std::max(peak, mk[x].peak[c]);
      p.plain_peak[c] = peak;
    }
    return p;
  };
  ChainProfile p = costs_of(micro_batches - 1);
  p.micro_batches = micro_batches;
  const std::vector<Mark>& mk = runs[0].back();
  for (int c = 0; c < kMemChannels; ++c) {  // every window outside the chains; the whole step's peak
    for (int i = 0; i < micro_batches; ++i) p.outside_peak[c] = std::max(p.outside_peak[c], mk[base(i)].peak[c]);
    p.outside_peak[c] = std::max(p.outside_peak[c], mk[last].peak[c]);
    for (const Mark& x : mk) p.plain_peak[c] = std::max(p.plain_peak[c], x.peak[c]);
  }
  if (micro_batches > 1) p.first_micro_batch.push_back(costs_of(0));
  for (const Mark& x : mk) p.model_state = std::max(p.model_state, x.state_peak);
  // Time outside the stages: before the first chain, each micro-batch's loss (chain end to
  // the last stage's output gradient), and from each backward's return to the next chain
  // (or the step's end).
  p.outside_ms = span_ms(0, 0, 1);
  for (int i = 0; i < micro_batches; ++i) {
    const std::size_t chain_end = base(i) + static_cast<std::size_t>(n);
    p.outside_ms += span_ms(0, chain_end, chain_end + 2) + span_ms(0, base(i) + per_batch - 1, base(i) + per_batch);
  }
  p.plain_ms = span_ms(0, 0, last);
  return p;
}

}  // namespace trainmem

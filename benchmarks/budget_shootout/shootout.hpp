// benchmarks/budget_shootout/shootout.hpp — trainmem's side of the fixed-budget shoot-out, on any
// backend: with B bytes for the whole step, how many tokens per step can it train, and how fast?
//
// For each budget (peak bytes of a whole steady-state step on the device: parameters,
// gradients, master weights, AdamW moments, activations, workspaces, the batch — every
// byte MemoryStats sees the backend's allocator hand out, MemoryStats::peak_device(),
// which on the CPU is the total) it finds the largest batch (in sequences) for which the
// checkpoint planner has a schedule that fits, checks that schedule's measured peak
// against the budget with real steps, then trains `steps` AdamW steps in BF16 (autocast,
// f32 masters) from the initial weights under that schedule and reports the time per
// token (median step, after two warm-up steps; each step ends with the loss read back,
// so a GPU step is timed whole), the measured peak and the loss of every step.
//
// The search brackets the batch from the planner's predictions at two small batches
// (the smallest budget each fits, a straight line through them), then bisects. Each
// probe either profiles the chain at that batch (the default: exact, but a GPU cannot
// profile a plain step that does not fit its memory) or, with --extrapolate A,B, plans
// from the two small batches' profiles extrapolated linearly in the batch
// (`extrapolate_profile`) — every byte and time of a step grows with the batch but the
// model state and workspaces, which stay — and runs two real steps under the plan to
// measure it. One model serves every probe (Gpt::set_batch); the training runs start
// from a snapshot of the initial weights, optimizer and masters (trainmem::Snapshot).
//
// `--export DIR` writes the initial weights (export.hpp) for torch_side.py (then exits
// with --export-only); `--fixed-batch N` trains N sequences per step with no
// checkpointing and no budget (the loss reference both sides compare at one batch size).
// Rows: side, schedule ("planner"), budget_mib, batch, tokens_per_step, us_per_token,
// peak_bytes (the steady training steps' peak), losses, and how the search went; the JSON
// is rewritten after every budget, so a run cut short keeps the budgets it finished.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "budget_shootout/export.hpp"
#include "budget_shootout/gpt.hpp"
#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/trainmem.hpp"

namespace shootout {

inline constexpr std::uint64_t kSeed = 20261201;

struct Settings {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string json_path = "budget_shootout_trainmem.json";
  std::vector<double> budgets_mib{128, 256, 512};
  int steps = 20;       // training steps at the first budget (its losses are the comparison)
  int later_steps = 0;  // at the budgets after it (0: `steps`)
  double lr = 1e-3;
  double time_limit_s = 0;                  // no budget is started after this many seconds (0: none)
  std::vector<std::int64_t> bracket{4, 8};  // the two small batches whose predictions bracket the search
  bool extrapolate = false;                 // plan from the bracket's profiles, extrapolated
  GptSizes sizes;
};

/// \brief The model, its optimizer and precision, and a snapshot of all three as they started.
template <class B>
struct Trainer {
  /// `before_training` sees the model before the optimizer and masters take its parameters.
  Trainer(const Settings& s, std::int64_t batch, const std::function<void(const Gpt<B>&)>& before_training = {})
      : model(s.sizes, batch, kSeed) {
    if (before_training) before_training(model);
    optimizer.emplace(model.parameters(), trainmem::optim::AdamWOptions{.lr = s.lr});
    precision.emplace(*optimizer, trainmem::amp::TrainStepOptions{.precision = trainmem::DType::BF16});
    params = model.parameters();
    std::vector<trainmem::SnapshotRef> objects{*optimizer, *precision};
    for (trainmem::Var<B>& p : params) objects.emplace_back(p);
    initial.emplace(objects);
  }

  /// Weights, masters and optimizer state as they were before the first step.
  void reset() const { initial->restore(); }

  /// One step on `step`'s windows, the stages run by `run`; returns the loss (read back: a device wait).
  double step(const std::vector<std::int32_t>& text, std::int64_t step, const trainmem::ChainRunner<B>& run) {
    auto [ids, labels] = model.batch_of(text, step);
    trainmem::Tensor<B> loss_value;
    {
      trainmem::Tape<B> tape;
      const trainmem::Var<B> loss =
          precision->forward([&] { return trainmem::cross_entropy(run(tape.input(ids)), labels); });
      loss_value = loss.value();
      run.backward_with([&] { precision->backward(loss); });
      precision->update();
    }
    return loss_value.template to_host<double>()[0];
  }

  Gpt<B> model;
  std::optional<trainmem::optim::AdamW<B>> optimizer;
  std::optional<trainmem::amp::TrainStep<B>> precision;
  std::vector<trainmem::Var<B>> params;
  std::optional<trainmem::Snapshot> initial;
};

/// Gives cached memory back where the backend caches (a GPU's pool, its pinned host buffers,
/// which are cached by size: every probed batch has new sizes, and host memory is finite).
template <class B>
void release_cached(B& backend) {
  if constexpr (requires { backend.allocator().release_cached(); }) backend.allocator().release_cached();
}

/// A profile for `batch` sequences from the profiles at `a` and `b` sequences: every byte
/// and time count on the straight line through the two (what does not grow with the batch,
/// the model state and workspaces, stays put on it); which modes were measured, from `pa`.
inline trainmem::ChainProfile extrapolate_profile(const trainmem::ChainProfile& pa, std::int64_t a,
                                                  const trainmem::ChainProfile& pb, std::int64_t b,
                                                  std::int64_t batch) {
  trainmem::require(a != b && pa.size() == pb.size(), "extrapolate_profile: two profiles of one chain at two batches");
  const double t = static_cast<double>(batch - a) / static_cast<double>(b - a);
  const auto line = [t](auto x, auto y) {
    using T = decltype(x);
    const double v = static_cast<double>(x) + t * (static_cast<double>(y) - static_cast<double>(x));
    if constexpr (std::is_integral_v<T>) return static_cast<T>(std::llround(v));
    else return static_cast<T>(v);
  };
  const auto lines = [&](auto& out, const auto& x, const auto& y) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = line(x[i], y[i]);
  };
  trainmem::ChainProfile p = pa;
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    trainmem::StageCosts& s = p.stages[k];
    const trainmem::StageCosts &x = pa.stages[k], &y = pb.stages[k];
    lines(s.fwd_ms, x.fwd_ms, y.fwd_ms);
    lines(s.bwd_ms, x.bwd_ms, y.bwd_ms);
    for (std::size_t m = 0; m < s.kept.size(); ++m) {
      lines(s.kept[m], x.kept[m], y.kept[m]);
      lines(s.fwd_peak[m], x.fwd_peak[m], y.fwd_peak[m]);
      lines(s.bwd_peak[m], x.bwd_peak[m], y.bwd_peak[m]);
      lines(s.bwd_change[m], x.bwd_change[m], y.bwd_change[m]);
    }
    s.output_bytes = line(x.output_bytes, y.output_bytes);
  }
  lines(p.start_live, pa.start_live, pb.start_live);
  lines(p.loss_fwd_peak, pa.loss_fwd_peak, pb.loss_fwd_peak);
  lines(p.loss_live, pa.loss_live, pb.loss_live);
  lines(p.loss_bwd_peak, pa.loss_bwd_peak, pb.loss_bwd_peak);
  lines(p.backward_rest, pa.backward_rest, pb.backward_rest);
  lines(p.outside_peak, pa.outside_peak, pb.outside_peak);
  lines(p.plain_peak, pa.plain_peak, pb.plain_peak);
  p.model_state = line(pa.model_state, pb.model_state);
  p.outside_ms = line(pa.outside_ms, pb.outside_ms);
  p.plain_ms = line(pa.plain_ms, pb.plain_ms);
  return p;
}

/// The schedule for a batch under a budget, with its predicted and measured peaks.
struct Fit {
  std::vector<trainmem::Segment> segments;
  std::string plan_text;
  std::int64_t predicted_peak = 0, measured_peak = 0, model_state = 0;
};

/// \brief The search for the largest batch under a budget, on one shared model.
template <class B>
class Search {
 public:
  Search(const Settings& s, const std::vector<std::int32_t>& text, Trainer<B>& trainer)
      : s_(s), text_(text), trainer_(trainer) {
    trainmem::require(s.bracket.size() == 2 && s.bracket[0] > 0 && s.bracket[1] > s.bracket[0],
                      "budget_shootout: --bracket takes two batch sizes, the second larger");
    for (int i = 0; i < 2; ++i) {
      profiles_[i] = profile_at(s.bracket[static_cast<std::size_t>(i)], 1);
      std::printf("  profile at %lld sequences: smallest budget %.1f MiB, plain peak %.1f MiB, model state %.1f MiB\n",
                  static_cast<long long>(s.bracket[static_cast<std::size_t>(i)]),
                  static_cast<double>(trainmem::smallest_budget(profiles_[i], trainmem::MemChannel::Total)) / 1048576.0,
                  static_cast<double>(profiles_[i].plain_peak[0]) / 1048576.0,
                  static_cast<double>(profiles_[i].model_state) / 1048576.0);
    }
  }

  /// The largest batch with a schedule that fits `budget` on the device (0: none), probed with real steps.
  std::int64_t largest_batch(std::int64_t budget) {
    const std::int64_t a = s_.bracket[0], b = s_.bracket[1];
    const std::int64_t least_a = trainmem::smallest_budget(profiles_[0], trainmem::MemChannel::Total);
    const std::int64_t least_b = trainmem::smallest_budget(profiles_[1], trainmem::MemChannel::Total);
    const double per_sequence = std::max(1.0, static_cast<double>(least_b - least_a) / static_cast<double>(b - a));
    const std::int64_t guess = std::max<std::int64_t>(
        1, a + static_cast<std::int64_t>(std::floor(static_cast<double>(budget - least_a) / per_sequence)));
    std::printf("  predicted: %.2f MiB per sequence, a first guess of %lld sequences\n", per_sequence / 1048576.0,
                static_cast<long long>(guess));
    fits_.clear();
    const auto fits = [&](std::int64_t batch) {
      if (auto it = fits_.find(batch); it != fits_.end()) return it->second.has_value();
      const bool ok = (fits_[batch] = fit(batch, budget, 1)).has_value();
      std::printf("  %lld sequences: %s\n", static_cast<long long>(batch), ok ? "fits" : "does not fit");
      std::fflush(stdout);
      return ok;
    };
    // Steps of 1, 2, 4, ... from the guess: a good prediction costs two probes (batch_search.py is
    // the same search on PyTorch's side).
    std::int64_t lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none known)
    if (fits(guess)) {
      lo = guess;
      for (std::int64_t step = 1; hi == 0; step *= 2) fits(lo + step) ? lo += step : hi = lo + step;
    } else {
      hi = guess;
      for (std::int64_t step = 1; lo == 0 && hi > 1; step *= 2) {
        const std::int64_t c = std::max<std::int64_t>(1, hi - step);
        if (fits(c)) lo = c;
        else hi = c;
      }
    }
    while (hi - lo > 1) {
      const std::int64_t mid = (lo + hi) / 2;
      (fits(mid) ? lo : hi) = mid;
    }
    return lo;
  }

  /// The final schedule at `batch` (profiled again with 3 reps, or the probe's extrapolated one).
  std::optional<Fit> final_fit(std::int64_t batch, std::int64_t budget) {
    if (s_.extrapolate && fits_.count(batch) != 0) return fits_[batch];
    return fit(batch, budget, 3);
  }

 private:
  trainmem::ChainProfile profile_at(std::int64_t batch, int reps) {
    trainer_.model.set_batch(batch);
    std::int64_t step = 0;
    const trainmem::ChainStep<B> chain_step = [&](const trainmem::ChainRunner<B>& run) {
      trainer_.step(text_, step++, run);
    };
    const trainmem::Planner<B> planner(trainer_.model.stages(), chain_step, {reps, {}});
    return planner.profile();
  }

  /// The steady peak of a step under `segments` at the model's batch: two real steps, the second measured.
  std::optional<std::int64_t> measured_peak(const std::vector<trainmem::Segment>& segments) {
    trainmem::MemoryStats& stats = B::default_instance().memory();
    const trainmem::ChainRunner<B> run(trainer_.model.stages(), segments);
    try {
      trainer_.step(text_, 0, run);
      B::default_instance().synchronize();
      stats.reset_peak();
      trainer_.step(text_, 1, run);
      B::default_instance().synchronize();
    } catch (const trainmem::Error& e) {  // the device itself ran out: the plan is far off
      std::printf("    the step failed: %.200s\n", e.what());
      release_cached(B::default_instance());
      return std::nullopt;
    }
    const std::int64_t peak = stats.peak_device();
    release_cached(B::default_instance());
    return peak;
  }

  std::optional<Fit> fit(std::int64_t batch, std::int64_t budget, int reps) {
    trainer_.model.set_batch(batch);
    if (!s_.extrapolate) {  // profile the chain at this batch, plan, measure (Planner::measure)
      std::int64_t step = 0;
      const trainmem::ChainStep<B> chain_step = [&](const trainmem::ChainRunner<B>& run) {
        trainer_.step(text_, step++, run);
      };
      std::optional<trainmem::Planner<B>> planner;
      try {
        planner.emplace(trainer_.model.stages(), chain_step, trainmem::PlannerOptions{reps, {}});
      } catch (const trainmem::Error& e) {
        std::printf("    profiling failed: %.200s\n", e.what());
        return std::nullopt;
      }
      return plan_and_check(batch, budget, planner->profile(), [&](const std::vector<trainmem::Segment>& segments) {
        const std::int64_t peak = planner->measure(segments).peak[0];
        release_cached(B::default_instance());
        return std::optional<std::int64_t>(peak);
      });
    }
    const trainmem::ChainProfile p =
        extrapolate_profile(profiles_[0], s_.bracket[0], profiles_[1], s_.bracket[1], batch);
    return plan_and_check(batch, budget, p,
                          [&](const std::vector<trainmem::Segment>& segments) { return measured_peak(segments); });
  }

  /// Plans for `budget`, measures; a miss lowers the target by what it missed (3 tries).
  template <class Measure>
  std::optional<Fit> plan_and_check(std::int64_t batch, std::int64_t budget, const trainmem::ChainProfile& p,
                                    const Measure& measure) {
    std::int64_t target = budget;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const trainmem::PlanSolution s = trainmem::solve_chain(p, trainmem::MemChannel::Total, target, {});
      if (!s.feasible) return std::nullopt;
      const std::optional<std::int64_t> peak = measure(s.segments);
      if (!peak) return std::nullopt;
      const trainmem::CheckpointPlan<B> plan(trainer_.model.stages(), s.segments, s.prediction,
                                             trainmem::Budget::whole_step(target), p);
      if (*peak <= budget)
        return Fit{plan.segments(),
                   plan.str() + trainmem::detail::concat("batch ", batch, ": predicted peak ", s.prediction.peak[0],
                                                         " bytes, measured ", *peak, "\n"),
                   s.prediction.peak[0], *peak, p.model_state};
      target -= *peak - budget + (budget >> 9);  // the prediction was short: aim lower by the miss
    }
    return std::nullopt;
  }

  const Settings& s_;
  const std::vector<std::int32_t>& text_;
  Trainer<B>& trainer_;
  std::array<trainmem::ChainProfile, 2> profiles_;
  std::map<std::int64_t, std::optional<Fit>> fits_;
};

/// `steps` steps from the initial weights at `batch` under `segments`: losses, step times, the steady peak.
template <class B>
nlohmann::json train(Trainer<B>& trainer, const std::vector<std::int32_t>& text, std::int64_t batch,
                     const std::vector<trainmem::Segment>& segments, int steps) {
  trainmem::MemoryStats& stats = B::default_instance().memory();
  trainer.reset();
  release_cached(B::default_instance());
  trainer.model.set_batch(batch);
  const trainmem::ChainRunner<B> run(trainer.model.stages(), segments);
  std::vector<double> losses, ms;
  std::int64_t steady_peak = 0;
  for (int k = 0; k < steps; ++k) {
    B::default_instance().synchronize();
    if (k == 1) stats.reset_peak();  // after the first step allocated the moments
    const benchmarks::Stopwatch watch;
    losses.push_back(trainer.step(text, k, run));  // reads the loss back: the step is done
    ms.push_back(watch.ms());
    if (k >= 1) steady_peak = stats.peak_device();
  }
  const double median_ms = benchmarks::median(std::vector<double>(ms.begin() + std::min(2, steps - 1), ms.end()));
  return {{"side", "trainmem"},
          {"batch", batch},
          {"tokens_per_step", trainer.model.tokens_per_step()},
          {"losses", losses},
          {"step_ms", ms},
          {"median_step_ms", median_ms},
          {"us_per_token", 1e3 * median_ms / static_cast<double>(trainer.model.tokens_per_step())},
          {"steady_peak_bytes", steady_peak},
          {"peak_bytes", steady_peak}};
}

/// One steady step at `batch` under `segments`, its timeline replayed: live bytes per category at the peak.
template <class B>
void breakdown(Trainer<B>& trainer, const std::vector<std::int32_t>& text, std::int64_t batch,
               const std::vector<trainmem::Segment>& segments) {
  trainmem::MemoryStats& stats = B::default_instance().memory();
  trainer.model.set_batch(batch);
  const trainmem::ChainRunner<B> run(trainer.model.stages(), segments);
  for (int k = 0; k < 2; ++k) trainer.step(text, k, run);
  std::array<std::int64_t, trainmem::kMemCategoryCount> live{}, at_peak{};
  for (std::size_t c = 0; c < live.size(); ++c) live[c] = stats.live(static_cast<trainmem::MemCategory>(c));
  stats.clear_timeline();
  stats.record_timeline(true);
  trainer.step(text, 2, run);
  stats.record_timeline(false);
  std::int64_t peak = 0, total = 0;
  std::string phase = "start", peak_phase;
  for (std::size_t c = 0; c < live.size(); ++c) total += live[c];
  for (const auto& e : stats.timeline()) {
    if (e.event == trainmem::MemoryStats::Event::Mark) {
      phase = e.label;
      continue;
    }
    live[static_cast<std::size_t>(e.category)] += e.bytes;
    total += e.bytes;
    if (total > peak) peak = total, at_peak = live, peak_phase = phase;
  }
  std::printf("batch %lld: peak %.1f MiB during %s\n", static_cast<long long>(batch), peak / 1048576.0,
              peak_phase.c_str());
  for (std::size_t c = 0; c < live.size(); ++c)
    if (at_peak[c] != 0)
      std::printf("  %-18s %9.1f MiB\n", std::string(trainmem::name_of(static_cast<trainmem::MemCategory>(c))).c_str(),
                  at_peak[c] / 1048576.0);
}

/// The program: `gpu` describes the device for the provenance record (empty on the CPU).
template <class B>
int main(int argc, char** argv, int threads, const std::string& gpu) {
  using json = nlohmann::json;
  Settings s;
  std::string export_dir;
  bool export_only = false;
  std::int64_t fixed_batch = 0, breakdown_batch = 0;
  std::vector<double> budgets_gib;
  CLI::App app{"trainmem: the largest batch that fits a whole-step byte budget, and its time per token"};
  app.add_option("--text", s.text, "training text, read as bytes");
  app.add_option("--json", s.json_path, "where to write the results");
  app.add_option("--budgets-mib", s.budgets_mib, "whole-step budgets in MiB")->delimiter(',');
  app.add_option("--budgets-gib", budgets_gib, "whole-step budgets in GiB (instead of --budgets-mib)")->delimiter(',');
  app.add_option("--steps", s.steps, "training steps at the first budget (losses of all, time: median after 2)")
      ->check(CLI::Range(3, 100000));
  app.add_option("--later-steps", s.later_steps, "training steps at the budgets after the first (default: --steps)")
      ->check(CLI::Range(3, 100000));
  app.add_option("--lr", s.lr, "AdamW learning rate");
  app.add_option("--blocks", s.sizes.blocks, "transformer blocks");
  app.add_option("--dim", s.sizes.dim, "model width (the MLP is 4x)");
  app.add_option("--heads", s.sizes.heads, "attention heads");
  app.add_option("--seq", s.sizes.seq, "sequence length");
  app.add_option("--vocab", s.sizes.vocab, "vocabulary (the text's bytes are the tokens: at least 256)")
      ->check(CLI::Range(256, 1 << 24));
  app.add_flag("--half-block-stages", s.sizes.half_block_stages, "two planner stages per block (attention, MLP)");
  app.add_option("--bracket", s.bracket, "the two small batches whose predicted budgets bracket the search")
      ->delimiter(',');
  app.add_flag("--extrapolate", s.extrapolate,
               "plan each probe from the bracket's profiles, extrapolated (no profile at the probed batch)");
  app.add_option("--time-limit-s", s.time_limit_s, "start no budget after this many seconds");
  app.add_option("--export", export_dir, "write manifest.json and weights.bin (the initial weights) to this folder");
  app.add_flag("--export-only", export_only, "exit after --export");
  app.add_option("--fixed-batch", fixed_batch, "train this many sequences per step, plain, no budget");
  app.add_option("--breakdown", breakdown_batch, "where the bytes are at the peak of a step with every block a region");
  CLI11_PARSE(app, argc, argv);
  s.sizes.hidden = 4 * s.sizes.dim;
  if (!budgets_gib.empty()) {
    s.budgets_mib.clear();
    for (double g : budgets_gib) s.budgets_mib.push_back(g * 1024.0);
  }
  if (s.later_steps == 0) s.later_steps = s.steps;
  const benchmarks::Stopwatch run_watch;
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, threads, gpu);
  const bool writes_json = !export_only && breakdown_batch == 0;
  if (writes_json) benchmarks::check_writable(s.json_path, provenance);
  std::printf("%s", provenance.text().c_str());
  try {
    const std::vector<std::int32_t> text = read_bytes(s.text);
    const auto before_training = [&](const Gpt<B>& model) {
      if (export_dir.empty()) return;
      const std::int64_t n = export_weights(model.parameters(), s.sizes, export_dir,
                                            {{"text", std::filesystem::absolute(s.text).string()},
                                             {"window_offset", "((step * batch + i) * 7919) % (len(text) - seq - 1)"},
                                             {"lr", s.lr},
                                             {"steps", s.steps}});
      std::printf("budget_shootout: wrote %s/manifest.json (%lld parameters)\n", export_dir.c_str(),
                  static_cast<long long>(n));
      std::fflush(stdout);
    };
    if (export_only) {
      const Gpt<B> model(s.sizes, 1, kSeed);
      before_training(model);
      return 0;
    }
    Trainer<B> trainer(s, 1, before_training);
    const std::int64_t n = s.sizes.blocks * (s.sizes.half_block_stages ? 2 : 1) + 2;
    if (breakdown_batch > 0) {
      std::vector<trainmem::Segment> every{{0, 1, trainmem::StageMode::Keep}};
      for (std::int64_t b = 1; b + 1 < n; ++b) every.push_back({b, b + 1, trainmem::StageMode::Recompute});
      every.push_back({n - 1, n, trainmem::StageMode::Keep});
      breakdown(trainer, text, breakdown_batch, every);
      breakdown(trainer, text, breakdown_batch, {{0, n, trainmem::StageMode::Keep}});
      return 0;
    }
    json rows = json::array();
    const auto write = [&] {
      std::ofstream(s.json_path) << json{{"side", "trainmem"},
                                         {"provenance", json::parse(provenance.json())},
                                         {"threads", threads},
                                         {"device", gpu.empty() ? "cpu" : gpu},
                                         {"sizes",
                                          {{"blocks", s.sizes.blocks},
                                           {"dim", s.sizes.dim},
                                           {"heads", s.sizes.heads},
                                           {"hidden", s.sizes.hidden},
                                           {"seq", s.sizes.seq},
                                           {"vocab", s.sizes.vocab}}},
                                         {"rows", rows}}
                                        .dump(2)
                                 << "\n";
    };
    if (fixed_batch > 0) {
      json r = train(trainer, text, fixed_batch, {{0, n, trainmem::StageMode::Keep}}, s.steps);
      r["schedule"] = "none";
      rows.push_back(r);
      write();
    }
    std::optional<Search<B>> search;
    for (std::size_t i = 0; i < (fixed_batch > 0 ? 0 : s.budgets_mib.size()); ++i) {
      const double mib = s.budgets_mib[i];
      if (s.time_limit_s > 0 && run_watch.seconds() > s.time_limit_s) {
        std::printf("budget %.0f MiB: not started, past the %.0f s limit\n", mib, s.time_limit_s);
        continue;
      }
      if (!search) search.emplace(s, text, trainer);
      const auto budget = static_cast<std::int64_t>(mib * 1048576.0);
      std::printf("budget %.0f MiB: searching the largest batch\n", mib);
      std::fflush(stdout);
      const benchmarks::Stopwatch search_watch;
      const std::int64_t batch = search->largest_batch(budget);
      if (batch == 0) {
        std::printf("budget %.0f MiB: not even one sequence fits\n", mib);
        rows.push_back({{"side", "trainmem"}, {"schedule", "planner"}, {"budget_mib", mib}, {"batch", 0}});
        write();
        continue;
      }
      const std::optional<Fit> fit = search->final_fit(batch, budget);
      trainmem::require(fit.has_value(), "budget_shootout: batch ", batch, " fitted once and not on the final plan");
      std::printf("%s", fit->plan_text.c_str());
      const double searched_s = search_watch.seconds();
      json r = train(trainer, text, batch, fit->segments, i == 0 ? s.steps : s.later_steps);
      r["budget_mib"] = mib;
      r["budget_bytes"] = budget;
      r["search_s"] = searched_s;
      r["predicted_peak_bytes"] = fit->predicted_peak;
      r["planned_peak_bytes"] = fit->measured_peak;
      r["model_state_bytes"] = fit->model_state;
      r["plan"] = fit->plan_text;
      r["extrapolated"] = s.extrapolate;
      r["schedule"] = "planner";
      std::printf(
          "budget %.0f MiB: %lld sequences (%lld tokens), %.1f us/token, steady peak %.1f MiB, loss %.4f -> %.4f\n",
          mib, static_cast<long long>(batch), static_cast<long long>(r["tokens_per_step"].get<std::int64_t>()),
          r["us_per_token"].get<double>(), r["steady_peak_bytes"].get<double>() / 1048576.0,
          r["losses"].front().get<double>(), r["losses"].back().get<double>());
      std::fflush(stdout);
      rows.push_back(r);
      write();
    }
    write();
    std::printf("budget_shootout: wrote %s in %.0f s\n", s.json_path.c_str(), run_watch.seconds());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "budget_shootout: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace shootout

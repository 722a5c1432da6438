// budget_shootout — trainmem's side of the fixed-budget shoot-out: with B bytes for the
// whole step, how many tokens per step can it train, and how fast?
//
// For each budget (peak bytes of a whole steady-state step: parameters, gradients,
// master weights, AdamW moments, activations, the batch — everything MemoryStats sees
// the allocator hand out), it finds the largest batch (in sequences) for which the
// checkpoint planner has a schedule that fits, checks the planned step's measured peak
// against the budget, then trains `steps` AdamW steps in BF16 (autocast, f32 masters)
// from the exported initial weights under that plan and reports the time per token
// (median step, after two warm-up steps), the measured peak and the loss of every step.
// `--export DIR` writes the initial weights (f32, manifest order) for torch_side.py,
// and `--fixed-batch N` trains N sequences per step with no checkpointing and no budget
// (the loss reference both sides compare at one batch size).
//
//   budget_shootout --text FILE --json trainmem.json [--budgets-mib 128,256,512] [--steps 20]
//   budget_shootout --export DIR
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "budget_shootout/gpt.hpp"
#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/trainmem.hpp"

namespace {

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using json = nlohmann::json;
using shootout::Gpt;
using shootout::GptSizes;

constexpr std::uint64_t kSeed = 20261201;

struct Settings {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string json_path = "budget_shootout_trainmem.json";
  std::vector<double> budgets_mib{128, 256, 512};
  int steps = 20;
  double lr = 1e-3;
  GptSizes sizes;
};

/// Everything one model instance needs for training steps: model, optimizer, precision.
struct Trainer {
  Trainer(const Settings& s, std::int64_t batch)
      : model(s.sizes, batch, kSeed),
        optimizer(model.parameters(), {.lr = s.lr}),
        precision(optimizer, {.precision = tmem::DType::BF16}) {}

  /// One step on `step`'s windows, the stages run by `run`; returns the loss.
  double step(const std::vector<std::int32_t>& text, std::int64_t step, const tmem::ChainRunner<B>& run) {
    auto [ids, labels] = model.batch_of(text, step);
    tmem::Tensor<B> loss_value;
    {
      tmem::Tape<B> tape;
      const tmem::Var<B> loss = precision.forward([&] { return tmem::cross_entropy(run(tape.input(ids)), labels); });
      loss_value = loss.value();
      run.backward_with([&] { precision.backward(loss); });
      precision.update();
    }
    return loss_value.to_host<double>()[0];
  }

  Gpt<B> model;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> precision;
};

/// The planner's schedule for `batch` sequences under `budget`, if one fits (measured, not only predicted).
struct Fit {
  std::vector<tmem::Segment> segments;
  std::string plan_text;
  std::int64_t predicted_peak = 0, measured_peak = 0, model_state = 0;
};

std::optional<Fit> plan_for(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t batch,
                            std::int64_t budget, int profile_reps) {
  Trainer trainer(s, batch);
  std::int64_t step = 0;
  const tmem::ChainStep<B> chain_step = [&](const tmem::ChainRunner<B>& run) { trainer.step(text, step++, run); };
  const tmem::Planner<B> planner(trainer.model.stages(), chain_step, {profile_reps, {}});
  std::int64_t target = budget;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::optional<tmem::CheckpointPlan<B>> plan;
    try {
      plan.emplace(planner.plan(tmem::Budget::whole_step(target)));
    } catch (const tmem::Error&) {
      return std::nullopt;
    }
    const tmem::StepMeasurement m = planner.measure(*plan);
    if (m.peak[0] <= budget)
      return Fit{plan->segments(), plan->str() + plan->compare(m), plan->prediction().peak[0], m.peak[0],
                 planner.profile().model_state};
    target -= m.peak[0] - budget + (budget >> 9);  // the prediction was short: aim lower by the miss
  }
  return std::nullopt;
}

/// The largest batch (sequences) with a fitting plan: a bracket from two small profiles, then bisection.
std::int64_t largest_batch(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t budget) {
  const auto least_at = [&](std::int64_t batch) {
    Trainer trainer(s, batch);
    std::int64_t step = 0;
    const tmem::ChainStep<B> chain_step = [&](const tmem::ChainRunner<B>& run) { trainer.step(text, step++, run); };
    const tmem::Planner<B> planner(trainer.model.stages(), chain_step, {1, {}});
    return planner.smallest_budget(tmem::MemChannel::Total);
  };
  const std::int64_t a = least_at(4), b = least_at(8);
  const double per_sequence = static_cast<double>(b - a) / 4.0;
  std::int64_t guess =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(budget - a) / per_sequence) + 4);
  std::int64_t lo = 0, hi = 0;  // lo fits (0: none known), hi does not (0: none known)
  const auto fits = [&](std::int64_t batch) {
    const bool ok = plan_for(s, text, batch, budget, 1).has_value();
    std::printf("  %lld sequences: %s\n", static_cast<long long>(batch), ok ? "fits" : "does not fit");
    std::fflush(stdout);
    return ok;
  };
  if (fits(guess)) {
    lo = guess;
    for (std::int64_t step = std::max<std::int64_t>(2, guess / 16); hi == 0; step *= 2)
      fits(lo + step) ? lo += step : hi = lo + step;
  } else {
    hi = guess;
    for (std::int64_t step = std::max<std::int64_t>(2, guess / 16); lo == 0 && hi > 1; step *= 2) {
      const std::int64_t c = std::max<std::int64_t>(1, hi - step);
      if (fits(c)) lo = c;
      else hi = c;
      if (c == 1 && lo == 0) return 0;
    }
  }
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

/// `steps` steps from the initial weights under `segments`: losses, step times, the steady peak.
json train(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t batch,
           const std::vector<tmem::Segment>& segments) {
  B::default_instance().memory().reset_peak();
  Trainer trainer(s, batch);
  const tmem::ChainRunner<B> run(trainer.model.stages(), segments);
  std::vector<double> losses, ms;
  std::int64_t steady_peak = 0;
  for (int k = 0; k < s.steps; ++k) {
    if (k == 1) B::default_instance().memory().reset_peak();  // after the first step allocated the model state
    const benchmarks::Stopwatch watch;
    losses.push_back(trainer.step(text, k, run));
    ms.push_back(watch.ms());
    if (k >= 1) steady_peak = B::default_instance().memory().peak_total();
  }
  const double median_ms = benchmarks::median(std::vector<double>(ms.begin() + std::min(2, s.steps - 1), ms.end()));
  return {{"batch", batch},
          {"tokens_per_step", trainer.model.tokens_per_step()},
          {"losses", losses},
          {"step_ms", ms},
          {"median_step_ms", median_ms},
          {"us_per_token", 1e3 * median_ms / static_cast<double>(trainer.model.tokens_per_step())},
          {"steady_peak_bytes", steady_peak}};
}

/// One steady step at `batch` under `segments`, its timeline replayed: live bytes per category at the peak.
void breakdown(const Settings& s, const std::vector<std::int32_t>& text, std::int64_t batch,
               const std::vector<tmem::Segment>& segments) {
  tmem::MemoryStats& stats = B::default_instance().memory();
  Trainer trainer(s, batch);
  const tmem::ChainRunner<B> run(trainer.model.stages(), segments);
  for (int k = 0; k < 2; ++k) trainer.step(text, k, run);
  std::array<std::int64_t, tmem::kMemCategoryCount> live{}, at_peak{};
  for (std::size_t c = 0; c < live.size(); ++c) live[c] = stats.live(static_cast<tmem::MemCategory>(c));
  stats.clear_timeline();
  stats.record_timeline(true);
  trainer.step(text, 2, run);
  stats.record_timeline(false);
  std::int64_t peak = 0, total = 0;
  std::string phase = "start", peak_phase;
  for (std::size_t c = 0; c < live.size(); ++c) total += live[c];
  for (const auto& e : stats.timeline()) {
    if (e.event == tmem::MemoryStats::Event::Mark) {
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
      std::printf("  %-18s %9.1f MiB\n", std::string(tmem::name_of(static_cast<tmem::MemCategory>(c))).c_str(),
                  at_peak[c] / 1048576.0);
}

void export_weights(const Settings& s, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const Gpt<B> model(s.sizes, 1, kSeed);
  json params = json::array();
  std::ofstream weights(dir / "weights.bin", std::ios::binary);
  std::int64_t offset = 0;
  for (const tmem::Var<B>& p : model.parameters()) {
    const std::vector<float> v = p.value().to_host<float>();
    weights.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    params.push_back({{"name", p.name()}, {"shape", p.shape().dims()}, {"offset", offset}});
    offset += static_cast<std::int64_t>(v.size());
  }
  const json manifest = {{"sizes",
                          {{"blocks", s.sizes.blocks},
                           {"dim", s.sizes.dim},
                           {"heads", s.sizes.heads},
                           {"hidden", s.sizes.hidden},
                           {"seq", s.sizes.seq},
                           {"vocab", s.sizes.vocab}}},
                         {"weights", "weights.bin"},
                         {"params", params},
                         {"text", s.text},
                         {"window_offset", "((step * batch + i) * 7919) % (len(text) - seq - 1)"},
                         {"lr", s.lr},
                         {"steps", s.steps}};
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
  std::printf("budget_shootout: wrote %s (%lld parameters)\n", (dir / "manifest.json").c_str(),
              static_cast<long long>(offset));
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  std::string export_dir;
  std::int64_t fixed_batch = 0;
  CLI::App app{"trainmem: the largest batch that fits a whole-step byte budget, and its time per token"};
  app.add_option("--text", s.text, "training text, read as bytes");
  app.add_option("--json", s.json_path, "where to write the results");
  app.add_option("--budgets-mib", s.budgets_mib, "whole-step budgets in MiB")->delimiter(',');
  app.add_option("--steps", s.steps, "training steps per budget (losses of all, time: median after 2)")
      ->check(CLI::Range(3, 100000));
  app.add_option("--lr", s.lr, "AdamW learning rate");
  app.add_option("--blocks", s.sizes.blocks, "transformer blocks");
  app.add_option("--dim", s.sizes.dim, "model width");
  app.add_flag("--half-block-stages", s.sizes.half_block_stages, "two planner stages per block (attention, MLP)");
  app.add_option("--export", export_dir, "write manifest.json and weights.bin to this folder and exit");
  app.add_option("--fixed-batch", fixed_batch, "train this many sequences per step, plain, no budget");
  std::int64_t breakdown_batch = 0;
  app.add_option("--breakdown", breakdown_batch, "where the bytes are at the peak of a step with every block a region");
  CLI11_PARSE(app, argc, argv);
  s.sizes.hidden = 4 * s.sizes.dim;
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, tmem::num_threads());
  if (export_dir.empty() && breakdown_batch == 0) benchmarks::check_writable(s.json_path, provenance);
  std::printf("%s", provenance.text().c_str());
  try {
    if (!export_dir.empty()) {
      export_weights(s, export_dir);
      return 0;
    }
    const std::vector<std::int32_t> text = shootout::read_bytes(s.text);
    json rows = json::array();
    const std::int64_t n = s.sizes.blocks * (s.sizes.half_block_stages ? 2 : 1) + 2;
    if (breakdown_batch > 0) {
      std::vector<tmem::Segment> every{{0, 1, tmem::StageMode::Keep}};
      for (std::int64_t b = 1; b + 1 < n; ++b) every.push_back({b, b + 1, tmem::StageMode::Recompute});
      every.push_back({n - 1, n, tmem::StageMode::Keep});
      breakdown(s, text, breakdown_batch, every);
      breakdown(s, text, breakdown_batch, {{0, n, tmem::StageMode::Keep}});
      return 0;
    }
    if (fixed_batch > 0) {
      json r = train(s, text, fixed_batch, {{0, n, tmem::StageMode::Keep}});
      r["schedule"] = "none";
      rows.push_back(r);
    }
    for (double mib : fixed_batch > 0 ? std::vector<double>{} : s.budgets_mib) {
      const auto budget = static_cast<std::int64_t>(mib * 1048576.0);
      std::printf("budget %.0f MiB: searching the largest batch\n", mib);
      const benchmarks::Stopwatch search_watch;
      const std::int64_t batch = largest_batch(s, text, budget);
      if (batch == 0) {
        std::printf("budget %.0f MiB: not even one sequence fits\n", mib);
        rows.push_back({{"budget_mib", mib}, {"batch", 0}});
        continue;
      }
      const std::optional<Fit> fit = plan_for(s, text, batch, budget, 3);
      tmem::require(fit.has_value(), "budget_shootout: batch ", batch, " fitted once and not on the final plan");
      std::printf("%s", fit->plan_text.c_str());
      json r = train(s, text, batch, fit->segments);
      r["budget_mib"] = mib;
      r["budget_bytes"] = budget;
      r["search_s"] = search_watch.seconds();
      r["predicted_peak_bytes"] = fit->predicted_peak;
      r["planned_peak_bytes"] = fit->measured_peak;
      r["model_state_bytes"] = fit->model_state;
      r["plan"] = fit->plan_text;
      r["schedule"] = "planner";
      std::printf(
          "budget %.0f MiB: %lld sequences (%lld tokens), %.1f us/token, steady peak %.1f MiB, loss %.4f -> %.4f\n",
          mib, static_cast<long long>(batch), static_cast<long long>(r["tokens_per_step"].get<std::int64_t>()),
          r["us_per_token"].get<double>(), r["steady_peak_bytes"].get<double>() / 1048576.0,
          r["losses"].front().get<double>(), r["losses"].back().get<double>());
      std::fflush(stdout);
      rows.push_back(r);
    }
    std::ofstream(s.json_path) << json{{"side", "trainmem"},
                                       {"provenance", json::parse(provenance.json())},
                                       {"threads", tmem::num_threads()},
                                       {"rows", rows}}
                                      .dump(2)
                               << "\n";
    std::printf("budget_shootout: wrote %s\n", s.json_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "budget_shootout: %s\n", e.what());
    return 1;
  }
  return 0;
}

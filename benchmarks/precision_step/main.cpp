// precision_step — the time of one training step in f32, bf16 and f16, measured side by side.
//
// The shoot-out's GPT (budget_shootout/gpt.hpp) trains AdamW steps without checkpointing in
// each precision: f32; bf16 autocast with f32 masters; f16 autocast with f32 masters and
// dynamic loss scaling. One model per precision from the same seed; the rounds run the
// three in rotating order, one step each, so the machine's drift falls on all of them
// alike. It reports each precision's median step (and quartiles) and the ratios of the
// medians: bf16 / f32 (what 16-bit saves in time) and f16 / bf16 (what half's range costs
// over bfloat16's: loss scaling, the check for inf and NaN, and its conversions).
//
//   precision_step [--rounds 15] [--batch 8] [--blocks 4] [--dim 256] [--seq 128] [--json precision_step.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
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

constexpr std::uint64_t kSeed = 20261202;

/// \brief One precision's model, optimizer and step.
struct Run {
  Run(const shootout::GptSizes& sizes, std::int64_t batch, tmem::DType precision)
      : model(sizes, batch, kSeed),
        optimizer(model.parameters(), {.lr = 1e-3}),
        step(optimizer, {.precision = precision}) {}

  /// One step on the windows of step `index`; returns its wall time in ms.
  double train(const std::vector<std::int32_t>& text, std::int64_t index) {
    auto [ids, labels] = model.batch_of(text, index);
    const benchmarks::Stopwatch watch;
    {
      tmem::Tape<B> tape;
      const tmem::Var<B> loss = step.forward([&] {
        tmem::Var<B> x = tape.input(ids);
        for (const auto& stage : model.stages()) x = stage(x);
        return tmem::cross_entropy(x, labels);
      });
      step.backward(loss);
      step.update();
    }
    return watch.ms();
  }

  shootout::Gpt<B> model;
  tmem::optim::AdamW<B> optimizer;
  tmem::amp::TrainStep<B> step;
};

}  // namespace

int main(int argc, char** argv) {
  shootout::GptSizes sizes;
  sizes.blocks = 4;
  std::int64_t batch = 8;
  int rounds = 15;
  std::string text_path = "/usr/share/common-licenses/GPL-3", json_path = "precision_step.json";
  CLI::App app{"Step time in f32, bf16 and f16 (AdamW, masters, loss scaling under f16), side by side"};
  app.add_option("--rounds", rounds, "timed steps per precision")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--blocks", sizes.blocks, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--dim", sizes.dim, "model width (4 heads, MLP 4x)")->check(CLI::PositiveNumber);
  app.add_option("--seq", sizes.seq, "sequence length")->check(CLI::PositiveNumber);
  app.add_option("--text", text_path, "training text, read as bytes");
  app.add_option("--json", json_path, "where the JSON goes");
  CLI11_PARSE(app, argc, argv);
  sizes.hidden = 4 * sizes.dim;
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, tmem::num_threads());
  benchmarks::check_writable(json_path, provenance);

  const std::vector<std::int32_t> text = shootout::read_bytes(text_path);
  const std::array<tmem::DType, 3> precisions{tmem::DType::F32, tmem::DType::BF16, tmem::DType::F16};
  std::vector<std::unique_ptr<Run>> runs;
  for (const tmem::DType p : precisions) runs.push_back(std::make_unique<Run>(sizes, batch, p));
  std::array<std::vector<double>, 3> ms;
  const int warm_up = 2;
  for (int round = 0; round < warm_up + rounds; ++round)
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const std::size_t which = (k + static_cast<std::size_t>(round)) % runs.size();  // rotating order
      const double t = runs[which]->train(text, round);
      if (round >= warm_up) ms[which].push_back(t);
    }

  const tmem::cpu::OneDnnSupport onednn = tmem::cpu::onednn_support();
  std::printf("%s", provenance.text().c_str());
  std::printf("precision_step: GPT %lld blocks, dim %lld, seq %lld, batch %lld; %d rounds, %d threads\n",
              static_cast<long long>(sizes.blocks), static_cast<long long>(sizes.dim),
              static_cast<long long>(sizes.seq), static_cast<long long>(batch), rounds, tmem::num_threads());
  const std::string& cpu = provenance.cpu;
  std::printf("oneDNN: %s; effective ISA %s, AMX %s, BF16 operands to oneDNN %s; vector loops %s\n\n",
              onednn.built_in ? "built in" : "not built in", onednn.isa, onednn.amx ? "yes" : "no",
              onednn.bf16 ? "yes" : "no", tmem::cpu::name_of(tmem::cpu::simd_level()));
  std::printf("%-10s %12s %12s %12s\n", "precision", "median ms", "q1 ms", "q3 ms");
  nlohmann::json out{{"benchmark", "precision_step"},
                     {"provenance", nlohmann::json::parse(provenance.json())},
                     {"model", {{"blocks", sizes.blocks}, {"dim", sizes.dim}, {"seq", sizes.seq}, {"batch", batch}}},
                     {"rounds", rounds},
                     {"threads", tmem::num_threads()},
                     {"cpu", cpu},
                     {"onednn_isa", onednn.isa},
                     {"vector_loops", tmem::cpu::name_of(tmem::cpu::simd_level())},
                     {"amx", onednn.amx},
                     {"bf16_to_onednn", onednn.bf16}};
  std::array<double, 3> medians{};
  for (std::size_t k = 0; k < precisions.size(); ++k) {
    medians[k] = benchmarks::median(ms[k]);
    const std::string name{tmem::name_of(precisions[k])};
    std::printf("%-10s %12.1f %12.1f %12.1f\n", name.c_str(), medians[k], benchmarks::quantile(ms[k], 0.25),
                benchmarks::quantile(ms[k], 0.75));
    out["steps_ms"][name] = ms[k];
    out["median_ms"][name] = medians[k];
  }
  std::printf("\nbf16 / f32  %.3f\nf16 / bf16  %.3f\n", medians[1] / medians[0], medians[2] / medians[1]);
  out["bf16_over_f32"] = medians[1] / medians[0];
  out["f16_over_bf16"] = medians[2] / medians[1];
  std::ofstream(json_path) << out.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
}

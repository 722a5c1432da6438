// loss_head — what linear_cross_entropy saves against cross_entropy(linear(...)): the
// output layer and the loss of a language model, at a vocabulary's width.
//
// For each vocabulary size and precision (F32, and BF16 under autocast), one training
// step of the head alone (x [tokens, dim] -> logits [tokens, vocab] -> mean
// cross-entropy, then backward to x, w and b), the two ways alternating within each
// round: the bytes kept for backward after forward, the step's peak above what was live
// before it (MemoryStats: every byte the allocator hands out), and its time. Time ratios
// are the median over rounds of the ratio within a round (the machines are shared).
//
//   loss_head [--tokens 4096] [--dim 512] [--vocab 8192,32768] [--reps 7] [--chunk-rows 0]
//             [--json FILE]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using V = tmem::Var<B>;
using T = tmem::Tensor<B>;

namespace {

struct Step {
  std::int64_t saved = 0, peak = 0;
  double ms = 0.0;
};

/// One forward and backward of the head, fused or not.
Step step(const T& x0, const V& w, const V& b, const T& labels, bool fused, bool bf16, std::int64_t chunk_rows) {
  auto& memory = B::default_instance().memory();
  std::optional<tmem::amp::Autocast> autocast;
  if (bf16) autocast.emplace(tmem::DType::BF16);
  Step s;
  const std::int64_t live = memory.live_total();
  memory.reset_peak();
  benchmarks::Stopwatch clock;
  {
    tmem::Tape<B> tape;
    const V x = tape.input(x0, true);
    const std::int64_t saved_before = memory.live(tmem::MemCategory::SavedActivation);
    const V loss = fused ? tmem::linear_cross_entropy(x, w, b, labels, {.chunk_rows = chunk_rows})
                         : tmem::cross_entropy(tmem::linear(x, w, b), labels);
    s.saved = memory.live(tmem::MemCategory::SavedActivation) - saved_before;
    tape.backward(loss);
  }
  s.ms = clock.ms();
  s.peak = memory.peak_total() - live;
  w.zero_grad();
  b.zero_grad();
  return s;
}

/// A [rows, cols] (or [rows] when cols is 0) f32 tensor of uniform values in [-scale, scale).
T uniform(std::int64_t rows, std::int64_t cols, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<std::size_t>(rows * (cols ? cols : 1)));
  for (float& e : v) e = u(rng);
  return cols ? T::from_host(tmem::Shape{rows, cols}, v) : T::from_host(tmem::Shape{rows}, v);
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("loss_head: linear_cross_entropy against cross_entropy(linear(...))");
  std::int64_t tokens = 4096, dim = 512;
  std::vector<std::int64_t> vocabs{8192, 32768};
  int reps = 7;
  std::int64_t chunk_rows = 0;
  std::string json_path;
  app.add_option("--tokens", tokens, "rows of x (tokens of a batch)")->check(CLI::PositiveNumber);
  app.add_option("--dim", dim, "model width")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocabs, "vocabulary sizes")->delimiter(',');
  app.add_option("--reps", reps, "rounds, each running both ways")->check(CLI::PositiveNumber);
  app.add_option("--chunk-rows", chunk_rows, "linear_cross_entropy's rows per chunk (0: its own choice)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, tmem::num_threads());
  if (!json_path.empty()) benchmarks::check_writable(json_path, provenance);

  std::printf("%sloss_head: tokens %lld, dim %lld, %d rounds, %d threads\n\n", provenance.text().c_str(),
              static_cast<long long>(tokens), static_cast<long long>(dim), reps, tmem::num_threads());
  std::printf("%-6s %-5s  %-8s %14s %14s %10s   %s\n", "vocab", "prec", "way", "kept MiB", "step peak MiB", "ms",
              "fused / unfused: kept, peak, time");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::int64_t vocab : vocabs) {
    const T x0 = uniform(tokens, dim, 1.0f, 1);
    const V w = V::parameter(uniform(vocab, dim, 0.05f, 2)), b = V::parameter(uniform(vocab, 0, 0.05f, 3));
    std::vector<float> label_values(static_cast<std::size_t>(tokens));
    for (std::int64_t r = 0; r < tokens; ++r) label_values[r] = static_cast<float>((r * 7919) % vocab);
    const T labels = T::from_host(tmem::Shape{tokens}, label_values, tmem::DType::I32);
    for (const bool bf16 : {false, true}) {
      step(x0, w, b, labels, true, bf16, chunk_rows);  // warm-up: the allocator's cache, oneDNN's primitives
      step(x0, w, b, labels, false, bf16, chunk_rows);
      std::vector<Step> fused, unfused;
      std::vector<double> ratio;
      for (int r = 0; r < reps; ++r) {
        unfused.push_back(step(x0, w, b, labels, false, bf16, chunk_rows));
        fused.push_back(step(x0, w, b, labels, true, bf16, chunk_rows));
        ratio.push_back(fused.back().ms / unfused.back().ms);
      }
      const auto median_ms = [](const std::vector<Step>& steps) {
        std::vector<double> ms;
        for (const Step& s : steps) ms.push_back(s.ms);
        return benchmarks::median(ms);
      };
      const char* precision = bf16 ? "bf16" : "f32";
      const Step& f = fused.back();
      const Step& u = unfused.back();
      const double f_ms = median_ms(fused), u_ms = median_ms(unfused), time_ratio = benchmarks::median(ratio);
      std::printf("%-6lld %-5s  %-8s %14.2f %14.2f %10.1f\n", static_cast<long long>(vocab), precision, "unfused",
                  mib(u.saved), mib(u.peak), u_ms);
      std::printf("%-6lld %-5s  %-8s %14.2f %14.2f %10.1f   %.3f, %.3f, %.3f\n", static_cast<long long>(vocab),
                  precision, "fused", mib(f.saved), mib(f.peak), f_ms,
                  static_cast<double>(f.saved) / static_cast<double>(u.saved),
                  static_cast<double>(f.peak) / static_cast<double>(u.peak), time_ratio);
      rows.push_back({{"vocab", vocab},
                      {"precision", precision},
                      {"unfused", {{"kept_bytes", u.saved}, {"step_peak_bytes", u.peak}, {"step_ms", u_ms}}},
                      {"fused", {{"kept_bytes", f.saved}, {"step_peak_bytes", f.peak}, {"step_ms", f_ms}}},
                      {"time_ratio_fused_vs_unfused", time_ratio},
                      {"time_ratios", ratio}});
    }
  }
  if (!json_path.empty()) {
    nlohmann::json out{{"benchmark", "loss_head"},
                       {"provenance", nlohmann::json::parse(provenance.json())},
                       {"cpu", provenance.cpu},
                       {"threads", tmem::num_threads()},
                       {"tokens", tokens},
                       {"dim", dim},
                       {"reps", reps},
                       {"chunk_rows", chunk_rows},
                       {"rows", rows}};
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("\nwrote %s\n", json_path.c_str());
  }
}

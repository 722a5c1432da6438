// checkpoint_schedules — memory saved and time paid by each checkpoint schedule.
//
// A deep residual MLP chain (N blocks of x + Linear(GELU(Linear(LayerNorm(x))))), the
// same width for every N, one f32 training step (amp::TrainStep: forward, backward, SGD
// update) per measurement. For each N and schedule it reports peak saved-activation
// bytes and peak total bytes from a MemoryStats peak window, the median step time,
// and both as ratios to the plain step measured in the same run; schedules are timed round-robin so that machine noise
// hits them alike. Writes a JSON file and an SVG chart (memory against time overhead).
//
// The default batch (256 rows) makes a block's activations (1.3 MB) outweigh its
// parameters (0.5 MB), as in real training, so checkpointing lowers the total peak too.
//
// The default value check's cost (DeterminismCheck::Fingerprint) is measured on its own:
// every_block with and without it (Metadata), in adjacent pairs whose order alternates, so
// a drift in the machine's speed hits both sides alike; the median of the per-pair ratios
// and its quartiles are reported.
//
//   checkpoint_schedules [--sizes 16,64,256,1024] [--width 128] [--hidden 512] [--batch 256]
//                        [--reps 5] [--check-pairs 60] [--every 4] [--json out.json] [--svg out.svg]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "trainmem/trainmem.hpp"

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using Var = tmem::Var<B>;

namespace {

struct Config {
  std::vector<int> sizes{16, 64, 256, 1024};
  std::int64_t width = 128, hidden = 512, batch = 256;
  int reps = 5;
  int check_pairs = 60;
  int every = 4;
  std::string json_path = "checkpoint_schedules.json";
  std::string svg_path = "checkpoint_schedules.svg";
};

struct Chain {
  Chain(int n, const Config& c) {
    tmem::nn::Init init(2026);
    for (int i = 0; i < n; ++i) {
      up.emplace_back(c.width, c.hidden, init, true, tmem::DType::F32, "up" + std::to_string(i));
      down.emplace_back(c.hidden, c.width, init, true, tmem::DType::F32, "down" + std::to_string(i));
      norm.emplace_back(c.width, 1e-5, tmem::DType::F32, "norm" + std::to_string(i));
    }
    for (int i = 0; i < n; ++i)
      layers.push_back([this, i](const Var& x) { return tmem::add(x, down[i](tmem::gelu(up[i](norm[i](x))))); });
    for (int i = 0; i < n; ++i)
      for (auto* ps : {&up[i], &down[i]})
        for (auto& p : ps->parameters()) params.push_back(p);
    for (int i = 0; i < n; ++i)
      for (auto& p : norm[i].parameters()) params.push_back(p);
    optimizer.emplace(params, tmem::optim::SgdOptions{.lr = 1e-3});
    train.emplace(*optimizer);
  }
  std::vector<tmem::nn::Linear<B>> up, down;
  std::vector<tmem::nn::LayerNorm<B>> norm;
  std::vector<tmem::Layer<B>> layers;
  std::vector<Var> params;
  std::optional<tmem::optim::SGD<B>> optimizer;
  std::optional<tmem::amp::TrainStep<B>> train;  // f32: forward, backward, SGD step
};

using Schedule = std::function<Var(tmem::Tape<B>&, const std::vector<tmem::Layer<B>>&, const Var&)>;

/// Every layer its own checkpoint region under `options`.
Schedule each_block(tmem::CheckpointOptions options) {
  return [options](tmem::Tape<B>& tape, const std::vector<tmem::Layer<B>>& layers, const Var& x) {
    Var h = x;
    for (const auto& layer : layers) h = tmem::checkpoint(tape, options, layer, h);
    return h;
  };
}

std::vector<std::pair<std::string, Schedule>> schedules(const Config& c) {
  tmem::CheckpointOptions selective;
  selective.policy = tmem::policy::save_matmuls();
  const int every = c.every;
  return {
      {"none",
       [](tmem::Tape<B>&, const std::vector<tmem::Layer<B>>& layers, const Var& x) {
         Var h = x;
         for (const auto& layer : layers) h = layer(h);
         return h;
       }},
      {"every_block", each_block({})},
      {"sqrt_n", [](tmem::Tape<B>& tape, const std::vector<tmem::Layer<B>>& layers,
                    const Var& x) { return tmem::checkpoint_sequential(tape, layers, x); }},
      {"every_" + std::to_string(every),
       [every](tmem::Tape<B>& tape, const std::vector<tmem::Layer<B>>& layers, const Var& x) {
         const auto n = static_cast<std::int64_t>(layers.size());
         return tmem::checkpoint_sequential(tape, layers, std::max<std::int64_t>(1, n / every), x);
       }},
      {"selective", each_block(selective)},
  };
}

struct Measurement {
  tmem::PeakBytes peak;  // the largest of every step's peaks
  std::vector<double> step_ms;

  std::int64_t peak_saved() const { return peak[tmem::MemCategory::SavedActivation]; }
};

/// One training step; returns its wall time in ms and updates the peaks.
double step(Chain& chain, const Schedule& schedule, const tmem::Tensor<B>& input, Measurement& m) {
  const tmem::PeakWindow window(B::default_instance().memory());
  const benchmarks::Stopwatch watch;
  {
    tmem::Tape<B> tape;
    auto x = tape.input(input);
    chain.train->run([&] { return tmem::mean(schedule(tape, chain.layers, x)); });
  }
  const double ms = watch.ms();
  m.peak.merge(window.peaks());
  return ms;
}

std::string svg_chart(const nlohmann::json& rows, const std::vector<int>& sizes) {
  const std::map<std::string, std::string> colors = {
      {"none", "#444444"}, {"every_block", "#d62728"}, {"sqrt_n", "#1f77b4"}, {"selective", "#2ca02c"}};
  const int panel_w = 430, panel_h = 280, margin = 50;
  const int cols = 2, rows_n = static_cast<int>((sizes.size() + 1) / 2);
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << cols * panel_w << "' height='" << rows_n * panel_h + 40
      << "' font-family='sans-serif' font-size='11'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='10' y='20' font-size='14'>Checkpoint schedules: peak saved activations vs step time "
         "(both relative to no checkpointing)</text>\n";
  for (std::size_t p = 0; p < sizes.size(); ++p) {
    const int ox = static_cast<int>(p % cols) * panel_w, oy = 30 + static_cast<int>(p / cols) * panel_h;
    const double x0 = ox + margin, y0 = oy + panel_h - margin, w = panel_w - 1.5 * margin, h = panel_h - 1.7 * margin;
    const double tmin = 0.9, tmax = 1.6;  // time ratio axis
    auto sx = [&](double t) { return x0 + (std::clamp(t, tmin, tmax) - tmin) / (tmax - tmin) * w; };
    auto sy = [&](double m) { return y0 - std::clamp(m, 0.0, 1.1) / 1.1 * h; };
    svg << "<text x='" << ox + margin << "' y='" << oy + 14 << "' font-size='12'>N = " << sizes[p]
        << " blocks</text>\n";
    svg << "<line x1='" << x0 << "' y1='" << y0 << "' x2='" << x0 + w << "' y2='" << y0 << "' stroke='black'/>\n";
    svg << "<line x1='" << x0 << "' y1='" << y0 << "' x2='" << x0 << "' y2='" << y0 - h << "' stroke='black'/>\n";
    for (double t = 1.0; t <= tmax + 1e-9; t += 0.1)
      svg << "<text x='" << sx(t) - 8 << "' y='" << y0 + 14 << "'>" << std::fixed << std::setprecision(1) << t
          << "</text>\n";
    for (double m = 0.0; m <= 1.01; m += 0.25)
      svg << "<text x='" << x0 - 32 << "' y='" << sy(m) + 4 << "'>" << std::setprecision(2) << m << "</text>\n";
    svg << "<text x='" << x0 + w / 2 - 50 << "' y='" << y0 + 30 << "'>step time / plain</text>\n";
    svg << "<text x='" << ox + 8 << "' y='" << y0 - h - 8 << "'>saved bytes / plain</text>\n";
    // Points sit close together, so names and values go in a legend, not beside the points.
    const double lx = x0 + 0.36 * w;
    double ly = y0 - h + 6;
    for (const auto& r : rows) {
      const std::string name = r["schedule"];
      if (r["n"] != sizes[p]) continue;
      const auto color = colors.count(name) ? colors.at(name) : std::string("#9467bd");
      const double time = r["time_ratio_vs_none"].get<double>(), saved = r["saved_ratio_vs_none"].get<double>();
      svg << "<circle cx='" << sx(time) << "' cy='" << sy(saved) << "' r='5' fill='" << color
          << "' fill-opacity='0.8'/>\n";
      svg << "<circle cx='" << lx << "' cy='" << ly - 4 << "' r='4' fill='" << color << "'/>\n";
      svg << "<text x='" << lx + 8 << "' y='" << ly << "' fill='" << color << "'>" << name << ": time "
          << std::setprecision(2) << time << "x, saved " << saved << "</text>\n";
      ly += 14;
    }
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"trainmem: memory and time of checkpoint schedules on a residual MLP chain"};
  app.add_option("--sizes", c.sizes, "chain lengths N")->delimiter(',');
  app.add_option("--width", c.width, "block width D");
  app.add_option("--hidden", c.hidden, "hidden width of each block's MLP");
  app.add_option("--batch", c.batch, "rows per batch");
  app.add_option("--reps", c.reps, "timed steps per schedule (median reported)");
  app.add_option("--check-pairs", c.check_pairs, "adjacent step pairs that measure the value check's cost");
  app.add_option("--every", c.every, "blocks per segment of the every-k schedule");
  app.add_option("--json", c.json_path, "where to write the JSON results");
  app.add_option("--svg", c.svg_path, "where to write the SVG chart");
  CLI11_PARSE(app, argc, argv);

  const int threads = tmem::num_threads();
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, threads);
  benchmarks::check_writable(c.json_path, provenance);
  benchmarks::check_writable(c.svg_path, provenance);
  std::printf("%s", provenance.text().c_str());
  std::printf("residual MLP chain: width %lld, hidden %lld, batch %lld, f32, %d threads, median of %d steps\n",
              static_cast<long long>(c.width), static_cast<long long>(c.hidden), static_cast<long long>(c.batch),
              threads, c.reps);
  std::printf("%6s  %-12s %16s %16s %10s %10s %10s\n", "N", "schedule", "peak saved B", "peak total B", "step ms",
              "saved/none", "time/none");

  nlohmann::json rows = nlohmann::json::array(), check_costs = nlohmann::json::array();
  std::map<int, std::int64_t> sqrt_peak, none_peak;
  std::map<int, std::int64_t> none_block_bytes;
  for (int n : c.sizes) {
    Chain chain(n, c);
    std::vector<float> values(static_cast<std::size_t>(c.batch * c.width));
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(std::sin(0.01 * static_cast<double>(i)));
    const auto input = tmem::Tensor<B>::from_host({c.batch, c.width}, values);
    auto scheds = schedules(c);
    std::vector<Measurement> m(scheds.size());
    for (std::size_t s = 0; s < scheds.size(); ++s) step(chain, scheds[s].second, input, m[s]);  // warm-up
    for (int r = 0; r < c.reps; ++r)
      for (std::size_t s = 0; s < scheds.size(); ++s)
        m[s].step_ms.push_back(step(chain, scheds[s].second, input, m[s]));
    const double none_ms = benchmarks::median(m[0].step_ms);
    for (std::size_t s = 0; s < scheds.size(); ++s) {
      const double ms = benchmarks::median(m[s].step_ms);
      const double saved_ratio = static_cast<double>(m[s].peak_saved()) / static_cast<double>(m[0].peak_saved());
      std::printf("%6d  %-12s %16lld %16lld %10.2f %10.3f %10.3f\n", n, scheds[s].first.c_str(),
                  static_cast<long long>(m[s].peak_saved()), static_cast<long long>(m[s].peak.total), ms, saved_ratio,
                  ms / none_ms);
      rows.push_back({{"n", n},
                      {"schedule", scheds[s].first},
                      {"peak_saved_bytes", m[s].peak_saved()},
                      {"peak_total_bytes", m[s].peak.total},
                      {"step_ms", ms},
                      {"step_ms_all", m[s].step_ms},
                      {"time_ratio_vs_none", ms / none_ms},
                      {"saved_ratio_vs_none", saved_ratio}});
      if (scheds[s].first == "sqrt_n") sqrt_peak[n] = m[s].peak_saved();
    }
    none_peak[n] = m[0].peak_saved();
    // The default check's cost: every_block (fingerprints) over every_block without the
    // value check (DeterminismCheck::Metadata) in adjacent pairs, alternating which runs first.
    const Schedule& checked = scheds[1].second;
    tmem::CheckpointOptions metadata_only;
    metadata_only.determinism = tmem::DeterminismCheck::Metadata;
    const Schedule unchecked = each_block(metadata_only);
    Measurement pair_steps;
    step(chain, unchecked, input, pair_steps);  // warm-up
    std::vector<double> check_ratio;
    for (int r = 0; r < c.check_pairs; ++r) {
      const bool checked_first = r % 2 == 0;
      const double first = step(chain, checked_first ? checked : unchecked, input, pair_steps);
      const double second = step(chain, checked_first ? unchecked : checked, input, pair_steps);
      check_ratio.push_back(checked_first ? first / second : second / first);
    }
    const double cost = benchmarks::median(check_ratio), q1 = benchmarks::quantile(check_ratio, 0.25),
                 q3 = benchmarks::quantile(check_ratio, 0.75);
    std::printf(
        "%6d  value check (fingerprint) cost: every_block with / without it = %.4f (quartiles %.4f, %.4f; %d "
        "pairs)\n",
        n, cost, q1, q3, c.check_pairs);
    check_costs.push_back(
        {{"n", n}, {"every_block_over_metadata", cost}, {"quartiles", {q1, q3}}, {"per_pair", check_ratio}});
  }

  // sqrt(N) against the (k + N/k) A model, A = one block's saved bytes in the plain run.
  std::printf("\nsqrt(N) schedule vs the model, k = round(sqrt N), A = plain peak saved / N, b = a block input:\n");
  const std::int64_t b = 4 * c.batch * c.width;
  nlohmann::json model = nlohmann::json::array();
  for (int n : c.sizes) {
    const std::int64_t k = tmem::sqrt_segments(n);
    const double a = static_cast<double>(none_peak[n]) / n;
    const double ideal = static_cast<double>(k + n / k) * a;
    const double exact = static_cast<double>(k - 1) * b + static_cast<double>(n - (k - 1) * (n / k)) * a;
    std::printf(
        "  N=%5d k=%3lld  measured %12lld  (k-1) b + (N-(k-1)floor(N/k)) A = %12.0f (%.3f)  (k+N/k) A = %12.0f "
        "(%.3f)\n",
        n, static_cast<long long>(k), static_cast<long long>(sqrt_peak[n]), exact, sqrt_peak[n] / exact, ideal,
        sqrt_peak[n] / ideal);
    model.push_back({{"n", n},
                     {"k", k},
                     {"measured", sqrt_peak[n]},
                     {"block_bytes_A", a},
                     {"boundary_bytes_b", b},
                     {"segments_model", exact},
                     {"k_plus_n_over_k_A", ideal}});
  }
  double slope = 0;
  if (c.sizes.size() >= 2) {  // least-squares slope of log(peak) on log(N)
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int n : c.sizes) {
      const double x = std::log(n), y = std::log(static_cast<double>(sqrt_peak[n]));
      sx += x;
      sy += y;
      sxx += x * x;
      sxy += x * y;
    }
    const double k = static_cast<double>(c.sizes.size());
    slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
    std::printf("  log-log slope of sqrt(N) peak saved bytes vs N: %.3f\n", slope);
  }

  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  nlohmann::json out = {{"benchmark", "checkpoint_schedules"},
                        {"provenance", nlohmann::json::parse(provenance.json())},
                        {"date", date},
                        {"threads", threads},
                        {"width", c.width},
                        {"hidden", c.hidden},
                        {"batch", c.batch},
                        {"reps", c.reps},
                        {"check_pairs", c.check_pairs},
                        {"results", rows},
                        {"fingerprint_check_cost", check_costs},
                        {"sqrt_model", model},
                        {"sqrt_loglog_slope", slope}};
  std::ofstream(c.json_path) << out.dump(2) << "\n";
  std::ofstream(c.svg_path) << "<!--\n" << provenance.text("") << "-->\n" << svg_chart(rows, c.sizes);
  std::printf("\nwrote %s and %s\n", c.json_path.c_str(), c.svg_path.c_str());
  return 0;
}

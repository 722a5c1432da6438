// trainmem_side — trainmem's half of the side-by-side comparison with PyTorch.
//
// Two models, built from seeded initialisers so every process gets the same weights:
//   mlp          N residual blocks x + Linear(GELU(Linear(LayerNorm(x)))) (width D, hidden
//                4D), then a Linear head and cross-entropy over C classes;
//   transformer  N pre-LN nn::TransformerBlocks on x [batch, T, D], then a Linear head
//                and cross-entropy over every token.
// `--export` writes the initial weights (manifest.json + weights.bin, f32, manifest
// order) and the batch (inputs.bin, labels.bin) that compare.py loads into PyTorch.
// A run trains `--steps` SGD steps under one configuration and writes
// <out>/<model>/trainmem_<config>.json (loss of every step, step times, peak memory)
// and grads_<config>.bin (every parameter gradient after the first step, manifest
// order). One configuration per process, so that the process peak RSS belongs to it:
//   f32        plain F32 training
//   ckpt_full  every block a checkpoint region (torch.utils.checkpoint, non-reentrant)
//   ckpt_sqrt  checkpoint_sequential with round(sqrt(N)) segments
//   bf16       amp::Autocast(BF16) around the forward, no checkpointing
//
// Default sizes (each can be changed on the command line, the same for --export and runs):
//   mlp          N=16, D=128, hidden 512, batch 512, 64 classes
//   transformer  N=4, D=128, 4 heads, hidden 512, batch 8, T=64, 256 classes
//
//   trainmem_side --model mlp --config f32 --out DIR [--export] [--steps 8] [--warmup 2] [--timeline]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/trainmem.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using Var = tmem::Var<B>;
using Tensor = tmem::Tensor<B>;
using json = nlohmann::json;

namespace {

struct Sizes {
  std::int64_t batch = 0, seq = 1, dim = 0, hidden = 0, heads = 0, layers = 0, classes = 0;
  json to_json() const {
    return {{"batch", batch}, {"seq", seq},       {"dim", dim},        {"hidden", hidden},
            {"heads", heads}, {"layers", layers}, {"classes", classes}};
  }
};

/// A model as the comparison sees it: parameters in manifest order, the blocks as
/// layers (what checkpointing cuts at), and the head that turns the last block's
/// output into [rows, classes] logits.
class Model {
 public:
  virtual ~Model() = default;
  const std::vector<Var>& parameters() const { return params_; }
  const std::vector<tmem::Layer<B>>& layers() const { return layers_; }
  virtual Var logits(const Var& h) const = 0;
  virtual tmem::Shape input_shape() const = 0;
  virtual std::int64_t label_count() const = 0;

 protected:
  void add_parameters(const std::vector<Var>& ps) { params_.insert(params_.end(), ps.begin(), ps.end()); }
  std::vector<Var> params_;
  std::vector<tmem::Layer<B>> layers_;
};

class MlpChain final : public Model {
 public:
  explicit MlpChain(const Sizes& s, tmem::nn::Init& init) : sizes_(s) {
    for (std::int64_t i = 0; i < s.layers; ++i) {
      const std::string name = "block" + std::to_string(i);
      norm_.push_back(std::make_unique<tmem::nn::LayerNorm<B>>(s.dim, 1e-5, tmem::DType::F32, name + ".ln"));
      up_.push_back(std::make_unique<tmem::nn::Linear<B>>(s.dim, s.hidden, init, true, tmem::DType::F32, name + ".up"));
      down_.push_back(
          std::make_unique<tmem::nn::Linear<B>>(s.hidden, s.dim, init, true, tmem::DType::F32, name + ".down"));
      add_parameters(norm_.back()->parameters());
      add_parameters(up_.back()->parameters());
      add_parameters(down_.back()->parameters());
      const auto* ln = norm_.back().get();
      const auto* up = up_.back().get();
      const auto* down = down_.back().get();
      layers_.push_back([ln, up, down](const Var& x) { return tmem::add(x, (*down)(tmem::gelu((*up)((*ln)(x))))); });
    }
    head_ = std::make_unique<tmem::nn::Linear<B>>(s.dim, s.classes, init, true, tmem::DType::F32, "head");
    add_parameters(head_->parameters());
  }
  Var logits(const Var& h) const override { return (*head_)(h); }
  tmem::Shape input_shape() const override { return tmem::Shape{sizes_.batch, sizes_.dim}; }
  std::int64_t label_count() const override { return sizes_.batch; }

 private:
  Sizes sizes_;
  std::vector<std::unique_ptr<tmem::nn::LayerNorm<B>>> norm_;
  std::vector<std::unique_ptr<tmem::nn::Linear<B>>> up_, down_;
  std::unique_ptr<tmem::nn::Linear<B>> head_;
};

class TransformerStack final : public Model {
 public:
  explicit TransformerStack(const Sizes& s, tmem::nn::Init& init) : sizes_(s) {
    for (std::int64_t i = 0; i < s.layers; ++i) {
      blocks_.push_back(std::make_unique<tmem::nn::TransformerBlock<B>>(s.dim, s.heads, s.hidden, init, 0.0f,
                                                                        tmem::DType::F32, "block" + std::to_string(i)));
      add_parameters(blocks_.back()->parameters());
      const auto* block = blocks_.back().get();
      layers_.push_back([block](const Var& x) { return (*block)(x); });
    }
    head_ = std::make_unique<tmem::nn::Linear<B>>(s.dim, s.classes, init, true, tmem::DType::F32, "head");
    add_parameters(head_->parameters());
  }
  Var logits(const Var& h) const override {
    return (*head_)(tmem::reshape(h, tmem::Shape{sizes_.batch * sizes_.seq, sizes_.dim}));
  }
  tmem::Shape input_shape() const override { return tmem::Shape{sizes_.batch, sizes_.seq, sizes_.dim}; }
  std::int64_t label_count() const override { return sizes_.batch * sizes_.seq; }

 private:
  Sizes sizes_;
  std::vector<std::unique_ptr<tmem::nn::TransformerBlock<B>>> blocks_;
  std::unique_ptr<tmem::nn::Linear<B>> head_;
};

// --- process memory -------------------------------------------------------------------
/// A field of /proc/self/status in bytes (VmRSS, VmHWM), or -1.
std::int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}
/// Resets the kernel's peak-RSS mark (VmHWM) to the current RSS; false where not allowed.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// --- files ------------------------------------------------------------------------------
void write_floats(const std::filesystem::path& path, const std::vector<std::vector<float>>& chunks) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& c : chunks)
    out.write(reinterpret_cast<const char*>(c.data()), static_cast<std::streamsize>(c.size() * sizeof(float)));
  tmem::require(static_cast<bool>(out), "trainmem_side: cannot write ", path.string());
}
json shape_json(const tmem::Shape& s) { return json(s.dims()); }

void export_model(const std::filesystem::path& dir, const std::string& model_name, const Sizes& s, const Model& model,
                  const std::vector<float>& inputs, const std::vector<std::int32_t>& labels) {
  json params = json::array();
  std::vector<std::vector<float>> chunks;
  std::int64_t offset = 0;
  for (const Var& p : model.parameters()) {
    params.push_back({{"name", p.name()}, {"shape", shape_json(p.shape())}, {"offset", offset}});
    offset += p.numel();
    chunks.push_back(p.value().to_host<float>());
  }
  write_floats(dir / "weights.bin", chunks);
  write_floats(dir / "inputs.bin", {inputs});
  {
    std::ofstream out(dir / "labels.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(labels.data()),
              static_cast<std::streamsize>(labels.size() * sizeof(std::int32_t)));
  }
  const json manifest = {
      {"model", model_name},
      {"sizes", s.to_json()},
      {"params", params},
      {"weights", "weights.bin"},
      {"inputs", {{"file", "inputs.bin"}, {"shape", shape_json(model.input_shape())}, {"dtype", "f32"}}},
      {"labels", {{"file", "labels.bin"}, {"shape", {model.label_count()}}, {"dtype", "i32"}}}};
  std::ofstream(dir / "manifest.json") << manifest.dump(2) << "\n";
}

/// The last step's peak: its phase, live bytes by category there, and the events before it.
json peak_neighbourhood(const std::vector<tmem::MemoryStats::TimelineEntry>& events,
                        std::map<std::string, std::int64_t> live, std::size_t before) {
  if (events.empty()) return json();
  std::size_t peak = 0;
  for (std::size_t i = 0; i < events.size(); ++i)
    if (events[i].live_total > events[peak].live_total) peak = i;
  std::string phase = "?";
  for (std::size_t i = 0; i <= peak; ++i) {
    if (events[i].event == tmem::MemoryStats::Event::Mark) phase = events[i].label;
    else live[std::string(tmem::name_of(events[i].category))] += events[i].bytes;
  }
  static constexpr const char* kEventNames[] = {"alloc", "free", "retag", "mark"};
  json window = json::array();
  for (std::size_t i = peak > before ? peak - before : 0; i < std::min(events.size(), peak + 6); ++i) {
    const auto& e = events[i];
    window.push_back(
        {{"i", static_cast<std::int64_t>(i) - static_cast<std::int64_t>(peak)},
         {"event", kEventNames[static_cast<int>(e.event)]},
         {"category", e.event == tmem::MemoryStats::Event::Mark ? e.label : std::string(tmem::name_of(e.category))},
         {"bytes", e.bytes},
         {"live_total", e.live_total}});
  }
  return {{"peak_bytes", events[peak].live_total},
          {"phase", phase},
          {"live_by_category_at_peak", live},
          {"events_around_peak", window}};
}

/// Which GEMM the products take on this machine (NOTE [CPU GEMM path]): F32 products go
/// to oneDNN from onednn_f32_min_dim() (64 on an AMD AVX-512 core: every product of the
/// default sizes; 512 elsewhere: none of them); BF16 operands go to oneDNN where it has
/// AMX or an AMD AVX512-BF16 core.
std::string gemm_description() {
  const std::string eigen = "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) +
                            "." + std::to_string(EIGEN_MINOR_VERSION);
  const tmem::cpu::OneDnnSupport onednn = tmem::cpu::onednn_support();
  const char* forced = std::getenv("TRAINMEM_CPU_GEMM");
  const std::int64_t f32_min = onednn.f32_min_dim;
  std::string text = onednn.built_in ? "oneDNN matmul for F32 products with m, n and k at least " +
                                           std::to_string(f32_min) + ", " + eigen + " GEMM for the others" +
                                           (f32_min <= 64 ? "" : " (all of them at the default sizes)")
                                     : eigen + " GEMM for F32 products";
  text += " (Eigen: rows split over OpenMP threads); 16-bit operands ";
  if (!onednn.built_in) text += "widened to F32 for Eigen (built without oneDNN)";
  else if (onednn.amx) text += "multiplied by oneDNN (AMX)";
  else if (onednn.bf16) text += "multiplied by oneDNN where BF16 (AVX512-BF16 on an AMD core), widened where F16";
  else text += "widened to F32 for Eigen (oneDNN found; this CPU has neither AMX nor an AMD AVX512-BF16 core)";
  if (forced != nullptr && *forced != '\0') text += std::string("; TRAINMEM_CPU_GEMM=") + forced;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "trainmem's side of the PyTorch comparison: export a model, or "
      "train it under one configuration"};
  std::string model_name = "mlp", config = "f32", out_dir = "pytorch_compare";
  bool do_export = false, timeline = false;
  int steps = 8, warmup = 2;
  double lr = 0.05, momentum = 0.9;
  std::uint64_t seed = 2026;
  Sizes s;
  std::int64_t dim = -1, layers = -1, batch = -1, seq = -1, heads = -1, classes = -1;
  app.add_option("--model", model_name, "mlp or transformer")->check(CLI::IsMember({"mlp", "transformer"}));
  app.add_option("--config", config, "f32, ckpt_full, ckpt_sqrt or bf16")
      ->check(CLI::IsMember({"f32", "ckpt_full", "ckpt_sqrt", "bf16"}));
  app.add_option("--out", out_dir, "output folder (a subfolder per model)");
  app.add_flag("--export", do_export, "write manifest.json, weights.bin, inputs.bin, labels.bin and exit");
  app.add_flag("--timeline", timeline,
               "record the last step's allocation timeline and write the "
               "events around its peak (diagnosis)");
  app.add_option("--steps", steps, "SGD steps")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", warmup, "steps left out of the median step time")->check(CLI::Range(0, 1000));
  app.add_option("--lr", lr, "SGD learning rate");
  app.add_option("--momentum", momentum, "SGD momentum");
  app.add_option("--seed", seed, "initialisation seed");
  app.add_option("--dim", dim, "model width D (mlp 128, transformer 128)");
  app.add_option("--layers", layers, "blocks N (mlp 16, transformer 4)");
  app.add_option("--batch", batch, "batch (mlp 512, transformer 8)");
  app.add_option("--seq", seq, "sequence length T (transformer 64)");
  app.add_option("--heads", heads, "attention heads (transformer 4)");
  app.add_option("--classes", classes, "classes of the head (mlp 64, transformer 256)");
  CLI11_PARSE(app, argc, argv);

  const bool transformer = model_name == "transformer";
  s.dim = dim > 0 ? dim : 128;
  s.layers = layers > 0 ? layers : (transformer ? 4 : 16);
  s.batch = batch > 0 ? batch : (transformer ? 8 : 512);
  s.seq = transformer ? (seq > 0 ? seq : 64) : 1;
  s.heads = transformer ? (heads > 0 ? heads : 4) : 0;
  s.classes = classes > 0 ? classes : (transformer ? 256 : 64);
  s.hidden = 4 * s.dim;

  B& backend = B::default_instance();
  tmem::nn::Init init(seed);
  std::unique_ptr<Model> model;
  if (transformer) model = std::make_unique<TransformerStack>(s, init);
  else model = std::make_unique<MlpChain>(s, init);

  // The batch: N(0, 1) inputs and uniform labels, from their own streams.
  tmem::nn::Init data_init(seed + 1);
  const tmem::Shape in_shape = model->input_shape();
  std::vector<float> inputs_host;
  for (double v : data_init.normal(in_shape.numel(), 0.0, 1.0)) inputs_host.push_back(static_cast<float>(v));
  std::vector<std::int32_t> labels_host;
  for (double u : data_init.uniform(model->label_count(), 0.0, 1.0))
    labels_host.push_back(std::min<std::int32_t>(static_cast<std::int32_t>(u * static_cast<double>(s.classes)),
                                                 static_cast<std::int32_t>(s.classes - 1)));

  const std::filesystem::path dir = std::filesystem::path(out_dir) / model_name;
  std::filesystem::create_directories(dir);
  if (do_export) {
    export_model(dir, model_name, s, *model, inputs_host, labels_host);
    std::cout << "exported " << model->parameters().size() << " parameters and the batch to " << dir.string() << "\n";
    return 0;
  }

  // The PyTorch side reads the exported files: a run with other sizes would compare different models.
  if (std::ifstream manifest_file(dir / "manifest.json"); manifest_file) {
    const json manifest = json::parse(manifest_file);
    tmem::require(manifest.at("sizes") == s.to_json(), "trainmem_side: ", (dir / "manifest.json").string(),
                  " was exported with sizes ", manifest.at("sizes").dump(), ", this run has ", s.to_json().dump(),
                  "; pass the same sizes or export again");
  }

  const Tensor inputs = Tensor::from_host(in_shape, inputs_host);
  Tensor labels = Tensor::empty(tmem::Shape{model->label_count()}, tmem::DType::I32);
  std::copy(labels_host.begin(), labels_host.end(), labels.data_as<std::int32_t>());

  tmem::optim::SGD<B> optimizer(model->parameters(), tmem::optim::SgdOptions{lr, momentum, 0.0, 0.0, false});
  const auto& layer_list = model->layers();
  const std::int64_t segments = tmem::sqrt_segments(static_cast<std::int64_t>(layer_list.size()));

  auto forward_blocks = [&](tmem::Tape<B>& tape, const Var& x) {
    if (config == "ckpt_full") {
      Var h = x;
      for (const auto& layer : layer_list) h = tmem::checkpoint(tape, layer, h);
      return h;
    }
    if (config == "ckpt_sqrt") return tmem::checkpoint_sequential(tape, layer_list, segments, x);
    Var h = x;
    for (const auto& layer : layer_list) h = layer(h);
    return h;
  };

  const std::int64_t rss_baseline = proc_status_bytes("VmRSS");
  const bool hwm_reset = reset_peak_rss();
  const tmem::PeakWindow run_window(backend.memory());  // the peaks of the training steps only
  const std::int64_t live_at_start = backend.memory().live_total();

  std::vector<double> losses, step_ms, step_cpu_ms, forward_ms, backward_ms, optimizer_ms;
  // Process CPU time (all threads): steadier than wall time on a machine shared with other work.
  auto cpu_ms = [] { return 1e3 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  tmem::MemoryStats& stats = backend.memory();
  std::map<std::string, std::int64_t> live_at_last_step;
  for (int step = 0; step < steps; ++step) {
    if (timeline && step + 1 == steps) {
      for (std::size_t c = 0; c < tmem::kMemCategoryCount; ++c)
        live_at_last_step[std::string(tmem::name_of(static_cast<tmem::MemCategory>(c)))] =
            stats.live(static_cast<tmem::MemCategory>(c));
      stats.clear_timeline();
      stats.record_timeline(true);
      stats.mark("forward");
    }
    const double c0 = cpu_ms();
    const benchmarks::Stopwatch clock;
    tmem::Tape<B> tape;
    Var loss;
    {
      std::optional<tmem::amp::Autocast> autocast;
      if (config == "bf16") autocast.emplace(tmem::DType::BF16);
      const Var x = tape.input(inputs);
      loss = tmem::cross_entropy(model->logits(forward_blocks(tape, x)), labels);
    }
    const double t1 = clock.ms();
    stats.mark("backward");
    tape.backward(loss);
    const double t2 = clock.ms();
    const double c2 = cpu_ms();
    losses.push_back(loss.value().to_host<double>()[0]);
    if (step == 0) {  // every gradient after the first step, before the update consumes it
      std::vector<std::vector<float>> grads;
      for (const Var& p : model->parameters()) {
        tmem::require(p.grad().defined(), "trainmem_side: '", p.name(), "' got no gradient");
        grads.push_back(p.grad().to_host<float>());
      }
      write_floats(dir / ("grads_" + config + ".bin"), grads);
    }
    const double c3 = cpu_ms();
    const double t3 = clock.ms();
    stats.mark("optimizer");
    optimizer.step();
    optimizer.zero_grad();
    tape.clear();
    const double t4 = clock.ms();
    const double c4 = cpu_ms();
    if (step >= warmup) {
      step_cpu_ms.push_back(c2 - c0 + c4 - c3);
      forward_ms.push_back(t1);
      backward_ms.push_back(t2 - t1);
      optimizer_ms.push_back(t4 - t3);
      step_ms.push_back(t2 + (t4 - t3));  // the host copies of the loss and first gradients left out
    }
  }

  const tmem::MemoryStats& mem = backend.memory();
  const tmem::PeakBytes peaks = run_window.peaks();
  json timeline_json;
  if (timeline) timeline_json = peak_neighbourhood(mem.timeline(), live_at_last_step, 40);
  json peak_by_category = json::object();
  for (std::size_t c = 0; c < tmem::kMemCategoryCount; ++c) {
    const auto cat = static_cast<tmem::MemCategory>(c);
    peak_by_category[std::string(tmem::name_of(cat))] = peaks[cat];
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const std::int64_t hwm = proc_status_bytes("VmHWM");
  int threads = 1;
  std::string threads_source = "no OpenMP";
#if defined(_OPENMP)
  threads = omp_get_max_threads();
  threads_source = "OpenMP " + std::to_string(_OPENMP);
#endif
  json params = json::array();
  for (const Var& p : model->parameters()) params.push_back(p.name());
  const json result = {
      {"side", "trainmem"},
      {"model", model_name},
      {"config", config},
      {"sizes", s.to_json()},
      {"provenance", nlohmann::json::parse(benchmarks::provenance(argc, argv, threads).json())},
      {"threads", threads},
      {"build",
       {{"gemm", gemm_description()},
        {"compiler", __VERSION__},
        {"simd", Eigen::SimdInstructionSetsInUse()},
        {"openmp", threads_source}}},
      {"steps", steps},
      {"warmup", warmup},
      {"lr", lr},
      {"momentum", momentum},
      {"sqrt_segments", segments},
      {"losses", losses},
      {"step_ms", step_ms},
      {"median_step_ms", benchmarks::median(step_ms)},
      {"min_step_ms", step_ms.empty() ? 0.0 : *std::min_element(step_ms.begin(), step_ms.end())},
      {"step_cpu_ms", step_cpu_ms},
      {"median_step_cpu_ms", benchmarks::median(step_cpu_ms)},
      {"median_forward_ms", benchmarks::median(forward_ms)},
      {"median_backward_ms", benchmarks::median(backward_ms)},
      {"median_optimizer_ms", benchmarks::median(optimizer_ms)},
      {"grads_file", "grads_" + config + ".bin"},
      {"params", params},
      {"memory",
       {{"accounting", "trainmem MemoryStats (every tensor byte, by category)"},
        {"live_at_start_bytes", live_at_start},
        {"peak_total_bytes", peaks.total},
        {"peak_by_category_bytes", peak_by_category},
        {"allocator_cached_bytes_at_end", backend.allocator().cached_bytes()},
        {"last_step_timeline", timeline_json}}},
      {"rss",
       {{"baseline_bytes", rss_baseline},
        {"peak_bytes", hwm > 0 ? hwm : static_cast<std::int64_t>(usage.ru_maxrss) * 1024},
        {"peak_reset_at_start", hwm_reset && hwm > 0},
        {"ru_maxrss_bytes", static_cast<std::int64_t>(usage.ru_maxrss) * 1024}}},
  };
  std::ofstream(dir / ("trainmem_" + config + ".json")) << result.dump(2) << "\n";
  std::printf(
      "trainmem %s %s: loss %.6f -> %.6f, median step %.2f ms (fwd "
      "%.2f bwd %.2f opt %.2f), peak %.1f MiB "
      "(MemoryStats), peak RSS %.1f MiB, %d threads\n",
      model_name.c_str(), config.c_str(), losses.front(), losses.back(), benchmarks::median(step_ms),
      benchmarks::median(forward_ms), benchmarks::median(backward_ms), benchmarks::median(optimizer_ms),
      static_cast<double>(peaks.total) / (1 << 20), static_cast<double>(hwm) / (1 << 20), threads);
  return 0;
}

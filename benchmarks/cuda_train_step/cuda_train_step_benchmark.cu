// benchmarks/cuda_train_step/cuda_train_step_benchmark.cu — one training step of a transformer stack on the GPU.
//
// A stack of nn::TransformerBlock (pre-LN GPT-2 blocks: dim 768, 12 heads, MLP 3072,
// 1024 tokens per sequence, batch 8, 6 blocks by default) runs one full step —
// forward, mean loss, backward, AdamW — in three precisions and three schedules:
//   precision  f32: f32 parameters and activations, f32 GEMMs without TF32;
//              bf16: f32 parameters with the forward under autocast (amp::TrainStep
//              without master weights: bf16 GEMMs with f32 accumulation, f32
//              softmax/norms/loss, weights cast once per step);
//              fp8: bf16 with linear's GEMMs in FP8 (TrainStepOptions::fp8, delayed
//              scaling: E4M3 weights and inputs, E5M2 gradients, cuBLASLt FP8 GEMMs);
//   schedule   plain: every activation kept for backward;
//              full: each block a checkpoint region that keeps nothing (full recompute);
//              selective: regions keeping matmul outputs (policy::save_matmuls).
// Each configuration starts from the same seeded weights and input, so the first
// step's loss and gradient norm must agree across schedules of one precision (a
// recompute reproduces the forward): they are checked, and a mismatch fails the run.
// Timing per METHOD.md: CUDA events around the whole step on the backend's stream
// (host gaps included), warm-up steps first, then the median of --steps steps. The
// configurations run one after another, each alone on the device, so the peak bytes
// per MemoryStats category (over each step's PeakWindow) are its own. Last, the fused
// attention op alone (forward and backward on one block's shapes) says how much of a
// step is attention, whose kernels use CUDA cores only (kernels/attention.cuh).
//
//   trainmem_cuda_train_step_benchmark [--json PATH] [--layers N] [--batch B] [--seq T]
//                                      [--dim D] [--heads H] [--steps N] [--dropout P] [--quick]
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.cuh"
#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "trainmem/cuda.hpp"

namespace {

namespace tmem = trainmem;
using Gpu = tmem::cuda::Backend;
using Var = tmem::Var<Gpu>;
using TensorT = tmem::Tensor<Gpu>;

struct Config {
  std::int64_t layers = 6, batch = 8, seq = 1024, dim = 768, heads = 12;
  int steps = 7, warmup = 2;
  float dropout = 0.0f;
  std::string json_path;
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--json") c.json_path = next();
    else if (arg == "--layers") c.layers = std::atoll(next());
    else if (arg == "--batch") c.batch = std::atoll(next());
    else if (arg == "--seq") c.seq = std::atoll(next());
    else if (arg == "--dim") c.dim = std::atoll(next());
    else if (arg == "--heads") c.heads = std::atoll(next());
    else if (arg == "--steps") c.steps = std::max(3, std::atoi(next()));
    else if (arg == "--dropout") c.dropout = static_cast<float>(std::atof(next()));
    else if (arg == "--quick") {
      c.layers = 2;
      c.batch = 2;
      c.seq = 256;
      c.dim = 256;
      c.heads = 4;
      c.steps = 3;
      c.warmup = 1;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json PATH] [--layers N] [--batch B] [--seq T] [--dim D] [--heads H] [--steps N] "
                   "[--dropout P] [--quick]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return c;
}

enum class Precision { F32, BF16, FP8 };
const char* name_of(Precision p) {
  switch (p) {
    case Precision::F32: return "f32";
    case Precision::BF16: return "bf16";
    case Precision::FP8: return "fp8";
  }
  return "?";
}

enum class Schedule { Plain, Full, Selective };
const char* name_of(Schedule s) {
  switch (s) {
    case Schedule::Plain: return "plain";
    case Schedule::Full: return "full";
    case Schedule::Selective: return "selective";
  }
  return "?";
}

/// The blocks a schedule runs: plain calls, or one checkpoint region per block.
Var run_blocks(Schedule schedule, tmem::Tape<Gpu>& tape, const std::vector<tmem::nn::TransformerBlock<Gpu>>& blocks,
               Var h) {
  tmem::CheckpointOptions options;
  if (schedule == Schedule::Selective) options.policy = tmem::policy::save_matmuls();
  for (const auto& block : blocks) {
    if (schedule == Schedule::Plain) h = block(h);
    else
      h = tmem::checkpoint(
          tape, options, [&block](const Var& x) { return block(x); }, h);
  }
  return h;
}

/// One model, optimizer and input per configuration; all start from the same seeds.
struct Run {
  Precision precision;
  Schedule schedule;
  std::vector<tmem::nn::TransformerBlock<Gpu>> blocks;
  std::unique_ptr<tmem::optim::AdamW<Gpu>> optimizer;
  std::unique_ptr<tmem::amp::TrainStep<Gpu>> train;  // the precision around the optimizer
  TensorT input;
  std::vector<double> step_ms;
  double first_loss = 0.0, first_grad_norm2 = 0.0;
  tmem::PeakBytes peak;  // the largest of every step's peaks
};

std::unique_ptr<Run> make_run(const Config& c, Precision precision, Schedule schedule, const std::vector<float>& x) {
  auto run = std::make_unique<Run>();
  run->precision = precision;
  run->schedule = schedule;
  tmem::nn::Init init(2026);
  for (std::int64_t i = 0; i < c.layers; ++i)
    run->blocks.emplace_back(c.dim, c.heads, 4 * c.dim, init, c.dropout, tmem::DType::F32, "block" + std::to_string(i));
  std::vector<Var> params;
  for (const auto& block : run->blocks)
    for (const auto& p : block.parameters()) params.push_back(p);
  run->optimizer = std::make_unique<tmem::optim::AdamW<Gpu>>(params, tmem::optim::AdamWOptions{3e-4});
  tmem::amp::TrainStepOptions options{.precision = precision == Precision::F32 ? tmem::DType::F32 : tmem::DType::BF16,
                                      .master_weights = false};
  if (precision == Precision::FP8) options.fp8 = tmem::amp::DelayedScaling{};
  run->train = std::make_unique<tmem::amp::TrainStep<Gpu>>(*run->optimizer, options);
  run->input = TensorT::from_host(tmem::Shape{c.batch, c.seq, c.dim}, x, tmem::DType::F32);
  return run;
}

/// One step; returns its time in ms (events around the step on the backend's stream).
double step(Run& run, bool record) {
  Gpu& gpu = Gpu::default_instance();
  cudaEvent_t start, stop;
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&start));
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&stop));
  gpu.synchronize();
  const tmem::PeakWindow window(gpu.memory());
  TRAINMEM_CUDA_CHECK(cudaEventRecord(start, gpu.stream()));
  {
    tmem::Tape<Gpu> tape(gpu);
    tape.manual_seed(7);
    Var x = tape.input(run.input);
    Var loss = run.train->forward([&] { return tmem::mean(run_blocks(run.schedule, tape, run.blocks, x)); });
    run.train->backward(loss);
    if (record) {  // the first step's loss and gradient norm, before the update
      run.first_loss = loss.value().to_host<double>()[0];
      auto norm2 = TensorT::zeros(tmem::Shape{}, tmem::DType::F64);
      for (const auto& e : run.optimizer->entries()) gpu.sum_squares(e.param.grad(), norm2);
      run.first_grad_norm2 = norm2.to_host<double>()[0];
    }
    run.train->update();  // steps and zeroes the gradients
  }
  TRAINMEM_CUDA_CHECK(cudaEventRecord(stop, gpu.stream()));
  TRAINMEM_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  TRAINMEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  gpu.synchronize();
  run.peak.merge(window.peaks());
  return ms;
}

/// Where one bf16 plain step's time goes, op by op (OpTimes: CUDA events around every op's
/// forward and backward, and around the optimizer's update), after two warm-up steps.
std::vector<tmem::OpTimeRow> op_profile(const Config& c, const std::vector<float>& x) {
  Gpu& gpu = Gpu::default_instance();
  auto run = make_run(c, Precision::BF16, Schedule::Plain, x);
  for (int w = 0; w < 2; ++w) step(*run, false);
  gpu.synchronize();
  tmem::OpTimes<Gpu> times(gpu);
  {
    tmem::Tape<Gpu> tape(gpu);
    tape.manual_seed(7);
    Var input = tape.input(run->input);
    Var loss = run->train->forward([&] { return tmem::mean(run_blocks(run->schedule, tape, run->blocks, input)); });
    run->train->backward(loss);
    tmem::OpTimes<Gpu>::Scope update("optimizer update (not an op)", false);
    run->train->update();
  }
  times.stop();
  auto rows = times.table();
  gpu.synchronize();
  return rows;
}

/// `text` with the characters JSON strings cannot hold as they are escaped.
std::string json_escaped(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';
    out += ch;
  }
  return out;
}

double gib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

/// The fused causal attention op alone, forward and backward, on one block's q, k and v
/// ([batch x heads, seq, dim / heads] in `dtype`, as the block's autocast gives it): median
/// ms, events as in step(). Times the layer count, it says how much of a step is attention.
double attention_ms(const Config& c, tmem::DType dtype, std::mt19937_64& engine) {
  Gpu& gpu = Gpu::default_instance();
  const tmem::Shape shape{c.batch * c.heads, c.seq, c.dim / c.heads};
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(shape.numel()));
  std::array<TensorT, 3> qkv;
  for (auto& t : qkv) {
    for (auto& v : values) v = dist(engine);
    t = TensorT::from_host(shape, values, dtype);
  }
  cudaEvent_t start, stop;
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&start));
  TRAINMEM_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    gpu.synchronize();
    TRAINMEM_CUDA_CHECK(cudaEventRecord(start, gpu.stream()));
    {
      tmem::Tape<Gpu> tape(gpu);
      Var q = tape.input(qkv[0], true), k = tape.input(qkv[1], true), v = tape.input(qkv[2], true);
      tape.backward(tmem::sum(tmem::scaled_dot_product_attention(q, k, v, true)));
    }
    TRAINMEM_CUDA_CHECK(cudaEventRecord(stop, gpu.stream()));
    TRAINMEM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    TRAINMEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (s >= c.warmup) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  gpu.synchronize();
  return benchmarks::median(times);
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = parse(argc, argv);
  try {
    if (tmem::cuda::device_count() == 0) {
      std::fprintf(stderr, "cuda_train_step: no CUDA device\n");
      return 77;
    }
    Gpu& gpu = Gpu::default_instance();
    cudaDeviceProp props{};
    TRAINMEM_CUDA_CHECK(cudaGetDeviceProperties(&props, gpu.device()));
    // One host thread drives the GPU.
    const benchmarks::Provenance provenance =
        benchmarks::provenance(argc, argv, 1, benchmarks::gpu_description(gpu.device()));
    if (!c.json_path.empty()) benchmarks::check_writable(c.json_path, provenance);
    std::printf("%s", provenance.text().c_str());
    std::mt19937_64 engine(std::random_device{}());
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(c.batch * c.seq * c.dim));
    for (auto& v : x) v = dist(engine);

    // One configuration at a time, so each one's peaks hold its own bytes only: its model,
    // gradients and optimizer state, its activations, and the backend's GEMM workspace.
    std::vector<std::unique_ptr<Run>> runs;
    for (Precision precision : {Precision::F32, Precision::BF16, Precision::FP8})
      for (Schedule schedule : {Schedule::Plain, Schedule::Full, Schedule::Selective}) {
        auto run = make_run(c, precision, schedule, x);
        for (int w = 0; w < c.warmup; ++w) step(*run, w == 0);
        for (int s = 0; s < c.steps; ++s) run->step_ms.push_back(step(*run, false));
        std::printf("  %-5s %-9s %8.2f ms\n", name_of(precision), name_of(schedule), benchmarks::median(run->step_ms));
        std::fflush(stdout);
        run->blocks.clear();  // free the model and its optimizer state before the next one
        run->train.reset();
        run->optimizer.reset();
        run->input = TensorT();
        tmem::amp::CastCache<Gpu>::instance().clear();
        gpu.synchronize();
        runs.push_back(std::move(run));
      }

    auto find = [&](Precision p, Schedule s) -> const Run& {
      for (const auto& run : runs)
        if (run->precision == p && run->schedule == s) return *run;
      throw tmem::Error("no such run");
    };
    bool consistent = true;
    for (const auto& run : runs) {
      const Run& plain = find(run->precision, Schedule::Plain);
      const double loss_diff = std::fabs(run->first_loss - plain.first_loss);
      const double norm_diff = std::fabs(run->first_grad_norm2 - plain.first_grad_norm2) / plain.first_grad_norm2;
      consistent = consistent && loss_diff == 0.0 && norm_diff <= 1e-6 && std::isfinite(run->first_grad_norm2);
    }

    const double f32_plain = benchmarks::median(find(Precision::F32, Schedule::Plain).step_ms);
    const double bf16_plain = benchmarks::median(find(Precision::BF16, Schedule::Plain).step_ms);
    const double fp8_plain = benchmarks::median(find(Precision::FP8, Schedule::Plain).step_ms);
    const double f32_attention = attention_ms(c, tmem::DType::F32, engine);
    const double bf16_attention = attention_ms(c, tmem::DType::BF16, engine);
    const tmem::cuda::AttentionPaths& paths = gpu.attention_paths();
    const std::vector<tmem::OpTimeRow> profile = op_profile(c, x);
    double profiled_ms = 0.0;
    for (const auto& row : profile) profiled_ms += row.total_ms();
    if (!c.json_path.empty()) {
      std::ofstream out(c.json_path);
      out << "{\n  \"benchmark\": \"cuda_train_step\",\n  \"provenance\": " << provenance.json()
          << ",\n  \"device\": \"" << props.name << "\",\n  \"config\": {"
          << "\"layers\": " << c.layers << ", \"batch\": " << c.batch << ", \"seq\": " << c.seq
          << ", \"dim\": " << c.dim << ", \"heads\": " << c.heads << ", \"hidden\": " << 4 * c.dim
          << ", \"dropout\": " << c.dropout << ", \"steps\": " << c.steps << ", \"warmup\": " << c.warmup
          << "},\n  \"first_steps_consistent\": " << (consistent ? "true" : "false")
          << ",\n  \"bf16_speedup_over_f32\": " << f32_plain / bf16_plain
          << ",\n  \"fp8_speedup_over_bf16\": " << bf16_plain / fp8_plain
          << ",\n  \"attention_fwd_bwd_ms_per_block\": {\"f32\": " << f32_attention << ", \"bf16\": " << bf16_attention
          << "},\n  \"attention_paths\": {\"cudnn_forward\": " << paths.cudnn_forward
          << ", \"cudnn_backward\": " << paths.cudnn_backward << ", \"kernel_forward\": " << paths.kernel_forward
          << ", \"kernel_backward\": " << paths.kernel_backward << ", \"cudnn_status\": \""
          << json_escaped(paths.cudnn_status) << "\"}"
          << ",\n  \"op_profile_bf16_plain\": [";
      for (std::size_t i = 0; i < profile.size(); ++i)
        out << (i ? ", " : "") << "{\"op\": \"" << json_escaped(profile[i].op)
            << "\", \"forward_ms\": " << profile[i].forward_ms << ", \"backward_ms\": " << profile[i].backward_ms
            << ", \"forward_calls\": " << profile[i].forward_calls
            << ", \"backward_calls\": " << profile[i].backward_calls << "}";
      out << "],\n  \"runs\": [\n";
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const Run& r = *runs[i];
        const double plain = benchmarks::median(find(r.precision, Schedule::Plain).step_ms);
        out << "    {\"precision\": \"" << name_of(r.precision) << "\", \"schedule\": \"" << name_of(r.schedule)
            << "\", \"median_ms\": " << benchmarks::median(r.step_ms)
            << ", \"over_plain\": " << benchmarks::median(r.step_ms) / plain << ", \"step_ms\": [";
        for (std::size_t s = 0; s < r.step_ms.size(); ++s) out << (s ? ", " : "") << r.step_ms[s];
        out << "], \"first_loss\": " << r.first_loss << ", \"first_grad_norm2\": " << r.first_grad_norm2
            << ", \"peak_total_bytes\": " << r.peak.total << ", \"peak_bytes\": {";
        for (std::size_t k = 0; k < tmem::kMemCategoryCount; ++k)
          out << (k ? ", " : "") << "\"" << tmem::name_of(static_cast<tmem::MemCategory>(k))
              << "\": " << r.peak.by_category[k];
        out << "}}" << (i + 1 < runs.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }

    std::printf(
        "cuda_train_step on %s: %lld x TransformerBlock(dim %lld, heads %lld, hidden %lld), batch %lld x %lld "
        "tokens, median of %d steps\n",
        props.name, static_cast<long long>(c.layers), static_cast<long long>(c.dim), static_cast<long long>(c.heads),
        static_cast<long long>(4 * c.dim), static_cast<long long>(c.batch), static_cast<long long>(c.seq), c.steps);
    std::printf("%-5s %-9s %10s %8s %12s %12s %12s\n", "prec", "schedule", "step ms", "/plain", "peak GiB", "saved GiB",
                "param+opt GiB");
    for (const auto& run : runs) {
      const Run& r = *run;
      const double plain = benchmarks::median(find(r.precision, Schedule::Plain).step_ms);
      const auto cat = [&](tmem::MemCategory k) { return r.peak[k]; };
      std::printf("%-5s %-9s %10.2f %8.3f %12.2f %12.2f %12.2f\n", name_of(r.precision), name_of(r.schedule),
                  benchmarks::median(r.step_ms), benchmarks::median(r.step_ms) / plain, gib(r.peak.total),
                  gib(cat(tmem::MemCategory::SavedActivation)),
                  gib(cat(tmem::MemCategory::Parameter) + cat(tmem::MemCategory::OptimizerState)));
    }
    std::printf(
        "bf16 speed-up over f32 (plain): %.2fx; fp8 speed-up over bf16 (plain): %.2fx; first steps consistent across "
        "schedules: %s\n",
        f32_plain / bf16_plain, bf16_plain / fp8_plain, consistent ? "yes" : "NO");
    std::printf(
        "fused attention alone, forward + backward per block: f32 %.2f ms, bf16 %.2f ms; x %lld blocks = %.0f%% "
        "(f32) and %.0f%% (bf16) of the plain step\n",
        f32_attention, bf16_attention, static_cast<long long>(c.layers),
        100.0 * f32_attention * static_cast<double>(c.layers) / f32_plain,
        100.0 * bf16_attention * static_cast<double>(c.layers) / bf16_plain);
    std::printf(
        "attention paths (every call of this run): cuDNN forward %llu, backward %llu; own kernels forward %llu, "
        "backward %llu; %s\n",
        static_cast<unsigned long long>(paths.cudnn_forward), static_cast<unsigned long long>(paths.cudnn_backward),
        static_cast<unsigned long long>(paths.kernel_forward), static_cast<unsigned long long>(paths.kernel_backward),
        paths.cudnn_status.c_str());
    std::printf("one bf16 plain step by op (events around each op; %.2f ms in all, with the marks' cost):\n",
                profiled_ms);
    std::printf("  %-32s %9s %9s %7s %6s\n", "op", "fwd ms", "bwd ms", "share", "calls");
    for (const auto& row : profile)
      std::printf("  %-32s %9.3f %9.3f %6.1f%% %6lld\n", row.op.c_str(), row.forward_ms, row.backward_ms,
                  100.0 * row.total_ms() / profiled_ms, static_cast<long long>(row.forward_calls + row.backward_calls));
    std::printf("target bf16 attention forward + backward per block <= 0.6 ms: %s (%.3f ms)\n",
                bf16_attention <= 0.6 ? "met" : "NOT met", bf16_attention);
    return consistent ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_train_step: %s\n", e.what());
    return 1;
  }
}

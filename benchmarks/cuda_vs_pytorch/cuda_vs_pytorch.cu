// benchmarks/cuda_vs_pytorch — trainmem's half of the GPU side-by-side with PyTorch.
//
// The budget shoot-out's GPT (budget_shootout/gpt.hpp: token and position embeddings,
// pre-LN blocks of causal attention and a GELU MLP, final LayerNorm, a head over bytes)
// at GPT-2-small widths: 6 blocks, dim 768, 12 heads, hidden 3072, sequences of 1024, a
// batch of 8. BF16 autocast over F32 parameters (the cast cache holds the 16-bit copies),
// AdamW; PyTorch's torch.autocast + torch.optim.AdamW(fused=True) is the same recipe.
// The initial weights are exported (manifest.json, weights.bin: f32 in manifest order)
// before the first step, so torch_side.py starts from the same numbers and trains on the
// same byte windows of the same text. Each step is timed by CUDA events on the backend's
// stream, with no host wait inside the loop (losses stay on the device until the end), so
// the time includes any launch gap the host leaves; the peak is MemoryStats' total over
// the timed steps (every byte the allocator handed out, workspaces included).
//
//   trainmem_cuda_vs_pytorch_benchmark --export DIR --json PATH [--text FILE] [--steps 20]
//        [--warmup 3] [--batch 8] [--seq 1024] [--blocks 6] [--dim 768] [--heads 12]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "budget_shootout/export.hpp"
#include "budget_shootout/gpt.hpp"
#include "common/gpu.cuh"
#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "trainmem/cuda.hpp"

namespace {

namespace tmem = trainmem;
using Gpu = tmem::cuda::Backend;
using json = nlohmann::json;

constexpr std::uint64_t kSeed = 20261206;

struct Config {
  std::string export_dir = "cuda_vs_pytorch", json_path = "cuda_vs_pytorch_trainmem.json";
  std::string text = "README.md";
  int steps = 20, warmup = 3;
  std::int64_t batch = 8;
  double lr = 3e-4;
  shootout::GptSizes sizes{.blocks = 6, .dim = 768, .heads = 12, .hidden = 3072, .seq = 1024, .vocab = 256};
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw tmem::Error("cuda_vs_pytorch: " + arg + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--export") c.export_dir = value;
    else if (arg == "--json") c.json_path = value;
    else if (arg == "--text") c.text = value;
    else if (arg == "--steps") c.steps = std::stoi(value);
    else if (arg == "--warmup") c.warmup = std::stoi(value);
    else if (arg == "--batch") c.batch = std::stoll(value);
    else if (arg == "--seq") c.sizes.seq = std::stoll(value);
    else if (arg == "--blocks") c.sizes.blocks = std::stoll(value);
    else if (arg == "--dim") c.sizes.dim = std::stoll(value), c.sizes.hidden = 4 * c.sizes.dim;
    else if (arg == "--heads") c.sizes.heads = std::stoll(value);
    else if (arg == "--lr") c.lr = std::stod(value);
    else throw tmem::Error("cuda_vs_pytorch: unknown option " + arg);
  }
  tmem::require(c.steps > 0 && c.warmup >= 0 && c.batch > 0, "cuda_vs_pytorch: steps, warmup and batch must be > 0");
  return c;
}

/// Model FLOPs of one training step (forward + backward = 3 x forward): every GEMM, and
/// causal attention's two products over the visible half of the scores.
double model_flops(const Config& c) {
  const auto& s = c.sizes;
  const double tokens = static_cast<double>(c.batch * s.seq);
  const double gemm_params =
      static_cast<double>(s.blocks * (4 * s.dim * s.dim + 2 * s.dim * s.hidden) + s.dim * s.vocab);
  const double attention = static_cast<double>(s.blocks) * 2.0 * static_cast<double>(c.batch) *
                           static_cast<double>(s.seq * s.seq) *
                           static_cast<double>(s.dim);  // causal: half of 4 B T^2 d
  return 3.0 * (2.0 * tokens * gemm_params + attention);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config c = parse(argc, argv);
    if (tmem::cuda::device_count() == 0) {
      std::fprintf(stderr, "cuda_vs_pytorch: no CUDA device\n");
      return 77;
    }
    Gpu& gpu = Gpu::default_instance();
    cudaDeviceProp props{};
    TRAINMEM_CUDA_CHECK(cudaGetDeviceProperties(&props, gpu.device()));
    // One host thread drives the GPU.
    const benchmarks::Provenance provenance =
        benchmarks::provenance(argc, argv, 1, benchmarks::gpu_description(gpu.device()));
    benchmarks::check_writable(c.json_path, provenance);
    std::printf("%s", provenance.text().c_str());
    const std::vector<std::int32_t> text = shootout::read_bytes(c.text);

    shootout::Gpt<Gpu> model(c.sizes, c.batch, kSeed);
    shootout::export_weights(model.parameters(), c.sizes, c.export_dir,
                             {{"text", std::filesystem::absolute(c.text).string()},
                              {"window_offset", "((step * batch + i) * 7919) % (len(text) - seq - 1)"},
                              {"batch", c.batch},
                              {"lr", c.lr},
                              {"steps", c.steps},
                              {"warmup", c.warmup},
                              {"model_flops_per_step", model_flops(c)}});
    tmem::optim::AdamW<Gpu> optimizer(model.parameters(), {.lr = c.lr});

    const int total = c.warmup + c.steps;
    std::vector<cudaEvent_t> marks(static_cast<std::size_t>(total + 1));
    for (auto& e : marks) TRAINMEM_CUDA_CHECK(cudaEventCreate(&e));
    // Every step's batch on the device first: an upload from pageable memory inside the
    // loop would make the host wait for the stream.
    std::vector<std::pair<tmem::Tensor<Gpu>, tmem::Tensor<Gpu>>> batches;
    for (int step = 0; step < total; ++step) batches.push_back(model.batch_of(text, step));
    std::vector<tmem::Tensor<Gpu>> losses;
    for (int step = 0; step < total; ++step) {
      if (step == c.warmup) {
        gpu.synchronize();
        gpu.memory().reset_peak();  // the timed steps' peak: steady state, workspaces and plans made
      }
      const auto& [ids, labels] = batches[static_cast<std::size_t>(step)];
      TRAINMEM_CUDA_CHECK(cudaEventRecord(marks[static_cast<std::size_t>(step)], gpu.stream()));
      {
        tmem::Tape<Gpu> tape(gpu);
        tmem::Var<Gpu> loss;
        {
          tmem::amp::Autocast autocast(tmem::DType::BF16);
          tmem::Var<Gpu> h = tape.input(ids);
          for (const auto& stage : model.stages()) h = stage(h);
          loss = tmem::cross_entropy(h, labels);
        }
        losses.push_back(loss.value());
        tape.backward(loss);
      }
      optimizer.step();
      optimizer.zero_grad();
      TRAINMEM_CUDA_CHECK(cudaEventRecord(marks[static_cast<std::size_t>(step) + 1], gpu.stream()));
    }
    gpu.synchronize();
    std::vector<double> step_ms, loss_values;
    for (int step = c.warmup; step < total; ++step) {
      float ms = 0.0f;
      TRAINMEM_CUDA_CHECK(
          cudaEventElapsedTime(&ms, marks[static_cast<std::size_t>(step)], marks[static_cast<std::size_t>(step) + 1]));
      step_ms.push_back(ms);
    }
    for (const auto& l : losses) loss_values.push_back(l.to_host<double>()[0]);
    for (auto& e : marks) cudaEventDestroy(e);

    const double median = benchmarks::median(step_ms);
    const double tflops = model_flops(c) / (median * 1e-3) / 1e12;
    const tmem::cuda::AttentionPaths& paths = gpu.attention_paths();
    const json result = {{"benchmark", "cuda_vs_pytorch"},
                         {"provenance", json::parse(provenance.json())},
                         {"side", "trainmem"},
                         {"device", props.name},
                         {"batch", c.batch},
                         {"tokens_per_step", c.batch * c.sizes.seq},
                         {"model_flops_per_step", model_flops(c)},
                         {"step_ms", step_ms},
                         {"median_ms", median},
                         {"tflops", tflops},
                         {"peak_bytes", gpu.memory().peak_device()},
                         {"losses", loss_values},
                         {"attention_paths",
                          {{"cudnn_forward", paths.cudnn_forward},
                           {"cudnn_backward", paths.cudnn_backward},
                           {"kernel_forward", paths.kernel_forward},
                           {"kernel_backward", paths.kernel_backward},
                           {"cudnn_status", paths.cudnn_status}}}};
    std::ofstream(c.json_path) << result.dump(2) << "\n";
    std::printf(
        "cuda_vs_pytorch (trainmem) on %s: %lld blocks, dim %lld, batch %lld x %lld: median step %.2f ms, "
        "%.1f TFLOP/s of model FLOPs, peak %.2f GiB, loss %.4f -> %.4f; attention: %s\n",
        props.name, static_cast<long long>(c.sizes.blocks), static_cast<long long>(c.sizes.dim),
        static_cast<long long>(c.batch), static_cast<long long>(c.sizes.seq), median, tflops,
        static_cast<double>(gpu.memory().peak_device()) / (1 << 30), loss_values.front(), loss_values.back(),
        paths.cudnn_status.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_vs_pytorch: %s\n", e.what());
    return 1;
  }
}

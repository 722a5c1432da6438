// benchmarks/cuda_fp8_gemm/cuda_fp8_gemm_benchmark.cu — TFLOP/s of cuda::Backend::gemm_fp8 against its bf16 gemm.
//
// Issue 52's target: at 4096³, trainmem's FP8 GEMM (E4M3 x E4M3, f32 accumulation, bf16
// C, per-tensor scales read on the device) at least 1.6x trainmem's bf16 GEMM on the same
// GPU. Both take a linear layer's layout, A [M, K] and B [N, K] ("NT": x W^T), which is
// the layout cuBLASLt's FP8 kernels take directly on sm_90 (gemm.cuh, NOTE [FP8 GEMM]);
// the FP8 "NN" row (B [K, N]) adds the byte transpose trainmem makes for it, and
// 8192x768x768 is a linear layer over 8192 tokens of width 768. Timing is cuda_gemm's
// (common/gpu.cuh's time_alternating): CUDA events on the backend's stream, warm-up
// first, then at least 20 samples of `inner` back-to-back calls (about 2 ms), the bf16
// and FP8 calls alternating sample by sample, the median reported; inputs are random and
// rotate over enough sets to exceed the L2. Before its speed counts, each output (written over NaN) is checked on
// 256 sampled entries against an FP64 dot product of the stored values (the FP8 ones
// decoded and scaled):
//   bf16: |C - C64| <= (4 u_C + 2 K 2^-24) sum_l |A_il B_lj|
//   FP8:  |C - C64| <= (4 u_C + 2 K 2^-24 + min(K, 128) 2^-14) |f| sum_l |A_il B_lj|
// (f = a_scale_inv b_scale_inv; the last term allows Tensor Core partial sums of 14 bits
// promoted to f32 at least every 128 products), and a failed check fails the run (exit 1).
//
//   trainmem_cuda_fp8_gemm_benchmark [--json PATH] [--samples N] [--quick]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
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
using TensorT = tmem::Tensor<Gpu>;

struct Options {
  std::string json_path;
  int samples = 25;
  bool quick = false;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) options.json_path = argv[++i];
    else if (arg == "--samples" && i + 1 < argc) options.samples = std::max(20, std::atoi(argv[++i]));
    else if (arg == "--quick") options.quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--samples N>=20] [--quick]\n", argv[0]);
      std::exit(2);
    }
  }
  return options;
}

struct Problem {
  std::int64_t m, n, k;
  bool trans_b;  // B stored [N, K] ("NT")
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + (trans_b ? " NT" : " NN");
  }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

/// One input set: the same values as bf16 and as E4M3 (values drawn from E4M3, so both hold them exactly).
struct OperandSet {
  TensorT a16, b16, a8, b8, c16, c8;
  std::vector<float> host_a, host_b;
};

/// n random E4M3 values of magnitude at most 8 (bf16 holds each exactly).
std::vector<float> random_e4m3(std::int64_t n, std::mt19937_64& engine) {
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (auto& v : values) v = static_cast<float>(tmem::Float8E4M3(dist(engine)));
  return values;
}

constexpr float kAScaleInv = 0.5f, kBScaleInv = 0.25f;

/// Worst sampled |C - C64| over its bound (<= 1 passes); infinite if an entry is NaN.
double verify(const Problem& p, const OperandSet& s, const TensorT& c, bool fp8, std::mt19937_64& engine) {
  const auto values = c.to_host<double>();
  const double f = fp8 ? static_cast<double>(kAScaleInv) * kBScaleInv : 1.0;
  const double bound = 4.0 * std::ldexp(1.0, -8) + 2.0 * static_cast<double>(p.k) * std::ldexp(1.0, -24) +
                       (fp8 ? static_cast<double>(std::min<std::int64_t>(p.k, 128)) * std::ldexp(1.0, -14) : 0.0);
  std::uniform_int_distribution<std::int64_t> row(0, p.m - 1), col(0, p.n - 1);
  double worst = 0.0;
  for (int sample = 0; sample < 256; ++sample) {
    const std::int64_t i = row(engine), j = col(engine);
    double dot = 0.0, scale = 0.0;
    for (std::int64_t l = 0; l < p.k; ++l) {
      const double a = s.host_a[i * p.k + l];
      const double b = p.trans_b ? s.host_b[j * p.k + l] : s.host_b[l * p.n + j];
      dot += a * b;
      scale += std::fabs(a * b);
    }
    const double got = values[i * p.n + j];
    if (std::isnan(got)) return INFINITY;
    worst = std::max(worst, std::fabs(got - f * dot) / (bound * f * scale));
  }
  return worst;
}

void poison(Gpu& gpu, const TensorT& t) {
  TRAINMEM_CUDA_CHECK(cudaMemsetAsync(t.data(), 0xff, t.bytes(), gpu.stream()));
}

struct Row {
  Problem problem;
  double bf16_tflops, fp8_tflops, bf16_error, fp8_error;
  int inner, samples;
};

Row run(Gpu& gpu, const Problem& p, const Options& options, std::mt19937_64& engine) {
  const double set_bytes = 3.0 * static_cast<double>(p.m * p.k + p.k * p.n) + 4.0 * static_cast<double>(p.m * p.n);
  const int sets = static_cast<int>(std::clamp(std::ceil(120e6 / set_bytes), 1.0, 8.0));
  const tmem::Shape b_shape = p.trans_b ? tmem::Shape{p.n, p.k} : tmem::Shape{p.k, p.n};
  std::vector<OperandSet> operands(static_cast<std::size_t>(sets));
  for (auto& s : operands) {
    s.host_a = random_e4m3(p.m * p.k, engine);
    s.host_b = random_e4m3(p.k * p.n, engine);
    const auto make = [&](const tmem::Shape& shape, const std::vector<float>& v, tmem::DType dtype) {
      return TensorT::from_host(shape, v, dtype, tmem::MemCategory::Temporary, gpu);
    };
    s.a16 = make(tmem::Shape{p.m, p.k}, s.host_a, tmem::DType::BF16);
    s.b16 = make(b_shape, s.host_b, tmem::DType::BF16);
    s.a8 = make(tmem::Shape{p.m, p.k}, s.host_a, tmem::DType::F8E4M3);
    s.b8 = make(b_shape, s.host_b, tmem::DType::F8E4M3);
    s.c16 = TensorT::empty(tmem::Shape{p.m, p.n}, tmem::DType::BF16, tmem::MemCategory::Temporary, gpu);
    s.c8 = TensorT::empty(tmem::Shape{p.m, p.n}, tmem::DType::BF16, tmem::MemCategory::Temporary, gpu);
  }
  const TensorT a_scale_inv = TensorT::from_host(tmem::Shape{1}, std::vector<float>{kAScaleInv}, tmem::DType::F32,
                                                 tmem::MemCategory::Temporary, gpu);
  const TensorT b_scale_inv = TensorT::from_host(tmem::Shape{1}, std::vector<float>{kBScaleInv}, tmem::DType::F32,
                                                 tmem::MemCategory::Temporary, gpu);
  tmem::GemmArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.trans_b = p.trans_b;
  auto call_bf16 = [&](const OperandSet& s) { gpu.gemm(args, s.a16, s.b16, s.c16); };
  auto call_fp8 = [&](const OperandSet& s) { gpu.gemm_fp8(args, s.a8, s.b8, s.c8, a_scale_inv, b_scale_inv); };

  Row row{p, 0, 0, 0, 0, 0, options.samples};
  poison(gpu, operands[0].c16);
  call_bf16(operands[0]);
  row.bf16_error = verify(p, operands[0], operands[0].c16, false, engine);
  poison(gpu, operands[0].c8);
  call_fp8(operands[0]);
  row.fp8_error = verify(p, operands[0], operands[0].c8, true, engine);

  // Warm-up sizes a batch to about 2 ms (0.5 with --quick).
  const auto set = [&](int r) -> const OperandSet& { return operands[static_cast<std::size_t>(r % sets)]; };
  const benchmarks::PairedTiming timing = benchmarks::time_alternating(
      gpu.stream(), sets, options.samples, options.quick ? 0.5 : 2.0, [&](int r) { call_bf16(set(r)); },
      [&](int r) { call_fp8(set(r)); });
  row.inner = timing.inner;
  row.bf16_tflops = p.flops() / (timing.first_ms * 1e-3) / 1e12;
  row.fp8_tflops = p.flops() / (timing.second_ms * 1e-3) / 1e12;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    if (tmem::cuda::device_count() == 0) {
      std::fprintf(stderr, "cuda_fp8_gemm: no CUDA device\n");
      return 77;
    }
    Gpu gpu;
    cudaDeviceProp props{};
    TRAINMEM_CUDA_CHECK(cudaGetDeviceProperties(&props, gpu.device()));
    const benchmarks::Provenance provenance =
        benchmarks::provenance(argc, argv, 1, benchmarks::gpu_description(gpu.device()));
    if (!options.json_path.empty()) benchmarks::check_writable(options.json_path, provenance);
    std::printf("%s", provenance.text().c_str());
    std::mt19937_64 engine(std::random_device{}());
    std::vector<Row> rows;
    for (Problem shape :
         {Problem{4096, 4096, 4096, true}, Problem{4096, 4096, 4096, false}, Problem{8192, 768, 768, true}}) {
      rows.push_back(run(gpu, shape, options, engine));
      const Row& r = rows.back();
      std::printf("  %-18s bf16 %7.1f TFLOP/s  fp8 %7.1f TFLOP/s  fp8/bf16 %.3f  err/bound %.2f %.2f\n",
                  r.problem.name().c_str(), r.bf16_tflops, r.fp8_tflops, r.fp8_tflops / r.bf16_tflops, r.bf16_error,
                  r.fp8_error);
      std::fflush(stdout);
    }
    bool ok = true;
    for (const Row& r : rows) ok = ok && r.bf16_error <= 1.0 && r.fp8_error <= 1.0;
    const Row& square = rows.front();
    const double target_ratio = square.fp8_tflops / square.bf16_tflops;

    if (!options.json_path.empty()) {
      std::ofstream out(options.json_path);
      out << "{\n  \"benchmark\": \"cuda_fp8_gemm\",\n  \"provenance\": " << provenance.json() << ",\n  \"device\": \""
          << props.name << "\",\n  \"sm_count\": " << props.multiProcessorCount
          << ",\n  \"timing\": \"cudaEvent, median of " << options.samples
          << " samples of `inner` calls, bf16 and fp8 alternating\",\n  \"fp8\": \"e4m3 x e4m3, f32 accumulation, "
             "bf16 C\",\n  \"verified\": "
          << (ok ? "true" : "false") << ",\n  \"fp8_over_bf16_4096_nt\": " << target_ratio
          << ",\n  \"target_fp8_over_bf16\": 1.6,\n  \"rows\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << "    {\"m\": " << r.problem.m << ", \"n\": " << r.problem.n << ", \"k\": " << r.problem.k
            << ", \"layout\": \"" << (r.problem.trans_b ? "NT" : "NN") << "\", \"bf16_tflops\": " << r.bf16_tflops
            << ", \"fp8_tflops\": " << r.fp8_tflops << ", \"ratio\": " << r.fp8_tflops / r.bf16_tflops
            << ", \"bf16_error_over_bound\": " << r.bf16_error << ", \"fp8_error_over_bound\": " << r.fp8_error
            << ", \"inner\": " << r.inner << ", \"samples\": " << r.samples << "}" << (i + 1 < rows.size() ? "," : "")
            << "\n";
      }
      out << "  ]\n}\n";
    }

    std::printf("\ncuda_fp8_gemm on %s (%d SMs), median of %d samples\n", props.name, props.multiProcessorCount,
                options.samples);
    std::printf("%-18s %12s %12s %9s %s\n", "shape", "bf16", "fp8", "fp8/bf16", "check");
    for (const Row& r : rows)
      std::printf("%-18s %8.1f TF/s %8.1f TF/s %9.3f %s\n", r.problem.name().c_str(), r.bf16_tflops, r.fp8_tflops,
                  r.fp8_tflops / r.bf16_tflops, r.bf16_error <= 1.0 && r.fp8_error <= 1.0 ? "ok" : "FAILED");
    std::printf("target fp8 >= 1.6x bf16 at 4096^3 NT: %.3f, %s\n", target_ratio,
                target_ratio >= 1.6 ? "met" : "NOT met");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_fp8_gemm: %s\n", e.what());
    return 1;
  }
}

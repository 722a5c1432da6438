// benchmarks/cuda_gemm/cuda_gemm_benchmark.cu — TFLOP/s of cuda::Backend::gemm against a direct cuBLASLt call.
//
// Shapes are M×N×K with row-major A [M, K] and C [M, N]; B is [K, N] ("NN") or, as in
// a linear layer's x W^T, [N, K] ("NT"). 4096³ is the square reference; 8192×768×768
// is a linear layer over 8192 tokens of width 768. Both rows of a pair run the same
// cuBLASLt configuration (COMPUTE_32F, 32 MiB workspace, the heuristic's first
// algorithm), so their ratio is trainmem's overhead: planning once and a cached lookup
// per call. Timing follows METHOD.md (common/gpu.cuh's time_alternating): CUDA events
// on the backend's stream, warm-up first, then at least 20 samples each of `inner`
// back-to-back calls (about 2 ms of work), the two implementations alternating sample
// by sample, reporting the median;
// inputs are random (never zeros) and rotate over enough sets to exceed the 60 MB L2.
// Before its speed counts, each implementation's output (written over NaN) is checked
// on 256 sampled entries against an FP64 dot product of the same rounded inputs:
//   |C - C64| <= (4 u_C + 2 K 2^-24) sum_l |A_il B_lj|,
// and a failed check fails the run (exit 1).
//
//   trainmem_cuda_gemm_benchmark [--json PATH] [--samples N] [--quick]
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
  bool trans_b;
  tmem::DType dtype;
  std::string name() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + (trans_b ? " NT " : " NN ") +
           std::string(tmem::name_of(dtype));
  }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

/// One input set: A, B and C on the device, A and B also on the host (as rounded to the dtype).
struct OperandSet {
  TensorT a, b, c;
  std::vector<float> host_a, host_b;
};

std::vector<float> random_rounded(std::int64_t n, tmem::DType dtype, std::mt19937_64& engine) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (auto& v : values) {
    v = dist(engine);
    v = dtype == tmem::DType::BF16 ? static_cast<float>(tmem::BFloat16(v)) : static_cast<float>(tmem::Half(v));
  }
  return values;
}

/// A direct cuBLASLt call with the configuration trainmem uses, planned once.
class DirectLt {
 public:
  DirectLt(Gpu& gpu, const Problem& p) : stream_(gpu.stream()) {
    TRAINMEM_CUBLAS_CHECK(cublasLtCreate(&handle_));
    TRAINMEM_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspace));
    const cudaDataType_t type = p.dtype == tmem::DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Row-major C = A op(B) as column-major C^T = op(B)^T A^T: cuBLASLt's A is our B.
    const cublasOperation_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    const std::uint64_t b_rows = p.trans_b ? p.k : p.n, b_cols = p.trans_b ? p.n : p.k;
    TRAINMEM_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&layout_a_, type, b_rows, b_cols, static_cast<std::int64_t>(b_rows)));
    TRAINMEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b_, type, p.k, p.m, p.k));
    TRAINMEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c_, type, p.n, p.m, p.n));
    cublasLtMatmulPreference_t preference;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::uint64_t workspace_bytes = kWorkspace;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layout_a_, layout_b_, layout_c_, layout_c_,
                                                         preference, 1, &result, &returned));
    cublasLtMatmulPreferenceDestroy(preference);
    tmem::require(returned > 0, "direct cuBLASLt: no algorithm for ", p.name());
    algo_ = result.algo;
  }
  ~DirectLt() {
    cublasLtMatrixLayoutDestroy(layout_a_);
    cublasLtMatrixLayoutDestroy(layout_b_);
    cublasLtMatrixLayoutDestroy(layout_c_);
    cublasLtMatmulDescDestroy(desc_);
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }
  void run(const OperandSet& s) {
    const float alpha = 1.0f, beta = 0.0f;
    TRAINMEM_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, s.b.data(), layout_a_, s.a.data(), layout_b_, &beta,
                                         s.c.data(), layout_c_, s.c.data(), layout_c_, &algo_, workspace_, kWorkspace,
                                         stream_));
  }

 private:
  static constexpr std::size_t kWorkspace = std::size_t{32} << 20;
  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
};

/// Worst sampled |C - C64| over its bound (<= 1 passes); infinite if an entry is NaN.
double verify(const Problem& p, const OperandSet& s, std::mt19937_64& engine) {
  const auto c = s.c.to_host<double>();
  const double u_c = p.dtype == tmem::DType::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double bound = 4.0 * u_c + 2.0 * static_cast<double>(p.k) * std::ldexp(1.0, -24);
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
    const double got = c[i * p.n + j];
    if (std::isnan(got)) return INFINITY;
    worst = std::max(worst, std::fabs(got - dot) / (bound * scale));
  }
  return worst;
}

void poison(Gpu& gpu, const TensorT& t) {
  TRAINMEM_CUDA_CHECK(cudaMemsetAsync(t.data(), 0xff, t.bytes(), gpu.stream()));
}

struct Row {
  Problem problem;
  double trainmem_tflops, direct_tflops, trainmem_error, direct_error;
  int inner, samples;
};

Row run(Gpu& gpu, const Problem& p, const Options& options, std::mt19937_64& engine) {
  // Enough operand sets that one pass over them exceeds the L2 (60 MB on an H200) twice.
  const double set_bytes = 2.0 * static_cast<double>(p.m * p.k + p.k * p.n + p.m * p.n);
  const int sets = static_cast<int>(std::clamp(std::ceil(120e6 / set_bytes), 1.0, 8.0));
  std::vector<OperandSet> operands(static_cast<std::size_t>(sets));
  for (auto& s : operands) {
    s.host_a = random_rounded(p.m * p.k, p.dtype, engine);
    s.host_b = random_rounded(p.k * p.n, p.dtype, engine);
    s.a = TensorT::from_host(tmem::Shape{p.m, p.k}, s.host_a, p.dtype, tmem::MemCategory::Temporary, gpu);
    s.b = TensorT::from_host(p.trans_b ? tmem::Shape{p.n, p.k} : tmem::Shape{p.k, p.n}, s.host_b, p.dtype,
                             tmem::MemCategory::Temporary, gpu);
    s.c = TensorT::empty(tmem::Shape{p.m, p.n}, p.dtype, tmem::MemCategory::Temporary, gpu);
  }
  tmem::GemmArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.trans_b = p.trans_b;
  DirectLt direct(gpu, p);
  auto call_trainmem = [&](const OperandSet& s) { gpu.gemm(args, s.a, s.b, s.c); };
  auto call_direct = [&](const OperandSet& s) { direct.run(s); };

  // Correct first: each implementation writes over NaN, then sampled entries are checked.
  Row row{p, 0, 0, 0, 0, 0, options.samples};
  poison(gpu, operands[0].c);
  call_trainmem(operands[0]);
  row.trainmem_error = verify(p, operands[0], engine);
  poison(gpu, operands[0].c);
  call_direct(operands[0]);
  row.direct_error = verify(p, operands[0], engine);

  // Warm-up sizes a batch to about 2 ms (0.5 with --quick).
  const auto set = [&](int r) -> const OperandSet& { return operands[static_cast<std::size_t>(r % sets)]; };
  const benchmarks::PairedTiming timing = benchmarks::time_alternating(
      gpu.stream(), sets, options.samples, options.quick ? 0.5 : 2.0, [&](int r) { call_trainmem(set(r)); },
      [&](int r) { call_direct(set(r)); });
  row.inner = timing.inner;
  row.trainmem_tflops = p.flops() / (timing.first_ms * 1e-3) / 1e12;
  row.direct_tflops = p.flops() / (timing.second_ms * 1e-3) / 1e12;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    if (tmem::cuda::device_count() == 0) {
      std::fprintf(stderr, "cuda_gemm: no CUDA device\n");
      return 77;
    }
    Gpu gpu;
    cudaDeviceProp props{};
    TRAINMEM_CUDA_CHECK(cudaGetDeviceProperties(&props, gpu.device()));
    // One host thread drives the GPU.
    const benchmarks::Provenance provenance =
        benchmarks::provenance(argc, argv, 1, benchmarks::gpu_description(gpu.device()));
    if (!options.json_path.empty()) benchmarks::check_writable(options.json_path, provenance);
    std::printf("%s", provenance.text().c_str());
    std::mt19937_64 engine(std::random_device{}());
    std::vector<Row> rows;
    for (tmem::DType dtype : {tmem::DType::BF16, tmem::DType::F16})
      for (Problem shape : {Problem{4096, 4096, 4096, false, dtype}, Problem{8192, 768, 768, false, dtype},
                            Problem{8192, 768, 768, true, dtype}}) {
        rows.push_back(run(gpu, shape, options, engine));
        const Row& r = rows.back();
        std::printf("  %-26s trainmem %7.1f TFLOP/s  cuBLASLt %7.1f TFLOP/s  ratio %.3f  err/bound %.2f %.2f\n",
                    r.problem.name().c_str(), r.trainmem_tflops, r.direct_tflops, r.trainmem_tflops / r.direct_tflops,
                    r.trainmem_error, r.direct_error);
        std::fflush(stdout);
      }
    bool ok = true;
    for (const Row& r : rows) ok = ok && r.trainmem_error <= 1.0 && r.direct_error <= 1.0;

    if (!options.json_path.empty()) {
      std::ofstream out(options.json_path);
      out << "{\n  \"benchmark\": \"cuda_gemm\",\n  \"provenance\": " << provenance.json() << ",\n  \"device\": \""
          << props.name << "\",\n  \"sm_count\": " << props.multiProcessorCount
          << ",\n  \"timing\": \"cudaEvent, median of " << options.samples
          << " samples of `inner` calls\",\n  \"verified\": " << (ok ? "true" : "false") << ",\n  \"rows\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        out << "    {\"m\": " << r.problem.m << ", \"n\": " << r.problem.n << ", \"k\": " << r.problem.k
            << ", \"layout\": \"" << (r.problem.trans_b ? "NT" : "NN") << "\", \"dtype\": \""
            << tmem::name_of(r.problem.dtype) << "\", \"trainmem_tflops\": " << r.trainmem_tflops
            << ", \"cublaslt_tflops\": " << r.direct_tflops << ", \"ratio\": " << r.trainmem_tflops / r.direct_tflops
            << ", \"trainmem_error_over_bound\": " << r.trainmem_error
            << ", \"cublaslt_error_over_bound\": " << r.direct_error << ", \"inner\": " << r.inner
            << ", \"samples\": " << r.samples << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      out << "  ]\n}\n";
    }

    std::printf("\ncuda_gemm on %s (%d SMs), median of %d samples\n", props.name, props.multiProcessorCount,
                options.samples);
    std::printf("%-26s %12s %12s %7s %s\n", "shape", "trainmem", "cuBLASLt", "ratio", "check");
    for (const Row& r : rows)
      std::printf("%-26s %8.1f TF/s %8.1f TF/s %7.3f %s\n", r.problem.name().c_str(), r.trainmem_tflops,
                  r.direct_tflops, r.trainmem_tflops / r.direct_tflops,
                  r.trainmem_error <= 1.0 && r.direct_error <= 1.0 ? "ok" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_gemm: %s\n", e.what());
    return 1;
  }
}

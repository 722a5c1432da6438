// tests/backend/cpu/test_gemm_paths.cpp — every CPU GEMM path against an F64 reference.
//
// Each path (Eigen, with 16-bit operands widened; oneDNN when trainmem was built with
// it) is forced in turn through cpu::force_gemm_path, the same switch as
// TRAINMEM_CPU_GEMM, so any CPU exercises all of them. The reference multiplies the
// values actually stored and adds beta C and the bias in F64; what is left is the
// GEMM's own error: FP32 accumulation over k terms, k 2^-24 sum|alpha a b| (plus one
// FP32 rounding for each of beta C and the bias), and one rounding of C to its storage
// dtype, 2^-p |ref| for p significand bits. With GELU (tanh form) after the bias, the
// pre-activation error grows by at most GELU's slope (< 1.13) and the FP32 GELU itself adds
// a few 1e-7 relative.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reference.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;

namespace {

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::F64: return std::ldexp(1.0, -53);
    default: return std::ldexp(1.0, -24);
  }
}

/// Forces a path for one test and restores the one before (TRAINMEM_CPU_GEMM's) after.
struct ForcedPath {
  explicit ForcedPath(cpu::GemmPath path) { cpu::force_gemm_path(path); }
  ~ForcedPath() { cpu::force_gemm_path(before); }
  ForcedPath(const ForcedPath&) = delete;
  ForcedPath& operator=(const ForcedPath&) = delete;
  cpu::GemmPath before = cpu::forced_gemm_path();
};

std::vector<cpu::GemmPath> paths() {
  std::vector<cpu::GemmPath> all{cpu::GemmPath::Auto, cpu::GemmPath::Eigen};
  if (cpu::kernels::kHaveOneDnn) all.push_back(cpu::GemmPath::OneDnn);
  return all;
}

const char* path_name(cpu::GemmPath path) {
  switch (path) {
    case cpu::GemmPath::Eigen: return "eigen";
    case cpu::GemmPath::OneDnn: return "onednn";
    default: return "auto";
  }
}

/// The path that a GEMM with these dtypes takes now.
const char* taken_path(const GemmArgs& g, DType ab, DType c, bool with_bias, bool gelu = false) {
  return visit_floating(ab, "test", [&]<class TA>() -> const char* {
    return visit_floating(c, "test", [&]<class TC>() -> const char* {
      using Acc = AccumulatorOf<TA>;
      const Acc row[1] = {};  // only whether there is a bias matters
      if constexpr (std::is_same_v<TA, double> != std::is_same_v<TC, double>) return "none";
      else return cpu::kernels::gemm_path_name<TA, TC>(g, cpu::kernels::Epilogue<Acc>{with_bias ? row : nullptr, gelu});
    });
  });
}

struct Case {
  GemmArgs g;
  DType ab, c;
  bool bias;
  bool gelu = false;
  std::optional<DType> bias_dtype;  // none: C's dtype
};

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/// Runs the case on backend and returns (elements outside the bound, worst error/bound).
std::pair<std::int64_t, double> run_case(const Case& cs, B& backend) {
  const GemmArgs& g = cs.g;
  const std::int64_t a_size = g.trans_a ? g.k * g.m : g.m * g.k, b_size = g.trans_b ? g.n * g.k : g.k * g.n;
  const std::int64_t a_entries = g.stride_a == 0 ? 1 : g.batch, b_entries = g.stride_b == 0 ? 1 : g.batch;
  const T a = testing::random_tensor(Shape{a_entries * a_size}, 200, -1, 1, cs.ab, backend);
  const T b = testing::random_tensor(Shape{b_entries * b_size}, 201, -1, 1, cs.ab, backend);
  const T c = testing::random_tensor(Shape{g.batch * g.m * g.n}, 202, -1, 1, cs.c, backend);
  const T bias = testing::random_tensor(Shape{g.n}, 203, -1, 1, cs.bias_dtype.value_or(cs.c), backend);
  const auto av = a.to_host<double>(), bv = b.to_host<double>(), c0 = c.to_host<double>(),
             biasv = bias.to_host<double>();
  if (cs.bias) backend.gemm_bias(g, a, b, bias, c, cs.gelu);
  else backend.gemm(g, a, b, c);
  const auto got = c.to_host<double>();

  // The reference wants every entry's A and B laid out contiguously.
  std::vector<double> a_full, b_full;
  for (std::int64_t e = 0; e < g.batch; ++e) {
    const std::int64_t ea = g.stride_a == 0 ? 0 : e, eb = g.stride_b == 0 ? 0 : e;
    a_full.insert(a_full.end(), av.begin() + ea * a_size, av.begin() + (ea + 1) * a_size);
    b_full.insert(b_full.end(), bv.begin() + eb * b_size, bv.begin() + (eb + 1) * b_size);
  }
  const auto ab = testing::matmul_reference(a_full, b_full, g.batch, g.m, g.n, g.k, g.trans_a, g.trans_b);
  const auto abs_ab = testing::abs_matmul_reference(a_full, b_full, g.batch, g.m, g.n, g.k, g.trans_a, g.trans_b);
  const double u_acc = cs.ab == DType::F64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  std::int64_t outside = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double b_term = cs.bias ? biasv[i % static_cast<std::size_t>(g.n)] : 0.0;
    const double pre = g.alpha * ab[i] + g.beta * c0[i] + b_term;
    const double ref = cs.gelu ? gelu_tanh(pre) : pre;
    const double scale = std::abs(g.alpha) * abs_ab[i] + std::abs(g.beta * c0[i]) + std::abs(b_term);
    const double accumulation = static_cast<double>(g.k + 2) * u_acc * scale;
    const double bound = unit_roundoff(cs.c) * std::abs(ref) +
                         (cs.gelu ? 1.13 * accumulation + 2e-6 * std::abs(pre) + 1e-7 : accumulation);
    const double error = std::abs(got[i] - ref);
    if (!(error <= bound)) ++outside;
    worst = std::max(worst, bound > 0 ? error / bound : (error > 0 ? INFINITY : 0.0));
  }
  return {outside, worst};
}

}  // namespace

TEST_CASE("every CPU GEMM path matches F64: dtypes, transposes, alpha, beta, bias", "[backend][cpu][gemm]") {
  const cpu::GemmPath path = GENERATE(from_range(paths()));
  const auto dtypes = GENERATE(std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
                               std::pair{DType::F16, DType::F16}, std::pair{DType::BF16, DType::F32},
                               std::pair{DType::F64, DType::F64});
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const bool with_bias = GENERATE(false, true);
  const auto [alpha, beta] = GENERATE(std::pair{1.0, 0.0}, std::pair{0.5, 1.0}, std::pair{1.0, -0.75});
  const ForcedPath forced(path);
  Case cs{GemmArgs{}, dtypes.first, dtypes.second, with_bias, false, std::nullopt};
  cs.g.m = 300;  // over the widening path's 256-row block, so its tail runs too
  cs.g.n = 65;
  cs.g.k = 257;
  cs.g.trans_a = ta;
  cs.g.trans_b = tb;
  cs.g.alpha = alpha;
  cs.g.beta = beta;
  B backend;
  const char* taken = taken_path(cs.g, cs.ab, cs.c, with_bias);
  INFO("forced " << path_name(path) << ", took " << taken << "; " << cs.ab << " -> " << cs.c << " trans_a " << ta
                 << " trans_b " << tb << " bias " << with_bias << " alpha " << alpha << " beta " << beta);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("outside bound: " << outside << ", worst error/bound " << worst);
  CHECK(outside == 0);
  CHECK(backend.memory().live(MemCategory::Workspace) == 0);
  if (path == cpu::GemmPath::Eigen)
    CHECK(std::string(taken) == (cs.ab == DType::F32 || cs.ab == DType::F64 ? "eigen" : "widen"));
  // oneDNN multiplies F32 on every x86-64 CPU, so forcing it must take it there.
  if (path == cpu::GemmPath::OneDnn && cs.ab == DType::F32) CHECK(std::string(taken) == "onednn");
}

TEST_CASE("every CPU GEMM path matches F64 on tiny shapes, on both sides of the loop rule", "[backend][cpu][gemm]") {
  // m + n + k < kTinyGemmSum multiplies by loops; the sizes reach past that rule as well.
  const cpu::GemmPath path = GENERATE(from_range(paths()));
  const auto dtypes = GENERATE(std::pair{DType::F32, DType::F32}, std::pair{DType::BF16, DType::BF16},
                               std::pair{DType::F64, DType::F64});
  const auto mnk = GENERATE(std::array<std::int64_t, 3>{1, 1, 1}, std::array<std::int64_t, 3>{4, 4, 4},
                            std::array<std::int64_t, 3>{1, 7, 3}, std::array<std::int64_t, 3>{6, 6, 7},
                            std::array<std::int64_t, 3>{7, 6, 7}, std::array<std::int64_t, 3>{2, 13, 9});
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const auto [alpha, beta] = GENERATE(std::pair{1.0, 0.0}, std::pair{-1.5, 0.0}, std::pair{0.5, 1.0});
  const ForcedPath forced(path);
  Case cs{GemmArgs{}, dtypes.first, dtypes.second, false, false, std::nullopt};
  cs.g.m = mnk[0];
  cs.g.n = mnk[1];
  cs.g.k = mnk[2];
  cs.g.trans_a = ta;
  cs.g.trans_b = tb;
  cs.g.alpha = alpha;
  cs.g.beta = beta;
  B backend;
  INFO("forced " << path_name(path) << "; " << cs.ab << " [" << cs.g.m << ", " << cs.g.n << ", " << cs.g.k
                 << "] trans_a " << ta << " trans_b " << tb << " alpha " << alpha << " beta " << beta);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("outside bound: " << outside << ", worst error/bound " << worst);
  CHECK(outside == 0);
}

TEST_CASE("the widening path chunks a deep k: F64 accuracy, workspace far below one widened operand",
          "[backend][cpu][gemm]") {
  const ForcedPath forced(cpu::GemmPath::Eigen);
  const auto dtypes = GENERATE(std::pair{DType::BF16, DType::BF16}, std::pair{DType::BF16, DType::F32},
                               std::pair{DType::F16, DType::F16});
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const auto [alpha, beta] = GENERATE(std::pair{1.0, 0.0}, std::pair{0.5, -0.75});
  const bool with_bias = GENERATE(false, true);
  Case cs{GemmArgs{}, dtypes.first, dtypes.second, with_bias, false, std::nullopt};
  cs.g.batch = 2;  // strided entries, each widened in its own chunks
  cs.g.m = 24;
  cs.g.n = 48;
  cs.g.k = 2 * cpu::kernels::kMaxWidenedDepth + 77;  // deep, and not a multiple of the chunk
  cs.g.trans_a = ta;
  cs.g.trans_b = tb;
  cs.g.stride_a = cs.g.m * cs.g.k;
  cs.g.stride_b = cs.g.k * cs.g.n;
  cs.g.stride_c = cs.g.m * cs.g.n;
  cs.g.alpha = alpha;
  cs.g.beta = beta;
  B backend;
  INFO(cs.ab << " -> " << cs.c << " trans_a " << ta << " trans_b " << tb << " alpha " << alpha << " beta " << beta
             << " bias " << with_bias);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("outside bound: " << outside << ", worst error/bound " << worst);
  CHECK(outside == 0);
  // Widening B whole would take k n f32 values; chunks take a fraction of it per thread.
  CHECK(backend.memory().peak(MemCategory::Workspace) < cs.g.k * cs.g.n * 4 / 2);
  CHECK(backend.memory().live(MemCategory::Workspace) == 0);
}

TEST_CASE("every CPU GEMM path fuses bias (any dtype) and GELU before C's one rounding", "[backend][cpu][gemm]") {
  const cpu::GemmPath path = GENERATE(from_range(paths()));
  const DType dtype = GENERATE(DType::F32, DType::BF16, DType::F16, DType::F64);
  const DType bias_dtype = GENERATE(DType::F32, DType::BF16, DType::F64);
  const bool gelu = GENERATE(false, true);
  const double alpha = GENERATE(1.0, -0.5);
  const ForcedPath forced(path);
  Case cs{GemmArgs{}, dtype, dtype, true, gelu, bias_dtype};
  cs.g.m = 70;
  cs.g.n = 33;
  cs.g.k = 45;
  cs.g.trans_b = true;  // linear's layout: y = x W^T + b
  cs.g.alpha = alpha;
  cs.g.beta = 0.25;
  B backend;
  const char* taken = taken_path(cs.g, dtype, dtype, true, gelu);
  INFO("forced " << path_name(path) << ", took " << taken << "; " << dtype << " bias " << bias_dtype << " gelu " << gelu
                 << " alpha " << alpha);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("outside bound: " << outside << ", worst error/bound " << worst);
  CHECK(outside == 0);
  if (path == cpu::GemmPath::OneDnn && dtype == DType::F32) CHECK(std::string(taken) == "onednn");
}

TEST_CASE("every CPU GEMM path matches F64 on batches: strided and shared operands", "[backend][cpu][gemm]") {
  const cpu::GemmPath path = GENERATE(from_range(paths()));
  const DType dtype = GENERATE(DType::F32, DType::BF16, DType::F16);
  const auto [stride_a_zero, stride_b_zero] =
      GENERATE(std::pair{false, false}, std::pair{false, true}, std::pair{true, false});
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const ForcedPath forced(path);
  Case cs{GemmArgs{}, dtype, dtype, true, false, std::nullopt};
  GemmArgs& g = cs.g;
  g.batch = 3;
  g.m = 37;
  g.n = 29;
  g.k = 41;
  g.trans_a = ta;
  g.trans_b = tb;
  g.stride_a = stride_a_zero ? 0 : g.m * g.k;
  g.stride_b = stride_b_zero ? 0 : g.k * g.n;
  g.stride_c = g.m * g.n;
  B backend;
  INFO("forced " << path_name(path) << ", took " << taken_path(g, dtype, dtype, true) << "; " << dtype << " shared A "
                 << stride_a_zero << " shared B " << stride_b_zero << " trans_a " << ta << " trans_b " << tb);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("outside bound: " << outside << ", worst error/bound " << worst);
  CHECK(outside == 0);
}

TEST_CASE("every CPU GEMM path gives C = beta C + bias for k = 0", "[backend][cpu][gemm]") {
  const cpu::GemmPath path = GENERATE(from_range(paths()));
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  const double beta = GENERATE(0.0, 0.5);
  const ForcedPath forced(path);
  Case cs{GemmArgs{}, dtype, dtype, true, false, std::nullopt};
  cs.g.m = 5;
  cs.g.n = 7;
  cs.g.k = 0;
  cs.g.beta = beta;
  B backend;
  INFO("forced " << path_name(path) << "; " << dtype << " beta " << beta);
  const auto [outside, worst] = run_case(cs, backend);
  INFO("worst error/bound " << worst);
  CHECK(outside == 0);
}

TEST_CASE("TRAINMEM_CPU_GEMM names a path, the 16-bit rule follows the core, the F32 rule the shape",
          "[backend][cpu][gemm]") {
  GemmArgs g;
  g.m = g.n = g.k = 64;
  const ForcedPath forced(cpu::GemmPath::Auto);
  // BF16 operands go to oneDNN where it has AMX, or AVX512-BF16 on an AMD core; F16 only
  // with AMX (NOTE [CPU GEMM path]).
  const bool amx = cpu::kernels::onednn_has_amx();
  const bool bf16_wins = cpu::kernels::onednn_bf16_wins();
  if (amx) CHECK(bf16_wins);
  if (bf16_wins && !amx) CHECK(cpu::kernels::cpu_is_amd());  // never an Intel core without AMX
  if (cpu::kernels::cpu_is_amd() && std::string(cpu::kernels::onednn_isa_name()) == "avx512_core_bf16")
    CHECK(bf16_wins);
  if (!cpu::kernels::kHaveOneDnn) CHECK_FALSE(bf16_wins);
  const bool onednn_bf16 = cpu::kernels::onednn_bf16_wins() && cpu::kernels::onednn_can_gemm<BFloat16, BFloat16>(g);
  CHECK(std::string(cpu::kernels::gemm_path_name<BFloat16, BFloat16>(g)) == (onednn_bf16 ? "onednn" : "widen"));
  const bool onednn_f16 = amx && cpu::kernels::onednn_can_gemm<Half, Half>(g);
  CHECK(std::string(cpu::kernels::gemm_path_name<Half, Half>(g)) == (onednn_f16 ? "onednn" : "widen"));
  // A oneDNN kernel, where there is one, is never its reference implementation.
  const std::string kernel = cpu::kernels::onednn_kernel_name<BFloat16, BFloat16>(g);
  CHECK(kernel.rfind("ref", 0) == std::string::npos);
  CHECK(kernel.empty() == !cpu::kernels::onednn_can_gemm<BFloat16, BFloat16>(g));
  CHECK(std::string(cpu::kernels::gemm_path_name<double, double>(g)) == "eigen");
  // F32 goes to oneDNN only in the shape class where it measured faster on this core:
  // from 64 on an AMD core with AVX-512, from 512 elsewhere.
  const std::int64_t f32_min = cpu::kernels::onednn_f32_min_dim();
  const bool amd_avx512 = cpu::kernels::kHaveOneDnn && cpu::kernels::cpu_is_amd() &&
                          std::string(cpu::kernels::onednn_isa_name()).rfind("avx512_core", 0) == 0;
  CHECK(f32_min == (amd_avx512 ? 64 : 512));
  GemmArgs large;
  large.m = large.n = large.k = f32_min;
  CHECK(std::string(cpu::kernels::gemm_path_name<float, float>(large)) ==
        (cpu::kernels::kHaveOneDnn ? "onednn" : "eigen"));
  large.k = f32_min - 1;
  CHECK(std::string(cpu::kernels::gemm_path_name<float, float>(large)) == "eigen");
  g.m = 63;
  CHECK(std::string(cpu::kernels::gemm_path_name<float, float>(g)) == "eigen");
  g.m = 64;
  cpu::force_gemm_path(cpu::GemmPath::Eigen);
  CHECK(std::string(cpu::kernels::gemm_path_name<BFloat16, BFloat16>(g)) == "widen");
  CHECK(std::string(cpu::kernels::gemm_path_name<float, float>(g)) == "eigen");
}

// benchmarks/gemm/gemm_benchmark.cpp — GFLOP/s of C = A·B on the CPU backend, by storage dtype.
//
// Shapes are M×N×K: A is M×K, B is K×N, C is M×N, all row-major; 8192×768×768 is a
// linear layer over 8192 tokens of width 768. Rows compare, for F32, BF16 and F16
// storage through cpu::Backend::gemm (F32 accumulation, C in the same dtype), the path
// trainmem picks on this CPU ("trainmem", its path named in the path column) with each
// path forced (NOTE [CPU GEMM path] in backend/cpu/gemm.hpp): "trainmem/eigen" (Eigen
// F32, rows split over the threads; 16-bit operands widened to F32) and
// "trainmem/onednn" (oneDNN's matmul, 16-bit operands multiplied directly; absent where
// oneDNN has no kernel for the dtype or trainmem was built without it). Also a plain
// Eigen F32 product (Eigen's own parallel GEMM) and Eigen's own bfloat16/half GEMM
// (which accumulates in 16 bits; half is not timed at 8192×768×768 unless asked: ~30 s
// a rep). The header line names oneDNN's effective ISA (AMX or not).
//
// The machine may be shared, so the F32/BF16/F16 rows are timed round-robin, one rep
// of each in turn: load from other processes hits them alike, and the bf16/f32 and
// f16/f32 ratios come from the same moments. Ratios are given from medians (the
// figure the targets use) and from best reps (what the code costs without
// interference, since interference only ever adds time).
//
// Every result is checked against an F64 reference on sampled entries before its
// speed is reported: err = max |C - C64| / (|A|·|B|), the componentwise bound's scale.
// F32 accumulation over K terms keeps err <= u_out + K·2^-24; Eigen's 16-bit
// accumulation has no useful worst-case bound, so it gets the probabilistic
// u_out + 4·sqrt(K)·u_storage. A result over its tolerance fails the run (exit 1).
// `--check` instead verifies every transpose, dtype, beta and batch-stride combination
// of cpu::Backend::gemm against an F64 loop, on every path.

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <CLI/CLI.hpp>
#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/provenance.hpp"
#include "common/stats.hpp"
#include "common/timing.hpp"
#include "trainmem/backend/cpu/backend.hpp"
#include "trainmem/backend/cpu/gemm_path.hpp"

namespace {

namespace tmem = trainmem;
using Backend = tmem::cpu::Backend;
using TensorT = tmem::Tensor<Backend>;

struct Shape3 {
  std::int64_t m, n, k;
  std::string name() const { return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k); }
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

double unit_roundoff(tmem::DType dtype) {
  switch (dtype) {
    case tmem::DType::F64: return std::ldexp(1.0, -53);
    case tmem::DType::F32: return std::ldexp(1.0, -24);
    case tmem::DType::F16: return std::ldexp(1.0, -11);
    case tmem::DType::BF16: return std::ldexp(1.0, -8);
    default: return 0.0;
  }
}

// Stored value of element i of a tensor of `dtype`, widened to double.
double stored_value(const void* data, tmem::DType dtype, std::int64_t i) {
  switch (dtype) {
    case tmem::DType::F64: return static_cast<const double*>(data)[i];
    case tmem::DType::F32: return static_cast<const float*>(data)[i];
    case tmem::DType::F16: return tmem::Half::to_float(static_cast<const tmem::Half*>(data)[i].bits);
    case tmem::DType::BF16: return tmem::BFloat16::to_float(static_cast<const tmem::BFloat16*>(data)[i].bits);
    default: return 0.0;
  }
}

std::vector<float> random_values(std::size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (auto& v : values) v = dist(rng);
  return values;
}

// Error of C (row-major m×n, ldc = n) against an F64 dot product of the stored A (m×k)
// and B (k×n) values, over `samples` random entries; scaled by sum_k |a_ik||b_kj|.
double sampled_error(const void* a, const void* b, const void* c, tmem::DType in_dtype, tmem::DType out_dtype,
                     const Shape3& s, int samples, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> row(0, s.m - 1), col(0, s.n - 1);
  double worst = 0.0;
  for (int t = 0; t < samples; ++t) {
    const std::int64_t i = row(rng), j = col(rng);
    double exact = 0.0, magnitude = 0.0;
    for (std::int64_t p = 0; p < s.k; ++p) {
      const double product = stored_value(a, in_dtype, i * s.k + p) * stored_value(b, in_dtype, p * s.n + j);
      exact += product;
      magnitude += std::fabs(product);
    }
    const double got = stored_value(c, out_dtype, i * s.n + j);
    if (!std::isfinite(got)) return INFINITY;
    worst = std::max(worst, std::fabs(got - exact) / std::max(magnitude, 1e-300));
  }
  return worst;
}

double seconds_of(const std::function<void()>& fn) {
  const benchmarks::Stopwatch watch;
  fn();
  return watch.seconds();
}

struct Row {
  Shape3 shape;
  tmem::DType dtype;
  std::string impl, path;
  double median_ms = 0, min_ms = 0, max_ms = 0, gflops = 0, ratio = 0, best_ratio = 0, error = 0, tolerance = 0;
  int reps = 0;
};

// One GEMM under test: `run` computes C = A·B, `a`, `b`, `c` expose the stored values.
struct Case {
  tmem::DType dtype;
  std::string impl, path;
  std::function<void()> run;
  const void *a, *b, *c;
  bool accumulates_in_f32;
  std::vector<double> times;
};

// Plain Eigen matrices of Scalar (float, Eigen::bfloat16 or Eigen::half): C = A*B.
template <class Scalar>
struct EigenProduct {
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Matrix a, b, c;
  EigenProduct(const Shape3& s, const std::vector<float>& av, const std::vector<float>& bv)
      : a(s.m, s.k), b(s.k, s.n), c(s.m, s.n) {
    for (std::int64_t i = 0; i < a.size(); ++i) a.data()[i] = Scalar(av[static_cast<std::size_t>(i)]);
    for (std::int64_t i = 0; i < b.size(); ++i) b.data()[i] = Scalar(bv[static_cast<std::size_t>(i)]);
  }
  void run() { c.noalias() = a * b; }
};

TensorT make_tensor(Backend& backend, std::int64_t rows, std::int64_t cols, const std::vector<float>& values,
                    tmem::DType dtype) {
  return TensorT::from_host({rows, cols}, values, dtype, tmem::MemCategory::Temporary, backend);
}

std::vector<Row> bench_shape(const Shape3& s, int reps, int warmup, bool native_bf16, bool native_half, int samples,
                             std::mt19937_64& rng) {
  Backend backend;
  const auto av = random_values(static_cast<std::size_t>(s.m * s.k), rng);
  const auto bv = random_values(static_cast<std::size_t>(s.k * s.n), rng);
  tmem::GemmArgs args;
  args.m = s.m;
  args.n = s.n;
  args.k = s.k;

  // The path a GEMM of this dtype takes with `path` forced (GemmPath::Auto: trainmem's rule).
  auto path_taken = [&](tmem::DType dtype, tmem::cpu::GemmPath path) {
    tmem::cpu::force_gemm_path(path);
    std::string name = tmem::visit_floating(
        dtype, "gemm", [&]<class T>() { return std::string(tmem::cpu::gemm_path_taken<T>(args)); });
    tmem::cpu::force_gemm_path(tmem::cpu::GemmPath::Auto);
    return name;
  };
  std::vector<Case> cases;
  const std::pair<tmem::cpu::GemmPath, const char*> paths[] = {{tmem::cpu::GemmPath::Auto, "trainmem"},
                                                               {tmem::cpu::GemmPath::Eigen, "trainmem/eigen"},
                                                               {tmem::cpu::GemmPath::OneDnn, "trainmem/onednn"}};
  for (tmem::DType dtype : {tmem::DType::F32, tmem::DType::BF16, tmem::DType::F16})
    for (const auto& [path, impl] : paths) {
      const std::string taken = path_taken(dtype, path);
      if (path == tmem::cpu::GemmPath::OneDnn && taken != "onednn") continue;  // no oneDNN kernel for it
      TensorT a = make_tensor(backend, s.m, s.k, av, dtype), b = make_tensor(backend, s.k, s.n, bv, dtype);
      TensorT c = TensorT::empty({s.m, s.n}, dtype, tmem::MemCategory::Temporary, backend);
      cases.push_back({dtype,
                       impl,
                       taken,
                       [&backend, args, a, b, c, path] {
                         tmem::cpu::force_gemm_path(path);
                         backend.gemm(args, a, b, c);
                         tmem::cpu::force_gemm_path(tmem::cpu::GemmPath::Auto);
                       },
                       a.data(),
                       b.data(),
                       c.data(),
                       true,
                       {}});
    }
  // Eigen's own F32 product (its parallel GEMM), for reference.
  EigenProduct<float> f32(s, av, bv);
  cases.push_back(
      {tmem::DType::F32, "eigen", "eigen", [&f32] { f32.run(); }, f32.a.data(), f32.b.data(), f32.c.data(), true, {}});
  // Round-robin: rep r of every case runs before rep r+1 of any. A fast shape gets more
  // reps (about 0.3 s of F32 time), so a burst of someone else's load moves no median.
  double f32_seconds = INFINITY;
  for (int r = 0; r < warmup; ++r)
    for (auto& cs : cases) {
      const double t = seconds_of(cs.run);
      if (&cs == &cases[0]) f32_seconds = std::min(f32_seconds, t);
    }
  const int round_robin_reps = std::max(reps, std::min(200, static_cast<int>(0.3 / f32_seconds)));
  for (int r = 0; r < round_robin_reps; ++r)
    for (auto& cs : cases) cs.times.push_back(seconds_of(cs.run));

  // Eigen's own 16-bit GEMM, one case after the other: it is 6-500x slower, so one
  // warm-up rep is plenty.
  auto bf16 = native_bf16 ? std::make_unique<EigenProduct<Eigen::bfloat16>>(s, av, bv) : nullptr;
  auto half = native_half ? std::make_unique<EigenProduct<Eigen::half>>(s, av, bv) : nullptr;
  const std::size_t first_native = cases.size();
  if (bf16)
    cases.push_back({tmem::DType::BF16,
                     "eigen",
                     "eigen16",
                     [m = bf16.get()] { m->run(); },
                     bf16->a.data(),
                     bf16->b.data(),
                     bf16->c.data(),
                     false,
                     {}});
  if (half)
    cases.push_back({tmem::DType::F16,
                     "eigen",
                     "eigen16",
                     [m = half.get()] { m->run(); },
                     half->a.data(),
                     half->b.data(),
                     half->c.data(),
                     false,
                     {}});
  for (std::size_t i = first_native; i < cases.size(); ++i)
    for (int r = 0; r < 1 + reps; ++r) {
      const double t = seconds_of(cases[i].run);
      if (r >= 1) cases[i].times.push_back(t);
    }

  std::vector<Row> rows;
  const double f32_gflops = s.flops() / benchmarks::median(cases[0].times) * 1e-9;
  const double f32_best_ms = *std::min_element(cases[0].times.begin(), cases[0].times.end()) * 1e3;
  for (auto& cs : cases) {
    Row row;
    row.shape = s;
    row.dtype = cs.dtype;
    row.impl = cs.impl;
    row.path = cs.path;
    row.reps = static_cast<int>(cs.times.size());
    row.median_ms = benchmarks::median(cs.times) * 1e3;
    row.min_ms = *std::min_element(cs.times.begin(), cs.times.end()) * 1e3;
    row.max_ms = *std::max_element(cs.times.begin(), cs.times.end()) * 1e3;
    row.gflops = s.flops() / (row.median_ms * 1e-3) * 1e-9;
    row.ratio = row.gflops / f32_gflops;
    row.best_ratio = f32_best_ms / row.min_ms;
    // Eigen's bfloat16/half are bit-compatible with trainmem's BFloat16/Half storage.
    row.error = sampled_error(cs.a, cs.b, cs.c, cs.dtype, cs.dtype, s, samples, rng);
    const double u = unit_roundoff(cs.dtype), k = static_cast<double>(s.k);
    row.tolerance = cs.accumulates_in_f32 ? (cs.dtype == tmem::DType::F32 ? 0.0 : u) + k * std::ldexp(1.0, -24)
                                          : u + 4.0 * std::sqrt(k) * u;
    rows.push_back(row);
  }
  return rows;
}

// --- --check: every GemmArgs combination against an F64 loop ---------------------------

struct CheckResult {
  int cases = 0, failures = 0;
};

// Reference C = alpha op(A) op(B) + beta C0 in F64 with the stored values; compares
// against the computed C within u_out·|ref| + (u_out + K·u_acc)·(|alpha||A||B| + |beta||C0|).
void check_one(Backend& backend, tmem::DType in_dtype, tmem::DType out_dtype, tmem::GemmArgs g, bool shared_a,
               std::mt19937_64& rng, CheckResult& result) {
  const std::int64_t a_size = g.m * g.k, b_size = g.k * g.n, c_size = g.m * g.n;
  g.stride_a = shared_a ? 0 : a_size;
  g.stride_c = c_size;
  const std::int64_t a_count = shared_a ? 1 : g.batch, b_count = g.stride_b == 0 ? 1 : g.batch;
  const auto av = random_values(static_cast<std::size_t>(a_size * a_count), rng);
  const auto bv = random_values(static_cast<std::size_t>(b_size * b_count), rng);
  const auto cv = random_values(static_cast<std::size_t>(c_size * g.batch), rng);
  TensorT a = TensorT::from_host({a_size * a_count}, av, in_dtype, tmem::MemCategory::Temporary, backend);
  TensorT b = TensorT::from_host({b_size * b_count}, bv, in_dtype, tmem::MemCategory::Temporary, backend);
  TensorT c = TensorT::from_host({c_size * g.batch}, cv, out_dtype, tmem::MemCategory::Temporary, backend);
  std::vector<double> c0(static_cast<std::size_t>(c_size * g.batch));
  for (std::size_t i = 0; i < c0.size(); ++i) c0[i] = stored_value(c.data(), out_dtype, static_cast<std::int64_t>(i));
  backend.gemm(g, a, b, c);

  const double u_out = out_dtype == tmem::DType::F64 ? unit_roundoff(tmem::DType::F64) : unit_roundoff(out_dtype);
  const double u_acc = in_dtype == tmem::DType::F64 ? unit_roundoff(tmem::DType::F64) : unit_roundoff(tmem::DType::F32);
  double worst = 0.0;
  for (std::int64_t e = 0; e < g.batch; ++e)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double dot = 0.0, magnitude = 0.0;
        for (std::int64_t p = 0; p < g.k; ++p) {
          const std::int64_t ai = e * g.stride_a + (g.trans_a ? p * g.m + i : i * g.k + p);
          const std::int64_t bi = e * g.stride_b + (g.trans_b ? j * g.k + p : p * g.n + j);
          const double product = stored_value(a.data(), in_dtype, ai) * stored_value(b.data(), in_dtype, bi);
          dot += product;
          magnitude += std::fabs(product);
        }
        const std::int64_t ci = e * g.stride_c + i * g.n + j;
        const double ref = g.alpha * dot + g.beta * c0[static_cast<std::size_t>(ci)];
        const double scale = std::fabs(g.alpha) * magnitude + std::fabs(g.beta * c0[static_cast<std::size_t>(ci)]);
        const double got = stored_value(c.data(), out_dtype, ci);
        const double tolerance = u_out * std::fabs(ref) + 2.0 * (u_out + static_cast<double>(g.k + 2) * u_acc) * scale;
        const double excess = std::fabs(got - ref) / std::max(tolerance, 1e-300);
        worst = std::max(worst, std::isfinite(excess) ? excess : INFINITY);
      }
  ++result.cases;
  const bool ok = worst <= 1.0;
  if (!ok) ++result.failures;
  if (!ok || std::getenv("GEMM_CHECK_VERBOSE"))
    std::printf(
        "  %s %-4s->%-4s m=%lld n=%lld k=%lld tA=%d tB=%d batch=%lld strideA=%s strideB=%s alpha=%g beta=%g"
        "  worst err/tol=%.3f\n",
        ok ? "ok  " : "FAIL", std::string(tmem::name_of(in_dtype)).c_str(),
        std::string(tmem::name_of(out_dtype)).c_str(), static_cast<long long>(g.m), static_cast<long long>(g.n),
        static_cast<long long>(g.k), g.trans_a, g.trans_b, static_cast<long long>(g.batch), shared_a ? "0" : "mk",
        g.stride_b == 0 ? "0" : "kn", g.alpha, g.beta, worst);
}

int run_check(tmem::cpu::GemmPath path) {
  tmem::cpu::force_gemm_path(path);
  Backend backend;
  std::mt19937_64 rng(7);
  CheckResult result;
  const std::vector<std::pair<tmem::DType, tmem::DType>> dtype_pairs = {
      {tmem::DType::F64, tmem::DType::F64},   {tmem::DType::F32, tmem::DType::F32},
      {tmem::DType::BF16, tmem::DType::BF16}, {tmem::DType::F16, tmem::DType::F16},
      {tmem::DType::BF16, tmem::DType::F32},  {tmem::DType::F16, tmem::DType::F32},
      {tmem::DType::F32, tmem::DType::BF16},  {tmem::DType::F32, tmem::DType::F16},
      {tmem::DType::BF16, tmem::DType::F16},  {tmem::DType::F16, tmem::DType::BF16}};
  // Odd sizes exercise conversion tails. 600x48x80 is split over two threads (when
  // there are two), each with two row blocks; a batch of three 300-row entries puts
  // one entry on both sides of the thread boundary; k = 0 leaves beta C.
  const std::vector<std::array<std::int64_t, 3>> sizes = {
      {37, 29, 53}, {1, 17, 9}, {300, 40, 70}, {600, 48, 80}, {5, 7, 0}};
  for (auto [in_dtype, out_dtype] : dtype_pairs)
    for (auto [m, n, k] : sizes)
      for (int trans = 0; trans < 4; ++trans)
        for (double beta : {0.0, 1.0})
          for (int batching = 0; batching < 3; ++batching) {
            tmem::GemmArgs g;
            g.m = m;
            g.n = n;
            g.k = k;
            g.trans_a = trans & 1;
            g.trans_b = trans & 2;
            g.beta = beta;
            g.alpha = batching == 2 ? -0.75 : 1.0;
            g.batch = batching == 0 ? 1 : 3;
            g.stride_b = batching == 1 ? 0 : k * n;  // batching 1: B shared by the batch
            check_one(backend, in_dtype, out_dtype, g, /*shared_a=*/batching == 2 && beta == 0.0, rng, result);
          }
  std::printf("gemm check, path %s: %d cases, %d failures\n",
              path == tmem::cpu::GemmPath::OneDnn ? "onednn where it has a kernel" : "eigen", result.cases,
              result.failures);
  tmem::cpu::force_gemm_path(tmem::cpu::GemmPath::Auto);
  return result.failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trainmem CPU GEMM benchmark: F32 vs BF16/F16 storage (F32 accumulation) vs Eigen's 16-bit GEMM"};
  std::string json_path;
  int reps = 9, warmup = 2, samples = 256;
#if defined(_OPENMP)
  int threads = omp_get_max_threads();
#else
  int threads = 1;
#endif
  bool check = false, eigen_half_large = false, no_eigen = false, no_large = false;
  std::vector<std::string> shape_names;
  app.add_option("--json", json_path, "write the results (provenance and rows) to this file");
  app.add_option("--reps", reps, "timed repetitions per figure, at least (median reported)")
      ->check(CLI::Range(7, 1000));
  app.add_option("--warmup", warmup, "untimed repetitions before timing")->check(CLI::Range(1, 100));
  app.add_option("--samples", samples, "entries of C checked against F64 per result")->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads, "threads for OpenMP and Eigen (default: OpenMP's)")->check(CLI::Range(1, 1024));
  app.add_flag("--eigen-half-large", eigen_half_large, "also time Eigen's half GEMM at 8192x768x768 (~30 s a rep)");
  app.add_flag("--no-eigen", no_eigen, "skip Eigen's own 16-bit GEMM (the slow rows)");
  app.add_flag("--no-large", no_large, "skip 8192x768x768 (time only 512^3 and 1024^3)");
  app.add_option("--shapes", shape_names, "shapes MxNxK to time instead of 512^3, 1024^3 and 8192x768x768")
      ->delimiter(',');
  app.add_flag("--check", check, "verify cpu::Backend::gemm against an F64 loop instead of timing");
  CLI11_PARSE(app, argc, argv);

#if defined(_OPENMP)
  omp_set_num_threads(threads);
  const int openmp_threads = omp_get_max_threads();
#else
  const int openmp_threads = 0;  // built without OpenMP: everything runs on one thread
#endif
  Eigen::setNbThreads(threads);
  const benchmarks::Provenance provenance = benchmarks::provenance(argc, argv, threads);
  if (!json_path.empty()) benchmarks::check_writable(json_path, provenance);
  if (check) {
    int failed = run_check(tmem::cpu::GemmPath::Eigen);
    if (tmem::cpu::onednn_support().built_in) failed |= run_check(tmem::cpu::GemmPath::OneDnn);
    return failed;
  }

#if !defined(__OPTIMIZE__)
  std::printf("warning: built without optimisation; figures are meaningless\n");
#endif
  std::printf("%s", provenance.text().c_str());
  std::printf("threads: %d (OpenMP %d, Eigen %d); median of >= %d timed reps after warm-up; C = A*B, shape MxNxK\n",
              threads, openmp_threads, Eigen::nbThreads(), reps);
  std::printf("err = max |C - C64| / (|A||B|) over %d sampled entries; tol = its bound for the accumulation used\n",
              samples);
  const tmem::cpu::OneDnnSupport onednn = tmem::cpu::onednn_support();
  std::printf("oneDNN: %s; effective ISA %s, AMX %s, BF16 operands to oneDNN %s\n",
              onednn.built_in ? "built in" : "not built in", onednn.isa, onednn.amx ? "yes" : "no",
              onednn.bf16 ? "yes" : "no");
  if (onednn.built_in) {  // which oneDNN kernel a 1024^3 product of each dtype would run
    tmem::GemmArgs g;
    g.m = g.n = g.k = 1024;
    auto name = [](std::string kernel) { return kernel.empty() ? std::string("none") : kernel; };
    std::printf("oneDNN kernels at 1024^3: f32 %s, bf16 %s, f16 %s\n",
                name(tmem::cpu::onednn_kernel_taken<float>(g)).c_str(),
                name(tmem::cpu::onednn_kernel_taken<tmem::BFloat16>(g)).c_str(),
                name(tmem::cpu::onednn_kernel_taken<tmem::Half>(g)).c_str());
  }
  std::mt19937_64 rng(2024);
  std::vector<Shape3> shapes = {{512, 512, 512}, {1024, 1024, 1024}, {8192, 768, 768}};
  if (no_large) shapes.pop_back();
  if (!shape_names.empty()) {
    shapes.clear();
    for (const std::string& name : shape_names) {
      Shape3 s{};
      char x1 = 0, x2 = 0;
      std::istringstream in(name);
      if (!(in >> s.m >> x1 >> s.n >> x2 >> s.k) || x1 != 'x' || x2 != 'x' || s.m <= 0 || s.n <= 0 || s.k <= 0) {
        std::fprintf(stderr, "gemm: --shapes %s: expected MxNxK with positive sizes\n", name.c_str());
        return 2;
      }
      shapes.push_back(s);
    }
  }
  std::vector<Row> rows;
  for (const auto& s : shapes) {
    const bool native_half = !no_eigen && (s.m <= 1024 || eigen_half_large);
    auto shape_rows = bench_shape(s, reps, warmup, !no_eigen, native_half, samples, rng);
    rows.insert(rows.end(), shape_rows.begin(), shape_rows.end());
  }

  std::printf("\n%-15s %-5s %-16s %-7s %9s %10s %8s %8s %5s %9s %8s %9s\n", "shape MxNxK", "dtype", "impl", "path",
              "GFLOP/s", "median ms", "min ms", "max ms", "reps", "vs f32", "err", "tol");
  bool all_ok = true;
  for (const auto& r : rows) {
    const bool ok = r.error <= r.tolerance;
    all_ok = all_ok && ok;
    std::printf("%-15s %-5s %-16s %-7s %9.1f %10.3f %8.3f %8.3f %5d %8.3fx %9.2e %8.1e%s\n", r.shape.name().c_str(),
                std::string(tmem::name_of(r.dtype)).c_str(), r.impl.c_str(), r.path.c_str(), r.gflops, r.median_ms,
                r.min_ms, r.max_ms, r.reps, r.ratio, r.error, r.tolerance, ok ? "" : "  WRONG");
  }
  if (!eigen_half_large && !no_eigen)
    std::printf("(Eigen's half GEMM is not timed at 8192x768x768, ~30 s a rep here; --eigen-half-large adds it)\n");
  std::printf("\nratios measured in this run (GFLOP/s relative to trainmem f32, the path it picks):\n");
  for (const auto& r : rows)
    if (r.impl != "eigen" && !(r.impl == "trainmem" && r.dtype == tmem::DType::F32))
      std::printf("  %-15s %-5s %-16s (%s)/f32 = %.3f from medians, %.3f from best reps\n", r.shape.name().c_str(),
                  std::string(tmem::name_of(r.dtype)).c_str(), r.impl.c_str(), r.path.c_str(), r.ratio, r.best_ratio);

  if (!json_path.empty()) {
    nlohmann::json out = {{"benchmark", "gemm"},
                          {"provenance", nlohmann::json::parse(provenance.json())},
                          {"onednn_isa", onednn.isa},
                          {"rows", nlohmann::json::array()}};
    for (const auto& r : rows)
      out["rows"].push_back({{"shape", r.shape.name()},
                             {"m", r.shape.m},
                             {"n", r.shape.n},
                             {"k", r.shape.k},
                             {"dtype", std::string(tmem::name_of(r.dtype))},
                             {"impl", r.impl},
                             {"path", r.path},
                             {"gflops", r.gflops},
                             {"median_ms", r.median_ms},
                             {"min_ms", r.min_ms},
                             {"max_ms", r.max_ms},
                             {"reps", r.reps},
                             {"ratio_vs_f32", r.ratio},
                             {"ratio_vs_f32_best", r.best_ratio},
                             {"max_rel_error", r.error},
                             {"tolerance", r.tolerance},
                             {"threads", threads}});
    std::ofstream file(json_path);
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
    file << out.dump(2) << '\n';
  }
  if (!all_ok) std::printf("\nFAILED: a result is outside its error tolerance; its speed is not valid\n");
  return all_ok ? 0 : 1;
}

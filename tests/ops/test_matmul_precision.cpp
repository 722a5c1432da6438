// tests/ops/test_matmul_precision.cpp — matmul forward in F32, BF16 and F16 storage
// against an F64 reference.
//
// The reference multiplies the values actually stored (inputs already rounded to the
// storage dtype), so the only errors left are the GEMM's: FP32 accumulation, bounded
// by k * 2^-24 * sum|a b|, and one rounding of the output to the storage dtype, at
// most half an ulp: 2^-p relative for p significand bits, 2^-24 (f32), 2^-8 (bf16),
// 2^-11 (f16). Accumulating in the 16-bit
// dtype instead would miss the first bound by two orders of magnitude at k = 257.
// Shapes are odd and m exceeds the 256-row panel so the blocked path runs its tail.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "reference.hpp"
#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

using namespace trainmem;
using B = cpu::Backend;
using T = Tensor<B>;
using V = Var<B>;

namespace {

/// Unit roundoff 2^-p: the largest relative error of one rounding to nearest.
double output_half_ulp(DType dtype) {
  switch (dtype) {
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

/// The normwise bound the issue states for each storage dtype: max|C - ref| / max|ref|.
double normwise_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F16: return 2e-3;
    case DType::BF16: return 1e-2;
    default: return 1e-5;
  }
}

struct Errors {
  std::int64_t outside = 0;  // elements outside the per-element bound
  double normwise = 0.0;     // max|C - ref| / max|ref|
  double worst_ratio = 0.0;  // max error / bound over elements
};

/// Compares C with ref element by element against roundings * half_ulp |ref| + k 2^-24 sum|ab|.
Errors compare(const std::vector<double>& c, const std::vector<double>& ref, const std::vector<double>& abs_ref,
               std::int64_t k, DType dtype, double roundings = 1.0) {
  Errors e;
  double max_error = 0, max_ref = 0;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double error = std::abs(c[i] - ref[i]);
    const double bound = roundings * output_half_ulp(dtype) * std::abs(ref[i]) +
                         static_cast<double>(k) * std::ldexp(1.0, -24) * abs_ref[i];
    if (!(error <= bound)) ++e.outside;
    e.worst_ratio = std::max(e.worst_ratio, error / bound);
    max_error = std::max(max_error, error);
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  e.normwise = max_error / max_ref;
  return e;
}

}  // namespace

TEST_CASE("matmul in f32/bf16/f16 storage matches F64 with FP32 accumulation", "[ops][matmul][precision]") {
  const DType dtype = GENERATE(DType::F32, DType::BF16, DType::F16);
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const std::int64_t m = 300, k = 257, n = 65;
  INFO(dtype << " trans_a " << ta << " trans_b " << tb);
  const T a = testing::random_tensor(ta ? Shape{k, m} : Shape{m, k}, 100, -1, 1, dtype);
  const T b = testing::random_tensor(tb ? Shape{n, k} : Shape{k, n}, 101, -1, 1, dtype);
  Tape<B> tape;
  const V c = matmul(tape.input(a), tape.input(b), ta, tb);
  CHECK(c.dtype() == dtype);
  CHECK(c.shape() == Shape{m, n});
  const auto av = a.to_host<double>(), bv = b.to_host<double>();
  const Errors e = compare(c.value().to_host<double>(), testing::matmul_reference(av, bv, 1, m, n, k, ta, tb),
                           testing::abs_matmul_reference(av, bv, 1, m, n, k, ta, tb), k, dtype);
  INFO("outside bound: " << e.outside << ", worst error/bound " << e.worst_ratio << ", normwise " << e.normwise);
  CHECK(e.outside == 0);
  CHECK(e.normwise <= normwise_tolerance(dtype));
}

TEST_CASE("a 16-bit GEMM holds its widening workspace only while it runs, an f32 GEMM needs none", "[ops][matmul]") {
  // The Eigen path's workspaces (oneDNN's path takes none but its own scratchpad).
  struct Restore {
    cpu::GemmPath before = cpu::forced_gemm_path();
    ~Restore() { cpu::force_gemm_path(before); }
  } restore;
  cpu::force_gemm_path(cpu::GemmPath::Eigen);
  B backend;  // its own MemoryStats
  auto& stats = backend.memory();
  const T a = testing::random_tensor(Shape{64, 48}, 110, -1, 1, DType::BF16, backend);
  const T b = testing::random_tensor(Shape{48, 32}, 111, -1, 1, DType::BF16, backend);
  auto product = [&] {
    Tape<B> tape;
    return matmul(tape.input(a), tape.input(b)).value().to_host<double>();
  };
  const auto first = product();
  CHECK(stats.peak(MemCategory::Workspace) > 0);  // A block, all of B and a C block widened to f32
  CHECK(stats.live(MemCategory::Workspace) == 0);
  stats.reset_peak();
  CHECK(product() == first);  // the allocator's cache hands the same blocks back
  CHECK(stats.peak(MemCategory::Workspace) > 0);
  CHECK(stats.live(MemCategory::Workspace) == 0);

  stats.reset_peak();
  const T a32 = testing::random_tensor(Shape{64, 48}, 112, -1, 1, DType::F32, backend);
  Tape<B> tape;
  static_cast<void>(matmul(tape.input(a32), tape.input(a32), false, true));
  CHECK(stats.peak(MemCategory::Workspace) == 0);  // f32 operands go to Eigen as they are
}

TEST_CASE("bmm and linear in bf16/f16 storage match F64", "[ops][matmul][precision]") {
  const DType dtype = GENERATE(DType::BF16, DType::F16, DType::F32);
  INFO(dtype);
  SECTION("bmm with transposes") {
    const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
    INFO("trans_a " << ta << " trans_b " << tb);
    const std::int64_t batch = 3, m = 70, k = 130, n = 40;
    const T a = testing::random_tensor(ta ? Shape{batch, k, m} : Shape{batch, m, k}, 102, -1, 1, dtype);
    const T b = testing::random_tensor(tb ? Shape{batch, n, k} : Shape{batch, k, n}, 103, -1, 1, dtype);
    Tape<B> tape;
    const V c = bmm(tape.input(a), tape.input(b), ta, tb);
    CHECK(c.dtype() == dtype);
    const auto av = a.to_host<double>(), bv = b.to_host<double>();
    const Errors e = compare(c.value().to_host<double>(), testing::matmul_reference(av, bv, batch, m, n, k, ta, tb),
                             testing::abs_matmul_reference(av, bv, batch, m, n, k, ta, tb), k, dtype);
    INFO("outside bound: " << e.outside << ", worst error/bound " << e.worst_ratio << ", normwise " << e.normwise);
    CHECK(e.outside == 0);
    CHECK(e.normwise <= normwise_tolerance(dtype));
  }
  SECTION("linear with bias (GEMM output rounded, then the bias add rounded)") {
    const std::int64_t rows = 260, in = 96, out = 33;
    const T x = testing::random_tensor(Shape{rows, in}, 104, -1, 1, dtype);
    const T w = testing::random_tensor(Shape{out, in}, 105, -1, 1, dtype);
    const T bias = testing::random_tensor(Shape{out}, 106, -1, 1, dtype);
    Tape<B> tape;
    const V y = linear(tape.input(x), tape.input(w), tape.input(bias));
    CHECK(y.dtype() == dtype);
    const auto xv = x.to_host<double>(), wv = w.to_host<double>(), bv = bias.to_host<double>();
    auto ref = testing::matmul_reference(xv, wv, 1, rows, out, in, false, true);
    auto abs_ref = testing::abs_matmul_reference(xv, wv, 1, rows, out, in, false, true);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t o = 0; o < out; ++o) {
        ref[r * out + o] += bv[o];
        abs_ref[r * out + o] += std::abs(bv[o]);
      }
    // Two roundings, each at most half an ulp of a value bounded by sum|ab| + |b|.
    std::vector<double> c = y.value().to_host<double>();
    std::int64_t outside = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      const double bound = 2 * output_half_ulp(dtype) * abs_ref[i] + in * std::ldexp(1.0, -24) * abs_ref[i];
      if (!(std::abs(c[i] - ref[i]) <= bound)) ++outside;
    }
    CHECK(outside == 0);
  }
}

TEST_CASE("matmul under bf16 autocast equals the bf16-rounded product", "[ops][matmul][precision]") {
  const std::int64_t m = 40, k = 100, n = 30;
  const T a = testing::random_tensor(Shape{m, k}, 107, -1, 1, DType::F32);
  const T b = testing::random_tensor(Shape{k, n}, 108, -1, 1, DType::F32);
  auto rounded = [](const T& t) {
    auto v = t.to_host<double>();
    for (auto& x : v) x = BFloat16::to_float(BFloat16::from_float(static_cast<float>(x)));
    return v;
  };
  Tape<B> tape;
  V c;
  {
    amp::Autocast autocast(DType::BF16);
    c = matmul(tape.input(a), tape.input(b));
  }
  CHECK(c.dtype() == DType::BF16);
  const auto av = rounded(a), bv = rounded(b);
  const Errors e = compare(c.value().to_host<double>(), testing::matmul_reference(av, bv, 1, m, n, k, false, false),
                           testing::abs_matmul_reference(av, bv, 1, m, n, k, false, false), k, DType::BF16);
  INFO("outside bound: " << e.outside << ", normwise " << e.normwise);
  CHECK(e.outside == 0);
}

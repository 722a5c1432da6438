// tests/backend/cpu/test_norm_kernels.cpp — layer and RMS norm kernels on shapes large
// enough that their backward splits rows into chunks (norm_backward_chunk_rows), the last
// one short: dx, dgamma and dbeta against an F64 reference, f32 and bf16 parameters, and
// the same bits on one thread and on two (the chunks' column sums add in chunk order).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "test_data.hpp"
#include "trainmem/backend/cpu/kernels/norm.hpp"
#include "trainmem/trainmem.hpp"

namespace {

namespace kernels = trainmem::cpu::kernels;
using trainmem::BFloat16;

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, double lo, double hi) {
  trainmem::testing::SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}

struct NormGrads {
  std::vector<float> dx;
  std::vector<double> dgamma, dbeta;
};

/// layer_norm_backward in F64 from the same inputs (xhat from the F64 statistics).
NormGrads layer_norm_reference(const std::vector<float>& dy, const std::vector<float>& x,
                               const std::vector<double>& gamma, std::int64_t rows, std::int64_t cols) {
  NormGrads g{std::vector<float>(x.size()), std::vector<double>(cols), std::vector<double>(cols)};
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(cols) + 1e-5);
    double sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * rstd, gv = dy[r * cols + c] * gamma[c];
      sum_g += gv;
      sum_g_xhat += gv * xhat;
      g.dgamma[c] += dy[r * cols + c] * xhat;
      g.dbeta[c] += dy[r * cols + c];
    }
    for (std::int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - mean) * rstd, gv = dy[r * cols + c] * gamma[c];
      g.dx[r * cols + c] = static_cast<float>(rstd * (gv - sum_g / cols - xhat * sum_g_xhat / cols));
    }
  }
  return g;
}

/// Runs the kernel pair (forward for the statistics, then backward) with `threads` threads.
template <class TP>
NormGrads layer_norm_kernels(const std::vector<float>& dy, const std::vector<float>& x, const std::vector<TP>& gamma,
                             std::int64_t rows, std::int64_t cols, int threads) {
  const int before = trainmem::num_threads();
  trainmem::set_num_threads(threads);
  std::vector<TP> beta(static_cast<std::size_t>(cols), trainmem::detail::narrow<TP>(0.25f)), dgamma(gamma.size()),
      dbeta(gamma.size());
  std::vector<float> y(x.size()), mean(static_cast<std::size_t>(rows)), rstd(mean.size()), dx(x.size());
  kernels::layer_norm(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), rows, cols, 1e-5);
  kernels::layer_norm_backward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), dx.data(), dgamma.data(),
                               dbeta.data(), rows, cols, trainmem::cpu::Backend::default_instance().allocator());
  trainmem::set_num_threads(before);
  NormGrads g{dx, {}, {}};
  for (std::int64_t c = 0; c < cols; ++c) {
    g.dgamma.push_back(static_cast<double>(trainmem::detail::widen(dgamma[c])));
    g.dbeta.push_back(static_cast<double>(trainmem::detail::widen(dbeta[c])));
  }
  return g;
}

/// |got - want| <= rel * (|want| + scale) elementwise.
template <class A, class Bv>
void check_close(const A& got, const Bv& want, double rel, double scale, const char* what) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) >
        rel * (std::abs(static_cast<double>(want[i])) + scale))
      ++bad;
  INFO(what);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("layer_norm_backward in row chunks matches F64 and gives the same bits on 1 and 2 threads",
          "[backend][cpu][norm]") {
  const std::int64_t rows = GENERATE(1000, 4099), cols = 67;  // chunks of 16 and 65 rows, the last one short
  INFO("rows " << rows << ", cols " << cols << ", chunk rows " << kernels::norm_backward_chunk_rows(rows, cols));
  REQUIRE(kernels::norm_backward_chunk_rows(rows, cols) < rows);
  REQUIRE(rows % kernels::norm_backward_chunk_rows(rows, cols) != 0);
  const auto x = random_floats(static_cast<std::size_t>(rows * cols), 11, -2.0, 3.0);
  const auto dy = random_floats(x.size(), 12, -1.0, 1.0);
  const auto gamma_f = random_floats(static_cast<std::size_t>(cols), 13, 0.5, 1.5);

  SECTION("f32 parameters") {
    const std::vector<double> gamma(gamma_f.begin(), gamma_f.end());
    const NormGrads want = layer_norm_reference(dy, x, gamma, rows, cols);
    const NormGrads one = layer_norm_kernels(dy, x, gamma_f, rows, cols, 1);
    const NormGrads two = layer_norm_kernels(dy, x, gamma_f, rows, cols, 2);
    check_close(one.dx, want.dx, 1e-4, 1e-3, "dx");
    check_close(one.dgamma, want.dgamma, 1e-5, 1.0, "dgamma");
    check_close(one.dbeta, want.dbeta, 1e-5, 1.0, "dbeta");
    CHECK(one.dx == two.dx);
    CHECK(one.dgamma == two.dgamma);
    CHECK(one.dbeta == two.dbeta);
  }
  SECTION("bf16 parameters: sums in f32, rounded once") {
    std::vector<BFloat16> gamma_b;
    std::vector<double> gamma;
    for (float g : gamma_f) {
      gamma_b.push_back(trainmem::detail::narrow<BFloat16>(g));
      gamma.push_back(static_cast<double>(trainmem::detail::widen(gamma_b.back())));
    }
    const NormGrads want = layer_norm_reference(dy, x, gamma, rows, cols);
    const NormGrads one = layer_norm_kernels(dy, x, gamma_b, rows, cols, 1);
    const NormGrads two = layer_norm_kernels(dy, x, gamma_b, rows, cols, 2);
    check_close(one.dx, want.dx, 1e-4, 1e-3, "dx");
    check_close(one.dgamma, want.dgamma, 1.0 / 128, 0.0, "dgamma (one bf16 rounding)");
    check_close(one.dbeta, want.dbeta, 1.0 / 128, 0.0, "dbeta (one bf16 rounding)");
    CHECK(one.dgamma == two.dgamma);
    CHECK(one.dbeta == two.dbeta);
  }
}

TEST_CASE("rms_norm_backward in row chunks matches F64 and gives the same bits on 1 and 2 threads",
          "[backend][cpu][norm]") {
  const std::int64_t rows = 1000, cols = 67;
  const auto x = random_floats(static_cast<std::size_t>(rows * cols), 21, -2.0, 3.0);
  const auto dy = random_floats(x.size(), 22, -1.0, 1.0);
  const auto weight = random_floats(static_cast<std::size_t>(cols), 23, 0.5, 1.5);
  std::vector<float> dx_want(x.size());
  std::vector<double> dweight_want(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    double squares = 0, sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) squares += static_cast<double>(x[r * cols + c]) * x[r * cols + c];
    const double rstd = 1.0 / std::sqrt(squares / cols + 1e-6);
    for (std::int64_t c = 0; c < cols; ++c) {
      sum_g_xhat += dy[r * cols + c] * weight[c] * x[r * cols + c] * rstd;
      dweight_want[c] += dy[r * cols + c] * x[r * cols + c] * rstd;
    }
    for (std::int64_t c = 0; c < cols; ++c)
      dx_want[r * cols + c] = static_cast<float>(
          rstd * (dy[r * cols + c] * weight[c] - x[r * cols + c] * rstd * sum_g_xhat / static_cast<double>(cols)));
  }
  auto run = [&](int threads) {
    const int before = trainmem::num_threads();
    trainmem::set_num_threads(threads);
    std::vector<float> y(x.size()), rstd(static_cast<std::size_t>(rows)), dx(x.size()), dweight(weight.size());
    kernels::rms_norm(x.data(), weight.data(), y.data(), rstd.data(), rows, cols, 1e-6);
    kernels::rms_norm_backward(dy.data(), x.data(), weight.data(), rstd.data(), dx.data(), dweight.data(), rows, cols,
                               trainmem::cpu::Backend::default_instance().allocator());
    trainmem::set_num_threads(before);
    return std::pair{dx, dweight};
  };
  const auto [dx1, dw1] = run(1);
  const auto [dx2, dw2] = run(2);
  check_close(dx1, dx_want, 1e-4, 1e-3, "dx");
  check_close(dw1, dweight_want, 1e-5, 1.0, "dweight");
  CHECK(dx1 == dx2);
  CHECK(dw1 == dw2);
}

TEST_CASE("a row's statistics are the same bits for a bf16 row and its f32 widening, at every row length",
          "[cpu][norm]") {
  // The row sums' order is fixed by the code (16 lanes, or in order below 16), not by the
  // vector width the compiler picks per instantiation: that order once differed between
  // the bf16 and f32 kernels on an Intel Xeon and gave rstd values 1 ulp apart.
  for (std::int64_t cols : {1, 3, 15, 16, 17, 31, 48, 128, 129}) {
    INFO("cols " << cols);
    const std::int64_t rows = 5;
    std::vector<trainmem::BFloat16> xb;
    std::vector<float> xf;
    for (std::int64_t i = 0; i < rows * cols; ++i) {
      xb.push_back(trainmem::BFloat16(static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 3.0)));
      xf.push_back(static_cast<float>(xb.back()));
    }
    const std::vector<float> gamma(static_cast<std::size_t>(cols), 1.0f), beta(static_cast<std::size_t>(cols), 0.0f);
    std::vector<trainmem::BFloat16> yb(xb.size());
    std::vector<float> yf(xf.size()), mean_b(rows), rstd_b(rows), mean_f(rows), rstd_f(rows);
    kernels::layer_norm(xb.data(), gamma.data(), beta.data(), yb.data(), mean_b.data(), rstd_b.data(), rows, cols,
                        1e-5);
    kernels::layer_norm(xf.data(), gamma.data(), beta.data(), yf.data(), mean_f.data(), rstd_f.data(), rows, cols,
                        1e-5);
    CHECK(mean_b == mean_f);
    CHECK(rstd_b == rstd_f);
    for (std::int64_t r = 0; r < rows; ++r) {  // and they are the row's mean, to f32 rounding
      double mean = 0;
      for (std::int64_t c = 0; c < cols; ++c) mean += xf[static_cast<std::size_t>(r * cols + c)];
      mean /= static_cast<double>(cols);
      CHECK(std::abs(mean_f[static_cast<std::size_t>(r)] - mean) <= 1e-6 * 3.0);
    }
  }
}

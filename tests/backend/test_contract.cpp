// tests/backend/test_contract.cpp — the backend contract: the concepts, the shared row formulas, one validation.
//
// The row functors of core/row_math.hpp are what both backends compute per element, so
// they are checked here on their own against FP64 references written from the
// definitions (a softmax Jacobian, a layer-norm Jacobian by central differences, the
// cross-entropy closed form); the Philox-to-uniform mapping against its definition.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "error_matchers.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::testing::ErrorContains;

static_assert(tmem::Backend<B>);
static_assert(tmem::HasGemmBias<B>);
static_assert(!tmem::HasOffload<B>, "the CPU backend keeps offloaded tensors where they are");

TEST_CASE("row math: softmax backward is the softmax Jacobian applied to dy", "[backend][contract][row_math]") {
  const std::vector<double> x = {0.3, -1.2, 2.0, 0.5}, dy = {0.7, -0.1, 0.4, 1.5};
  std::vector<double> y(x.size()), log_y(x.size());
  double sum = 0;
  for (double v : x) sum += std::exp(v);
  for (std::size_t i = 0; i < x.size(); ++i) {
    y[i] = std::exp(x[i]) / sum;
    log_y[i] = std::log(y[i]);
  }
  for (const bool log_output : {false, true}) {
    const tmem::math::SoftmaxBackwardRow row{log_output};
    const std::vector<double>& saved = log_output ? log_y : y;
    double dot = 0;
    for (std::size_t i = 0; i < x.size(); ++i) dot += row.term(dy[i], saved[i]);
    for (std::size_t i = 0; i < x.size(); ++i) {
      // d out_j / d x_i: softmax y_j (delta_ij - y_i); log-softmax delta_ij - y_i.
      double expected = 0;
      for (std::size_t j = 0; j < x.size(); ++j) {
        const double delta = i == j ? 1.0 : 0.0;
        expected += dy[j] * (log_output ? delta - y[i] : y[j] * (delta - y[i]));
      }
      CHECK(row(dy[i], saved[i], dot) == Approx(expected).epsilon(1e-12));
    }
  }
}

TEST_CASE("row math: layer-norm dx matches central differences of sum(dy * y)", "[backend][contract][row_math]") {
  const std::vector<double> x = {0.3, -1.2, 2.0, 0.5, -0.7}, dy = {0.7, -0.1, 0.4, 1.5, -0.9},
                            gamma = {1.1, 0.9, -0.5, 2.0, 0.3};
  const double eps = 1e-5;
  const auto n = static_cast<double>(x.size());
  auto objective = [&](const std::vector<double>& v) {  // sum_c dy_c * gamma_c * xhat_c
    double mean = 0, var = 0;
    for (double e : v) mean += e / n;
    for (double e : v) var += (e - mean) * (e - mean) / n;
    double total = 0;
    for (std::size_t c = 0; c < v.size(); ++c) total += dy[c] * gamma[c] * (v[c] - mean) / std::sqrt(var + eps);
    return total;
  };
  double mean = 0, var = 0;
  for (double e : x) mean += e / n;
  for (double e : x) var += (e - mean) * (e - mean) / n;
  const tmem::math::LayerNormBackwardRow<double> row{mean, 1.0 / std::sqrt(var + eps)};
  double sum_g = 0, sum_g_xhat = 0;
  for (std::size_t c = 0; c < x.size(); ++c) row.add_terms(dy[c], x[c], gamma[c], sum_g, sum_g_xhat);
  for (std::size_t c = 0; c < x.size(); ++c) {
    std::vector<double> up = x, down = x;
    const double h = 1e-6;
    up[c] += h;
    down[c] -= h;
    const double expected = (objective(up) - objective(down)) / (2 * h);
    CHECK(row(dy[c], x[c], gamma[c], sum_g, sum_g_xhat, 1.0 / n) == Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE("row math: cross-entropy backward is dloss / rows * (softmax - onehot)", "[backend][contract][row_math]") {
  const std::vector<double> logits = {0.3, -1.2, 2.0};
  double sum = 0;
  for (double v : logits) sum += std::exp(v);
  const double lse = std::log(sum), dloss = 2.0;
  const std::int64_t rows = 4;
  const tmem::math::CrossEntropyBackwardRow<double> row{tmem::math::cross_entropy_scale(dloss, rows), lse, 1};
  for (std::int64_t c = 0; c < 3; ++c) {
    const double p = std::exp(logits[c]) / sum;
    CHECK(row(logits[c], c) == Approx(dloss / rows * (p - (c == 1 ? 1.0 : 0.0))).epsilon(1e-12));
  }
}

TEST_CASE("rng: a draw maps to 0 <= u < 1 by its top 24 bits", "[backend][contract][rng]") {
  CHECK(tmem::detail::uniform_from_bits(0u) == 0.0f);
  CHECK(tmem::detail::uniform_from_bits(0xffffffffu) == 1.0f - 1.0f / 16777216.0f);
  CHECK(tmem::detail::uniform_from_bits(0x80000000u) == 0.5f);
  CHECK(tmem::detail::uniform_from_bits(0x000000ffu) == 0.0f);  // the low 8 bits are dropped
  const tmem::RngState rng{42, 8};
  for (std::uint64_t i = 0; i < 8; ++i)
    CHECK(tmem::detail::random_uniform(rng, i) == tmem::detail::uniform_from_bits(tmem::detail::random_bits(rng, i)));
}

TEST_CASE("validation: the optimizer, not the backend, refuses a 16-bit parameter", "[backend][contract]") {
  B& be = B::default_instance();
  auto w = tmem::Var<B>::parameter(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{1.0, 2.0, 3.0},
                                                              tmem::DType::F16, tmem::MemCategory::Parameter, be),
                                   "w");
  w.set_grad(tmem::Tensor<B>::from_host(tmem::Shape{3}, std::vector<double>{0.5, 0.5, 0.5}, tmem::DType::F16,
                                        tmem::MemCategory::Gradient, be));
  tmem::optim::SGD<B> sgd({w}, {0.1});
  CHECK_THROWS_MATCHES(sgd.step(), tmem::Error, ErrorContains("optimizer: 'w' is f16"));
  CHECK(w.value().to_host<double>() == std::vector<double>{1.0, 2.0, 3.0});
}

TEST_CASE("validation: a backend precondition names itself a library bug", "[backend][contract]") {
  CHECK_THROWS_MATCHES(tmem::detail::expects(false, "gemm_bias: bias of n = ", 4, " elements"), tmem::Error,
                       ErrorContains("internal error: gemm_bias: bias of n = 4 elements"));
  CHECK_NOTHROW(tmem::detail::expects(true, "never formatted"));
}

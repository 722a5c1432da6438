// tests/amp/test_master_weights.cpp — why FP32 masters exist, their memory, stochastic rounding.
//
// References: bf16 rounding by counting significant bits (amp_reference.hpp), the f32
// update written out in closed form, Philox from the paper (philox_reference.hpp), and
// the binomial spread of stochastic rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include <trainmem/amp/master_weights.hpp>
#include <trainmem/optim/adamw.hpp>
#include <trainmem/optim/sgd.hpp>
#include <trainmem/trainmem.hpp>

#include "amp_reference.hpp"
#include "error_matchers.hpp"
#include "philox_reference.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;

namespace {

tmem::Var<B> parameter(std::vector<double> values, DType dtype = DType::F32, B& backend = B::default_instance()) {
  const auto n = static_cast<std::int64_t>(values.size());
  return tmem::Var<B>::parameter(
      tmem::Tensor<B>::from_host(tmem::Shape{n}, values, dtype, tmem::MemCategory::Parameter, backend), "w");
}

void set_constant_grad(const tmem::Var<B>& p, double value, DType dtype) {
  p.set_grad(tmem::Tensor<B>::from_host(p.shape(), std::vector<double>(static_cast<std::size_t>(p.numel()), value),
                                        dtype, tmem::MemCategory::Gradient, p.value().backend()));
}

}  // namespace

TEST_CASE("updates below bf16's resolution: a pure-bf16 weight stays put, an f32 master moves", "[amp][master]") {
  constexpr int kSteps = 100;
  constexpr double kLr = 1.0, kGrad = 1e-3;  // lr * g = 1e-3 < 2^-9, half of bf16's step just below 1
  const double grad_bf16 = tmem::testing::round_to_significant_bits(kGrad, 8);  // the gradient bf16 stores

  // Pure bf16: the weight, the gradient and the update all in bf16 (trainmem's bf16 ops).
  tmem::Tape<B> tape;
  auto pure = tape.input(tmem::Tensor<B>::from_host(tmem::Shape{4}, std::vector<double>(4, 1.0), DType::BF16));
  auto step_bf16 =
      tape.input(tmem::Tensor<B>::from_host(tmem::Shape{4}, std::vector<double>(4, kLr * kGrad), DType::BF16));
  for (int k = 0; k < kSteps; ++k) pure = tmem::sub(pure, step_bf16);
  CHECK(pure.dtype() == DType::BF16);
  CHECK(pure.value().to_host<double>() == std::vector<double>(4, 1.0));              // every update rounded away
  CHECK(tmem::testing::round_to_significant_bits(1.0 - kLr * grad_bf16, 8) == 1.0);  // why

  // f32 masters behind bf16 model weights, SGD over them.
  auto weight = parameter(std::vector<double>(4, 1.0));
  tmem::amp::MasterWeights<B> masters({weight}, {.model_dtype = DType::BF16});
  tmem::optim::SGD<B> sgd({weight}, {.lr = kLr});
  masters.attach(sgd);
  REQUIRE(weight.dtype() == DType::BF16);
  for (int k = 0; k < kSteps; ++k) {
    set_constant_grad(weight, kGrad, DType::BF16);  // a bf16 model's gradient is bf16
    sgd.step();
  }
  float expected_master = 1.0f;  // the same updates in f32, closed form
  for (int k = 0; k < kSteps; ++k) expected_master -= static_cast<float>(kLr * grad_bf16);
  const auto master = masters.master(0).to_host<double>();
  const auto model = weight.value().to_host<double>();
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(master[i] == Approx(static_cast<double>(expected_master)).epsilon(1e-7));
    CHECK(master[i] == Approx(1.0 - kSteps * kLr * grad_bf16).epsilon(1e-5));
    CHECK(model[i] == tmem::testing::round_to_significant_bits(master[i], 8));
    CHECK(model[i] < 0.91);  // moved by ~0.1 where pure bf16 did not move at all
  }
  WARN("after " << kSteps << " updates of " << kLr * kGrad << ": pure bf16 weight " << pure.value().to_host<double>()[0]
                << ", bf16 weight with f32 master " << model[0] << " (master " << master[0] << ")");
}

TEST_CASE("master weights: memory categories and the optimizer writing the model copy", "[amp][master]") {
  B backend;  // its own MemoryStats
  const std::int64_t n = 1000;
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = std::sin(0.37 * static_cast<double>(i));
  auto weight = parameter(values, DType::F32, backend);
  auto& stats = backend.memory();
  CHECK(stats.live(tmem::MemCategory::Parameter) == 4 * n);

  tmem::amp::MasterWeights<B> masters({weight}, {.model_dtype = DType::F16});
  CHECK(stats.live(tmem::MemCategory::Parameter) == 2 * n);
  CHECK(stats.live(tmem::MemCategory::MasterWeight) == 4 * n);
  CHECK(weight.dtype() == DType::F16);
  CHECK(masters.master(0).to_host<double>() == tmem::Tensor<B>::from_host(tmem::Shape{n}, values).to_host<double>());
  const auto model0 = weight.value().to_host<double>();
  for (std::size_t i = 0; i < model0.size(); i += 97)
    CHECK(model0[i] == tmem::testing::round_to_significant_bits(static_cast<float>(values[i]), 11));

  tmem::optim::AdamW<B> adamw({weight}, {.lr = 1e-3});
  masters.attach(adamw);
  set_constant_grad(weight, 0.5, DType::F16);
  const auto version = weight.value().version();
  adamw.step();
  CHECK(weight.value().version() > version);                           // cast caches recast the model copy
  CHECK(stats.live(tmem::MemCategory::OptimizerState) >= 8 * n);       // two f32 moments
  CHECK(stats.live(tmem::MemCategory::OptimizerState) < 8 * n + 256);  // plus a few scalars
  CHECK(stats.live(tmem::MemCategory::MasterWeight) == 4 * n);
  // First AdamW step: m_hat / sqrt(v_hat) = sign(g), so master = w (1 - lr wd) - lr.
  const auto master = masters.master(0).to_host<double>();
  const auto model = weight.value().to_host<double>();
  for (std::size_t i = 0; i < master.size(); i += 37) {
    const double expected = static_cast<double>(static_cast<float>(values[i])) * (1 - 1e-3 * 1e-2) - 1e-3;
    CHECK(master[i] == Approx(expected).margin(1e-6));
    CHECK(model[i] == tmem::testing::round_to_significant_bits(master[i], 11));
  }

  // Already-16-bit parameters get masters widened from them.
  auto bf16_weight = parameter({0.5, 0.25, 3.0}, DType::BF16, backend);
  tmem::amp::MasterWeights<B> from_bf16({bf16_weight});
  CHECK(from_bf16.master(0).dtype() == DType::F32);
  CHECK(from_bf16.master(0).to_host<double>() == std::vector<double>{0.5, 0.25, 3.0});
  CHECK_THROWS_AS(tmem::amp::MasterWeights<B>({bf16_weight}, {.model_dtype = DType::F16}), tmem::Error);
  CHECK_THROWS_AS(tmem::amp::MasterWeights<B>({weight}, {.model_dtype = DType::F32}), tmem::Error);
}

TEST_CASE("stochastic rounding of the bf16 copy: unbiased, counter-based, reproducible", "[amp][master]") {
  constexpr std::int64_t kN = 1 << 16;
  constexpr std::uint64_t kSeed = 42;
  // v = 1 + 77 * 2^-15 lies 77/256 of the way from bf16's 1 to its next value 1 + 2^-7.
  const double v = 1.0 + 77.0 * std::ldexp(1.0, -15), low = 1.0, high = 1.0 + std::ldexp(1.0, -7);
  const double p_up = 77.0 / 256.0;
  auto make = [&](std::uint64_t seed) {
    auto w = parameter(std::vector<double>(kN, v));
    auto masters = std::make_shared<tmem::amp::MasterWeights<B>>(
        std::vector<tmem::Var<B>>{w},
        tmem::amp::MasterWeightsOptions{DType::BF16, tmem::RoundingMode::Stochastic, seed});
    auto sgd = std::make_shared<tmem::optim::SGD<B>>(std::vector<tmem::Var<B>>{w}, tmem::optim::SgdOptions{.lr = 0.0});
    masters->attach(*sgd);
    return std::tuple{w, masters, sgd};
  };
  auto step = [](auto& run) {
    auto& [w, masters, sgd] = run;
    set_constant_grad(w, 0.0, DType::BF16);
    sgd->step();  // the master stays v; the pass rewrites the copy
    return w.value().template to_host<double>();
  };
  auto run = make(kSeed);
  const auto first = step(run);
  const auto second = step(run);

  // Element i rounds up exactly when its Philox draw's low 16 bits plus v's 16 dropped
  // bits carry: draw i of the stream (seed, 0) on the first step, (seed, kN) on the second.
  const std::uint32_t dropped = 77u << 8;  // v's f32 bits below bf16's
  std::int64_t ups_first = 0, ups_second = 0, mismatches = 0;
  for (std::int64_t i = 0; i < kN; ++i) {
    const auto draw1 = tmem::testing::philox_stream_reference(kSeed, 0, static_cast<std::uint64_t>(i));
    const auto draw2 = tmem::testing::philox_stream_reference(kSeed, kN, static_cast<std::uint64_t>(i));
    const double expected1 = dropped + (draw1 & 0xffffu) >= 0x10000u ? high : low;
    const double expected2 = dropped + (draw2 & 0xffffu) >= 0x10000u ? high : low;
    mismatches +=
        (first[static_cast<std::size_t>(i)] != expected1) + (second[static_cast<std::size_t>(i)] != expected2);
    ups_first += first[static_cast<std::size_t>(i)] == high;
    ups_second += second[static_cast<std::size_t>(i)] == high;
  }
  CHECK(mismatches == 0);
  const double sigma = std::sqrt(p_up * (1 - p_up) / kN);
  const double frac1 = static_cast<double>(ups_first) / kN, frac2 = static_cast<double>(ups_second) / kN;
  WARN("stochastic rounding of " << v << ": fraction rounded up " << frac1 << " and " << frac2 << " (expected " << p_up
                                 << " +- " << sigma << "); nearest-even would give 0");
  CHECK(std::fabs(frac1 - p_up) < 5 * sigma);
  CHECK(std::fabs(frac2 - p_up) < 5 * sigma);
  CHECK(first != second);  // a new stream each step

  auto rerun = make(kSeed);
  CHECK(step(rerun) == first);  // reproducible
  auto other = make(kSeed + 1);
  CHECK(step(other) != first);

  auto w16 = parameter({1.0});
  CHECK_THROWS_AS(tmem::amp::MasterWeights<B>({w16}, {DType::F16, tmem::RoundingMode::Stochastic, 0}), tmem::Error);
}

TEST_CASE("MasterWeights and attach check everything before they change a parameter or an optimizer",
          "[amp][master][errors]") {
  using tmem::testing::ErrorContains;
  B backend;
  auto named = [&](std::vector<double> values, DType dtype, const char* name) {
    const auto n = static_cast<std::int64_t>(values.size());
    return tmem::Var<B>::parameter(
        tmem::Tensor<B>::from_host(tmem::Shape{n}, values, dtype, tmem::MemCategory::Parameter, backend), name);
  };
  // The second parameter is f64: the first keeps its f32 value and its gradient.
  const auto a = named({1.1, 2.2}, DType::F32, "a"), b = named({3.0}, DType::F64, "b");
  set_constant_grad(a, 1.0, DType::F32);
  CHECK_THROWS_MATCHES(tmem::amp::MasterWeights<B>({a, b}), tmem::Error, ErrorContains("'b' is f64"));
  CHECK(a.dtype() == DType::F32);
  CHECK(a.value().to_host<double>() ==
        tmem::Tensor<B>::from_host(tmem::Shape{2}, std::vector<double>{1.1, 2.2}).to_host<double>());
  CHECK(a.grad().defined());
  CHECK_THROWS_MATCHES(tmem::amp::MasterWeights<B>({a, a}), tmem::Error, ErrorContains("share values"));
  CHECK(a.dtype() == DType::F32);
  // 70000 is beyond f16's largest finite value (65504): its f16 copy would be inf and every
  // step would overflow. bf16 holds it (as 70144, the nearest).
  const auto big = named({1.0, 70000.0}, DType::F32, "big");
  CHECK_THROWS_MATCHES(tmem::amp::MasterWeights<B>({a, big}, {.model_dtype = DType::F16}), tmem::Error,
                       ErrorContains("'big' holds values beyond f16's largest finite one (65504)"));
  CHECK(a.dtype() == DType::F32);
  CHECK(big.dtype() == DType::F32);
  CHECK(big.value().to_host<double>() == std::vector<double>{1.0, 70000.0});
  tmem::amp::MasterWeights<B> wide({big}, {.model_dtype = DType::BF16});
  CHECK(big.value().to_host<double>() == std::vector<double>{1.0, 70144.0});

  // attach: the second parameter was stepped already, so neither gets a master.
  const auto c = named({1.0, 2.0}, DType::F32, "c"), d = named({3.0}, DType::F32, "d");
  tmem::optim::SGD<B> sgd({c, d}, {.lr = 0.1});
  set_constant_grad(d, 1.0, DType::F32);
  sgd.step();
  tmem::amp::MasterWeights<B> masters({c, d});
  CHECK_THROWS_MATCHES(masters.attach(sgd), tmem::Error, ErrorContains("'d' has been stepped already"));
  CHECK_FALSE(sgd.entries()[0].master.defined());
  CHECK_FALSE(sgd.entries()[1].master.defined());
  // And a second set of masters over the same optimizer is refused, not swapped in.
  tmem::optim::SGD<B> fresh({c}, {.lr = 0.1});
  masters.attach(fresh);
  tmem::amp::MasterWeights<B> again({c});
  CHECK_THROWS_MATCHES(again.attach(fresh), tmem::Error, ErrorContains("'c' has a master already"));
  CHECK(fresh.entries()[0].master.same_storage(masters.master(0)));
}

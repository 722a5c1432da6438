// tests/amp/test_fp8_recipe.cpp — the FP8 recipe: delayed scaling and linear's FP8 GEMMs.
//
// References: the delayed-scaling rule in closed form on host floats (amax = max |t| of
// each role's tensor, scale = (fp8_max / amax) / 2^margin, the history a ring of H steps,
// max or most_recent); linear's outputs and gradients against host GEMMs in double over
// operands quantized by the Float8 types' own conversions, times the scale inverses,
// rounded to bf16 (within one bf16 rounding: the order of the f32 sum is the kernel's).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_data.hpp"
#include "trainmem/trainmem.hpp"

namespace tmem = trainmem;
using B = tmem::cpu::Backend;
using tmem::DType;
using tmem::Tensor;
using tmem::Var;
using tmem::amp::Fp8Role;

namespace fp8_recipe_test {
namespace {

constexpr std::int64_t kRows = 6, kIn = 8, kOut = 5;

float amax_of(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

/// Host tensor values; `gain` sets their amax.
std::vector<float> values(std::size_t n, std::uint64_t seed, double gain) {
  std::vector<float> out;
  for (double v : tmem::testing::random_values(n, seed)) out.push_back(static_cast<float>(gain * v));
  return out;
}

struct OneLinear {
  OneLinear()
      : w(Var<B>::parameter(Tensor<B>::from_host({kOut, kIn}, values(kOut * kIn, 1, 0.6)), "w")),
        b(Var<B>::parameter(Tensor<B>::from_host({kOut}, values(kOut, 2, 0.1)), "b")) {}
  Var<B> w, b;
};

/// linear(x, w, b) under FP8, then loss = sum(y * c): dy = c. Returns y (as f32).
std::vector<float> fp8_step(OneLinear& m, tmem::amp::Fp8Scaling<B>& scaling, const std::vector<float>& x,
                            const std::vector<float>& c) {
  tmem::Tape<B> tape;
  Var<B> y, loss;
  {
    tmem::amp::Fp8Autocast guard(scaling);
    y = tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, x)), m.w, m.b);
    loss = tmem::sum(tmem::mul(y, tape.input(Tensor<B>::from_host({kRows, kOut}, c, DType::BF16))));
  }
  tape.backward(loss);
  return y.value().to_host<float>();
}

float role_value(const Tensor<B>& per_role, const tmem::amp::Fp8Scaling<B>& s, Fp8Role role) {
  return per_role.to_host<float>()[s.role_index(0, role)];
}

float rule(float amax, float fp8_max, int margin = 0) { return (fp8_max / amax) / std::ldexp(1.0f, margin); }

}  // namespace

TEST_CASE("delayed scaling: amax per role, the history ring and both rules in closed form", "[amp][fp8]") {
  for (const auto amax_rule : {tmem::amp::AmaxRule::Max, tmem::amp::AmaxRule::MostRecent}) {
    INFO("rule " << tmem::amp::name_of(amax_rule));
    OneLinear m;
    tmem::amp::Fp8Scaling<B> s({m.w, m.b}, {.history_length = 2, .margin = 1, .rule = amax_rule});
    CHECK(s.weight_count() == 1);  // the bias stays 16-bit
    const float w_amax = amax_of(m.w.value().to_host<float>());
    // Three steps whose input and gradient amaxes are 3, then 1.5, then 0.75 times smaller.
    std::vector<float> x_amax, dy_amax;
    for (int k = 0; k < 3; ++k) {
      const auto x = values(kRows * kIn, 10 + k, 3.0 / (1 << k)), c = values(kRows * kOut, 20 + k, 1e-3 / (1 << k));
      std::vector<float> c_bf16;
      for (float v : c) c_bf16.push_back(static_cast<float>(tmem::BFloat16(v)));
      fp8_step(m, s, x, c);
      x_amax.push_back(amax_of(x));
      dy_amax.push_back(amax_of(c_bf16));
      CHECK(s.amax_slot(s.role_index(0, Fp8Role::Input)).to_host<float>()[0] == x_amax.back());
      CHECK(s.amax_slot(s.role_index(0, Fp8Role::GradOutput)).to_host<float>()[0] == dy_amax.back());
      // The weight is quantized once per generation: recorded on the first step of each.
      CHECK(s.amax_slot(s.role_index(0, Fp8Role::Weight)).to_host<float>()[0] == w_amax);
      s.update(true);
      const std::size_t last = x_amax.size() - 1, first_kept = last == 0 ? 0 : last - 1;
      const bool max = amax_rule == tmem::amp::AmaxRule::Max;
      const float x_used = max ? std::max(x_amax[first_kept], x_amax[last]) : x_amax[last];
      const float dy_used = max ? std::max(dy_amax[first_kept], dy_amax[last]) : dy_amax[last];
      CHECK(role_value(s.scales()->scale, s, Fp8Role::Input) == rule(x_used, 448.0f, 1));
      CHECK(role_value(s.scales()->scale, s, Fp8Role::Weight) == rule(w_amax, 448.0f, 1));
      CHECK(role_value(s.scales()->scale, s, Fp8Role::GradOutput) == rule(dy_used, 57344.0f, 1));
      CHECK(role_value(s.scales()->scale_inv, s, Fp8Role::Input) == 1.0f / rule(x_used, 448.0f, 1));
      CHECK(s.amax_slot(0).to_host<float>()[0] == 0.0f);  // the running amax starts again
      CHECK(s.generation() == static_cast<std::uint64_t>(k + 1));
    }
    // History [H = 2, R]: row (position - 1) holds the last step, the other one the step before.
    const auto history = s.history().to_host<float>();
    const auto r = static_cast<std::int64_t>(s.role_count());
    const std::int64_t last_row = (s.position() + 1) % 2;
    CHECK(history[static_cast<std::size_t>(last_row * r) + s.role_index(0, Fp8Role::Input)] == x_amax[2]);
    CHECK(history[static_cast<std::size_t>((1 - last_row) * r) + s.role_index(0, Fp8Role::Input)] == x_amax[1]);
  }
}

TEST_CASE("a skipped step drops its amaxes and leaves history, scales and generation as they were", "[amp][fp8]") {
  OneLinear m;
  tmem::amp::Fp8Scaling<B> s({m.w, m.b}, {.history_length = 4});
  fp8_step(m, s, values(kRows * kIn, 3, 2.0), values(kRows * kOut, 4, 1.0));
  s.update(true);
  const auto history = s.history().to_host<float>();
  const auto scale = s.scales()->scale.to_host<float>(), scale_inv = s.scales()->scale_inv.to_host<float>();
  const auto generation = s.generation();
  const auto position = s.position();
  // A step whose input holds an inf: amax inf, then skipped.
  auto poisoned = values(kRows * kIn, 5, 2.0);
  poisoned[7] = std::numeric_limits<float>::infinity();
  fp8_step(m, s, poisoned, values(kRows * kOut, 6, 1.0));
  CHECK(std::isinf(s.amax_slot(s.role_index(0, Fp8Role::Input)).to_host<float>()[0]));
  s.update(false);
  CHECK(s.history().to_host<float>() == history);
  CHECK(s.scales()->scale.to_host<float>() == scale);
  CHECK(s.scales()->scale_inv.to_host<float>() == scale_inv);
  CHECK(s.generation() == generation);
  CHECK(s.position() == position);
  CHECK(s.amax_slot(s.role_index(0, Fp8Role::Input)).to_host<float>()[0] == 0.0f);
  // An inf amax that did enter the history (a step the caller took anyway) keeps the old scale.
  fp8_step(m, s, poisoned, values(kRows * kOut, 6, 1.0));
  s.update(true);
  CHECK(role_value(s.scales()->scale, s, Fp8Role::Input) == scale[s.role_index(0, Fp8Role::Input)]);
}

TEST_CASE("FP8 linear: y, dx and dW are the GEMMs of the quantized operands times the scale inverses", "[amp][fp8]") {
  OneLinear m;
  tmem::amp::Fp8Scaling<B> s({m.w, m.b}, {.history_length = 1});
  const auto x = values(kRows * kIn, 30, 5.0), c = values(kRows * kOut, 31, 0.02);
  fp8_step(m, s, x, c);
  s.update(true);  // scales from this data's amaxes: far from 1
  m.w.zero_grad();
  m.b.zero_grad();
  tmem::Tape<B> tape;
  Var<B> xv = tape.input(Tensor<B>::from_host({kRows, kIn}, x), true);
  Var<B> y;
  {
    tmem::amp::Fp8Autocast guard(s);
    y = tmem::linear(xv, m.w, m.b);
    CHECK(y.dtype() == DType::BF16);
    tape.backward(tmem::sum(tmem::mul(y, tape.input(Tensor<B>::from_host({kRows, kOut}, c, DType::BF16)))));
  }
  const auto scale = s.scales()->scale.to_host<float>(), scale_inv = s.scales()->scale_inv.to_host<float>();
  const auto sx = scale[s.role_index(0, Fp8Role::Input)], sw = scale[s.role_index(0, Fp8Role::Weight)],
             sg = scale[s.role_index(0, Fp8Role::GradOutput)];
  const auto ix = scale_inv[s.role_index(0, Fp8Role::Input)], iw = scale_inv[s.role_index(0, Fp8Role::Weight)],
             ig = scale_inv[s.role_index(0, Fp8Role::GradOutput)];
  CHECK(sx != 1.0f);
  CHECK(sg != 1.0f);
  const auto q43 = [](float v, float sc) { return static_cast<double>(static_cast<float>(tmem::Float8E4M3(v * sc))); };
  const auto q52 = [](float v, float sc) { return static_cast<double>(static_cast<float>(tmem::Float8E5M2(v * sc))); };
  const auto w = m.w.value().to_host<float>(), bias = m.b.value().to_host<float>();
  std::vector<float> dy;
  for (float v : c) dy.push_back(static_cast<float>(tmem::BFloat16(v)));
  const auto near_bf16 = [](double got, double want) {
    return std::abs(got - want) <= std::ldexp(std::abs(want), -7) + 1e-30;  // one bf16 rounding (2^-8), doubled
  };
  const auto yv = y.value().to_host<float>();
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t o = 0; o < kOut; ++o) {
      double acc = 0.0;
      for (std::int64_t k = 0; k < kIn; ++k) acc += q43(x[i * kIn + k], sx) * q43(w[o * kIn + k], sw);
      const double want = static_cast<float>(tmem::BFloat16(static_cast<float>(acc * ix * iw))) +
                          static_cast<double>(static_cast<float>(tmem::BFloat16(bias[o])));
      INFO("y[" << i << ", " << o << "]");
      CHECK(near_bf16(yv[i * kOut + o], want));
    }
  const auto dx = xv.grad().to_host<float>(), dw = m.w.grad().to_host<float>();
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t k = 0; k < kIn; ++k) {
      double acc = 0.0;
      for (std::int64_t o = 0; o < kOut; ++o) acc += q52(dy[i * kOut + o], sg) * q43(w[o * kIn + k], sw);
      INFO("dx[" << i << ", " << k << "]");
      CHECK(near_bf16(dx[i * kIn + k], acc * ig * iw));
    }
  for (std::int64_t o = 0; o < kOut; ++o)
    for (std::int64_t k = 0; k < kIn; ++k) {
      double acc = 0.0;
      for (std::int64_t i = 0; i < kRows; ++i) acc += q52(dy[i * kOut + o], sg) * q43(x[i * kIn + k], sx);
      INFO("dW[" << o << ", " << k << "]");
      CHECK(near_bf16(dw[o * kIn + k], acc * ig * ix));
    }
  // The bias gradient is dy's row sum in bf16, as without FP8.
  const auto db = m.b.grad().to_host<float>();
  for (std::int64_t o = 0; o < kOut; ++o) {
    double acc = 0.0;
    for (std::int64_t i = 0; i < kRows; ++i) acc += dy[i * kOut + o];
    CHECK(near_bf16(db[o], acc));
  }
}

TEST_CASE("the quantized weight is made once per weight version and scale generation", "[amp][fp8]") {
  OneLinear m;
  tmem::amp::Fp8Scaling<B> s({m.w, m.b}, {.history_length = 2});
  const auto x = values(kRows * kIn, 40, 1.0), c = values(kRows * kOut, 41, 1.0);
  fp8_step(m, s, x, c);
  fp8_step(m, s, x, c);  // a second micro-batch: the same generation, the same weight
  CHECK(s.weight_quantizations() == 1);
  s.update(true);  // a new generation misses
  fp8_step(m, s, x, c);
  CHECK(s.weight_quantizations() == 2);
  {
    tmem::NoGradGuard no_grad;  // an optimizer step writes the weight in place: a new version misses
    B::default_instance().map(tmem::math::Scale{0.5}, m.w.value(), m.w.value());
    m.w.value().bump_version();
  }
  fp8_step(m, s, x, c);
  CHECK(s.weight_quantizations() == 3);
}

TEST_CASE("TrainStep with fp8: amax is the max over micro-batches, and the scales follow it", "[amp][fp8]") {
  OneLinear m;
  tmem::optim::SGD<B> sgd({m.w, m.b}, {.lr = 0.0});
  tmem::amp::TrainStepOptions options{.precision = DType::BF16, .micro_batches = 2};
  options.fp8 = tmem::amp::DelayedScaling{.history_length = 1};
  tmem::amp::TrainStep<B> step(sgd, options);
  REQUIRE(step.fp8() != nullptr);
  const std::vector<std::vector<float>> xs = {values(kRows * kIn, 50, 1.0), values(kRows * kIn, 51, 4.0)};
  tmem::Tape<B> tape;
  step.run([&](int micro) {
    return tmem::sum(
        tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, xs[static_cast<std::size_t>(micro)])), m.w, m.b));
  });
  const float want = std::max(amax_of(xs[0]), amax_of(xs[1]));
  const auto& s = *step.fp8();
  CHECK(s.history().to_host<float>()[s.role_index(0, Fp8Role::Input)] == want);
  CHECK(role_value(s.scales()->scale, s, Fp8Role::Input) == rule(want, 448.0f));
}

TEST_CASE("FP8 refuses what it cannot run, naming it", "[amp][fp8][errors]") {
  OneLinear m;
  const Var<B> other = Var<B>::parameter(Tensor<B>::from_host({kOut, kIn}, values(kOut * kIn, 60, 1.0)), "other");
  tmem::amp::Fp8Scaling<B> s({m.w, m.b});
  tmem::Tape<B> tape;
  tmem::amp::Fp8Autocast guard(s);
  CHECK_THROWS_WITH(tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, values(kRows * kIn, 61, 1.0))), other),
                    Catch::Contains("linear: weight 'other'") && Catch::Contains("does not hold"));
  CHECK_THROWS_WITH(tmem::amp::Fp8Scaling<B>({m.w, m.w}), Catch::Contains("two parameters are named 'w'"));
  CHECK_THROWS_WITH(tmem::amp::Fp8Scaling<B>({m.b}), Catch::Contains("none of the 1 parameters is 2-D"));
  CHECK_THROWS_WITH(tmem::amp::Fp8Scaling<B>({m.w}, {.history_length = 0}),
                    Catch::Contains("history_length must be >= 1, got 0"));
  tmem::optim::SGD<B> sgd({m.w, m.b}, {.lr = 0.1});
  tmem::amp::TrainStepOptions options{.precision = DType::F32};
  options.fp8 = tmem::amp::DelayedScaling{};
  CHECK_THROWS_WITH(tmem::amp::TrainStep<B>(sgd, options), Catch::Contains("fp8 runs on top of bf16 or f16"));
}

}  // namespace fp8_recipe_test

namespace fp8_recipe_test {

TEST_CASE("TrainStep with fp8 skips a step whose amax is inf: FP8 saturated it, nothing may train on it",
          "[amp][fp8]") {
  for (const DType precision : {DType::BF16, DType::F16}) {
    INFO("precision " << precision);
    OneLinear m;
    tmem::optim::SGD<B> sgd({m.w, m.b}, {.lr = 0.1});
    tmem::amp::TrainStepOptions options{.precision = precision};
    options.fp8 = tmem::amp::DelayedScaling{.history_length = 2};
    options.scaler.init_scale = 16.0;  // f16: small enough that the clean steps do not overflow
    tmem::amp::TrainStep<B> step(sgd, options);
    tmem::Tape<B> tape;
    const auto run = [&](std::vector<float> x) {
      return step.run([&] {
        return tmem::sum(tmem::linear(tape.input(Tensor<B>::from_host({kRows, kIn}, x)), m.w, m.b));
      });
    };
    CHECK(run(values(kRows * kIn, 70, 1.0)).stepped);
    const auto w = m.w.value().to_host<float>();
    const auto scale = step.fp8()->scales()->scale.to_host<float>();
    auto poisoned = values(kRows * kIn, 71, 1.0);
    poisoned[2] = std::numeric_limits<float>::infinity();
    const auto report = run(poisoned);
    CHECK(std::isfinite(report.loss_value()));  // the saturated forward looks finite...
    CHECK_FALSE(report.stepped);                // ...but its amax is inf: skipped
    CHECK(m.w.value().to_host<float>() == w);
    CHECK(step.fp8()->scales()->scale.to_host<float>() == scale);
    CHECK(step.skipped_steps() == 1);
    CHECK(run(values(kRows * kIn, 72, 1.0)).stepped);  // and the next step trains again
  }
}

}  // namespace fp8_recipe_test

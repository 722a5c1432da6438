// tests/backend/cpu/test_update_kernel.cpp — the optimizer's pass over a tensor
// (backend/cpu/kernels/update.hpp) runs in blocks, asks SGD for its fixed-flag variant
// once (NOTE [Update flags fixed for the loop] in core/update_rules.hpp) and writes the model copy
// a block at a time; every element must still get the bits of PyTorch's SGD rule written
// out here element by element (in the master's type, widened gradient, one rounding of
// the copy), for each flag combination, gradient and copy dtype, at lengths with tails
// and lengths that split over threads. The same for AdamW, whose square roots the pass
// takes a block at a time (NOTE [Square roots a block at a time] in core/update_rules.hpp), in
// every vector form the CPU has (NOTE [Vector paths chosen at run time] in simd.hpp).
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "simd_levels.hpp"
#include "test_data.hpp"
#include "trainmem/backend/cpu/kernels/update.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/optim/adamw.hpp"
#include "trainmem/optim/optimizer.hpp"

namespace update_kernel_test {

namespace kernels = trainmem::cpu::kernels;
using trainmem::BFloat16;
using trainmem::Half;

template <class T>
std::uint64_t bits(T v) {
  if constexpr (std::is_same_v<T, float>) return std::bit_cast<std::uint32_t>(v);
  else if constexpr (std::is_same_v<T, double>) return std::bit_cast<std::uint64_t>(v);
  else return v.bits;
}

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double scale) {
  trainmem::testing::SplitMix64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = trainmem::detail::narrow<T>((rng.uniform() * 2.0 - 1.0) * scale);
  return v;
}

/// The gradient as the update sees it: divided by the loss scale where there is one.
template <class TP>
TP divided(TP g, const float* divisor) {
  return divisor != nullptr ? g / static_cast<TP>(*divisor) : g;
}

/// torch.optim.SGD for one element, in TP.
template <class TP>
void sgd_element(const trainmem::math::SgdUpdate& u, TP& p, TP g, TP& buffer) {
  g = g * static_cast<TP>(u.grad_scale) + static_cast<TP>(u.weight_decay) * p;
  if (u.momentum != 0.0) {
    if (u.first_step) buffer = g;
    else buffer = static_cast<TP>(u.momentum) * buffer + static_cast<TP>(1.0 - u.dampening) * g;
    g = u.nesterov ? g + static_cast<TP>(u.momentum) * buffer : buffer;
  }
  p -= static_cast<TP>(u.lr) * g;
}

/// Runs the kernel once over n elements and counts the elements of the master, the
/// momentum buffer and the copy whose bits differ from sgd_element's.
template <class TP, class TG, class TC>
int differing(const trainmem::math::SgdUpdate& u, std::int64_t n, bool stochastic, const float* divisor = nullptr) {
  const auto count = static_cast<std::size_t>(n);
  std::vector<TP> p = random_values<TP>(count, 1, 2.0), buffer = random_values<TP>(count, 2, 0.5);
  const std::vector<TG> g = random_values<TG>(count, 3, 1.0);
  std::vector<TC> copy(count);
  std::vector<TP> want_p = p, want_buffer = buffer;
  std::vector<TC> want_copy(count);
  const trainmem::RngState rng{12345, 8};
  for (std::size_t i = 0; i < count; ++i) {
    sgd_element(u, want_p[i], divided(static_cast<TP>(trainmem::detail::widen(g[i])), divisor), want_buffer[i]);
    if constexpr (std::is_same_v<TC, BFloat16>) {
      if (stochastic) {
        want_copy[i] = trainmem::bf16_round_stochastic(
            static_cast<float>(want_p[i]), trainmem::detail::random_bits(rng, static_cast<std::uint64_t>(i)));
        continue;
      }
    }
    want_copy[i] = trainmem::detail::narrow<TC>(want_p[i]);
  }
  TP* moment = u.momentum != 0.0 ? buffer.data() : nullptr;
  if (divisor != nullptr) {
    kernels::apply_update(trainmem::detail::DivideGrad<trainmem::math::SgdUpdate>{u, divisor}, p.data(), g.data(),
                          moment, static_cast<TP*>(nullptr), n, kernels::NearestCopy<TC>{copy.data()});
  } else if constexpr (std::is_same_v<TC, BFloat16>) {
    if (stochastic) {
      kernels::apply_update(u, p.data(), g.data(), moment, static_cast<TP*>(nullptr), n,
                            kernels::StochasticBf16Copy{copy.data(), rng});
    } else {
      kernels::apply_update(u, p.data(), g.data(), moment, static_cast<TP*>(nullptr), n,
                            kernels::NearestCopy<TC>{copy.data()});
    }
  } else {
    kernels::apply_update(u, p.data(), g.data(), moment, static_cast<TP*>(nullptr), n,
                          kernels::NearestCopy<TC>{copy.data()});
  }
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    wrong += bits(p[i]) != bits(want_p[i]) || bits(copy[i]) != bits(want_copy[i]);
    if (moment != nullptr) wrong += bits(buffer[i]) != bits(want_buffer[i]);
  }
  return wrong;
}

/// AdamW for one element, in TP, with the bias corrections 1 - beta^t given.
template <class TP>
void adamw_element(const trainmem::math::AdamWUpdate& u, TP& p, TP g, TP& m, TP& v) {
  g = g * static_cast<TP>(u.grad_scale);
  p = p * static_cast<TP>(1.0 - u.lr * u.weight_decay);
  m = static_cast<TP>(u.beta1) * m + static_cast<TP>(1.0 - u.beta1) * g;
  v = static_cast<TP>(u.beta2) * v + static_cast<TP>(1.0 - u.beta2) * g * g;
  const TP denominator = std::sqrt(v / static_cast<TP>(u.bias2)) + static_cast<TP>(u.eps);
  p -= static_cast<TP>(u.lr) * (m / static_cast<TP>(u.bias1)) / denominator;
}

/// As `differing`, for AdamW through the optimizer's functor (corrections read from
/// [beta1^t, beta2^t]): elements of the master, both moments and the copy that differ.
template <class TP, class TG, class TC>
int adamw_differing(const trainmem::math::AdamWUpdate& rule, const double (&powers)[2], std::int64_t n,
                    const float* divisor = nullptr) {
  const auto count = static_cast<std::size_t>(n);
  std::vector<TP> p = random_values<TP>(count, 4, 2.0), m = random_values<TP>(count, 5, 0.1);
  std::vector<TP> v = random_values<TP>(count, 6, 0.01);
  for (TP& x : v) x = x * x;  // a second moment is not negative
  const std::vector<TG> g = random_values<TG>(count, 7, 1.0);
  trainmem::math::AdamWUpdate u = rule;
  u.bias1 = 1.0 - powers[0];
  u.bias2 = 1.0 - powers[1];
  std::vector<TP> want_p = p, want_m = m, want_v = v;
  std::vector<TC> copy(count), want_copy(count);
  for (std::size_t i = 0; i < count; ++i) {
    adamw_element(u, want_p[i], divided(static_cast<TP>(trainmem::detail::widen(g[i])), divisor), want_m[i], want_v[i]);
    want_copy[i] = trainmem::detail::narrow<TC>(want_p[i]);
  }
  const trainmem::detail::AdamWPoweredUpdate update{rule, powers};
  if (divisor != nullptr) {
    kernels::apply_update(trainmem::detail::DivideGrad<trainmem::detail::AdamWPoweredUpdate>{update, divisor}, p.data(),
                          g.data(), m.data(), v.data(), n, kernels::NearestCopy<TC>{copy.data()});
  } else {
    kernels::apply_update(update, p.data(), g.data(), m.data(), v.data(), n, kernels::NearestCopy<TC>{copy.data()});
  }
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += bits(p[i]) != bits(want_p[i]) || bits(m[i]) != bits(want_m[i]) || bits(v[i]) != bits(want_v[i]) ||
             bits(copy[i]) != bits(want_copy[i]);
  return wrong;
}

/// AdamW's rule against the pass, for two rules, two sets of powers and every length and dtype mix.
void adamw_bits_at_every_length() {
  using trainmem::math::AdamWUpdate;
  // lr, beta1, beta2, eps, weight decay, grad scale (the corrections come from the powers)
  const AdamWUpdate rules[] = {
      {1e-3, 0.9, 0.999, 1e-8, 1e-2, 1.0, 0.0, 0.0},
      {3e-2, 0.8, 0.95, 1e-6, 0.0, 0.25, 0.0, 0.0},
  };
  const double powers[][2] = {{0.9, 0.999}, {0.9 * 0.9 * 0.9, 0.95 * 0.95 * 0.95}};  // [beta1^t, beta2^t]
  const std::int64_t lengths[] = {1, 15, 255, 4099, 70001};  // tails of every width, blocks, threads
  for (const AdamWUpdate& rule : rules) {
    for (const auto& pw : powers) {
      for (const std::int64_t n : lengths) {
        INFO("beta1 " << rule.beta1 << " beta1^t " << pw[0] << " n = " << n);
        CHECK(adamw_differing<float, float, BFloat16>(rule, pw, n) == 0);
        CHECK(adamw_differing<float, BFloat16, BFloat16>(rule, pw, n) == 0);
        CHECK(adamw_differing<float, Half, Half>(rule, pw, n) == 0);
        CHECK(adamw_differing<double, BFloat16, float>(rule, pw, n) == 0);
        CHECK(adamw_differing<double, double, BFloat16>(rule, pw, n) == 0);
      }
    }
  }
}

}  // namespace update_kernel_test

TEST_CASE("the update pass gives every element the bits of SGD's rule, for every flag and dtype mix",
          "[backend][cpu][optim]") {
  using trainmem::math::SgdUpdate;
  using namespace update_kernel_test;
  // lr, momentum, dampening, weight decay, grad scale, nesterov, first step
  const SgdUpdate updates[] = {
      {0.1, 0.0, 0.0, 0.0, 1.0, false, false},    // plain
      {0.05, 0.9, 0.0, 0.01, 0.5, false, true},   // momentum, first step
      {0.05, 0.9, 0.2, 0.01, 0.5, false, false},  // momentum, later step, dampening
      {0.02, 0.8, 0.0, 0.0, 1.0, true, true},     // Nesterov, first step
      {0.02, 0.8, 0.0, 0.1, 2.0, true, false},    // Nesterov, later step
  };
  // under a block, blocks with a tail, and enough to split over threads
  const std::int64_t lengths[] = {1, 255, 4099, 70001};
  for (const SgdUpdate& u : updates) {
    for (const std::int64_t n : lengths) {
      INFO("momentum " << u.momentum << " nesterov " << u.nesterov << " first " << u.first_step << " n = " << n);
      CHECK(differing<float, float, BFloat16>(u, n, false) == 0);
      CHECK(differing<float, BFloat16, BFloat16>(u, n, false) == 0);
      CHECK(differing<float, BFloat16, BFloat16>(u, n, true) == 0);
      CHECK(differing<float, Half, Half>(u, n, false) == 0);
      CHECK(differing<float, float, float>(u, n, false) == 0);
      CHECK(differing<double, BFloat16, float>(u, n, false) == 0);
      CHECK(differing<double, double, BFloat16>(u, n, false) == 0);
    }
  }
}

TEST_CASE("the update pass gives every element the bits of AdamW's rule, square roots a block at a time",
          "[backend][cpu][optim]") {
  trainmem::testing::for_each_simd_level([](trainmem::cpu::SimdLevel level) {
    INFO("vector level " << trainmem::cpu::name_of(level));
    update_kernel_test::adamw_bits_at_every_length();
  });
}

TEST_CASE("under a loss scale the update pass gives the bits of the rule on the divided gradient",
          "[backend][cpu][optim]") {
  // The divisor is read once per tensor (DivideGrad::visit_fixed), and AdamW keeps its
  // block of square roots under it.
  using namespace update_kernel_test;
  const float scale = 1024.0f * 3.0f;
  const trainmem::math::SgdUpdate sgd{0.05, 0.9, 0.0, 0.01, 1.0, true, false};
  const trainmem::math::AdamWUpdate adamw{1e-3, 0.9, 0.999, 1e-8, 1e-2, 1.0, 0.0, 0.0};
  const double powers[2] = {0.9 * 0.9, 0.999 * 0.999};
  for (const std::int64_t n : {1, 255, 4099, 70001}) {
    INFO("n = " << n);
    CHECK(differing<float, Half, Half>(sgd, n, false, &scale) == 0);
    CHECK(differing<double, float, BFloat16>(sgd, n, false, &scale) == 0);
    CHECK(adamw_differing<float, Half, Half>(adamw, powers, n, &scale) == 0);
    CHECK(adamw_differing<float, BFloat16, BFloat16>(adamw, powers, n, &scale) == 0);
    CHECK(adamw_differing<double, double, float>(adamw, powers, n, &scale) == 0);
  }
}

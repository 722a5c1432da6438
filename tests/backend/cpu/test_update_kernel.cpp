// tests/backend/cpu/test_update_kernel.cpp — the optimizer's pass over a tensor
// (backend/cpu/kernels/update.hpp) runs in blocks, asks SGD for its fixed-flag variant
// once (NOTE [Update flags fixed for the loop] in core/math.hpp) and writes the model copy
// a block at a time; every element must still get the bits of PyTorch's SGD rule written
// out here element by element (in the master's type, widened gradient, one rounding of
// the copy), for each flag combination, gradient and copy dtype, at lengths with tails
// and lengths that split over threads.
#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "test_data.hpp"
#include "trainmem/backend/cpu/kernels/update.hpp"
#include "trainmem/core/math.hpp"

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
int differing(const trainmem::math::SgdUpdate& u, std::int64_t n, bool stochastic) {
  const auto count = static_cast<std::size_t>(n);
  std::vector<TP> p = random_values<TP>(count, 1, 2.0), buffer = random_values<TP>(count, 2, 0.5);
  const std::vector<TG> g = random_values<TG>(count, 3, 1.0);
  std::vector<TC> copy(count);
  std::vector<TP> want_p = p, want_buffer = buffer;
  std::vector<TC> want_copy(count);
  const trainmem::RngState rng{12345, 8};
  for (std::size_t i = 0; i < count; ++i) {
    sgd_element(u, want_p[i], static_cast<TP>(trainmem::detail::widen(g[i])), want_buffer[i]);
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
  if constexpr (std::is_same_v<TC, BFloat16>) {
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

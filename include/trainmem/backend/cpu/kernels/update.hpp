// trainmem/backend/cpu/kernels/update.hpp — the optimizer's one pass over a parameter.
//
// The update functor (core/math.hpp: SGD, AdamW) changes the f32/f64 master and its
// moments in place, and the 16-bit model copy is written from the new value in the
// same pass, so the master is read once per step. How the copy is rounded is a small
// writer type: none, nearest-even, or stochastic bf16.
#pragma once

#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"

namespace trainmem::cpu::kernels {

/// Applies an optimizer update element by element: param (the f32/f64 master) and the
/// optional moments are updated in place; the gradient is widened; `store_copy(i, value)`
/// writes the 16-bit model copy from the updated value in the same pass (or nothing).
template <class Update, class TP, class TG, class StoreCopy>
void apply_update(Update update, TP* param, const TG* grad, TP* first_moment, TP* second_moment, std::int64_t n,
                  StoreCopy store_copy) {
  parallel_for(n, n > kParallelGrain, [&](std::int64_t i) {
    TP unused1 = 0, unused2 = 0;
    TP& s1 = first_moment ? first_moment[i] : unused1;
    TP& s2 = second_moment ? second_moment[i] : unused2;
    update(param[i], static_cast<TP>(detail::widen(grad[i])), s1, s2);
    store_copy(i, param[i]);
  });
}

/// Model-copy writers for apply_update.
struct NoCopy {
  template <class TP>
  void operator()(std::int64_t, TP) const {}
};
template <class TC>
struct NearestCopy {
  TC* copy;
  template <class TP>
  void operator()(std::int64_t i, TP value) const {
    copy[i] = detail::narrow<TC>(value);
  }
};
/// Rounds element i with draw i of `rng`, so the result does not depend on how the loop is split.
struct StochasticBf16Copy {
  BFloat16* copy;
  RngState rng;
  template <class TP>
  void operator()(std::int64_t i, TP value) const {
    copy[i] = bf16_round_stochastic(static_cast<float>(value), detail::random_bits(rng, static_cast<std::uint64_t>(i)));
  }
};

}  // namespace trainmem::cpu::kernels

// trainmem/backend/cpu/kernels/loss_scale.hpp — unscaling gradients and finding inf/NaN in one pass.
//
// The check reads what is stored after unscaling: a finite gradient that overflows its
// dtype when multiplied by 1/scale (a scale below 1) counts as non-finite too. The
// scale update itself is update_scale_state (core/loss_scale_rule.hpp), which the
// backend calls directly.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

/// x *= inv_scale in place (no write when inv_scale is 1: a pure check); returns whether
/// any element was inf or NaN before scaling (PyTorch's non-finite check and unscale).
template <class T>
bool unscale_and_check(T* x, std::int64_t n, float inv_scale) {
  using Acc = AccumulatorOf<T>;
  const bool scales = inv_scale != 1.0f;
  const std::int64_t non_finite = parallel_sum<std::int64_t>(n, n > kParallelGrain, [&](std::int64_t i) {
    Acc v = static_cast<Acc>(detail::widen(x[i]));
    if (scales) {
      x[i] = detail::narrow<T>(v * static_cast<Acc>(inv_scale));
      v = static_cast<Acc>(detail::widen(x[i]));  // check what is stored: a scale < 1 can overflow it
    }
    return std::int64_t{std::isfinite(v) ? 0 : 1};
  });
  return non_finite != 0;
}

}  // namespace trainmem::cpu::kernels

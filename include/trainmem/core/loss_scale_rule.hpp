// trainmem/core/loss_scale_rule.hpp — one step of the dynamic loss-scale rule.
//
// Written once as a TRAINMEM_HOST_DEVICE function so the CPU backend runs it inline
// and the CUDA backend runs it in a one-thread kernel next to the gradients (no host
// sync per step). PyTorch's rule (torch.amp.GradScaler / _amp_update_scale_): on an
// overflow, multiply the scale by the backoff factor and restart the growth count; on
// `growth_interval` clean steps in a row, multiply it by the growth factor if the
// result stays finite. Added, as DeepSpeed does: min/max scale, and hysteresis — back
// off only after `hysteresis` consecutive overflows (a clean step re-arms it).
//
// The scale never leaves [kMinScale, kMaxScale], the normal f32 range: a backoff floors
// at the larger of min_scale and kMinScale (65536 * 0.5^n is 0 in f32 after ~165
// overflows, and dividing a gradient by 0 writes NaN into the weights), and growth stops
// at max_scale (<= f32 max, so never inf). The growth count compares before it adds, so
// a loaded growth_tracker near INT32_MAX cannot overflow.
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem {

/// Smallest and largest loss scale: the normal f32 range, [2^-126, (2 - 2^-23) 2^127].
inline constexpr double kMinScale = 1.1754943508222875e-38;
inline constexpr double kMaxScale = 3.4028234663852886e38;

/// \brief The constants of the rule (GradScalerOptions fills them).
struct ScaleUpdateArgs {
  float growth_factor = 2.0f;                 // applied after growth_interval clean steps in a row
  float backoff_factor = 0.5f;                // applied on an overflow (after hysteresis)
  std::int32_t growth_interval = 2000;        // clean steps between growths
  float min_scale = 1.1754943508222875e-38f;  // backoff never goes below this (nor below kMinScale)
  float max_scale = 3.4028234663852886e38f;   // growth never goes above this
  std::int32_t hysteresis = 1;                // consecutive overflows before a backoff; 1: every overflow (PyTorch)
};

/// Updates (scale, growth_tracker, hysteresis_left) in place given whether this step overflowed.
TRAINMEM_HOST_DEVICE void update_scale_state(float& scale, std::int32_t& growth_tracker, std::int32_t& hysteresis_left,
                                             bool found_inf, const ScaleUpdateArgs& args) {
  if (found_inf) {
    growth_tracker = 0;
    if (hysteresis_left > 1) {
      --hysteresis_left;
      return;
    }
    const float floor = args.min_scale > static_cast<float>(kMinScale) ? args.min_scale : static_cast<float>(kMinScale);
    const float backed_off = scale * args.backoff_factor;
    scale = backed_off >= floor ? backed_off : floor;  // a NaN scale lands on the floor too
    return;
  }
  hysteresis_left = args.hysteresis;
  if (growth_tracker >= args.growth_interval - 1) {
    const float grown = scale * args.growth_factor;
    const bool finite = grown - grown == 0.0f;  // false for inf and NaN: PyTorch keeps the scale then
    if (finite) scale = grown > args.max_scale ? args.max_scale : grown;
    growth_tracker = 0;
  } else {
    growth_tracker = growth_tracker < 0 ? 1 : growth_tracker + 1;
  }
}

}  // namespace trainmem

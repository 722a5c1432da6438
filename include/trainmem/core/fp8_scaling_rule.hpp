// trainmem/core/fp8_scaling_rule.hpp — delayed scaling's per-element rules, host and device.
//
// An FP8 tensor is stored as fp8(x * scale): the scale maps the tensor's largest
// magnitude (its amax) to just under the format's largest finite value, so the values
// use the format's whole range. Delayed scaling takes the amax from a history of past
// steps, because the current tensor's amax is only known after it has been quantized:
//   scale = (fp8_max / amax) / 2^margin,
// kept unchanged when amax is 0 (nothing seen yet) or not finite (a diverged step must
// not turn every later scale into 0 or NaN). These functors run through Backend::map on
// [1]-shaped f32 tensors, so a GPU updates its scales without a host read (the
// TransformerEngine rule, transformer_engine/pytorch/fp8.py's _default_sf_compute).
#pragma once

#include "trainmem/config.hpp"

namespace trainmem::math {

/// max(a, b) that propagates NaN from either side (an amax of a tensor holding NaN is NaN).
struct AmaxMax {
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
  }
};

/// The new scale from (amax, the current scale): (fp8_max / amax) / 2^margin when amax
/// is positive and finite, else the current scale.
struct Fp8ScaleFromAmax {
  float fp8_max;
  float margin_factor;  // 2^margin
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T amax, T scale) const {
    const bool usable = amax > T(0) && amax - amax == T(0);  // positive and finite (inf - inf and NaN fail)
    return usable ? (static_cast<T>(fp8_max) / amax) / static_cast<T>(margin_factor) : scale;
  }
};

/// 1 / x: a scale's inverse, which the FP8 GEMM multiplies its f32 accumulator by.
struct Reciprocal {
  template <class T>
  TRAINMEM_HOST_DEVICE T operator()(T x) const {
    return T(1) / x;
  }
};

}  // namespace trainmem::math

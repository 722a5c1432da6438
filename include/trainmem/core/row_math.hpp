// trainmem/core/row_math.hpp — per-row backward formulas, written once for CPU and GPU.
//
// A row kernel (softmax, layer and RMS norm, cross-entropy) does two things: it reduces the
// row (a dot product, two sums) and then computes every element from the element and
// the reduced values. How a backend reduces differs (a loop on the CPU, a block tree
// on the GPU); the per-element formulas do not, so they live here and both backends
// call them. Each functor holds a row's saved statistics; `term` is what the row sums,
// `operator()` the element's gradient once the sums are known. All work in the
// accumulator type (float, or double for f64), like the functors in core/math.hpp.
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"
#include "trainmem/core/math.hpp"

namespace trainmem::math {

/// softmax: dx = y (dy - sum(dy y)); log-softmax (y holds log p): dx = dy - exp(y) sum(dy).
struct SoftmaxBackwardRow {
  bool log_output;
  /// The summand of the row's dot: dy y, or dy for log-softmax.
  template <class Acc>
  TRAINMEM_HOST_DEVICE Acc term(Acc dy, Acc y) const {
    return log_output ? dy : dy * y;
  }
  template <class Acc>
  TRAINMEM_HOST_DEVICE Acc operator()(Acc dy, Acc y, Acc dot) const {
    return log_output ? dy - exp(y) * dot : y * (dy - dot);
  }
};

/// Layer norm's input gradient for one row with its saved mean and rstd:
/// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma.
template <class Acc>
struct LayerNormBackwardRow {
  Acc mean, rstd;
  TRAINMEM_HOST_DEVICE Acc xhat(Acc x) const { return (x - mean) * rstd; }
  /// The two summands of the row, g and g xhat, for the element (dy, x, gamma).
  TRAINMEM_HOST_DEVICE void add_terms(Acc dy, Acc x, Acc gamma, Acc& sum_g, Acc& sum_g_xhat) const {
    const Acc g = dy * gamma;
    sum_g += g;
    sum_g_xhat += g * xhat(x);
  }
  /// inv_cols is 1 / cols, formed once per launch.
  TRAINMEM_HOST_DEVICE Acc operator()(Acc dy, Acc x, Acc gamma, Acc sum_g, Acc sum_g_xhat, Acc inv_cols) const {
    const Acc g = dy * gamma;
    return rstd * (g - sum_g * inv_cols - xhat(x) * sum_g_xhat * inv_cols);
  }
};

/// RMS norm's reciprocal root mean square of a row from its sum of squares.
template <class Acc>
TRAINMEM_HOST_DEVICE Acc rms_norm_rstd(Acc sum_squares, std::int64_t cols, Acc eps) {
  return Acc(1) / sqrt(sum_squares / static_cast<Acc>(cols) + eps);
}

/// RMS norm's input gradient for one row with its saved rstd:
/// dx = rstd (g - xhat mean(g xhat)) with g = dy weight and xhat = x rstd.
template <class Acc>
struct RmsNormBackwardRow {
  Acc rstd;
  TRAINMEM_HOST_DEVICE Acc xhat(Acc x) const { return x * rstd; }
  /// The summand of the row, g xhat, for the element (dy, x, weight).
  TRAINMEM_HOST_DEVICE Acc term(Acc dy, Acc x, Acc weight) const { return dy * weight * xhat(x); }
  /// inv_cols is 1 / cols, formed once per launch.
  TRAINMEM_HOST_DEVICE Acc operator()(Acc dy, Acc x, Acc weight, Acc sum_g_xhat, Acc inv_cols) const {
    return rstd * (dy * weight - xhat(x) * sum_g_xhat * inv_cols);
  }
};

/// Mean cross-entropy's logit gradient for one row with its saved log-sum-exp:
/// dlogits = dloss / rows * (softmax(logits) - onehot(label)).
template <class Acc>
struct CrossEntropyBackwardRow {
  Acc scale;  // dloss / rows: cross_entropy_scale
  Acc lse;
  std::int32_t label;
  TRAINMEM_HOST_DEVICE Acc operator()(Acc logit, std::int64_t c) const {
    const Acc p = exp(logit - lse);
    return scale * (p - (c == label ? Acc(1) : Acc(0)));
  }
};
/// The factor every logit gradient of a mean over `rows` rows carries.
template <class Acc>
TRAINMEM_HOST_DEVICE Acc cross_entropy_scale(Acc dloss, std::int64_t rows) {
  return dloss / static_cast<Acc>(rows);
}

}  // namespace trainmem::math

// trainmem/backend/cpu/kernels/softmax.hpp — row-wise softmax and log-softmax, forward and backward.
//
// Max-subtracted, so no row overflows; backward needs only the output y (one dot per
// row, math::SoftmaxBackwardRow), which is what the op saves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "trainmem/backend/cpu/kernels/lane_sum.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cpu::kernels {

/// A row's maximum and sum of exp(x - max): the stable base of softmax and log-sum-exp.
template <class Acc>
struct MaxSumExp {
  Acc max;
  Acc sum;
};
template <class Acc, class T>
MaxSumExp<Acc> max_and_sum_exp(const T* row, std::int64_t cols) {
  Acc max = -std::numeric_limits<Acc>::infinity();
  for (std::int64_t c = 0; c < cols; ++c) max = std::max(max, static_cast<Acc>(detail::widen(row[c])));
  const Acc sum =
      lane_sum<Acc>(cols, [&](std::int64_t c) { return math::exp(static_cast<Acc>(detail::widen(row[c])) - max); });
  return {max, sum};
}

/// Row-wise softmax (or log-softmax) over the last dimension, max-subtracted.
template <class T>
void softmax(const T* x, T* y, std::int64_t rows, std::int64_t cols, bool log_output) {
  using Acc = AccumulatorOf<T>;
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const auto [max, sum] = max_and_sum_exp<Acc>(xr, cols);
    const Acc log_sum = std::log(sum);
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc shifted = static_cast<Acc>(detail::widen(xr[c])) - max;
      yr[c] = detail::narrow<T>(log_output ? shifted - log_sum : math::exp(shifted) / sum);
    }
  });
}

/// dx from dy and the saved output y, row by row (math::SoftmaxBackwardRow).
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols, bool log_output) {
  using Acc = AccumulatorOf<T>;
  auto w = [](T v) { return static_cast<Acc>(detail::widen(v)); };
  const math::SoftmaxBackwardRow row{log_output};
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const T *dyr = dy + r * cols, *yr = y + r * cols;
    T* dxr = dx + r * cols;
    const Acc dot = lane_sum<Acc>(cols, [&](std::int64_t c) { return row.term(w(dyr[c]), w(yr[c])); });
    for (std::int64_t c = 0; c < cols; ++c) dxr[c] = detail::narrow<T>(row(w(dyr[c]), w(yr[c]), dot));
  });
}

}  // namespace trainmem::cpu::kernels

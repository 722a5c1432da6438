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
#pragma omp simd reduction(max : max)
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
    auto shifted = [&](std::int64_t c) { return static_cast<Acc>(detail::widen(xr[c])) - max; };
    if (log_output) {
      const Acc log_sum = std::log(sum);
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) yr[c] = detail::narrow<T>(shifted(c) - log_sum);
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c) yr[c] = detail::narrow<T>(math::exp(shifted(c)) / sum);
    }
  });
}

/// One row of softmax's backward, the flag a constant so that no load of it is left in
/// the vector loops.
template <bool kLogOutput, class T>
void softmax_backward_row(const T* dy, const T* y, T* dx, std::int64_t cols) {
  using Acc = AccumulatorOf<T>;
  constexpr math::SoftmaxBackwardRow row{kLogOutput};
  auto w = [](T v) { return static_cast<Acc>(detail::widen(v)); };
  const Acc dot = lane_sum<Acc>(cols, [&](std::int64_t c) { return row.term(w(dy[c]), w(y[c])); });
#pragma omp simd
  for (std::int64_t c = 0; c < cols; ++c) dx[c] = detail::narrow<T>(row(w(dy[c]), w(y[c]), dot));
}

/// dx from dy and the saved output y, row by row (math::SoftmaxBackwardRow).
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols, bool log_output) {
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const std::int64_t at = r * cols;
    if (log_output) softmax_backward_row<true>(dy + at, y + at, dx + at, cols);
    else softmax_backward_row<false>(dy + at, y + at, dx + at, cols);
  });
}

}  // namespace trainmem::cpu::kernels

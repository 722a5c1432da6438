// trainmem/backend/cpu/kernels/loss.hpp — mean cross-entropy of integer labels, forward and backward.
//
// The forward keeps each row's log-sum-exp, not a probability matrix: backward re-forms
// softmax(logits) element by element from it (math::CrossEntropyBackwardRow). Labels
// are data, so only the kernel can range-check them; it reports the first bad row.
#pragma once

#include <cmath>
#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/kernels/softmax.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cpu::kernels {

/// Mean cross-entropy of integer labels; keeps each row's log-sum-exp for backward. The
/// sum of the rows' losses is divided by `mean_rows` (the whole batch's rows when these
/// are a chunk of it). Returns the first out-of-range label's row, or -1.
template <class T, class Acc>
std::int64_t cross_entropy(const T* logits, const std::int32_t* labels, Acc* loss, Acc* lse, std::int64_t rows,
                           std::int64_t cols, std::int64_t mean_rows) {
  auto w = [](T v) { return static_cast<Acc>(detail::widen(v)); };
  for (std::int64_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || labels[r] >= cols) return r;
  const Acc total = parallel_sum<Acc>(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const T* xr = logits + r * cols;
    const auto [max, sum] = max_and_sum_exp<Acc>(xr, cols);
    lse[r] = max + std::log(sum);
    return lse[r] - w(xr[labels[r]]);
  });
  loss[0] = total / static_cast<Acc>(mean_rows);
  return -1;
}

/// dlogits = dloss / mean_rows * (softmax(logits) - onehot(label)), row by row.
template <class T, class Acc>
void cross_entropy_backward(Acc dloss, const T* logits, const std::int32_t* labels, const Acc* lse, T* dlogits,
                            std::int64_t rows, std::int64_t cols, std::int64_t mean_rows) {
  const Acc scale = math::cross_entropy_scale(dloss, mean_rows);
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const math::CrossEntropyBackwardRow<Acc> row{scale, lse[r], labels[r]};
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c)
      dlogits[r * cols + c] = detail::narrow<T>(row(static_cast<Acc>(detail::widen(logits[r * cols + c])), c));
  });
}

}  // namespace trainmem::cpu::kernels

// trainmem/backend/cpu/kernels/norm.hpp — layer norm over the last dimension, forward and backward.
//
// The forward keeps each row's mean and rstd (accumulator type), so backward re-forms
// xhat from x instead of saving it; the input gradient is math::LayerNormBackwardRow,
// the parameter gradients are column sums over the rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cpu::kernels {

/// y = (x - mean) * rstd * gamma + beta per row; keeps mean and rstd (accumulator type).
template <class T, class TP, class Acc>
void layer_norm(const T* x, const TP* gamma, const TP* beta, T* y, Acc* mean_out, Acc* rstd_out, std::int64_t rows,
                std::int64_t cols, double eps) {
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const T* xr = x + r * cols;
    Acc mean = 0;
    for (std::int64_t c = 0; c < cols; ++c) mean += static_cast<Acc>(detail::widen(xr[c]));
    mean /= static_cast<Acc>(cols);
    Acc var = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc d = static_cast<Acc>(detail::widen(xr[c])) - mean;
      var += d * d;
    }
    var /= static_cast<Acc>(cols);
    const Acc rstd = Acc(1) / std::sqrt(var + static_cast<Acc>(eps));
    mean_out[r] = mean;
    rstd_out[r] = rstd;
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc xhat = (static_cast<Acc>(detail::widen(xr[c])) - mean) * rstd;
      y[r * cols + c] = detail::narrow<T>(xhat * static_cast<Acc>(detail::widen(gamma[c])) +
                                          static_cast<Acc>(detail::widen(beta[c])));
    }
  });
}

/// dx per row (math::LayerNormBackwardRow); dgamma = sum_r dy xhat and dbeta = sum_r dy.
template <class T, class TP, class Acc>
void layer_norm_backward(const T* dy, const T* x, const TP* gamma, const Acc* mean, const Acc* rstd, T* dx, TP* dgamma,
                         TP* dbeta, std::int64_t rows, std::int64_t cols) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  std::vector<Acc> dgamma_acc(static_cast<std::size_t>(cols), Acc(0)),
      dbeta_acc(static_cast<std::size_t>(cols), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * cols, *xr = x + r * cols;
    const math::LayerNormBackwardRow<Acc> row{mean[r], rstd[r]};
    Acc sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      row.add_terms(w(dyr[c]), w(xr[c]), w(gamma[c]), sum_g, sum_g_xhat);
      dgamma_acc[c] += w(dyr[c]) * row.xhat(w(xr[c]));
      dbeta_acc[c] += w(dyr[c]);
    }
    const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
    for (std::int64_t c = 0; c < cols; ++c)
      dx[r * cols + c] = detail::narrow<T>(row(w(dyr[c]), w(xr[c]), w(gamma[c]), sum_g, sum_g_xhat, inv_cols));
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    dgamma[c] = detail::narrow<TP>(dgamma_acc[c]);
    dbeta[c] = detail::narrow<TP>(dbeta_acc[c]);
  }
}

}  // namespace trainmem::cpu::kernels

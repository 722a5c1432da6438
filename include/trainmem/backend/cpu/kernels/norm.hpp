// trainmem/backend/cpu/kernels/norm.hpp — layer and RMS norm over the last dimension, forward and backward.
//
// The forward keeps each row's statistics (mean and rstd, or rstd alone; accumulator
// type), so backward re-forms xhat from x instead of saving it; the input gradient is
// math::LayerNormBackwardRow / RmsNormBackwardRow, the parameter gradients are column
// sums over the rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cpu::kernels {

/// \brief Column sums of a backward (dgamma, dbeta) accumulated in Acc: straight into the
/// output when it is Acc, else in a buffer rounded to TP once by finish().
template <class TP, class Acc>
class ColumnSums {
 public:
  ColumnSums(TP* out, std::int64_t cols) : out_(out), cols_(cols) {
    if constexpr (std::is_same_v<TP, Acc>) {
      std::fill(out, out + cols, Acc(0));
      sums_ = out;
    } else {
      buffer_.assign(static_cast<std::size_t>(cols), Acc(0));
      sums_ = buffer_.data();
    }
  }
  Acc& operator[](std::int64_t c) { return sums_[c]; }
  void finish() {
    if constexpr (!std::is_same_v<TP, Acc>)
      for (std::int64_t c = 0; c < cols_; ++c) out_[c] = detail::narrow<TP>(sums_[c]);
  }

 private:
  TP* out_;
  std::int64_t cols_;
  std::vector<Acc> buffer_;  // empty when TP is Acc
  Acc* sums_;
};

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
  ColumnSums<TP, Acc> dgamma_acc(dgamma, cols), dbeta_acc(dbeta, cols);
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
  dgamma_acc.finish();
  dbeta_acc.finish();
}

/// y = x * rstd * weight per row with rstd = 1 / sqrt(mean(x^2) + eps); keeps rstd (accumulator type).
template <class T, class TP, class Acc>
void rms_norm(const T* x, const TP* weight, T* y, Acc* rstd_out, std::int64_t rows, std::int64_t cols, double eps) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    const T* xr = x + r * cols;
    Acc squares = 0;
    for (std::int64_t c = 0; c < cols; ++c) squares += w(xr[c]) * w(xr[c]);
    const Acc rstd = math::rms_norm_rstd(squares, cols, static_cast<Acc>(eps));
    rstd_out[r] = rstd;
    for (std::int64_t c = 0; c < cols; ++c) y[r * cols + c] = detail::narrow<T>(w(xr[c]) * rstd * w(weight[c]));
  });
}

/// dx per row (math::RmsNormBackwardRow); dweight = sum_r dy xhat.
template <class T, class TP, class Acc>
void rms_norm_backward(const T* dy, const T* x, const TP* weight, const Acc* rstd, T* dx, TP* dweight,
                       std::int64_t rows, std::int64_t cols) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  ColumnSums<TP, Acc> dweight_acc(dweight, cols);
  const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * cols, *xr = x + r * cols;
    const math::RmsNormBackwardRow<Acc> row{rstd[r]};
    Acc sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      sum_g_xhat += row.term(w(dyr[c]), w(xr[c]), w(weight[c]));
      dweight_acc[c] += w(dyr[c]) * row.xhat(w(xr[c]));
    }
    for (std::int64_t c = 0; c < cols; ++c)
      dx[r * cols + c] = detail::narrow<T>(row(w(dyr[c]), w(xr[c]), w(weight[c]), sum_g_xhat, inv_cols));
  }
  dweight_acc.finish();
}

}  // namespace trainmem::cpu::kernels

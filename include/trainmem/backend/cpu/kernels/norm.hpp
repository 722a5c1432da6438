// trainmem/backend/cpu/kernels/norm.hpp — layer and RMS norm over the last dimension, forward and backward.
//
// The forward keeps each row's statistics (mean and rstd, or rstd alone; accumulator
// type), so backward re-forms xhat from x instead of saving it; the input gradient is
// math::LayerNormBackwardRow / RmsNormBackwardRow, the parameter gradients are column
// sums over the rows. Row sums run in SIMD lanes (lane_sum.hpp); backward splits the rows
// into chunks, each with its own column sums, added in chunk order at the end.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/kernels/lane_sum.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cpu::kernels {

/// Rows per chunk of a norm's backward: all rows below the parallel grain, else at most
/// 64 chunks of at least 8 rows. A function of the shape only, so the column sums, added
/// chunk by chunk in chunk order, are the same bits on any number of threads.
inline std::int64_t norm_backward_chunk_rows(std::int64_t rows, std::int64_t cols) {
  if (rows * cols <= kParallelGrain) return std::max<std::int64_t>(rows, 1);
  return std::max<std::int64_t>(8, (rows + 63) / 64);
}

/// A norm's backward over row chunks (threads when large): row(r, sums) writes row r's dx
/// and adds its terms of the K column sums (dgamma, dbeta) to sums[k][c], in Acc; each
/// chunk has its own sums (tracked workspace), added in chunk order and rounded once to
/// TP into outs[k] (as a single product would). One chunk of Acc sums writes in place.
template <int K, class TP, class Acc, class Row>
void norm_backward_rows(Allocator& allocator, std::int64_t rows, std::int64_t cols, const std::array<TP*, K>& outs,
                        Row&& row) {
  const std::int64_t chunk_rows = norm_backward_chunk_rows(rows, cols);
  const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  const bool in_place = chunks == 1 && std::is_same_v<TP, Acc>;
  const Workspace<Acc> partial(allocator, in_place ? 0 : static_cast<std::size_t>(chunks * K * cols));
  auto sums_of = [&](std::int64_t chunk) {
    std::array<Acc*, K> sums;
    for (int k = 0; k < K; ++k) {
      if constexpr (std::is_same_v<TP, Acc>) sums[k] = in_place ? outs[k] : partial.get() + (chunk * K + k) * cols;
      else sums[k] = partial.get() + (chunk * K + k) * cols;
    }
    return sums;
  };
  parallel_for(chunks, chunks > 1, [&](std::int64_t chunk) {
    const std::array<Acc*, K> sums = sums_of(chunk);
    for (Acc* s : sums) std::fill(s, s + cols, Acc(0));
    for (std::int64_t r = chunk * chunk_rows; r < std::min(rows, (chunk + 1) * chunk_rows); ++r) row(r, sums);
  });
  if (in_place) return;
  for (int k = 0; k < K; ++k)
    for (std::int64_t c = 0; c < cols; ++c) {
      Acc total = 0;
      for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partial.get()[(chunk * K + k) * cols + c];
      outs[k][c] = detail::narrow<TP>(total);
    }
}

/// One row of layer_norm: y = (x - mean) * rstd * gamma + beta, and the row's statistics.
template <class T, class TP, class Acc>
void layer_norm_row(const T* x, const TP* gamma, const TP* beta, T* y, std::int64_t cols, Acc eps, Acc& mean_out,
                    Acc& rstd_out) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const Acc mean = lane_sum<Acc>(cols, [&](std::int64_t c) { return w(x[c]); }) / static_cast<Acc>(cols);
  const Acc var =
      lane_sum<Acc>(cols, [&](std::int64_t c) { return (w(x[c]) - mean) * (w(x[c]) - mean); }) / static_cast<Acc>(cols);
  const Acc rstd = Acc(1) / std::sqrt(var + eps);
  mean_out = mean;
  rstd_out = rstd;
#pragma omp simd
  for (std::int64_t c = 0; c < cols; ++c) y[c] = detail::narrow<T>((w(x[c]) - mean) * rstd * w(gamma[c]) + w(beta[c]));
}

/// y = (x - mean) * rstd * gamma + beta per row; keeps mean and rstd (accumulator type).
template <class T, class TP, class Acc>
void layer_norm(const T* x, const TP* gamma, const TP* beta, T* y, Acc* mean_out, Acc* rstd_out, std::int64_t rows,
                std::int64_t cols, double eps) {
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    layer_norm_row(x + r * cols, gamma, beta, y + r * cols, cols, static_cast<Acc>(eps), mean_out[r], rstd_out[r]);
  });
}

/// One row of layer_norm_backward: dx (math::LayerNormBackwardRow), and the row's terms
/// added to the column sums dgamma_sum (dy xhat) and dbeta_sum (dy).
template <class T, class TP, class Acc>
void layer_norm_backward_row(const T* dy, const T* x, const TP* gamma, Acc mean, Acc rstd, T* dx, Acc* dgamma_sum,
                             Acc* dbeta_sum, std::int64_t cols) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const math::LayerNormBackwardRow<Acc> row{mean, rstd};
  Acc sum_g = 0, sum_g_xhat = 0;
  lane_sum2<Acc>(
      cols, [&](std::int64_t c, Acc& g, Acc& g_xhat) { row.add_terms(w(dy[c]), w(x[c]), w(gamma[c]), g, g_xhat); },
      sum_g, sum_g_xhat);
  const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
#pragma omp simd
  for (std::int64_t c = 0; c < cols; ++c) {
    dgamma_sum[c] += w(dy[c]) * row.xhat(w(x[c]));
    dbeta_sum[c] += w(dy[c]);
    dx[c] = detail::narrow<T>(row(w(dy[c]), w(x[c]), w(gamma[c]), sum_g, sum_g_xhat, inv_cols));
  }
}

/// dx per row (math::LayerNormBackwardRow); dgamma = sum_r dy xhat and dbeta = sum_r dy.
template <class T, class TP, class Acc>
void layer_norm_backward(const T* dy, const T* x, const TP* gamma, const Acc* mean, const Acc* rstd, T* dx, TP* dgamma,
                         TP* dbeta, std::int64_t rows, std::int64_t cols, Allocator& allocator) {
  norm_backward_rows<2, TP, Acc>(allocator, rows, cols, {dgamma, dbeta}, [&](std::int64_t r, const auto& sums) {
    layer_norm_backward_row(dy + r * cols, x + r * cols, gamma, mean[r], rstd[r], dx + r * cols, sums[0], sums[1],
                            cols);
  });
}

/// One row of rms_norm: y = x * rstd * weight, and the row's rstd.
template <class T, class TP, class Acc>
void rms_norm_row(const T* x, const TP* weight, T* y, std::int64_t cols, Acc eps, Acc& rstd_out) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const Acc rstd =
      math::rms_norm_rstd(lane_sum<Acc>(cols, [&](std::int64_t c) { return w(x[c]) * w(x[c]); }), cols, eps);
  rstd_out = rstd;
#pragma omp simd
  for (std::int64_t c = 0; c < cols; ++c) y[c] = detail::narrow<T>(w(x[c]) * rstd * w(weight[c]));
}

/// y = x * rstd * weight per row with rstd = 1 / sqrt(mean(x^2) + eps); keeps rstd (accumulator type).
template <class T, class TP, class Acc>
void rms_norm(const T* x, const TP* weight, T* y, Acc* rstd_out, std::int64_t rows, std::int64_t cols, double eps) {
  parallel_for(rows, rows * cols > kParallelGrain, [&](std::int64_t r) {
    rms_norm_row(x + r * cols, weight, y + r * cols, cols, static_cast<Acc>(eps), rstd_out[r]);
  });
}

/// One row of rms_norm_backward: dx (math::RmsNormBackwardRow), and the row's terms added
/// to the column sums dweight_sum (dy xhat).
template <class T, class TP, class Acc>
void rms_norm_backward_row(const T* dy, const T* x, const TP* weight, Acc rstd, T* dx, Acc* dweight_sum,
                           std::int64_t cols) {
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const math::RmsNormBackwardRow<Acc> row{rstd};
  const Acc sum_g_xhat = lane_sum<Acc>(cols, [&](std::int64_t c) { return row.term(w(dy[c]), w(x[c]), w(weight[c])); });
  const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
#pragma omp simd
  for (std::int64_t c = 0; c < cols; ++c) {
    dweight_sum[c] += w(dy[c]) * row.xhat(w(x[c]));
    dx[c] = detail::narrow<T>(row(w(dy[c]), w(x[c]), w(weight[c]), sum_g_xhat, inv_cols));
  }
}

/// dx per row (math::RmsNormBackwardRow); dweight = sum_r dy xhat.
template <class T, class TP, class Acc>
void rms_norm_backward(const T* dy, const T* x, const TP* weight, const Acc* rstd, T* dx, TP* dweight,
                       std::int64_t rows, std::int64_t cols, Allocator& allocator) {
  norm_backward_rows<1, TP, Acc>(allocator, rows, cols, {dweight}, [&](std::int64_t r, const auto& sums) {
    rms_norm_backward_row(dy + r * cols, x + r * cols, weight, rstd[r], dx + r * cols, sums[0], cols);
  });
}

}  // namespace trainmem::cpu::kernels

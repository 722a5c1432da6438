// trainmem/backend/cpu/kernels.hpp — the CPU loops behind cpu::Backend.
//
// Loops over typed pointers. Every element is widened to its accumulator type (float,
// or double for f64), computed with the shared math functors, and narrowed on store;
// reductions (softmax, layer norm, sums, losses) accumulate in the accumulator type.
// Rows are independent, so the outer loops are OpenMP-parallel when compiled with it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"

namespace trainmem::cpu::detail {

template <class... Ts>
using AccumulatorFor = std::conditional_t<(std::is_same_v<Ts, double> || ...), double, float>;

// NOTE [Parallel and SIMD]
// Loops split across threads only above kParallelGrain elements (a fork/join costs
// more than a small loop). On `parallel for simd` the condition is written
// `if (parallel : ...)`: a bare `if` applies to the simd part too (OpenMP 5), and GCC
// then runs every small loop scalar — GELU over 64x512 was 5x slower that way.
inline constexpr std::int64_t kParallelGrain = 1 << 15;

template <class Op, class TIn, class TOut>
void map_unary(Op op, const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = trainmem::detail::narrow<TOut>(op(static_cast<Acc>(trainmem::detail::widen(in[i]))));
}

/// out = op(a, b) where b has a's shape, is a row of `cols`, or a scalar.
template <class Op, class TA, class TB, class TOut>
void map_binary(Op op, const TA* a, const TB* b, TOut* out, std::int64_t rows, std::int64_t cols,
                std::int64_t b_numel) {
  using Acc = AccumulatorFor<TA, TB, TOut>;
  auto w = [](auto v) { return static_cast<Acc>(trainmem::detail::widen(v)); };
  const std::int64_t n = rows * cols;
  if (b_numel == n) {
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) out[i] = trainmem::detail::narrow<TOut>(op(w(a[i]), w(b[i])));
  } else if (b_numel == 1) {
    const Acc scalar = w(b[0]);
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
    for (std::int64_t i = 0; i < n; ++i) out[i] = trainmem::detail::narrow<TOut>(op(w(a[i]), scalar));
  } else {
#pragma omp parallel for if (n > kParallelGrain)
    for (std::int64_t r = 0; r < rows; ++r)
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c)
        out[r * cols + c] = trainmem::detail::narrow<TOut>(op(w(a[r * cols + c]), w(b[c])));
  }
}

/// out[c] = beta * out[c] + sum_r in[r, c].
template <class TIn, class TOut>
void sum_rows(const TIn* in, TOut* out, std::int64_t rows, std::int64_t cols, double beta) {
  using Acc = AccumulatorFor<TIn, TOut>;
  std::vector<Acc> acc(static_cast<std::size_t>(cols), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) acc[c] += static_cast<Acc>(trainmem::detail::widen(in[r * cols + c]));
  for (std::int64_t c = 0; c < cols; ++c) {
    const Acc prior = beta == 0.0 ? Acc(0) : static_cast<Acc>(beta) * static_cast<Acc>(trainmem::detail::widen(out[c]));
    out[c] = trainmem::detail::narrow<TOut>(prior + acc[c]);
  }
}

template <class TIn, class TOut>
void sum_all(const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  Acc total = 0;
#pragma omp parallel for reduction(+ : total) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) total += static_cast<Acc>(trainmem::detail::widen(in[i]));
  out[0] = trainmem::detail::narrow<TOut>(total);
}

/// A row's maximum and sum of exp(x - max): the stable base of softmax and log-sum-exp.
template <class Acc>
struct MaxSumExp {
  Acc max;
  Acc sum;
};
template <class Acc, class T>
MaxSumExp<Acc> max_and_sum_exp(const T* row, std::int64_t cols) {
  Acc max = -std::numeric_limits<Acc>::infinity();
  for (std::int64_t c = 0; c < cols; ++c) max = std::max(max, static_cast<Acc>(trainmem::detail::widen(row[c])));
  Acc sum = 0;
  for (std::int64_t c = 0; c < cols; ++c) sum += math::exp(static_cast<Acc>(trainmem::detail::widen(row[c])) - max);
  return {max, sum};
}

/// Row-wise softmax (or log-softmax) over the last dimension, max-subtracted.
template <class T>
void softmax(const T* x, T* y, std::int64_t rows, std::int64_t cols, bool log_output) {
  using Acc = AccumulatorOf<T>;
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const auto [max, sum] = max_and_sum_exp<Acc>(xr, cols);
    const Acc log_sum = std::log(sum);
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc shifted = static_cast<Acc>(trainmem::detail::widen(xr[c])) - max;
      yr[c] = trainmem::detail::narrow<T>(log_output ? shifted - log_sum : math::exp(shifted) / sum);
    }
  }
}

/// softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy).
template <class T>
void softmax_backward(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols, bool log_output) {
  using Acc = AccumulatorOf<T>;
  auto w = [](T v) { return static_cast<Acc>(trainmem::detail::widen(v)); };
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * cols, *yr = y + r * cols;
    T* dxr = dx + r * cols;
    Acc dot = 0;
    for (std::int64_t c = 0; c < cols; ++c) dot += log_output ? w(dyr[c]) : w(dyr[c]) * w(yr[c]);
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc g = log_output ? w(dyr[c]) - math::exp(w(yr[c])) * dot : w(yr[c]) * (w(dyr[c]) - dot);
      dxr[c] = trainmem::detail::narrow<T>(g);
    }
  }
}

/// y = (x - mean) * rstd * gamma + beta per row; keeps mean and rstd (accumulator type).
template <class T, class TP, class Acc>
void layer_norm(const T* x, const TP* gamma, const TP* beta, T* y, Acc* mean_out, Acc* rstd_out, std::int64_t rows,
                std::int64_t cols, double eps) {
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    Acc mean = 0;
    for (std::int64_t c = 0; c < cols; ++c) mean += static_cast<Acc>(trainmem::detail::widen(xr[c]));
    mean /= static_cast<Acc>(cols);
    Acc var = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc d = static_cast<Acc>(trainmem::detail::widen(xr[c])) - mean;
      var += d * d;
    }
    var /= static_cast<Acc>(cols);
    const Acc rstd = Acc(1) / std::sqrt(var + static_cast<Acc>(eps));
    mean_out[r] = mean;
    rstd_out[r] = rstd;
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc xhat = (static_cast<Acc>(trainmem::detail::widen(xr[c])) - mean) * rstd;
      y[r * cols + c] = trainmem::detail::narrow<T>(xhat * static_cast<Acc>(trainmem::detail::widen(gamma[c])) +
                                                    static_cast<Acc>(trainmem::detail::widen(beta[c])));
    }
  }
}

/// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma; dgamma, dbeta summed over rows.
template <class T, class TP, class Acc>
void layer_norm_backward(const T* dy, const T* x, const TP* gamma, const Acc* mean, const Acc* rstd, T* dx, TP* dgamma,
                         TP* dbeta, std::int64_t rows, std::int64_t cols) {
  auto w = [](auto v) { return static_cast<Acc>(trainmem::detail::widen(v)); };
  std::vector<Acc> dgamma_acc(static_cast<std::size_t>(cols), Acc(0)),
      dbeta_acc(static_cast<std::size_t>(cols), Acc(0));
  for (std::int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * cols, *xr = x + r * cols;
    Acc sum_g = 0, sum_g_xhat = 0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc xhat = (w(xr[c]) - mean[r]) * rstd[r];
      const Acc g = w(dyr[c]) * w(gamma[c]);
      sum_g += g;
      sum_g_xhat += g * xhat;
      dgamma_acc[c] += w(dyr[c]) * xhat;
      dbeta_acc[c] += w(dyr[c]);
    }
    const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc xhat = (w(xr[c]) - mean[r]) * rstd[r];
      const Acc g = w(dyr[c]) * w(gamma[c]);
      dx[r * cols + c] = trainmem::detail::narrow<T>(rstd[r] * (g - sum_g * inv_cols - xhat * sum_g_xhat * inv_cols));
    }
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    dgamma[c] = trainmem::detail::narrow<TP>(dgamma_acc[c]);
    dbeta[c] = trainmem::detail::narrow<TP>(dbeta_acc[c]);
  }
}

/// Mean cross-entropy of integer labels; keeps each row's log-sum-exp for backward.
/// Returns the first out-of-range label's row, or -1.
template <class T, class Acc>
std::int64_t cross_entropy(const T* logits, const std::int32_t* labels, Acc* loss, Acc* lse, std::int64_t rows,
                           std::int64_t cols) {
  auto w = [](T v) { return static_cast<Acc>(trainmem::detail::widen(v)); };
  for (std::int64_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || labels[r] >= cols) return r;
  Acc total = 0;
#pragma omp parallel for reduction(+ : total) if (rows * cols > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* xr = logits + r * cols;
    const auto [max, sum] = max_and_sum_exp<Acc>(xr, cols);
    lse[r] = max + std::log(sum);
    total += lse[r] - w(xr[labels[r]]);
  }
  loss[0] = total / static_cast<Acc>(rows);
  return -1;
}

/// dlogits = dloss / rows * (softmax(logits) - onehot(label)).
template <class T, class Acc>
void cross_entropy_backward(Acc dloss, const T* logits, const std::int32_t* labels, const Acc* lse, T* dlogits,
                            std::int64_t rows, std::int64_t cols) {
  const Acc scale = dloss / static_cast<Acc>(rows);
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const Acc p = math::exp(static_cast<Acc>(trainmem::detail::widen(logits[r * cols + c])) - lse[r]);
      dlogits[r * cols + c] = trainmem::detail::narrow<T>(scale * (p - (c == labels[r] ? Acc(1) : Acc(0))));
    }
}

/// in [a, b, c, d] -> out [a, c, b, d]: swaps the two middle axes. With d = 1 it is a
/// batched transpose; with d = head size it splits or merges attention heads.
template <class T>
void swap_middle_axes(const T* in, T* out, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
#pragma omp parallel for collapse(2) if (a * b * c * d > kParallelGrain)
  for (std::int64_t i = 0; i < a; ++i)
    for (std::int64_t j = 0; j < b; ++j)
      for (std::int64_t k = 0; k < c; ++k) {
        const T* src = in + ((i * b + j) * c + k) * d;
        T* dst = out + ((i * c + k) * b + j) * d;
        for (std::int64_t e = 0; e < d; ++e) dst[e] = src[e];
      }
}

/// Copies [.., T, T] and sets entries above the diagonal (key after query) to `fill`.
template <class T>
void causal_mask(const T* in, T* out, std::int64_t batch, std::int64_t t, double fill) {
  const T fill_value = trainmem::detail::narrow<T>(static_cast<AccumulatorOf<T>>(fill));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t j = 0; j < t; ++j) {
        const std::int64_t at = (b * t + i) * t + j;
        out[at] = j > i ? fill_value : in[at];
      }
}

/// out = in * keep(i) / (1 - p); the same call is dropout's backward on the gradient.
template <class T>
void dropout(const T* in, T* out, std::int64_t n, float p, RngState rng) {
  const math::DropoutScale scale{p};
#pragma omp parallel for if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto factor =
        static_cast<AccumulatorOf<T>>(scale(trainmem::detail::random_uniform(rng, static_cast<std::uint64_t>(i))));
    out[i] = trainmem::detail::narrow<T>(static_cast<AccumulatorOf<T>>(trainmem::detail::widen(in[i])) * factor);
  }
}

/// The position of the first id outside [0, vocab), or -1 when every id is a row.
inline std::int64_t first_bad_id(const std::int32_t* ids, std::int64_t count, std::int64_t vocab) {
  for (std::int64_t i = 0; i < count; ++i)
    if (ids[i] < 0 || ids[i] >= vocab) return i;
  return -1;
}

/// out rows = weight rows by id; returns the position of the first id outside [0, vocab)
/// (out is then written up to it), or -1. The check rides on the copy loop: no extra pass.
template <class T>
std::int64_t embedding(const T* weight, const std::int32_t* ids, T* out, std::int64_t count, std::int64_t dim,
                       std::int64_t vocab) {
  for (std::int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) return i;
    std::copy_n(weight + ids[i] * dim, dim, out + i * dim);
  }
  return -1;
}

/// dweight (zeroed by the caller) += scatter of dout rows by id, accumulated in Acc; the
/// ids are checked first (a saved id may have been overwritten since the forward), so a
/// bad one leaves dweight untouched. Returns its position, or -1.
template <class T, class TW>
std::int64_t embedding_backward(const T* dout, const std::int32_t* ids, TW* dweight, std::int64_t count,
                                std::int64_t dim, std::int64_t vocab) {
  using Acc = AccumulatorFor<T, TW>;
  if (const std::int64_t bad = first_bad_id(ids, count, vocab); bad >= 0) return bad;
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t d = 0; d < dim; ++d) {
      TW& slot = dweight[ids[i] * dim + d];
      slot = trainmem::detail::narrow<TW>(static_cast<Acc>(trainmem::detail::widen(slot)) +
                                          static_cast<Acc>(trainmem::detail::widen(dout[i * dim + d])));
    }
  return -1;
}

/// Applies an optimizer update element by element: param (the f32/f64 master) and the
/// optional states are updated in place; the gradient is widened; `store_copy(i, value)`
/// writes the 16-bit model copy from the updated value in the same pass (or nothing).
template <class Update, class TP, class TG, class StoreCopy>
void apply_update(Update update, TP* param, const TG* grad, TP* state1, TP* state2, std::int64_t n,
                  StoreCopy store_copy) {
#pragma omp parallel for if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    TP unused1 = 0, unused2 = 0;
    TP& s1 = state1 ? state1[i] : unused1;
    TP& s2 = state2 ? state2[i] : unused2;
    update(param[i], static_cast<TP>(trainmem::detail::widen(grad[i])), s1, s2);
    store_copy(i, param[i]);
  }
}

/// Model-copy writers for apply_update.
struct NoCopy {
  template <class TP>
  void operator()(std::int64_t, TP) const {}
};
template <class TC>
struct NearestCopy {
  TC* copy;
  template <class TP>
  void operator()(std::int64_t i, TP value) const {
    copy[i] = trainmem::detail::narrow<TC>(value);
  }
};
/// Rounds element i with draw i of `rng`, so the result does not depend on how the loop is split.
struct StochasticBf16Copy {
  BFloat16* copy;
  RngState rng;
  template <class TP>
  void operator()(std::int64_t i, TP value) const {
    copy[i] = bf16_round_stochastic(static_cast<float>(value),
                                    trainmem::detail::random_bits(rng, static_cast<std::uint64_t>(i)));
  }
};

// --- mixed precision: loss scaling and master weights ----------------------------------

/// x *= inv_scale in place (no write when inv_scale is 1: a pure check); returns whether
/// any element was inf or NaN before scaling (PyTorch's non-finite check and unscale).
template <class T>
bool unscale_and_check(T* x, std::int64_t n, float inv_scale) {
  using Acc = AccumulatorOf<T>;
  int found = 0;
  const bool scales = inv_scale != 1.0f;
#pragma omp parallel for reduction(| : found) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    Acc v = static_cast<Acc>(trainmem::detail::widen(x[i]));
    if (scales) {
      x[i] = trainmem::detail::narrow<T>(v * static_cast<Acc>(inv_scale));
      v = static_cast<Acc>(trainmem::detail::widen(x[i]));  // check what is stored: a scale < 1 can overflow it
    }
    found |= std::isfinite(v) ? 0 : 1;
  }
  return found != 0;
}

/// accumulator[0] += sum of x[i]^2, summed in the accumulator's type.
template <class T, class TAcc>
void sum_squares(const T* x, TAcc* accumulator, std::int64_t n) {
  TAcc total = 0;
#pragma omp parallel for reduction(+ : total) if (n > kParallelGrain)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<TAcc>(trainmem::detail::widen(x[i]));
    total += v * v;
  }
  accumulator[0] += total;
}

}  // namespace trainmem::cpu::detail

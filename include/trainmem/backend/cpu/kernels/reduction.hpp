// trainmem/backend/cpu/kernels/reduction.hpp — column sums, sums over one axis, the sum of all elements, the sum of
// squares.
//
// Each sum runs in the accumulator type, in a fixed order per thread count: column
// sums walk the rows in order, full sums are OpenMP reductions.
#pragma once

#include <cstdint>
#include <vector>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

/// out[c] = beta * out[c] + sum_r in[r, c].
template <class TIn, class TOut>
void sum_rows(const TIn* in, TOut* out, std::int64_t rows, std::int64_t cols, double beta) {
  using Acc = AccumulatorFor<TIn, TOut>;
  std::vector<Acc> acc(static_cast<std::size_t>(cols), Acc(0));
  Acc* sums = acc.data();
  for (std::int64_t r = 0; r < rows; ++r) {
    const TIn* row = in + r * cols;
#pragma omp simd  // columns are independent sums; each still adds its rows in order
    for (std::int64_t c = 0; c < cols; ++c) sums[c] += static_cast<Acc>(detail::widen(row[c]));
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    const Acc prior = beta == 0.0 ? Acc(0) : static_cast<Acc>(beta) * static_cast<Acc>(detail::widen(out[c]));
    out[c] = detail::narrow<TOut>(prior + acc[c]);
  }
}

/// out[o, i] = sum_e in[o, e, i] for in seen as `view`; e runs in order, so the result
/// does not depend on the thread count.
template <class TIn, class TOut>
void sum_axis(const TIn* in, TOut* out, const AxisView& view) {
  using Acc = AccumulatorFor<TIn, TOut>;
  const std::int64_t extent = view.extent, inner = view.inner;
  const bool split = view.numel() > kParallelGrain;
  if (inner == 1) {  // one contiguous run per output (a row sum)
    parallel_for(view.outer, split, [&](std::int64_t o) {
      const TIn* run = in + o * extent;
      Acc acc = Acc(0);
      for (std::int64_t e = 0; e < extent; ++e) acc += static_cast<Acc>(detail::widen(run[e]));
      out[o] = detail::narrow<TOut>(acc);
    });
    return;
  }
  parallel_for(view.outer, split && view.outer > 1, [&](std::int64_t o) {
    std::vector<Acc> acc(static_cast<std::size_t>(inner), Acc(0));
    Acc* sums = acc.data();
    for (std::int64_t e = 0; e < extent; ++e) {
      const TIn* row = in + (o * extent + e) * inner;
#pragma omp simd
      for (std::int64_t i = 0; i < inner; ++i) sums[i] += static_cast<Acc>(detail::widen(row[i]));
    }
    for (std::int64_t i = 0; i < inner; ++i) out[o * inner + i] = detail::narrow<TOut>(acc[i]);
  });
}

template <class TIn, class TOut>
void sum_all(const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  const Acc total =
      parallel_sum<Acc>(n, n > kParallelGrain, [&](std::int64_t i) { return static_cast<Acc>(detail::widen(in[i])); });
  out[0] = detail::narrow<TOut>(total);
}

/// accumulator[0] += sum of x[i]^2, summed in the accumulator's type.
template <class T, class TAcc>
void sum_squares(const T* x, TAcc* accumulator, std::int64_t n) {
  const TAcc total = parallel_sum<TAcc>(n, n > kParallelGrain, [&](std::int64_t i) {
    const auto v = static_cast<TAcc>(detail::widen(x[i]));
    return v * v;
  });
  accumulator[0] += total;
}

}  // namespace trainmem::cpu::kernels

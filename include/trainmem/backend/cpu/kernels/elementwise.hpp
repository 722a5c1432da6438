// trainmem/backend/cpu/kernels/elementwise.hpp — out = op(in) and out = op(a, b), element by element.
//
// One loop per way b lines up with a (same shape, a scalar, rows of b, one b element per
// slice), so each inner loop is a plain stride-1 loop the compiler vectorises; the op is
// a functor of core/math.hpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

template <class T>
void fill(T* out, T value, std::int64_t n) {
  std::fill_n(out, n, value);
}

template <class Op, class TIn, class TOut>
void map_unary(Op op, const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  // Both branches written out, each simd (NOTE [Parallel and SIMD]).
  if (n > kParallelGrain) {
#pragma omp parallel for simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(static_cast<Acc>(detail::widen(in[i]))));
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(static_cast<Acc>(detail::widen(in[i]))));
  }
}

/// out = op(a, b) where a is seen as `view` and b as its reduced partner [outer, inner]
/// (core/axis_view.hpp): b has a's shape, is a scalar, a row, or a with one axis collapsed.
template <class Op, class TA, class TB, class TOut>
void map_binary(Op op, const TA* a, const TB* b, TOut* out, const AxisView& view) {
  using Acc = AccumulatorFor<TA, TB, TOut>;
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const std::int64_t n = view.numel();
  const bool parallel = n > kParallelGrain;
  if (view.extent == 1) {  // same shape
    if (parallel) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    }
  } else if (view.outer == 1 && view.inner == 1) {  // a scalar
    const Acc scalar = w(b[0]);
    if (parallel) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), scalar));
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), scalar));
    }
  } else if (view.inner > 1) {  // each row of `inner` pairs with row r / extent of b (a bias: outer 1)
    const std::int64_t rows = view.outer * view.extent, cols = view.inner, extent = view.extent;
    auto row = [&](std::int64_t r) {
      const TB* b_row = b + (r / extent) * cols;
#pragma omp simd
      for (std::int64_t c = 0; c < cols; ++c)
        out[r * cols + c] = detail::narrow<TOut>(op(w(a[r * cols + c]), w(b_row[c])));
    };
    parallel_for(rows, parallel, row);
  } else {  // inner 1: the extent elements of slice o share b[o] (a column per row)
    const std::int64_t extent = view.extent;
    auto slice = [&](std::int64_t o) {
      const Acc shared = w(b[o]);
#pragma omp simd
      for (std::int64_t e = 0; e < extent; ++e)
        out[o * extent + e] = detail::narrow<TOut>(op(w(a[o * extent + e]), shared));
    };
    parallel_for(view.outer, parallel, slice);
  }
}

}  // namespace trainmem::cpu::kernels

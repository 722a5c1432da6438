// trainmem/backend/cpu/kernels/elementwise.hpp — out = op(in) and out = op(a, b), element by element.
//
// One loop per shape of b (same shape, one row broadcast, a scalar), so each inner loop
// is a plain stride-1 loop the compiler vectorises; the op is a functor of core/math.hpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
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

/// out = op(a, b) where b has a's shape, is a row of `cols`, or a scalar.
template <class Op, class TA, class TB, class TOut>
void map_binary(Op op, const TA* a, const TB* b, TOut* out, std::int64_t rows, std::int64_t cols,
                std::int64_t b_numel) {
  using Acc = AccumulatorFor<TA, TB, TOut>;
  auto w = [](auto v) { return static_cast<Acc>(detail::widen(v)); };
  const std::int64_t n = rows * cols;
  if (b_numel == n) {
    if (n > kParallelGrain) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    }
  } else if (b_numel == 1) {
    const Acc scalar = w(b[0]);
    if (n > kParallelGrain) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), scalar));
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), scalar));
    }
  } else {
    if (n > kParallelGrain) {
#pragma omp parallel for
      for (std::int64_t r = 0; r < rows; ++r)
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = detail::narrow<TOut>(op(w(a[r * cols + c]), w(b[c])));
    } else {
      for (std::int64_t r = 0; r < rows; ++r)
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = detail::narrow<TOut>(op(w(a[r * cols + c]), w(b[c])));
    }
  }
}

}  // namespace trainmem::cpu::kernels

// trainmem/backend/cpu/kernels/elementwise.hpp — out = op(in) and out = op(a, b), element by element.
//
// One loop per way b lines up with a (same shape, a scalar, rows of b, one b element per
// slice), so each inner loop is a plain stride-1 loop the compiler vectorises; the op is
// a functor of core/math.hpp. Where a 16-bit type is involved, the loops run on float
// blocks: the bulk converters of convert.hpp widen a block of each input and narrow the
// block of results (NOTE [16-bit blocks]).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

template <class T>
void fill(T* out, T value, std::int64_t n) {
  std::fill_n(out, n, value);
}

// NOTE [16-bit blocks]
// A loop that converts each element with the scalar Half conversion does not vectorise
// (an F16C scalar intrinsic is a barrier to GCC's vectoriser), so the functor around it
// runs scalar too: GELU over f16 was 8x slower than over bf16 and most of an FP16 step's
// element-wise time. Converting kBlock elements at a time with the vector converters and
// running the functor over float blocks makes the loop the same as the f32 one. The
// converters give the bits of the scalar conversions, so the results are bitwise those of
// the element-by-element loop (and bf16 takes the same path: one way for 16-bit storage).
namespace float_blocks {
inline constexpr std::int64_t kBlock = 256;

template <class... Ts>
inline constexpr bool kBlocked =
    (... || (std::is_same_v<Ts, Half> || std::is_same_v<Ts, BFloat16>)) && std::is_same_v<AccumulatorFor<Ts...>, float>;

/// p[0, m) as floats: p itself, or widened into buf.
template <class T>
const float* floats(const T* p, std::int64_t m, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return p;
  } else {
    widen_to_float(p, buf, static_cast<std::size_t>(m));
    return buf;
  }
}
/// Where a block of results goes: out itself when it is float, else buf (stored after).
template <class T>
float* results(T* out, float* buf) {
  if constexpr (std::is_same_v<T, float>) return out;
  else return buf;
}
template <class T>
void store(const float* results, T* out, std::int64_t m) {
  if constexpr (!std::is_same_v<T, float>) narrow_from_float(results, out, static_cast<std::size_t>(m));
}

/// out[0, n) = op(in[i]) in float blocks.
template <class Op, class TIn, class TOut>
void unary_span(Op op, const TIn* in, TOut* out, std::int64_t n) {
  alignas(64) float x_buf[kBlock], y_buf[kBlock];
  for (std::int64_t s = 0; s < n; s += kBlock) {
    const std::int64_t m = std::min(kBlock, n - s);
    const float* x = floats(in + s, m, x_buf);
    float* y = results(out + s, y_buf);
#pragma omp simd
    for (std::int64_t i = 0; i < m; ++i) y[i] = op(x[i]);
    store(y, out + s, m);
  }
}

/// out[0, n) = op(a[i], b[i]), or op(a[i], b[0]) when `b_shared`, in float blocks.
template <class Op, class TA, class TB, class TOut>
void binary_span(Op op, const TA* a, const TB* b, bool b_shared, TOut* out, std::int64_t n) {
  alignas(64) float a_buf[kBlock], b_buf[kBlock], y_buf[kBlock];
  const float shared = b_shared ? static_cast<float>(trainmem::detail::widen(b[0])) : 0.0f;
  for (std::int64_t s = 0; s < n; s += kBlock) {
    const std::int64_t m = std::min(kBlock, n - s);
    const float* x = floats(a + s, m, a_buf);
    float* y = results(out + s, y_buf);
    if (b_shared) {
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) y[i] = op(x[i], shared);
    } else {
      const float* z = floats(b + s, m, b_buf);
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) y[i] = op(x[i], z[i]);
    }
    store(y, out + s, m);
  }
}

/// The blocks of [0, n), over threads when `split`: span(begin, count).
template <class Span>
void for_blocks(std::int64_t n, bool split, Span&& span) {
  constexpr std::int64_t chunk = 16 * kBlock;  // a thread's share: several blocks
  parallel_for((n + chunk - 1) / chunk, split,
               [&](std::int64_t c) { span(c * chunk, std::min(chunk, n - c * chunk)); });
}
}  // namespace float_blocks

template <class Op, class TIn, class TOut>
void map_unary(Op op, const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  if constexpr (float_blocks::kBlocked<TIn, TOut>) {
    float_blocks::for_blocks(n, n > kParallelGrain,
                             [&](std::int64_t s, std::int64_t m) { float_blocks::unary_span(op, in + s, out + s, m); });
  } else if (n > kParallelGrain) {  // both branches written out, each simd (NOTE [Parallel and SIMD])
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
  constexpr bool blocked = float_blocks::kBlocked<TA, TB, TOut>;
  if (view.extent == 1) {  // same shape
    if constexpr (blocked) {
      float_blocks::for_blocks(n, parallel, [&](std::int64_t s, std::int64_t m) {
        float_blocks::binary_span(op, a + s, b + s, false, out + s, m);
      });
    } else if (parallel) {
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) out[i] = detail::narrow<TOut>(op(w(a[i]), w(b[i])));
    }
  } else if (view.outer == 1 && view.inner == 1) {  // a scalar
    const Acc scalar = w(b[0]);
    if constexpr (blocked) {
      float_blocks::for_blocks(n, parallel, [&](std::int64_t s, std::int64_t m) {
        float_blocks::binary_span(op, a + s, b, true, out + s, m);
      });
    } else if (parallel) {
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
      if constexpr (blocked) {
        float_blocks::binary_span(op, a + r * cols, b_row, false, out + r * cols, cols);
      } else {
#pragma omp simd
        for (std::int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = detail::narrow<TOut>(op(w(a[r * cols + c]), w(b_row[c])));
      }
    };
    parallel_for(rows, parallel, row);
  } else {  // inner 1: the extent elements of slice o share b[o] (a column per row)
    const std::int64_t extent = view.extent;
    auto slice = [&](std::int64_t o) {
      if constexpr (blocked) {
        float_blocks::binary_span(op, a + o * extent, b + o, true, out + o * extent, extent);
      } else {
        const Acc shared = w(b[o]);
#pragma omp simd
        for (std::int64_t e = 0; e < extent; ++e)
          out[o * extent + e] = detail::narrow<TOut>(op(w(a[o * extent + e]), shared));
      }
    };
    parallel_for(view.outer, parallel, slice);
  }
}

}  // namespace trainmem::cpu::kernels

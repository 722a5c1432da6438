// trainmem/backend/cpu/kernels/elementwise.hpp — out = op(in) and out = op(a, b), element by element.
//
// The dtypes of the operands are run-time values (Operand); the functor (core/math.hpp)
// is the only compile-time parameter. Each map runs in blocks: every operand's block is
// widened to the accumulator type by the bulk converters, the functor runs over
// accumulator blocks in one stride-1 simd loop, and the results are narrowed back
// (NOTE [Element-wise maps in blocks]). One loop per way b lines up with a (same shape, a
// scalar, rows of b, one b element per slice).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/axis_view.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"

namespace trainmem::cpu::kernels {

template <class T>
void fill(T* out, T value, std::int64_t n) {
  std::fill_n(out, n, value);
}

// NOTE [Element-wise maps in blocks]
// Two reasons the functor, not the dtypes, is what a map is compiled for:
// - Speed. A loop that converts each element with the scalar Half conversion does not
//   vectorise (GCC's vectoriser stops at the F16C scalar intrinsic), so the functor
//   around it ran scalar too: GELU over f16 was 8x slower than over bf16, and most of an
//   FP16 step's element-wise time. Converting kBlock elements at a time with the vector
//   converters makes the functor's loop the f32 one for every dtype.
// - Code size. Compiled per (functor, dtype of a, of b, of out), the 16 binary functors
//   made 1,024 copies of every loop: 60% of the compiled mode's library code, which took
//   257 s to compile (74 s now). Now each functor has one loop per accumulator type
//   (float, or double when an operand is f64), and the conversions are shared by all.
// The converters give the bits of the scalar conversions, and a double result is
// narrowed as detail::narrow does (round to odd, then to 16 bits), so every result is
// bitwise narrow<out>(op(widen(a), widen(b))), the element-by-element formula
// (tests/backend/cpu/test_elementwise_blocks.cpp).

/// \brief An element-wise operand: its data and its dtype, known at run time.
struct Operand {
  const void* data;
  DType dtype;
};
/// \brief An element-wise result.
struct Result {
  void* data;
  DType dtype;
};

namespace blocks {
inline constexpr std::int64_t kBlock = 256;

/// Accumulator type of a map over these dtypes: double if any is f64, else float.
template <class... Ds>
bool needs_double(Ds... dtypes) {
  return ((dtypes == DType::F64) || ...);
}

/// The m elements of `x` from `offset` as Acc: x's own memory when it is Acc already, else widened into buf.
template <class Acc>
const Acc* load(Operand x, std::int64_t offset, std::int64_t m, Acc* buf) {
  if (x.dtype == dtype_of<Acc>()) return static_cast<const Acc*>(x.data) + offset;
  visit_floating(x.dtype, "map", [&]<class T>() {
    const T* p = static_cast<const T*>(x.data) + offset;
    if constexpr (std::is_same_v<Acc, float>) widen_to_float(p, buf, static_cast<std::size_t>(m));
    else
      for (std::int64_t i = 0; i < m; ++i) buf[i] = static_cast<Acc>(trainmem::detail::widen(p[i]));
  });
  return buf;
}

/// Where the results for out[offset, offset + m) are computed: out itself when it is Acc, else buf.
template <class Acc>
Acc* results(Result out, std::int64_t offset, Acc* buf) {
  return out.dtype == dtype_of<Acc>() ? static_cast<Acc*>(out.data) + offset : buf;
}

/// Narrows results computed in buf into out[offset, offset + m) (nothing when out is Acc).
template <class Acc>
void store(const Acc* y, Result out, std::int64_t offset, std::int64_t m) {
  if (out.dtype == dtype_of<Acc>()) return;
  visit_floating(out.dtype, "map", [&]<class T>() {
    T* p = static_cast<T*>(out.data) + offset;
    if constexpr (std::is_same_v<Acc, float>) narrow_from_float(y, p, static_cast<std::size_t>(m));
    else
      for (std::int64_t i = 0; i < m; ++i) p[i] = trainmem::detail::narrow<T>(y[i]);
  });
}

/// The functor's loops over accumulator blocks: the only code compiled per functor.
template <class Op, class Acc>
void unary_loop(const void* op, const Acc* x, Acc* y, std::int64_t m) {
  const Op& f = *static_cast<const Op*>(op);
#pragma omp simd
  for (std::int64_t i = 0; i < m; ++i) y[i] = f(x[i]);
}
template <class Op, class Acc>
void binary_loop(const void* op, const Acc* x, const Acc* z, bool z_shared, Acc* y, std::int64_t m) {
  const Op& f = *static_cast<const Op*>(op);
  if (z_shared) {
    const Acc shared = z[0];
#pragma omp simd
    for (std::int64_t i = 0; i < m; ++i) y[i] = f(x[i], shared);
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < m; ++i) y[i] = f(x[i], z[i]);
  }
}

/// \brief A functor's loop and the functor it runs.
template <class Acc>
struct UnaryLoop {
  void (*run)(const void*, const Acc*, Acc*, std::int64_t);
  const void* op;
};
template <class Acc>
struct BinaryLoop {
  void (*run)(const void*, const Acc*, const Acc*, bool, Acc*, std::int64_t);
  const void* op;
};

/// out[o, o + n) = op(in[i, i + n)), block by block (in one loop when nothing needs converting).
template <class Acc>
void unary_span(UnaryLoop<Acc> loop, Operand in, std::int64_t i, Result out, std::int64_t o, std::int64_t n) {
  constexpr DType acc = dtype_of<Acc>();
  if (in.dtype == acc && out.dtype == acc) {
    loop.run(loop.op, static_cast<const Acc*>(in.data) + i, static_cast<Acc*>(out.data) + o, n);
    return;
  }
  alignas(64) Acc x_buf[kBlock], y_buf[kBlock];
  for (std::int64_t s = 0; s < n; s += kBlock) {
    const std::int64_t m = std::min(kBlock, n - s);
    Acc* y = results(out, o + s, y_buf);
    loop.run(loop.op, load(in, i + s, m, x_buf), y, m);
    store(y, out, o + s, m);
  }
}

/// out[o, o + n) = op(a[i, i + n), b[j, j + n)), or op(a[i + k], b[j]) for each k when `b_shared`;
/// block by block (in one loop when nothing needs converting).
template <class Acc>
void binary_span(BinaryLoop<Acc> loop, Operand a, std::int64_t i, Operand b, std::int64_t j, bool b_shared, Result out,
                 std::int64_t o, std::int64_t n) {
  constexpr DType acc = dtype_of<Acc>();
  if (a.dtype == acc && b.dtype == acc && out.dtype == acc) {
    loop.run(loop.op, static_cast<const Acc*>(a.data) + i, static_cast<const Acc*>(b.data) + j, b_shared,
             static_cast<Acc*>(out.data) + o, n);
    return;
  }
  alignas(64) Acc a_buf[kBlock], b_buf[kBlock], y_buf[kBlock];
  Acc shared = 0;
  if (b_shared) shared = *load(b, j, 1, b_buf);
  for (std::int64_t s = 0; s < n; s += kBlock) {
    const std::int64_t m = std::min(kBlock, n - s);
    const Acc* x = load(a, i + s, m, a_buf);
    const Acc* z = b_shared ? &shared : load(b, j + s, m, b_buf);
    Acc* y = results(out, o + s, y_buf);
    loop.run(loop.op, x, z, b_shared, y, m);
    store(y, out, o + s, m);
  }
}

/// span(begin, count) over [0, n) in chunks of several blocks, over threads when `split`.
template <class Span>
void for_chunks(std::int64_t n, bool split, Span&& span) {
  constexpr std::int64_t chunk = 16 * kBlock;  // a thread's share: several blocks
  parallel_for((n + chunk - 1) / chunk, split,
               [&](std::int64_t c) { span(c * chunk, std::min(chunk, n - c * chunk)); });
}

template <class Acc>
void map_unary(UnaryLoop<Acc> loop, Operand in, Result out, std::int64_t n) {
  for_chunks(n, n > kParallelGrain, [&](std::int64_t s, std::int64_t m) { unary_span(loop, in, s, out, s, m); });
}

template <class Acc>
void map_binary(BinaryLoop<Acc> loop, Operand a, Operand b, Result out, const AxisView& view) {
  const std::int64_t n = view.numel();
  const bool split = n > kParallelGrain;
  if (view.extent == 1) {  // same shape
    for_chunks(n, split, [&](std::int64_t s, std::int64_t m) { binary_span(loop, a, s, b, s, false, out, s, m); });
  } else if (view.outer == 1 && view.inner == 1) {  // b a scalar
    for_chunks(n, split, [&](std::int64_t s, std::int64_t m) { binary_span(loop, a, s, b, 0, true, out, s, m); });
  } else if (view.inner > 1) {  // each row of `inner` pairs with row r / extent of b (a bias: outer 1)
    const std::int64_t cols = view.inner, extent = view.extent;
    parallel_for(view.outer * extent, split, [&](std::int64_t r) {
      binary_span(loop, a, r * cols, b, (r / extent) * cols, false, out, r * cols, cols);
    });
  } else {  // inner 1: the extent elements of slice o share b[o] (a column per row)
    const std::int64_t extent = view.extent;
    parallel_for(view.outer, split,
                 [&](std::int64_t o) { binary_span(loop, a, o * extent, b, o, true, out, o * extent, extent); });
  }
}
}  // namespace blocks

/// out1, out2 = op(a, b) over n elements of one shape, for a functor with two results,
/// op(a, b, y1, y2) (core/math.hpp: GELU's backward and value). In blocks as map_binary;
/// out1 may be a's or b's storage (each block is read before its results are written).
template <class Op>
void map_binary_pair(const Op& op, Operand a, Operand b, Result out1, Result out2, std::int64_t n) {
  auto run = [&]<class Acc>() {
    blocks::for_chunks(n, n > kParallelGrain, [&](std::int64_t chunk, std::int64_t length) {
      alignas(64) Acc a_buf[blocks::kBlock], b_buf[blocks::kBlock], y1_buf[blocks::kBlock], y2_buf[blocks::kBlock];
      for (std::int64_t s = chunk; s < chunk + length; s += blocks::kBlock) {
        const std::int64_t m = std::min(blocks::kBlock, chunk + length - s);
        const Acc* x = blocks::load(a, s, m, a_buf);
        const Acc* z = blocks::load(b, s, m, b_buf);
        Acc* y1 = blocks::results(out1, s, y1_buf);
        Acc* y2 = blocks::results(out2, s, y2_buf);
#pragma omp simd
        for (std::int64_t i = 0; i < m; ++i) op(x[i], z[i], y1[i], y2[i]);
        blocks::store(y1, out1, s, m);
        blocks::store(y2, out2, s, m);
      }
    });
  };
  if (blocks::needs_double(a.dtype, b.dtype, out1.dtype, out2.dtype)) run.template operator()<double>();
  else run.template operator()<float>();
}

/// A cast between f32 and a 16-bit dtype: the bulk converter over each chunk, nothing
/// else (the block path would copy every element once more between widening and
/// narrowing). The same converters, so the same bits. False for other dtype pairs.
inline bool cast_by_converter(Operand in, Result out, std::int64_t n) {
  const bool widen = is_16bit(in.dtype) && out.dtype == DType::F32;
  if (!widen && !(in.dtype == DType::F32 && is_16bit(out.dtype))) return false;
  visit_floating(widen ? in.dtype : out.dtype, "cast", [&]<class T>() {
    if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) {
      blocks::for_chunks(n, n > kParallelGrain, [&](std::int64_t s, std::int64_t m) {
        const auto count = static_cast<std::size_t>(m);
        if (widen) widen_to_float(static_cast<const T*>(in.data) + s, static_cast<float*>(out.data) + s, count);
        else narrow_from_float(static_cast<const float*>(in.data) + s, static_cast<T*>(out.data) + s, count);
      });
    }
  });
  return true;
}

/// out = op(in) over n elements; in and out may differ in dtype (a cast is map(Identity)).
template <class Op>
void map_unary(const Op& op, Operand in, Result out, std::int64_t n) {
  if constexpr (std::is_same_v<Op, math::Identity>) {
    if (cast_by_converter(in, out, n)) return;
  }
  if (n <= kParallelGrain && in.dtype == DType::F32 && out.dtype == DType::F32) {  // as in map_binary
    blocks::unary_loop<Op, float>(&op, static_cast<const float*>(in.data), static_cast<float*>(out.data), n);
    return;
  }
  if (blocks::needs_double(in.dtype, out.dtype))
    blocks::map_unary<double>({&blocks::unary_loop<Op, double>, &op}, in, out, n);
  else blocks::map_unary<float>({&blocks::unary_loop<Op, float>, &op}, in, out, n);
}

/// out = op(a, b) where a is seen as `view` and b as its reduced partner [outer, inner]
/// (core/axis_view.hpp): b has a's shape, is a scalar, a row, or a with one axis collapsed.
template <class Op>
void map_binary(const Op& op, Operand a, Operand b, Result out, const AxisView& view) {
  if (view.extent == 1 && view.numel() <= kParallelGrain && a.dtype == DType::F32 && b.dtype == DType::F32 &&
      out.dtype == DType::F32) {  // the commonest small map, called without indirection (op entry cost)
    blocks::binary_loop<Op, float>(&op, static_cast<const float*>(a.data), static_cast<const float*>(b.data), false,
                                   static_cast<float*>(out.data), view.numel());
    return;
  }
  if (blocks::needs_double(a.dtype, b.dtype, out.dtype))
    blocks::map_binary<double>({&blocks::binary_loop<Op, double>, &op}, a, b, out, view);
  else blocks::map_binary<float>({&blocks::binary_loop<Op, float>, &op}, a, b, out, view);
}

}  // namespace trainmem::cpu::kernels

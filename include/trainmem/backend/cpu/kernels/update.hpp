// trainmem/backend/cpu/kernels/update.hpp — the optimizer's one pass over a parameter.
//
// The update functor (core/update_rules.hpp: SGD, AdamW) changes the f32/f64 master and its
// moments in place, and the 16-bit model copy is written from the new value in the
// same pass, so the master is read once per step. How the copy is rounded is a small
// writer type: none, nearest-even, or stochastic bf16. AdamW's square roots are taken a
// block at a time (NOTE [Square roots a block at a time] in core/update_rules.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/simd.hpp"
#include "trainmem/core/bit_cast.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"

namespace trainmem::cpu::kernels {

namespace sqrt_impl {

// Each vector form takes the roots of the longest prefix of whole vectors and returns its length.
#if defined(TRAINMEM_SIMD_DISPATCH)
TRAINMEM_SIMD_BEGIN
TRAINMEM_TARGET_AVX512 inline std::int64_t sqrt_avx512(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::int64_t sqrt_avx2(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
  return i;
}
TRAINMEM_TARGET_AVX512 inline std::int64_t sqrt_avx512(double* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm512_storeu_pd(x + i, _mm512_sqrt_pd(_mm512_loadu_pd(x + i)));
  return i;
}
TRAINMEM_TARGET_AVX2 inline std::int64_t sqrt_avx2(double* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(x + i, _mm256_sqrt_pd(_mm256_loadu_pd(x + i)));
  return i;
}
TRAINMEM_SIMD_END
#endif

}  // namespace sqrt_impl

/// x[i] = sqrt(x[i]) for i < n: IEEE square roots, the bits of std::sqrt, 16 or 8 floats
/// (8 or 4 doubles) an instruction on a CPU with AVX-512 or AVX2 (simd.hpp).
template <class T>
void sqrt_in_place(T* x, std::int64_t n) {
  std::int64_t i = 0;
#if defined(TRAINMEM_SIMD_DISPATCH)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    const SimdLevel level = simd_level();
    if (level >= SimdLevel::Avx512) i = sqrt_impl::sqrt_avx512(x, n);
    if (level >= SimdLevel::Avx2) i += sqrt_impl::sqrt_avx2(x + i, n - i);
  }
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

/// The update loop over one tensor, a block of elements at a time: the block's gradient
/// widened to TP, then one simd loop of the functor over raw pointers (a missing moment
/// points at zeros in scratch), then the model copy.
template <class Update, class TP, class TG, class StoreCopy>
void update_blocks(const Update& update, TP* param, const TG* grad, TP* first_moment, TP* second_moment, std::int64_t n,
                   StoreCopy store_copy) {
  constexpr std::int64_t kBlock = 256;
  parallel_for((n + kBlock - 1) / kBlock, n > kParallelGrain, [&](std::int64_t b) {
    const std::int64_t s = b * kBlock, m = std::min(kBlock, n - s);
    alignas(64) TP g_block[kBlock], zeros1[kBlock], zeros2[kBlock];
    const TP* g = g_block;
    if constexpr (std::is_same_v<TG, TP>) g = grad + s;
    else if constexpr (std::is_same_v<TP, float>) widen_to_float(grad + s, g_block, static_cast<std::size_t>(m));
    else
      for (std::int64_t i = 0; i < m; ++i) g_block[i] = static_cast<TP>(detail::widen(grad[s + i]));
    TP* p = param + s;
    TP* s1 = first_moment ? first_moment + s : zeros1;
    TP* s2 = second_moment ? second_moment + s : zeros2;
    if (!first_moment) std::fill_n(zeros1, m, TP(0));
    if (!second_moment) std::fill_n(zeros2, m, TP(0));
    if constexpr (requires(TP x) { update.finish(x, x, x); }) {  // NOTE [Square roots a block at a time]
      alignas(64) TP root[kBlock];
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) root[i] = update.moments(p[i], g[i], s1[i], s2[i]);
      sqrt_in_place(root, m);
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) update.finish(p[i], s1[i], root[i]);
    } else {
#pragma omp simd
      for (std::int64_t i = 0; i < m; ++i) update(p[i], g[i], s1[i], s2[i]);
    }
    store_copy.store(s, p, m);
  });
}

/// Applies an optimizer update element by element: param (the f32/f64 master) and the
/// optional moments are updated in place; the gradient is widened; `store_copy` writes the
/// 16-bit model copy from the updated values in the same pass (or nothing). An
/// update with run-time flags is asked for its fixed-flag variant once, so the loop has
/// no branch on them (NOTE [Update flags fixed for the loop] in core/update_rules.hpp).
template <class Update, class TP, class TG, class StoreCopy>
void apply_update(Update update, TP* param, const TG* grad, TP* first_moment, TP* second_moment, std::int64_t n,
                  StoreCopy store_copy) {
  if constexpr (requires { update.visit_fixed([](const auto&) {}); }) {
    update.visit_fixed(
        [&](const auto& fixed) { update_blocks(fixed, param, grad, first_moment, second_moment, n, store_copy); });
  } else {
    update_blocks(update, param, grad, first_moment, second_moment, n, store_copy);
  }
}

/// The smallest f32 whose nearest-even TC is inf: 65520 for f16, 0x7F7F8000 for bf16 (the
/// ties between their largest finite value and the next power of two round up, to even).
template <class TC>
inline float nearest_overflow_at() {
  if constexpr (std::is_same_v<TC, Half>) return 65520.0f;
  else if constexpr (std::is_same_v<TC, BFloat16>) return detail::bits_float(0x7F7F8000u);
  else return std::numeric_limits<float>::infinity();
}

/// Adds to `overflowed` the elements of values[0, m) that are finite while their copy is
/// inf: a model copy the update made overflow (NOTE [Model copies that overflow] in
/// core/copy_overflow.hpp). A nearest-even copy of f32 values is judged from the values
/// (one vector compare against nearest_overflow_at); any other copy is read back.
template <bool kNearestFromFloat, class TC, class TP>
void count_overflowed(const TC* copy, const TP* values, std::int64_t m, std::atomic<std::int64_t>* overflowed) {
  if (overflowed == nullptr) return;
  std::int64_t n = 0;
  if constexpr (kNearestFromFloat && std::is_same_v<TP, float>) {
    const float at = nearest_overflow_at<TC>();
#pragma omp simd reduction(+ : n)
    for (std::int64_t i = 0; i < m; ++i) {
      const float a = std::fabs(values[i]);
      n += (a >= at && a - a == 0.0f) ? 1 : 0;  // x - x is 0 for finite x, NaN for inf and NaN
    }
  } else {
    for (std::int64_t i = 0; i < m; ++i) {
      const auto c = static_cast<double>(detail::widen(copy[i]));
      const auto v = static_cast<double>(values[i]);
      n += (std::isinf(c) && std::isfinite(v)) ? 1 : 0;
    }
  }
  if (n != 0) overflowed->fetch_add(n, std::memory_order_relaxed);
}

/// Model-copy writers for apply_update: store(s, values, m) writes copy[s, s + m) from the
/// block's updated values, and counts the elements it made overflow into `overflowed`.
struct NoCopy {
  template <class TP>
  void store(std::int64_t, const TP*, std::int64_t) const {}
};
template <class TC>
struct NearestCopy {
  TC* copy;
  std::atomic<std::int64_t>* overflowed = nullptr;  // null: not counted
  template <class TP>
  void store(std::int64_t s, const TP* values, std::int64_t m) const {
    if constexpr (std::is_same_v<TP, float>) {
      narrow_from_float(values, copy + s, static_cast<std::size_t>(m));  // detail::narrow's bits, 16 at a time
    } else {
      for (std::int64_t i = 0; i < m; ++i) copy[s + i] = detail::narrow<TC>(values[i]);
    }
    count_overflowed<true>(copy + s, values, m, overflowed);
  }
};
/// Rounds element i with draw i of `rng`, so the result does not depend on how the loop is split.
struct StochasticBf16Copy {
  BFloat16* copy;
  RngState rng;
  std::atomic<std::int64_t>* overflowed = nullptr;  // null: not counted
  template <class TP>
  void store(std::int64_t s, const TP* values, std::int64_t m) const {
    for (std::int64_t i = 0; i < m; ++i) {
      const auto at = static_cast<std::uint64_t>(s + i);
      copy[s + i] = bf16_round_stochastic(static_cast<float>(values[i]), detail::random_bits(rng, at));
    }
    count_overflowed<false>(copy + s, values, m, overflowed);
  }
};

}  // namespace trainmem::cpu::kernels

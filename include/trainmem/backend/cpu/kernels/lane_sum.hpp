// trainmem/backend/cpu/kernels/lane_sum.hpp — a row's sum in 16 independent lanes, so it runs in SIMD.
//
// `for (c) sum += term(c)` is one chain of dependent additions: without -ffast-math the
// compiler may not reorder it, so it runs scalar at one add per FP latency (a LayerNorm
// over 512 x 128 f32 took 78 us forward and 133 us backward on a Zen 4 core pair, 7 GB/s).
// Partial sums in lanes let it run in SIMD: 18 and 32 us. The lanes are explicit, 16 of
// them (term c goes to lane c mod 16), added in a fixed tree at the end; a row shorter
// than 16 is summed in order. So the order is the code's, not the compiler's: `omp simd
// reduction` would leave the lane count to the vectorizer, which picks it per
// instantiation and per target (a bf16 row and its f32 widening summed in different
// orders on an Intel Xeon, whose tuning prefers 256-bit vectors, and gave layer_norm
// rstd values 1 ulp apart). A result is the same bits for every input dtype, thread
// count and call (the forward and a checkpoint's recompute agree), whatever vector width
// the compiler picks, and its error is that of the lanes' shorter sums.
#pragma once

#include <array>
#include <cstdint>

namespace trainmem::cpu::kernels {

inline constexpr int kSumLanes = 16;

/// The lanes' total, in a fixed tree: lane l + lane l+8, then +4, +2, +1 (written out, so
/// the halves add as vectors).
template <class Acc>
Acc fold_lanes(const std::array<Acc, kSumLanes>& lanes) {
  static_assert(kSumLanes == 16);
  std::array<Acc, 8> half;
  for (int l = 0; l < 8; ++l) half[l] = lanes[l] + lanes[l + 8];
  std::array<Acc, 4> quarter;
  for (int l = 0; l < 4; ++l) quarter[l] = half[l] + half[l + 4];
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

/// Sum of term(c) for c in [0, n) in Acc, in 16 lanes (in order when n < 16, where lanes
/// and their fold would cost more than the sum: a LayerNorm on [4, 4] took 2.5x as long).
template <class Acc, class Term>
Acc lane_sum(std::int64_t n, Term&& term) {
  if (n < kSumLanes) {
    Acc sum = 0;
    for (std::int64_t c = 0; c < n; ++c) sum += term(c);
    return sum;
  }
  std::array<Acc, kSumLanes> lanes{};
  const std::int64_t full = n - n % kSumLanes;
  for (std::int64_t c = 0; c < full; c += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) lanes[l] += term(c + l);
  }
  for (std::int64_t c = full; c < n; ++c) lanes[c - full] += term(c);
  return fold_lanes(lanes);
}

/// The two sums of terms(c, a, b) (which adds to a and b) in 16 lanes each, as lane_sum.
template <class Acc, class Terms>
void lane_sum2(std::int64_t n, Terms&& terms, Acc& sum_a, Acc& sum_b) {
  if (n < kSumLanes) {
    Acc a = 0, b = 0;
    for (std::int64_t c = 0; c < n; ++c) terms(c, a, b);
    sum_a = a;
    sum_b = b;
    return;
  }
  std::array<Acc, kSumLanes> a{}, b{};
  const std::int64_t full = n - n % kSumLanes;
  for (std::int64_t c = 0; c < full; c += kSumLanes) {
#pragma omp simd
    for (int l = 0; l < kSumLanes; ++l) terms(c + l, a[l], b[l]);
  }
  for (std::int64_t c = full; c < n; ++c) terms(c, a[c - full], b[c - full]);
  sum_a = fold_lanes(a);
  sum_b = fold_lanes(b);
}

}  // namespace trainmem::cpu::kernels

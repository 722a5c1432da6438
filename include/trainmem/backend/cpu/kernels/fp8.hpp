// trainmem/backend/cpu/kernels/fp8.hpp — FP8 quantize, dequantize and GEMM: an exact emulation.
//
// The element rules are core/fp8_rules.hpp's, the code the CUDA kernels run. The GEMM
// widens every FP8 operand to f32 through a 256-entry table (exact: every FP8 value is
// an f32 value), multiplies the widened matrices with the f32 GEMM (oneDNN or Eigen,
// alpha 1 and beta 0, so each product of two FP8 values is exact in f32 and only the
// f32 sum rounds), and then applies the f32 factor alpha * a_scale_inv * b_scale_inv and
// beta C, rounding C once. The widened operands and the f32 sums are workspaces of the
// call (4 bytes per element, counted as MemCategory::Workspace).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/gemm.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/fp8_rules.hpp"
#include "trainmem/core/gemm_args.hpp"

namespace trainmem::cpu::kernels {

/// Every code's f32 value, for widening whole operands.
template <class F8>
const std::array<float, 256>& fp8_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (unsigned code = 0; code < 256; ++code)
      values[code] = static_cast<float>(F8::from_bits(static_cast<std::uint8_t>(code)));
    return values;
  }();
  return table;
}

/// Elements per chunk of the amax reduction (each chunk's maximum, then theirs in order).
inline constexpr std::int64_t kFp8Chunk = 1 << 14;

/// dst[i] = F8(src[i] * scale); returns max |src[i]| (NaN wins; 0 for n = 0).
template <class TS, class F8>
float quantize_fp8(const TS* src, std::int64_t n, float scale, F8* dst) {
  const std::int64_t chunks = (n + kFp8Chunk - 1) / kFp8Chunk;
  std::vector<float> chunk_amax(static_cast<std::size_t>(chunks), 0.0f);
  parallel_for(chunks, n > kParallelGrain, [&](std::int64_t c) {
    const std::int64_t begin = c * kFp8Chunk, end = std::min(n, begin + kFp8Chunk);
    float amax = 0.0f;
    for (std::int64_t i = begin; i < end; ++i) {
      const float x = static_cast<float>(detail::widen(src[i]));
      amax = fp8::amax_update(amax, x);
      dst[i] = fp8::quantize<F8>(x, scale);
    }
    chunk_amax[static_cast<std::size_t>(c)] = amax;
  });
  float amax = 0.0f;
  for (float a : chunk_amax) amax = fp8::amax_update(amax, a);
  return amax;
}

/// dst[i] = float(src[i]) * scale_inv, rounded once to TD.
template <class F8, class TD>
void dequantize_fp8(const F8* src, std::int64_t n, float scale_inv, TD* dst) {
  const std::int64_t chunks = (n + kFp8Chunk - 1) / kFp8Chunk;
  parallel_for(chunks, n > kParallelGrain, [&](std::int64_t c) {
    const std::int64_t begin = c * kFp8Chunk, end = std::min(n, begin + kFp8Chunk);
    for (std::int64_t i = begin; i < end; ++i) dst[i] = fp8::dequantize<TD>(src[i], scale_inv);
  });
}

/// n codes widened to f32.
template <class F8>
void widen_fp8(const F8* src, std::int64_t n, float* dst) {
  const std::array<float, 256>& values = fp8_values<F8>();
  parallel_for((n + kFp8Chunk - 1) / kFp8Chunk, n > kParallelGrain, [&](std::int64_t c) {
    const std::int64_t begin = c * kFp8Chunk, end = std::min(n, begin + kFp8Chunk);
    for (std::int64_t i = begin; i < end; ++i) dst[i] = values[src[i].bits];
  });
}

/// C = factor * (op(A) op(B)) + beta C, the sums in f32 (see the top of this file).
template <class FA, class FB, class TC>
void gemm_fp8(const GemmArgs& g, const FA* a, const FB* b, TC* c, float a_scale_inv, float b_scale_inv,
              Allocator& allocator) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  const std::int64_t a_span = fp8::operand_span(g.batch, g.stride_a, g.m * g.k);
  const std::int64_t b_span = fp8::operand_span(g.batch, g.stride_b, g.k * g.n);
  const Workspace<float> a32(allocator, static_cast<std::size_t>(a_span));
  const Workspace<float> b32(allocator, static_cast<std::size_t>(b_span));
  const Workspace<float> sums(allocator, static_cast<std::size_t>(g.batch * g.m * g.n));
  if (g.k > 0) {
    widen_fp8(a, a_span, a32.get());
    widen_fp8(b, b_span, b32.get());
    GemmArgs f32 = g;
    f32.alpha = 1.0;
    f32.beta = 0.0;
    f32.stride_c = g.m * g.n;
    gemm<float, float>(f32, a32.get(), b32.get(), sums.get(), allocator);
  } else {
    std::fill(sums.get(), sums.get() + g.batch * g.m * g.n, 0.0f);
  }
  const float factor = fp8::gemm_factor(static_cast<float>(g.alpha), a_scale_inv, b_scale_inv);
  const auto beta = static_cast<float>(g.beta);
  const std::int64_t rows = g.batch * g.m;
  parallel_for(rows, rows * g.n > kParallelGrain, [&](std::int64_t row) {
    const std::int64_t e = row / g.m, r = row % g.m;
    const float* sum = sums.get() + row * g.n;
    TC* out = c + e * g.stride_c + r * g.ldc();
    for (std::int64_t j = 0; j < g.n; ++j) {
      const float old = beta == 0.0f ? 0.0f : static_cast<float>(detail::widen(out[j]));
      out[j] = detail::narrow<TC>(fp8::gemm_output(sum[j], factor, beta, old));
    }
  });
}

}  // namespace trainmem::cpu::kernels

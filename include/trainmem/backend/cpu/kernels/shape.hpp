// trainmem/backend/cpu/kernels/shape.hpp — axis swaps and the causal mask: copies, no arithmetic.
//
// Both move stored elements unchanged (the mask writes its fill value), so they are
// exact in every dtype and agree with the CUDA kernels bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::kernels {

/// in [a, b, c, d] -> out [a, c, b, d]: swaps the two middle axes. With d = 1 it is a
/// batched transpose; with d = head size it splits or merges attention heads.
template <class T>
void swap_middle_axes(const T* in, T* out, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  parallel_for(a * b, a * b * c * d > kParallelGrain, [&](std::int64_t ij) {
    const std::int64_t i = ij / b, j = ij % b;
    for (std::int64_t k = 0; k < c; ++k) {
      const T* src = in + ((i * b + j) * c + k) * d;
      T* dst = out + ((i * c + k) * b + j) * d;
      if (d == 1) *dst = *src;
      else  // a head's row: memcpy moves it in whole vectors, where a loop of unknown length stayed scalar
        std::memcpy(dst, src, static_cast<std::size_t>(d) * sizeof(T));
    }
  });
}

/// Copies [.., T, T] and sets entries above the diagonal (key after query) to `fill`.
template <class T>
void causal_mask(const T* in, T* out, std::int64_t batch, std::int64_t t, double fill) {
  const T fill_value = detail::narrow<T>(static_cast<AccumulatorOf<T>>(fill));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < t; ++i)
      for (std::int64_t j = 0; j < t; ++j) {
        const std::int64_t at = (b * t + i) * t + j;
        out[at] = j > i ? fill_value : in[at];
      }
}

}  // namespace trainmem::cpu::kernels

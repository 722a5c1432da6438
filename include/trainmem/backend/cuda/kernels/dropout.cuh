// trainmem/backend/cuda/kernels/dropout.cuh — dropout from a counter-based stream, no mask stored.
//
// The mirror of backend/cpu/kernels/dropout.hpp, bit for bit: element i keeps or drops
// by draw i of the (seed, offset) Philox stream, mapped to [0, 1) by the same
// uniform_from_bits (core/rng.hpp).
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/math.hpp"
#include "trainmem/core/rng.hpp"

namespace trainmem::cuda::kernels {

/// out = in * keep(i) / (1 - p) with keep drawn from Philox at position rng.offset + i,
/// exactly as detail::random_uniform draws it on the CPU. One Philox call
/// yields four consecutive draws; when the stream starts on a multiple of four (always,
/// for streams from Generator::take) each thread uses all four.
namespace device {
template <class T>
__global__ void dropout_kernel(const T* in, T* out, std::int64_t n, float p, RngState rng) {
  using Acc = AccumulatorOf<T>;
  const math::DropoutScale scale{p};
  if ((rng.offset & 3u) == 0) {
    const std::int64_t groups = (n + 3) / 4;
    for (std::int64_t g = global_thread(); g < groups; g += grid_stride()) {
      const detail::Philox4 bits = detail::philox4x32_10((rng.offset >> 2) + static_cast<std::uint64_t>(g), rng.seed);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t i = 4 * g + j;
        if (i < n) {
          const float uniform = detail::uniform_from_bits(bits.v[j]);
          out[i] = narrow<T>(load<Acc>(in, i) * static_cast<Acc>(scale(uniform)));
        }
      }
    }
  } else {
    for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
      const float uniform = detail::random_uniform(rng, static_cast<std::uint64_t>(i));
      out[i] = narrow<T>(load<Acc>(in, i) * static_cast<Acc>(scale(uniform)));
    }
  }
}
}  // namespace device

template <class T>
void dropout(const KernelContext& ctx, const T* in, T* out, std::int64_t n, float p, RngState rng) {
  if (n == 0) return;
  device::dropout_kernel<<<blocks_for(ctx, (n + 3) / 4), kThreads, 0, ctx.stream>>>(in, out, n, p, rng);
  TRAINMEM_CUDA_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace trainmem::cuda::kernels

// trainmem/backend/cuda/kernels/shape.cuh — axis swaps and the causal mask: copies, no arithmetic.
//
// The mirror of backend/cpu/kernels/shape.hpp, bit for bit. One thread per output
// element, so writes coalesce; indices are 32-bit when the tensor allows.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cuda::kernels {

/// out [a, c, b, d] from in [a, b, c, d]; one thread per output element, so writes coalesce
/// and reads do too whenever d spans a warp. Index is 32-bit when the tensor allows.
namespace device {
template <class T, class Index>
__global__ void swap_middle_axes_kernel(const T* in, T* out, Index n, Index b, Index c, Index d) {
  for (Index o = static_cast<Index>(global_thread()); o < n; o += static_cast<Index>(grid_stride())) {
    const Index e = o % d;
    Index t = o / d;
    const Index j = t % b;
    t /= b;
    const Index k = t % c;
    const Index i = t / c;
    out[o] = in[((i * b + j) * c + k) * d + e];
  }
}
}  // namespace device

template <class T>
void swap_middle_axes(const KernelContext& ctx, const T* in, T* out, std::int64_t a, std::int64_t b, std::int64_t c,
                      std::int64_t d) {
  const std::int64_t n = a * b * c * d;
  if (n == 0) return;
  const unsigned blocks = blocks_for(ctx, n);
  if (n < (std::int64_t{1} << 31))
    device::swap_middle_axes_kernel<T, std::uint32_t>
        <<<blocks, kThreads, 0, ctx.stream>>>(in, out, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(b),
                                              static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(d));
  else device::swap_middle_axes_kernel<T, std::int64_t><<<blocks, kThreads, 0, ctx.stream>>>(in, out, n, b, c, d);
  TRAINMEM_CUDA_CHECK_LAUNCH("swap_middle_axes_kernel");
}

namespace device {
template <class T, class Index>
__global__ void causal_mask_kernel(const T* in, T* out, Index n, Index t, T fill) {
  for (Index at = static_cast<Index>(global_thread()); at < n; at += static_cast<Index>(grid_stride())) {
    const Index j = at % t, i = (at / t) % t;
    out[at] = j > i ? fill : in[at];
  }
}
}  // namespace device

/// Copies [batch, t, t] and sets entries above the diagonal (key after query) to `fill`.
template <class T>
void causal_mask(const KernelContext& ctx, const T* in, T* out, std::int64_t batch, std::int64_t t, double fill) {
  const std::int64_t n = batch * t * t;
  if (n == 0) return;
  const T fill_value = detail::narrow<T>(static_cast<AccumulatorOf<T>>(fill));
  const unsigned blocks = blocks_for(ctx, n);
  if (n < (std::int64_t{1} << 31))
    device::causal_mask_kernel<T, std::uint32_t><<<blocks, kThreads, 0, ctx.stream>>>(
        in, out, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(t), fill_value);
  else device::causal_mask_kernel<T, std::int64_t><<<blocks, kThreads, 0, ctx.stream>>>(in, out, n, t, fill_value);
  TRAINMEM_CUDA_CHECK_LAUNCH("causal_mask_kernel");
}

}  // namespace trainmem::cuda::kernels

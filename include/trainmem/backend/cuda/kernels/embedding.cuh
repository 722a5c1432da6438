// trainmem/backend/cuda/kernels/embedding.cuh — table lookup by id, and its deterministic scatter-add.
//
// The mirror of backend/cpu/kernels/embedding.hpp. An id outside [0, vocab) is recorded
// on the device (report_bad_index, launch.cuh) and raised by the backend at its next
// host wait. Backward sorts the ids (cub radix sort) instead of adding with atomics,
// so each table row adds its rows in the CPU's order and the result is the CPU's.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/dtype.hpp"

namespace trainmem::cuda::kernels {

namespace device {
/// An id outside [0, vocab) gives a zero row and is recorded in `bad_id`.
template <class T>
__global__ void embedding_kernel(const T* weight, const std::int32_t* ids, T* out, std::int64_t count, std::int64_t dim,
                                 std::int64_t vocab, BadIndex* bad_id) {
  const std::int64_t n = count * dim;
  for (std::int64_t at = global_thread(); at < n; at += grid_stride()) {
    const std::int64_t i = at / dim, d = at - i * dim;
    const std::int64_t id = ids[i];
    if (id >= 0 && id < vocab) {
      out[at] = weight[id * dim + d];
    } else {
      out[at] = T{};
      if (d == 0) report_bad_index(bad_id, i, id, vocab);
    }
  }
}
}  // namespace device

template <class T>
void embedding(const KernelContext& ctx, const T* weight, const std::int32_t* ids, T* out, std::int64_t count,
               std::int64_t dim, std::int64_t vocab) {
  if (count * dim == 0) return;
  device::embedding_kernel<<<blocks_for(ctx, count * dim), kThreads, 0, ctx.stream>>>(
      weight, ids, out, count, dim, vocab, ctx.bad_indices + static_cast<int>(IndexCheck::EmbeddingId));
  TRAINMEM_CUDA_CHECK_LAUNCH("embedding_kernel");
}

namespace device {
template <class I>
__global__ void iota_kernel(I* out, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) out[i] = static_cast<I>(i);
}

/// One block column per run of equal sorted ids: the first position of a run adds the
/// run's rows into its table row, in original position order, narrowing after each
/// addition as the CPU loop does — so the result is the CPU's, bit for bit.
template <class T, class TW>
__global__ void embedding_backward_kernel(const T* dout, const std::uint32_t* sorted_ids,
                                          const std::int32_t* sorted_positions, TW* dweight, std::int64_t count,
                                          std::int64_t dim, std::uint32_t vocab) {
  using Acc = AccumulatorFor<T, TW>;
  for (std::int64_t j = blockIdx.x; j < count; j += gridDim.x) {
    const std::uint32_t id = sorted_ids[j];
    if ((j > 0 && sorted_ids[j - 1] == id) || id >= vocab) continue;
    for (std::int64_t d = static_cast<std::int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; d < dim;
         d += static_cast<std::int64_t>(gridDim.y) * blockDim.x) {
      TW* slot = dweight + static_cast<std::int64_t>(id) * dim + d;
      TW value = *slot;
      for (std::int64_t k = j; k < count && sorted_ids[k] == id; ++k)
        value = narrow<TW>(static_cast<Acc>(widen(value)) +
                           load<Acc>(dout, static_cast<std::int64_t>(sorted_positions[k]) * dim + d));
      *slot = value;
    }
  }
}
}  // namespace device

/// dweight (zeroed by the caller) += scatter of dout rows by id: a stable radix sort of
/// the ids groups equal ids without atomics, so the sums are deterministic.
template <class T, class TW>
void embedding_backward(const KernelContext& ctx, const T* dout, const std::int32_t* ids, TW* dweight,
                        std::int64_t count, std::int64_t dim, std::int64_t vocab) {
  if (count == 0 || dim == 0) return;
  detail::check(count < (std::int64_t{1} << 31) && vocab < (std::int64_t{1} << 31),
                "embedding_backward: at most 2^31 ids and table rows, got ", count, " and ", vocab);
  const int items = static_cast<int>(count);
  int end_bit = 1;
  while (end_bit < 32 && (std::int64_t{1} << end_bit) < vocab) ++end_bit;
  // Sorting the ids' low end_bit bits as unsigned keeps the order of valid ids. An id
  // outside [0, vocab) adds nothing (the kernel skips it), but may split the run of a
  // valid id that shares its low bits; the forward recorded it, so this step raises at
  // the next host wait and its gradient is not to be used (memory stays in bounds).
  const auto* keys_in = reinterpret_cast<const std::uint32_t*>(ids);
  ScratchBuffer keys_out(ctx, count * sizeof(std::uint32_t));
  ScratchBuffer positions_in(ctx, count * sizeof(std::int32_t));
  ScratchBuffer positions_out(ctx, count * sizeof(std::int32_t));
  device::iota_kernel<<<blocks_for(ctx, count), kThreads, 0, ctx.stream>>>(positions_in.as<std::int32_t>(), count);
  TRAINMEM_CUDA_CHECK_LAUNCH("iota_kernel");
  std::size_t temp_bytes = 0;
  TRAINMEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out.as<std::uint32_t>(),
                                                      positions_in.as<const std::int32_t>(),
                                                      positions_out.as<std::int32_t>(), items, 0, end_bit, ctx.stream));
  ScratchBuffer temp(ctx, temp_bytes);
  TRAINMEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.as<void>(), temp_bytes, keys_in, keys_out.as<std::uint32_t>(), positions_in.as<const std::int32_t>(),
      positions_out.as<std::int32_t>(), items, 0, end_bit, ctx.stream));
  const unsigned threads = 128;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(count, std::int64_t{1} << 20)),
                  static_cast<unsigned>(std::min<std::int64_t>((dim + threads - 1) / threads, 65535)));
  device::embedding_backward_kernel<<<grid, threads, 0, ctx.stream>>>(dout, keys_out.as<const std::uint32_t>(),
                                                                      positions_out.as<const std::int32_t>(), dweight,
                                                                      count, dim, static_cast<std::uint32_t>(vocab));
  TRAINMEM_CUDA_CHECK_LAUNCH("embedding_backward_kernel");
}

}  // namespace trainmem::cuda::kernels

// trainmem/backend/cuda/kernels/softmax.cuh — row-wise softmax and log-softmax, forward and backward.
//
// The mirror of backend/cpu/kernels/softmax.hpp: one block per row, reduced with
// block_all_reduce (reduce.cuh); the per-element backward formula is the CPU's
// (math::SoftmaxBackwardRow), only the order of additions in the row's dot differs.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/math.hpp"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class T>
__global__ void softmax_kernel(const T* x, T* y, std::int64_t rows, std::int64_t cols, bool log_output) {
  using Acc = AccumulatorOf<T>;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const auto [max, sum] = block_max_and_sum_exp<Acc>(xr, cols);
    const Acc log_sum = acc_log(sum);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc shifted = load<Acc>(xr, c) - max;
      yr[c] = narrow<T>(log_output ? shifted - log_sum : math::exp(shifted) / sum);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols,
                                        bool log_output) {
  using Acc = AccumulatorOf<T>;
  const math::SoftmaxBackwardRow row{log_output};
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *dyr = dy + r * cols, *yr = y + r * cols;
    T* dxr = dx + r * cols;
    Acc dot = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += row.term(load<Acc>(dyr, c), load<Acc>(yr, c));
    dot = block_all_reduce(dot, SumOp{}, Acc(0));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dxr[c] = narrow<T>(row(load<Acc>(dyr, c), load<Acc>(yr, c), dot));
  }
}
}  // namespace device

template <class T>
void softmax(const KernelContext& ctx, const T* x, T* y, std::int64_t rows, std::int64_t cols, bool log_output) {
  if (rows == 0 || cols == 0) return;
  device::softmax_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(x, y, rows, cols, log_output);
  TRAINMEM_CUDA_CHECK_LAUNCH("softmax_kernel");
}

template <class T>
void softmax_backward(const KernelContext& ctx, const T* dy, const T* y, T* dx, std::int64_t rows, std::int64_t cols,
                      bool log_output) {
  if (rows == 0 || cols == 0) return;
  device::softmax_backward_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(dy, y, dx, rows, cols,
                                                                                                log_output);
  TRAINMEM_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
}

}  // namespace trainmem::cuda::kernels

// trainmem/backend/cuda/kernels/loss.cuh — mean cross-entropy of integer labels, forward and backward.
//
// The mirror of backend/cpu/kernels/loss.hpp: each row keeps its log-sum-exp, not a
// probability matrix, and backward re-forms softmax from it with the CPU's formula
// (math::CrossEntropyBackwardRow). A label outside [0, cols) is recorded on the device
// (report_bad_index, launch.cuh) and raised by the backend at its next host wait.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class T, class Acc>
__global__ void cross_entropy_rows_kernel(const T* logits, const std::int32_t* labels, Acc* lse, Acc* row_loss,
                                          std::int64_t rows, std::int64_t cols, BadIndex* bad_label) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * cols;
    const auto [max, sum] = block_max_and_sum_exp<Acc>(xr, cols);
    if (threadIdx.x == 0) {
      const Acc row_lse = max + acc_log(sum);
      lse[r] = row_lse;
      const std::int32_t label = labels[r];
      if (label < 0 || label >= cols) {
        report_bad_index(bad_label, r, label, cols);
        row_loss[r] = Acc(0);
      } else {
        row_loss[r] = row_lse - load<Acc>(xr, label);
      }
    }
  }
}

template <class Acc>
struct StoreMean {
  Acc* out;
  std::int64_t count;
  __device__ void operator()(Acc total) const { out[0] = total / static_cast<Acc>(count); }
};

template <class Acc>
struct LoadPlain {
  const Acc* in;
  __device__ Acc operator()(std::int64_t i) const { return in[i]; }
};
}  // namespace device

/// Mean cross-entropy (the rows' sum over mean_rows); keeps each row's log-sum-exp. A
/// label outside [0, cols) counts as a zero loss here and is recorded in ctx.bad_indices,
/// which the backend raises later.
template <class T, class Acc>
void cross_entropy(const KernelContext& ctx, const T* logits, const std::int32_t* labels, Acc* loss, Acc* lse,
                   std::int64_t rows, std::int64_t cols, std::int64_t mean_rows) {
  ScratchBuffer row_loss(ctx, static_cast<std::size_t>(rows) * sizeof(Acc));
  if (rows > 0) {
    device::cross_entropy_rows_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
        logits, labels, lse, row_loss.as<Acc>(), rows, cols,
        ctx.bad_indices + static_cast<int>(IndexCheck::CrossEntropyLabel));
    TRAINMEM_CUDA_CHECK_LAUNCH("cross_entropy_rows_kernel");
  }
  reduce_all<Acc>(ctx, rows, device::LoadPlain<Acc>{row_loss.as<const Acc>()}, device::StoreMean<Acc>{loss, mean_rows});
}

namespace device {
template <class T, class Acc>
__global__ void cross_entropy_backward_kernel(const Acc* dloss, const T* logits, const std::int32_t* labels,
                                              const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t cols,
                                              std::int64_t mean_rows) {
  const Acc scale = math::cross_entropy_scale(dloss[0], mean_rows);
  const std::int64_t n = rows * cols;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t r = i / cols, c = i - r * cols;
    dlogits[i] = narrow<T>(math::CrossEntropyBackwardRow<Acc>{scale, lse[r], labels[r]}(load<Acc>(logits, i), c));
  }
}
}  // namespace device

/// dlogits = dloss / mean_rows * (softmax(logits) - onehot(label)); dloss is read on the device.
template <class T, class Acc>
void cross_entropy_backward(const KernelContext& ctx, const Acc* dloss, const T* logits, const std::int32_t* labels,
                            const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t cols, std::int64_t mean_rows) {
  if (rows * cols == 0) return;
  device::cross_entropy_backward_kernel<<<blocks_for(ctx, rows * cols), kThreads, 0, ctx.stream>>>(
      dloss, logits, labels, lse, dlogits, rows, cols, mean_rows);
  TRAINMEM_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
}

}  // namespace trainmem::cuda::kernels

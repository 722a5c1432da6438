// trainmem/backend/cuda/kernels/norm.cuh — layer norm over the last dimension, forward and backward.
//
// The mirror of backend/cpu/kernels/norm.hpp: one block per row keeps mean and rstd;
// backward forms dx per row with the CPU's formula (math::LayerNormBackwardRow) and
// dgamma, dbeta as deterministic column sums (reduce.cuh).
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/row_math.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class T, class TP, class Acc>
__global__ void layer_norm_kernel(const T* x, const TP* gamma, const TP* beta, T* y, Acc* mean_out, Acc* rstd_out,
                                  std::int64_t rows, std::int64_t cols, Acc eps) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    Acc sum = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += load<Acc>(xr, c);
    const Acc mean = block_all_reduce(sum, SumOp{}, Acc(0)) / static_cast<Acc>(cols);
    Acc squares = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc d = load<Acc>(xr, c) - mean;
      squares += d * d;
    }
    const Acc var = block_all_reduce(squares, SumOp{}, Acc(0)) / static_cast<Acc>(cols);
    const Acc rstd = Acc(1) / acc_sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc xhat = (load<Acc>(xr, c) - mean) * rstd;
      y[r * cols + c] = narrow<T>(xhat * load<Acc>(gamma, c) + load<Acc>(beta, c));
    }
  }
}

template <class T, class TP, class Acc>
__global__ void layer_norm_backward_dx_kernel(const T* dy, const T* x, const TP* gamma, const Acc* mean,
                                              const Acc* rstd, T* dx, std::int64_t rows, std::int64_t cols) {
  const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *dyr = dy + r * cols, *xr = x + r * cols;
    const math::LayerNormBackwardRow<Acc> row{mean[r], rstd[r]};
    Acc sum_g = Acc(0), sum_g_xhat = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      row.add_terms(load<Acc>(dyr, c), load<Acc>(xr, c), load<Acc>(gamma, c), sum_g, sum_g_xhat);
    sum_g = block_all_reduce(sum_g, SumOp{}, Acc(0));
    sum_g_xhat = block_all_reduce(sum_g_xhat, SumOp{}, Acc(0));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dx[r * cols + c] =
          narrow<T>(row(load<Acc>(dyr, c), load<Acc>(xr, c), load<Acc>(gamma, c), sum_g, sum_g_xhat, inv_cols));
  }
}

template <class Acc, class T>
struct LayerNormGammaTerm {  // dy[r, c] * xhat[r, c]
  const T *dy, *x;
  const Acc *mean, *rstd;
  std::int64_t cols;
  __device__ Acc operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t at = r * cols + c;
    return load<Acc>(dy, at) * math::LayerNormBackwardRow<Acc>{mean[r], rstd[r]}.xhat(load<Acc>(x, at));
  }
};

template <class Acc, class TP>
struct StoreParamGrad {
  TP* out;
  __device__ void operator()(std::int64_t c, Acc sum) const { out[c] = narrow<TP>(sum); }
};
}  // namespace device

template <class T, class TP, class Acc>
void layer_norm(const KernelContext& ctx, const T* x, const TP* gamma, const TP* beta, T* y, Acc* mean, Acc* rstd,
                std::int64_t rows, std::int64_t cols, double eps) {
  if (rows == 0 || cols == 0) return;
  device::layer_norm_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
      x, gamma, beta, y, mean, rstd, rows, cols, static_cast<Acc>(eps));
  TRAINMEM_CUDA_CHECK_LAUNCH("layer_norm_kernel");
}

/// dx per row; dgamma = sum_r dy xhat and dbeta = sum_r dy as deterministic column sums.
template <class T, class TP, class Acc>
void layer_norm_backward(const KernelContext& ctx, const T* dy, const T* x, const TP* gamma, const Acc* mean,
                         const Acc* rstd, T* dx, TP* dgamma, TP* dbeta, std::int64_t rows, std::int64_t cols) {
  if (cols == 0) return;
  if (rows > 0) {
    device::layer_norm_backward_dx_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
        dy, x, gamma, mean, rstd, dx, rows, cols);
    TRAINMEM_CUDA_CHECK_LAUNCH("layer_norm_backward_dx_kernel");
  }
  reduce_columns<Acc>(ctx, rows, cols, device::LayerNormGammaTerm<Acc, T>{dy, x, mean, rstd, cols},
                      device::StoreParamGrad<Acc, TP>{dgamma});
  reduce_columns<Acc>(ctx, rows, cols, device::WidenedElement<Acc, T>{dy, cols},
                      device::StoreParamGrad<Acc, TP>{dbeta});
}

}  // namespace trainmem::cuda::kernels

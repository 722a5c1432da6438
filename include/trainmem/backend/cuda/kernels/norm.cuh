// trainmem/backend/cuda/kernels/norm.cuh — layer and RMS norm over the last dimension, forward and backward.
//
// The mirror of backend/cpu/kernels/norm.hpp: one block per row keeps its statistics
// (mean and rstd, or rstd alone); backward forms dx per row with the CPU's formulas
// (math::LayerNormBackwardRow, RmsNormBackwardRow) and the parameter gradients as
// deterministic column sums (reduce.cuh). The entry points take the backend's tensors
// and pick the kernels for their dtypes, so the backend's methods only forward.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/dtype.hpp"
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

template <class T, class TP, class Acc>
__global__ void rms_norm_kernel(const T* x, const TP* weight, T* y, Acc* rstd_out, std::int64_t rows, std::int64_t cols,
                                Acc eps) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    Acc squares = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) squares += load<Acc>(xr, c) * load<Acc>(xr, c);
    const Acc rstd = math::rms_norm_rstd(block_all_reduce(squares, SumOp{}, Acc(0)), cols, eps);
    if (threadIdx.x == 0) rstd_out[r] = rstd;
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      y[r * cols + c] = narrow<T>(load<Acc>(xr, c) * rstd * load<Acc>(weight, c));
  }
}

template <class T, class TP, class Acc>
__global__ void rms_norm_backward_dx_kernel(const T* dy, const T* x, const TP* weight, const Acc* rstd, T* dx,
                                            std::int64_t rows, std::int64_t cols) {
  const Acc inv_cols = Acc(1) / static_cast<Acc>(cols);
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *dyr = dy + r * cols, *xr = x + r * cols;
    const math::RmsNormBackwardRow<Acc> row{rstd[r]};
    Acc sum_g_xhat = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      sum_g_xhat += row.term(load<Acc>(dyr, c), load<Acc>(xr, c), load<Acc>(weight, c));
    sum_g_xhat = block_all_reduce(sum_g_xhat, SumOp{}, Acc(0));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dx[r * cols + c] =
          narrow<T>(row(load<Acc>(dyr, c), load<Acc>(xr, c), load<Acc>(weight, c), sum_g_xhat, inv_cols));
  }
}

template <class Acc, class T>
struct RmsNormWeightTerm {  // dy[r, c] * x[r, c] * rstd[r]
  const T *dy, *x;
  const Acc* rstd;
  std::int64_t cols;
  __device__ Acc operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t at = r * cols + c;
    return load<Acc>(dy, at) * math::RmsNormBackwardRow<Acc>{rstd[r]}.xhat(load<Acc>(x, at));
  }
};

template <class Acc, class TP>
struct StoreParamGrad {
  TP* out;
  __device__ void operator()(std::int64_t c, Acc sum) const { out[c] = narrow<TP>(sum); }
};
}  // namespace device

template <class TensorT>
void layer_norm(const KernelContext& ctx, const TensorT& x, const TensorT& gamma, const TensorT& beta, const TensorT& y,
                const TensorT& mean, const TensorT& rstd, double eps) {
  const std::int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0 || cols == 0) return;
  visit_floating(x.dtype(), "layer_norm", [&]<class T>() {
    visit_floating(gamma.dtype(), "layer_norm", [&]<class TP>() {
      using Acc = AccumulatorOf<T>;
      device::layer_norm_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
          x.template data_as<const T>(), gamma.template data_as<const TP>(), beta.template data_as<const TP>(),
          y.template data_as<T>(), mean.template data_as<Acc>(), rstd.template data_as<Acc>(), rows, cols,
          static_cast<Acc>(eps));
      TRAINMEM_CUDA_CHECK_LAUNCH("layer_norm_kernel");
    });
  });
}

/// dx per row; dgamma = sum_r dy xhat and dbeta = sum_r dy as deterministic column sums.
template <class TensorT>
void layer_norm_backward(const KernelContext& ctx, const TensorT& dy, const TensorT& x, const TensorT& gamma,
                         const TensorT& mean, const TensorT& rstd, const TensorT& dx, const TensorT& dgamma,
                         const TensorT& dbeta) {
  const std::int64_t rows = x.rows(), cols = x.cols();
  if (cols == 0) return;
  visit_floating(x.dtype(), "layer_norm_backward", [&]<class T>() {
    visit_floating(gamma.dtype(), "layer_norm_backward", [&]<class TP>() {
      using Acc = AccumulatorOf<T>;
      const T *dyp = dy.template data_as<const T>(), *xp = x.template data_as<const T>();
      const Acc *meanp = mean.template data_as<const Acc>(), *rstdp = rstd.template data_as<const Acc>();
      if (rows > 0) {
        device::layer_norm_backward_dx_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
            dyp, xp, gamma.template data_as<const TP>(), meanp, rstdp, dx.template data_as<T>(), rows, cols);
        TRAINMEM_CUDA_CHECK_LAUNCH("layer_norm_backward_dx_kernel");
      }
      reduce_columns<Acc>(ctx, rows, cols, device::LayerNormGammaTerm<Acc, T>{dyp, xp, meanp, rstdp, cols},
                          device::StoreParamGrad<Acc, TP>{dgamma.template data_as<TP>()});
      reduce_columns<Acc>(ctx, rows, cols, device::WidenedElement<Acc, T>{dyp, cols},
                          device::StoreParamGrad<Acc, TP>{dbeta.template data_as<TP>()});
    });
  });
}

/// y = x rstd weight per row with rstd = 1 / sqrt(mean(x^2) + eps) (accumulator type).
template <class TensorT>
void rms_norm(const KernelContext& ctx, const TensorT& x, const TensorT& weight, const TensorT& y, const TensorT& rstd,
              double eps) {
  const std::int64_t rows = x.rows(), cols = x.cols();
  if (rows == 0 || cols == 0) return;
  visit_floating(x.dtype(), "rms_norm", [&]<class T>() {
    visit_floating(weight.dtype(), "rms_norm", [&]<class TP>() {
      using Acc = AccumulatorOf<T>;
      device::rms_norm_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
          x.template data_as<const T>(), weight.template data_as<const TP>(), y.template data_as<T>(),
          rstd.template data_as<Acc>(), rows, cols, static_cast<Acc>(eps));
      TRAINMEM_CUDA_CHECK_LAUNCH("rms_norm_kernel");
    });
  });
}

/// dx per row; dweight = sum_r dy xhat as a deterministic column sum.
template <class TensorT>
void rms_norm_backward(const KernelContext& ctx, const TensorT& dy, const TensorT& x, const TensorT& weight,
                       const TensorT& rstd, const TensorT& dx, const TensorT& dweight) {
  const std::int64_t rows = x.rows(), cols = x.cols();
  if (cols == 0) return;
  visit_floating(x.dtype(), "rms_norm_backward", [&]<class T>() {
    visit_floating(weight.dtype(), "rms_norm_backward", [&]<class TP>() {
      using Acc = AccumulatorOf<T>;
      const T *dyp = dy.template data_as<const T>(), *xp = x.template data_as<const T>();
      const Acc* rstdp = rstd.template data_as<const Acc>();
      if (rows > 0) {
        device::rms_norm_backward_dx_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
            dyp, xp, weight.template data_as<const TP>(), rstdp, dx.template data_as<T>(), rows, cols);
        TRAINMEM_CUDA_CHECK_LAUNCH("rms_norm_backward_dx_kernel");
      }
      reduce_columns<Acc>(ctx, rows, cols, device::RmsNormWeightTerm<Acc, T>{dyp, xp, rstdp, cols},
                          device::StoreParamGrad<Acc, TP>{dweight.template data_as<TP>()});
    });
  });
}

}  // namespace trainmem::cuda::kernels

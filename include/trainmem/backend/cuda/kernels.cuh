// trainmem/backend/cuda/kernels.cuh — the CUDA kernels behind cuda::Backend, one per CPU loop.
//
// Each kernel here mirrors the loop of the same name in backend/cpu/kernels.hpp and
// computes the same function: elements are widened to the accumulator type (float, or
// double for f64), computed with the shared math functors, and narrowed on store;
// softmax, layer norm, cross-entropy and every sum accumulate in that type. What
// differs is only the order of additions inside a reduction (a tree here, a loop on
// the CPU), so results agree to rounding, and bit for bit where no sum is involved
// (dropout, embedding backward, casts).
//
// Layout of the work: element-wise kernels are grid-stride loops that move 16 bytes
// per access when the pointers allow; row-wise kernels (softmax, layer norm,
// cross-entropy) give each row one block and reduce with block_all_reduce; column sums
// and full sums use the deterministic two-stage reductions of reduce.cuh. Element-wise
// ops instantiate one kernel per dtype when all operands share it and one run-time
// dtype kernel per accumulator for mixed dtypes, instead of every combination.
//
// Launchers take typed pointers and a KernelContext; they validate nothing (the ops
// and the Backend methods do), except what only the device knows: an out-of-range
// cross-entropy label or embedding id is recorded on the device (report_bad_index,
// launch.cuh) and raised by the backend at its next host wait, so no launcher waits.
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/math.hpp"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"

namespace trainmem::cuda::detail {

/// double if any operand is double, else float (as the CPU loops choose).
template <class... Ts>
using AccumulatorFor = std::conditional_t<(std::is_same_v<Ts, double> || ...), double, float>;

inline bool any_f64(std::initializer_list<DType> dtypes) {
  for (DType d : dtypes)
    if (d == DType::F64) return true;
  return false;
}

// ======================================================================================
// map: out = op(in), out = op(a, b)
// ======================================================================================

/// How b of a binary map lines up with a: same shape, one row of a's last extent, or a scalar.
enum class Broadcast : int { Full, Row, Scalar };

namespace device {
template <class Op, class TIn, class TOut>
__global__ void map_unary_kernel(Op op, const TIn* in, TOut* out, std::int64_t n, bool packed) {
  using Acc = AccumulatorFor<TIn, TOut>;
  constexpr int kPack = pack_width<TIn, TOut>();
  std::int64_t scalar_from = 0;
  if (packed) {
    const std::int64_t packs = n / kPack;
    const auto* in_packs = reinterpret_cast<const Pack<TIn, kPack>*>(in);
    auto* out_packs = reinterpret_cast<Pack<TOut, kPack>*>(out);
    for (std::int64_t p = global_thread(); p < packs; p += grid_stride()) {
      const Pack<TIn, kPack> x = in_packs[p];
      Pack<TOut, kPack> y;
#pragma unroll
      for (int j = 0; j < kPack; ++j) y.v[j] = narrow<TOut>(op(static_cast<Acc>(widen(x.v[j]))));
      out_packs[p] = y;
    }
    scalar_from = packs * kPack;
  }
  for (std::int64_t i = scalar_from + global_thread(); i < n; i += grid_stride())
    out[i] = narrow<TOut>(op(load<Acc>(in, i)));
}

template <class Op, class Acc>
__global__ void map_unary_any_kernel(Op op, const void* in, DType in_dtype, void* out, DType out_dtype,
                                     std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride())
    store_as<Acc>(out, out_dtype, i, op(load_as<Acc>(in, in_dtype, i)));
}

template <class Op, class T>
__global__ void map_binary_kernel(Op op, const T* a, const T* b, T* out, std::int64_t n, std::int64_t cols,
                                  Broadcast mode, bool packed) {
  using Acc = AccumulatorOf<T>;
  constexpr int kPack = pack_width<T>();
  std::int64_t scalar_from = 0;
  if (packed) {  // the launcher guarantees alignment, and cols % kPack == 0 for Row
    using P = Pack<T, kPack>;
    const std::int64_t packs = n / kPack;
    const auto* a_packs = reinterpret_cast<const P*>(a);
    const auto* b_packs = reinterpret_cast<const P*>(b);
    auto* out_packs = reinterpret_cast<P*>(out);
    for (std::int64_t p = global_thread(); p < packs; p += grid_stride()) {
      const P x = a_packs[p];
      P y;
      if (mode == Broadcast::Full) {
        y = b_packs[p];
      } else if (mode == Broadcast::Row) {
        y = b_packs[(p * kPack % cols) / kPack];
      } else {
#pragma unroll
        for (int j = 0; j < kPack; ++j) y.v[j] = b[0];
      }
      P z;
#pragma unroll
      for (int j = 0; j < kPack; ++j)
        z.v[j] = narrow<T>(op(static_cast<Acc>(widen(x.v[j])), static_cast<Acc>(widen(y.v[j]))));
      out_packs[p] = z;
    }
    scalar_from = packs * kPack;
  }
  for (std::int64_t i = scalar_from + global_thread(); i < n; i += grid_stride()) {
    const std::int64_t bi = mode == Broadcast::Full ? i : mode == Broadcast::Row ? i % cols : 0;
    out[i] = narrow<T>(op(load<Acc>(a, i), load<Acc>(b, bi)));
  }
}

template <class Op, class Acc>
__global__ void map_binary_any_kernel(Op op, const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                                      DType out_dtype, std::int64_t n, std::int64_t cols, Broadcast mode) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t bi = mode == Broadcast::Full ? i : mode == Broadcast::Row ? i % cols : 0;
    store_as<Acc>(out, out_dtype, i, op(load_as<Acc>(a, a_dtype, i), load_as<Acc>(b, b_dtype, bi)));
  }
}
}  // namespace device

/// out = op(in) element-wise; a cast is map(Identity). Casts get a kernel per dtype pair.
template <class Op>
void map_unary(const KernelContext& ctx, Op op, DType in_dtype, const void* in, DType out_dtype, void* out,
               std::int64_t n) {
  if (n == 0) return;
  constexpr bool kCast = std::is_same_v<Op, math::Identity>;
  if (kCast || in_dtype == out_dtype) {
    visit_floating(in_dtype, "map", [&]<class TI>() {
      visit_floating(out_dtype, "map", [&]<class TO>() {
        if constexpr (kCast || std::is_same_v<TI, TO>) {
          constexpr int kPack = pack_width<TI, TO>();
          const bool packed = pack_aligned<TI, kPack>(in) && pack_aligned<TO, kPack>(out);
          device::map_unary_kernel<<<blocks_for(ctx, n, kPack), kThreads, 0, ctx.stream>>>(
              op, static_cast<const TI*>(in), static_cast<TO*>(out), n, packed);
          TRAINMEM_CUDA_CHECK_LAUNCH("map_unary_kernel");
        }
      });
    });
    return;
  }
  if (any_f64({in_dtype, out_dtype}))
    device::map_unary_any_kernel<Op, double>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, in, in_dtype, out, out_dtype, n);
  else
    device::map_unary_any_kernel<Op, float>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, in, in_dtype, out, out_dtype, n);
  TRAINMEM_CUDA_CHECK_LAUNCH("map_unary_any_kernel");
}

/// out = op(a, b) for a viewed as [rows, cols]; b has a's shape, is a row of cols, or a scalar.
template <class Op>
void map_binary(const KernelContext& ctx, Op op, DType a_dtype, const void* a, DType b_dtype, const void* b,
                DType out_dtype, void* out, std::int64_t rows, std::int64_t cols, std::int64_t b_numel) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  const Broadcast mode = b_numel == n ? Broadcast::Full : b_numel == 1 ? Broadcast::Scalar : Broadcast::Row;
  if (a_dtype == b_dtype && a_dtype == out_dtype) {
    visit_floating(a_dtype, "map", [&]<class T>() {
      constexpr int kPack = pack_width<T>();
      const bool packed = pack_aligned<T, kPack>(a) && pack_aligned<T, kPack>(out) &&
                          (mode == Broadcast::Scalar || pack_aligned<T, kPack>(b)) &&
                          (mode != Broadcast::Row || cols % kPack == 0);
      device::map_binary_kernel<<<blocks_for(ctx, n, kPack), kThreads, 0, ctx.stream>>>(
          op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n, cols, mode, packed);
      TRAINMEM_CUDA_CHECK_LAUNCH("map_binary_kernel");
    });
    return;
  }
  if (any_f64({a_dtype, b_dtype, out_dtype}))
    device::map_binary_any_kernel<Op, double>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, a, a_dtype, b, b_dtype, out, out_dtype, n, cols, mode);
  else
    device::map_binary_any_kernel<Op, float>
        <<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(op, a, a_dtype, b, b_dtype, out, out_dtype, n, cols, mode);
  TRAINMEM_CUDA_CHECK_LAUNCH("map_binary_any_kernel");
}

// ======================================================================================
// sums
// ======================================================================================

namespace device {
template <class Acc, class TOut>
struct StoreColumnSum {  // out[c] = beta out[c] + sum, as the CPU loop rounds it
  TOut* out;
  double beta;
  __device__ void operator()(std::int64_t c, Acc sum) const {
    const Acc prior = beta == 0.0 ? Acc(0) : static_cast<Acc>(beta) * load<Acc>(out, c);
    out[c] = narrow<TOut>(prior + sum);
  }
};

template <class Acc, class TOut>
struct StoreTotal {
  TOut* out;
  __device__ void operator()(Acc total) const { out[0] = narrow<TOut>(total); }
};
}  // namespace device

/// out[c] = beta out[c] + sum_r in[r, c].
template <class TIn, class TOut>
void sum_rows(const KernelContext& ctx, const TIn* in, TOut* out, std::int64_t rows, std::int64_t cols, double beta) {
  using Acc = AccumulatorFor<TIn, TOut>;
  reduce_columns<Acc>(ctx, rows, cols, device::WidenedElement<Acc, TIn>{in, cols},
                      device::StoreColumnSum<Acc, TOut>{out, beta});
}

template <class TIn, class TOut>
void sum_all(const KernelContext& ctx, const TIn* in, TOut* out, std::int64_t n) {
  using Acc = AccumulatorFor<TIn, TOut>;
  reduce_all<Acc>(ctx, n, device::WidenedElement<Acc, TIn>{in, 0}, device::StoreTotal<Acc, TOut>{out});
}

// ======================================================================================
// softmax
// ======================================================================================

/// A row's maximum and sum of exp(x - max), reduced over the block (every thread gets
/// both): the stable base of softmax and log-sum-exp.
namespace device {
template <class Acc>
struct MaxSumExp {
  Acc max;
  Acc sum;
};
template <class Acc, class T>
__device__ MaxSumExp<Acc> block_max_and_sum_exp(const T* row, std::int64_t cols) {
  Acc max = negative_infinity<Acc>();
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) max = MaxOp{}(max, load<Acc>(row, c));
  max = block_all_reduce(max, MaxOp{}, negative_infinity<Acc>());
  Acc sum = Acc(0);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += math::exp(load<Acc>(row, c) - max);
  sum = block_all_reduce(sum, SumOp{}, Acc(0));
  return {max, sum};
}

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
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *dyr = dy + r * cols, *yr = y + r * cols;
    T* dxr = dx + r * cols;
    Acc dot = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dot += log_output ? load<Acc>(dyr, c) : load<Acc>(dyr, c) * load<Acc>(yr, c);
    dot = block_all_reduce(dot, SumOp{}, Acc(0));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc g = log_output ? load<Acc>(dyr, c) - math::exp(load<Acc>(yr, c)) * dot
                               : load<Acc>(yr, c) * (load<Acc>(dyr, c) - dot);
      dxr[c] = narrow<T>(g);
    }
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

// ======================================================================================
// layer norm
// ======================================================================================

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
    const Acc mu = mean[r], rs = rstd[r];
    Acc sum_g = Acc(0), sum_g_xhat = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc xhat = (load<Acc>(xr, c) - mu) * rs;
      const Acc g = load<Acc>(dyr, c) * load<Acc>(gamma, c);
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    sum_g = block_all_reduce(sum_g, SumOp{}, Acc(0));
    sum_g_xhat = block_all_reduce(sum_g_xhat, SumOp{}, Acc(0));
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const Acc xhat = (load<Acc>(xr, c) - mu) * rs;
      const Acc g = load<Acc>(dyr, c) * load<Acc>(gamma, c);
      dx[r * cols + c] = narrow<T>(rs * (g - sum_g * inv_cols - xhat * sum_g_xhat * inv_cols));
    }
  }
}

template <class Acc, class T>
struct LayerNormGammaTerm {  // dy[r, c] * xhat[r, c]
  const T *dy, *x;
  const Acc *mean, *rstd;
  std::int64_t cols;
  __device__ Acc operator()(std::int64_t r, std::int64_t c) const {
    const std::int64_t at = r * cols + c;
    return load<Acc>(dy, at) * ((load<Acc>(x, at) - mean[r]) * rstd[r]);
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

// ======================================================================================
// cross-entropy
// ======================================================================================

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

/// Mean cross-entropy; keeps each row's log-sum-exp. A label outside [0, cols) counts as
/// a zero loss here and is recorded in ctx.bad_indices, which the backend raises later.
template <class T, class Acc>
void cross_entropy(const KernelContext& ctx, const T* logits, const std::int32_t* labels, Acc* loss, Acc* lse,
                   std::int64_t rows, std::int64_t cols) {
  ScratchBuffer row_loss(ctx, static_cast<std::size_t>(rows) * sizeof(Acc));
  if (rows > 0) {
    device::cross_entropy_rows_kernel<<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(
        logits, labels, lse, row_loss.as<Acc>(), rows, cols,
        ctx.bad_indices + static_cast<int>(IndexCheck::CrossEntropyLabel));
    TRAINMEM_CUDA_CHECK_LAUNCH("cross_entropy_rows_kernel");
  }
  reduce_all<Acc>(ctx, rows, device::LoadPlain<Acc>{row_loss.as<const Acc>()}, device::StoreMean<Acc>{loss, rows});
}

namespace device {
template <class T, class Acc>
__global__ void cross_entropy_backward_kernel(const Acc* dloss, const T* logits, const std::int32_t* labels,
                                              const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t cols) {
  const Acc scale = dloss[0] / static_cast<Acc>(rows);
  const std::int64_t n = rows * cols;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const std::int64_t r = i / cols, c = i - r * cols;
    const Acc p = math::exp(load<Acc>(logits, i) - lse[r]);
    dlogits[i] = narrow<T>(scale * (p - (c == labels[r] ? Acc(1) : Acc(0))));
  }
}
}  // namespace device

/// dlogits = dloss / rows * (softmax(logits) - onehot(label)); dloss is read on the device.
template <class T, class Acc>
void cross_entropy_backward(const KernelContext& ctx, const Acc* dloss, const T* logits, const std::int32_t* labels,
                            const Acc* lse, T* dlogits, std::int64_t rows, std::int64_t cols) {
  if (rows * cols == 0) return;
  device::cross_entropy_backward_kernel<<<blocks_for(ctx, rows * cols), kThreads, 0, ctx.stream>>>(
      dloss, logits, labels, lse, dlogits, rows, cols);
  TRAINMEM_CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
}

// ======================================================================================
// shape: swap the middle axes, causal mask
// ======================================================================================

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
  const T fill_value = trainmem::detail::narrow<T>(static_cast<AccumulatorOf<T>>(fill));
  const unsigned blocks = blocks_for(ctx, n);
  if (n < (std::int64_t{1} << 31))
    device::causal_mask_kernel<T, std::uint32_t><<<blocks, kThreads, 0, ctx.stream>>>(
        in, out, static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(t), fill_value);
  else device::causal_mask_kernel<T, std::int64_t><<<blocks, kThreads, 0, ctx.stream>>>(in, out, n, t, fill_value);
  TRAINMEM_CUDA_CHECK_LAUNCH("causal_mask_kernel");
}

// ======================================================================================
// dropout
// ======================================================================================

/// out = in * keep(i) / (1 - p) with keep drawn from Philox at position rng.offset + i,
/// exactly as trainmem::detail::random_uniform draws it on the CPU. One Philox call
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
      const trainmem::detail::Philox4 bits =
          trainmem::detail::philox4x32_10((rng.offset >> 2) + static_cast<std::uint64_t>(g), rng.seed);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::int64_t i = 4 * g + j;
        if (i < n) {
          // random_uniform's mapping: the top 24 bits as a multiple of 2^-24.
          const float uniform = static_cast<float>(bits.v[j] >> 8) * (1.0f / 16777216.0f);
          out[i] = narrow<T>(load<Acc>(in, i) * static_cast<Acc>(scale(uniform)));
        }
      }
    }
  } else {
    for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
      const float uniform = trainmem::detail::random_uniform(rng, static_cast<std::uint64_t>(i));
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

// ======================================================================================
// embedding
// ======================================================================================

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
  trainmem::detail::check(count < (std::int64_t{1} << 31) && vocab < (std::int64_t{1} << 31),
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

// ======================================================================================
// optimizer update
// ======================================================================================

/// One optimizer pass over param (TP, the f32/f64 master): the gradient and the optional
/// 16-bit model copy have run-time dtypes; with `skip` set and non-zero, nothing changes.
/// A bf16 copy may be rounded stochastically with draw i of `rng` (bf16_round_stochastic).
namespace device {
template <class Update, class TP>
__global__ void apply_update_kernel(Update update, TP* param, const void* grad, DType grad_dtype, TP* state1,
                                    TP* state2, void* copy, DType copy_dtype, std::int64_t n, const float* skip,
                                    bool stochastic, RngState rng) {
  if (skip != nullptr && *skip != 0.0f) return;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    TP p = param[i];
    TP s1 = state1 != nullptr ? state1[i] : TP(0);
    TP s2 = state2 != nullptr ? state2[i] : TP(0);
    update(p, load_as<TP>(grad, grad_dtype, i), s1, s2);
    param[i] = p;
    if (state1 != nullptr) state1[i] = s1;
    if (state2 != nullptr) state2[i] = s2;
    if (copy == nullptr) continue;
    if (stochastic)
      static_cast<BFloat16*>(copy)[i] = bf16_round_stochastic(
          static_cast<float>(p), trainmem::detail::random_bits(rng, static_cast<std::uint64_t>(i)));
    else store_as<TP>(copy, copy_dtype, i, p);
  }
}
}  // namespace device

template <class Update, class TP>
void apply_update(const KernelContext& ctx, Update update, TP* param, const void* grad, DType grad_dtype, TP* state1,
                  TP* state2, void* copy, DType copy_dtype, std::int64_t n, const float* skip,
                  const CopyRounding& rounding) {
  if (n == 0) return;
  const bool stochastic = copy != nullptr && rounding.mode == RoundingMode::Stochastic;
  device::apply_update_kernel<<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(
      update, param, grad, grad_dtype, state1, state2, copy, copy_dtype, n, skip, stochastic, rounding.rng);
  TRAINMEM_CUDA_CHECK_LAUNCH("apply_update_kernel");
}

}  // namespace trainmem::cuda::detail

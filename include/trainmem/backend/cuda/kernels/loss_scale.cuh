// trainmem/backend/cuda/kernels/loss_scale.cuh — the loss scaler's device side, with no host sync per step.
//
// The mirror of backend/cpu/kernels/loss_scale.hpp. The scale, the growth counter, the
// hysteresis counter and the found-inf flag are one-element tensors on the device.
// Unscaling is one multi-tensor launch per up to kMultiTensorCapacity gradients: the
// tensor list travels as a kernel parameter, each block owns one chunk of one tensor,
// multiplies it by 1/scale in place and raises found_inf if any stored result is not
// finite — which covers an inf or NaN gradient and also a finite one that overflows
// its dtype when unscaled by a scale below 1. The flag is only ever set, so several
// launches and several calls OR together. The scale update is a one-thread kernel
// running update_scale_state, the same function the CPU backend calls. The optimizer's
// fused pass (kernels/update.cuh) reads the flag on the device and does nothing when
// it is set; the host reads it only when the user asks.
#pragma once

#include <cstdint>
#include <span>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/loss_scale_rule.hpp"

namespace trainmem::cuda::kernels {

inline constexpr int kMultiTensorCapacity = 48;           // tensors per launch (kernel parameters < 4 KB)
inline constexpr std::int64_t kMultiTensorChunk = 16384;  // elements per block

/// A gradient as the multi-tensor kernel sees it.
struct GradRef {
  void* data;
  std::int64_t numel;
  DType dtype;
};

/// Up to Capacity tensors and where each one's blocks start, passed by value to the kernel.
template <int Capacity>
struct MultiTensorList {
  void* data[Capacity];
  std::int64_t numel[Capacity];
  std::int64_t first_block[Capacity + 1];
  DType dtype[Capacity];
  int count;
};

namespace device {
/// With inv_scale 1 (a check only, GradScaler::step_async) the values cannot change, so
/// nothing is written back, as on the CPU backend.
template <class T>
__device__ bool unscale_chunk(T* grad, std::int64_t begin, std::int64_t end, float inv_scale) {
  using Acc = AccumulatorOf<T>;
  const bool rewrite = inv_scale != 1.0f;
  bool non_finite = false;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const T stored = rewrite ? narrow<T>(load<Acc>(grad, i) * static_cast<Acc>(inv_scale)) : grad[i];
    if (rewrite) grad[i] = stored;
    non_finite = non_finite || !acc_isfinite(static_cast<Acc>(widen(stored)));
  }
  return non_finite;
}

template <int Capacity>
__global__ void unscale_grads_kernel(MultiTensorList<Capacity> list, const float* scale, float* found_inf) {
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= static_cast<std::int64_t>(blockIdx.x)) ++t;
  const std::int64_t begin = (static_cast<std::int64_t>(blockIdx.x) - list.first_block[t]) * kMultiTensorChunk;
  const std::int64_t end = begin + kMultiTensorChunk < list.numel[t] ? begin + kMultiTensorChunk : list.numel[t];
  // As the CPU backend forms it: the reciprocal in f64, rounded once to f32.
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale[0]));
  bool non_finite = false;
  switch (list.dtype[t]) {
    case DType::F32: non_finite = unscale_chunk(static_cast<float*>(list.data[t]), begin, end, inv_scale); break;
    case DType::F64: non_finite = unscale_chunk(static_cast<double*>(list.data[t]), begin, end, inv_scale); break;
    case DType::F16: non_finite = unscale_chunk(static_cast<Half*>(list.data[t]), begin, end, inv_scale); break;
    case DType::BF16: non_finite = unscale_chunk(static_cast<BFloat16*>(list.data[t]), begin, end, inv_scale); break;
    default: break;
  }
  if (__syncthreads_or(non_finite) && threadIdx.x == 0) found_inf[0] = 1.0f;
}
}  // namespace device

/// grads *= 1/scale[0] in place; found_inf[0] = 1 if any stored result is inf or NaN (never cleared).
inline void unscale_grads(const KernelContext& ctx, std::span<const GradRef> grads, const float* scale,
                          float* found_inf) {
  MultiTensorList<kMultiTensorCapacity> list{};
  auto launch = [&] {
    if (list.count == 0) return;
    const auto blocks = static_cast<unsigned>(list.first_block[list.count]);
    device::unscale_grads_kernel<<<blocks, kThreads, 0, ctx.stream>>>(list, scale, found_inf);
    TRAINMEM_CUDA_CHECK_LAUNCH("unscale_grads_kernel");
    list = {};
  };
  for (const GradRef& grad : grads) {
    if (grad.numel == 0) continue;
    const std::int64_t blocks = (grad.numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
    if (list.count == kMultiTensorCapacity || list.first_block[list.count] + blocks > (std::int64_t{1} << 30)) launch();
    list.data[list.count] = grad.data;
    list.numel[list.count] = grad.numel;
    list.dtype[list.count] = grad.dtype;
    list.first_block[list.count + 1] = list.first_block[list.count] + blocks;
    ++list.count;
  }
  launch();
}

namespace device {
template <class Scale>
__global__ void update_scale_kernel(Scale* scale, std::int32_t* growth_tracker, std::int32_t* hysteresis_left,
                                    const float* found_inf, ScaleUpdateArgs args) {
  update_scale_state(scale[0], growth_tracker[0], hysteresis_left[0], found_inf[0] != 0.0f, args);
}
}  // namespace device

/// One step of the dynamic loss-scale rule, run next to the gradients.
inline void update_scale(const KernelContext& ctx, float* scale, std::int32_t* growth_tracker,
                         std::int32_t* hysteresis_left, const float* found_inf, const ScaleUpdateArgs& args) {
  device::update_scale_kernel<<<1, 1, 0, ctx.stream>>>(scale, growth_tracker, hysteresis_left, found_inf, args);
  TRAINMEM_CUDA_CHECK_LAUNCH("update_scale_kernel");
}

}  // namespace trainmem::cuda::kernels

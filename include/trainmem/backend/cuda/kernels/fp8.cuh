// trainmem/backend/cuda/kernels/fp8.cuh — FP8 quantize and dequantize, and the FP8 GEMM's helpers.
//
// The mirror of backend/cpu/kernels/fp8.hpp: each element goes through core/fp8_rules.hpp
// (the conversions of core/float8.hpp included), so both backends give the same codes and
// values. amax needs no host sync and no fixed reduction order: |x| as f32 bits (sign
// cleared) orders like the values, with every NaN above inf, so a block's maximum and an
// atomicMax on those bits give the NaN-winning maximum of the CPU's amax_update in any
// order (the stored amax must hold a value >= 0 or a NaN, which is what quantize writes).
// The GEMM itself is cuBLASLt's (gemm.cuh); here are what it needs around it: a byte
// transpose (cuBLASLt's FP8 kernels on sm_90 take only the "TN" layout), an exact widening
// to bf16 (the path for shapes cuBLASLt's FP8 kernels refuse), and the epilogue that
// applies alpha * a_scale_inv * b_scale_inv, read on the device, to f32 sums.
#pragma once

#include <algorithm>
#include <cstdint>

#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/fp8_rules.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class TS, class F8>
__global__ void quantize_fp8_kernel(const TS* src, std::int64_t n, const float* scale, F8* dst,
                                    unsigned int* amax_bits) {
  const float s = scale[0];
  unsigned int local = 0;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    const float x = static_cast<float>(::trainmem::detail::widen(src[i]));
    dst[i] = fp8::quantize<F8>(x, s);
    const unsigned int bits = ::trainmem::detail::float_bits(x) & 0x7fffffffu;
    local = bits > local ? bits : local;
  }
  if (amax_bits == nullptr) return;
  const unsigned int block_max = block_all_reduce(local, MaxOp{}, 0u);
  if (threadIdx.x == 0 && block_max != 0u) atomicMax(amax_bits, block_max);
}

template <class F8, class TD>
__global__ void dequantize_fp8_kernel(const F8* src, std::int64_t n, const float* scale_inv, TD* dst) {
  const float s = scale_inv[0];
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) dst[i] = fp8::dequantize<TD>(src[i], s);
}

inline constexpr int kTransposeTile = 32;
/// out[e][c][r] = in[e][r][c] for [rows, cols] byte matrices, one 32 x 32 tile per block (z: batch entry).
__global__ void transpose_bytes_kernel(const std::uint8_t* in, std::int64_t in_stride, std::uint8_t* out,
                                       std::int64_t out_stride, std::int64_t rows, std::int64_t cols) {
  __shared__ std::uint8_t tile[kTransposeTile][kTransposeTile + 1];
  const std::uint8_t* src = in + static_cast<std::int64_t>(blockIdx.z) * in_stride;
  std::uint8_t* dst = out + static_cast<std::int64_t>(blockIdx.z) * out_stride;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * kTransposeTile;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * kTransposeTile;
  for (int dy = static_cast<int>(threadIdx.y); dy < kTransposeTile; dy += static_cast<int>(blockDim.y)) {
    const std::int64_t r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[dy][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int dy = static_cast<int>(threadIdx.y); dy < kTransposeTile; dy += static_cast<int>(blockDim.y)) {
    const std::int64_t c = c0 + dy, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][dy];
  }
}

template <class F8>
__global__ void widen_fp8_kernel(const F8* src, std::int64_t n, BFloat16* dst) {
  for (std::int64_t i = global_thread(); i < n; i += grid_stride())
    dst[i] = BFloat16(static_cast<float>(src[i]));  // exact: every FP8 value is a bf16 value
}

/// c[e][i][j] = factor * sums[e][i][j] + beta c (fp8::gemm_output), factor from the device scales.
template <class TC>
__global__ void gemm_fp8_epilogue_kernel(const float* sums, std::int64_t batch, std::int64_t mn, TC* c,
                                         std::int64_t stride_c, float alpha, float beta, const float* a_scale_inv,
                                         const float* b_scale_inv) {
  const float factor = fp8::gemm_factor(alpha, a_scale_inv[0], b_scale_inv[0]);
  for (std::int64_t idx = global_thread(); idx < batch * mn; idx += grid_stride()) {
    TC* out = c + (idx / mn) * stride_c + idx % mn;
    const float old = beta == 0.0f ? 0.0f : static_cast<float>(::trainmem::detail::widen(*out));
    *out = ::trainmem::detail::narrow<TC>(fp8::gemm_output(sums[idx], factor, beta, old));
  }
}
}  // namespace device

/// dst = fp8(src * scale[0]) for n elements; amax[0] = max(amax[0], max |src|) unless amax is null.
template <class TS, class F8>
void quantize_fp8(const KernelContext& ctx, const TS* src, std::int64_t n, const float* scale, F8* dst, float* amax) {
  if (n == 0) return;
  device::quantize_fp8_kernel<<<blocks_for(ctx, n, 4), kThreads, 0, ctx.stream>>>(
      src, n, scale, dst, reinterpret_cast<unsigned int*>(amax));
  TRAINMEM_CUDA_CHECK_LAUNCH("quantize_fp8_kernel");
}

/// dst = float(src) * scale_inv[0], rounded once to TD, for n elements.
template <class F8, class TD>
void dequantize_fp8(const KernelContext& ctx, const F8* src, std::int64_t n, const float* scale_inv, TD* dst) {
  if (n == 0) return;
  device::dequantize_fp8_kernel<<<blocks_for(ctx, n, 4), kThreads, 0, ctx.stream>>>(src, n, scale_inv, dst);
  TRAINMEM_CUDA_CHECK_LAUNCH("dequantize_fp8_kernel");
}

/// `batch` byte matrices [rows, cols] (in_stride apart) into [cols, rows] ones (out_stride apart).
inline void transpose_bytes(const KernelContext& ctx, const void* in, std::int64_t in_stride, void* out,
                            std::int64_t out_stride, std::int64_t rows, std::int64_t cols, std::int64_t batch) {
  if (rows == 0 || cols == 0 || batch == 0) return;
  constexpr std::int64_t kMaxGridZ = 65535;
  for (std::int64_t first = 0; first < batch; first += kMaxGridZ) {
    const dim3 grid(static_cast<unsigned>((cols + device::kTransposeTile - 1) / device::kTransposeTile),
                    static_cast<unsigned>((rows + device::kTransposeTile - 1) / device::kTransposeTile),
                    static_cast<unsigned>(std::min(kMaxGridZ, batch - first)));
    device::transpose_bytes_kernel<<<grid, dim3(device::kTransposeTile, 8), 0, ctx.stream>>>(
        static_cast<const std::uint8_t*>(in) + first * in_stride, in_stride,
        static_cast<std::uint8_t*>(out) + first * out_stride, out_stride, rows, cols);
    TRAINMEM_CUDA_CHECK_LAUNCH("transpose_bytes_kernel");
  }
}

/// n FP8 values (of `dtype`) widened to bf16.
inline void widen_fp8(const KernelContext& ctx, DType dtype, const void* src, std::int64_t n, BFloat16* dst) {
  if (n == 0) return;
  visit_fp8(dtype, "gemm_fp8", [&]<class F8>() {
    device::widen_fp8_kernel<<<blocks_for(ctx, n, 4), kThreads, 0, ctx.stream>>>(static_cast<const F8*>(src), n, dst);
  });
  TRAINMEM_CUDA_CHECK_LAUNCH("widen_fp8_kernel");
}

/// C = alpha a_scale_inv b_scale_inv sums + beta C for `batch` [m, n] blocks (C's stride_c apart).
inline void gemm_fp8_epilogue(const KernelContext& ctx, const float* sums, std::int64_t batch, std::int64_t mn,
                              DType c_dtype, void* c, std::int64_t stride_c, float alpha, float beta,
                              const float* a_scale_inv, const float* b_scale_inv) {
  if (batch * mn == 0) return;
  visit_floating(c_dtype, "gemm_fp8", [&]<class TC>() {
    if constexpr (!std::is_same_v<TC, double>)
      device::gemm_fp8_epilogue_kernel<<<blocks_for(ctx, batch * mn, 4), kThreads, 0, ctx.stream>>>(
          sums, batch, mn, static_cast<TC*>(c), stride_c, alpha, beta, a_scale_inv, b_scale_inv);
  });
  TRAINMEM_CUDA_CHECK_LAUNCH("gemm_fp8_epilogue_kernel");
}

}  // namespace trainmem::cuda::kernels

// trainmem/backend/cuda/kernels/attention.cuh — fused scaled-dot-product attention.
//
// The CPU's algorithm (backend/cpu/kernels/attention.hpp) with the work cut by rows:
// forward, one block per query row, its scores in shared memory, then the row's
// softmax, output and log-sum-exp; backward in two passes, one block per query row
// (recomputed probabilities, dP, delta, dS, dq) and one block per key row (dv and dk,
// summing over the query rows that see the key). Plain loops, f32 (f64 for f64) math:
// correct and memory-light first, Tensor Cores later. A row's scores must fit the
// 48 KiB of shared memory a block gets by default (12,032 keys in f32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cuda::kernels {

namespace device {
template <class Acc, class T>
__device__ __forceinline__ Acc row_dot(const T* a, const T* b, std::int64_t d) {
  Acc acc = Acc(0);
  for (std::int64_t c = 0; c < d; ++c) acc += load<Acc>(a, c) * load<Acc>(b, c);
  return acc;
}

template <class T, class Acc>
__global__ void attention_kernel(const T* q, const T* k, const T* v, T* out, Acc* lse, AttentionSizes s) {
  extern __shared__ unsigned char shared_bytes[];
  Acc* p = reinterpret_cast<Acc*>(shared_bytes);
  const Acc scale = static_cast<Acc>(s.scale);
  for (std::int64_t r = blockIdx.x; r < s.n * s.tq; r += gridDim.x) {
    const std::int64_t slice = r / s.tq, visible = s.visible(r % s.tq);
    const T *qi = q + r * s.d, *ks = k + slice * s.tk * s.d, *vs = v + slice * s.tk * s.d;
    Acc max = negative_infinity<Acc>();
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      p[j] = scale * row_dot<Acc>(qi, ks + j * s.d, s.d);
      max = MaxOp{}(max, p[j]);
    }
    max = block_all_reduce(max, MaxOp{}, negative_infinity<Acc>());
    Acc sum = Acc(0);
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += p[j] = math::exp(p[j] - max);
    sum = block_all_reduce(sum, SumOp{}, Acc(0));  // ends in a barrier: every p[j] is written
    for (std::int64_t c = threadIdx.x; c < s.d; c += blockDim.x) {
      Acc o = Acc(0);
      for (std::int64_t j = 0; j < visible; ++j) o += p[j] * load<Acc>(vs, j * s.d + c);
      out[r * s.d + c] = narrow<T>(o / sum);
    }
    if (threadIdx.x == 0) lse[r] = max + acc_log(sum);
    __syncthreads();  // p is the next row's
  }
}

/// Per query row: P from lse, dP = dO V^T, delta = <P, dP>, dS = scale P (dP - delta), dq = dS K.
template <class T, class Acc>
__global__ void attention_rows_backward_kernel(const T* q, const T* k, const T* v, const Acc* lse, const T* dout, T* dq,
                                               Acc* delta, AttentionSizes s) {
  extern __shared__ unsigned char shared_bytes[];
  Acc* p = reinterpret_cast<Acc*>(shared_bytes);
  Acc* dp = p + s.tk;
  const Acc scale = static_cast<Acc>(s.scale);
  for (std::int64_t r = blockIdx.x; r < s.n * s.tq; r += gridDim.x) {
    const std::int64_t slice = r / s.tq, visible = s.visible(r % s.tq);
    const T *qi = q + r * s.d, *doi = dout + r * s.d, *ks = k + slice * s.tk * s.d, *vs = v + slice * s.tk * s.d;
    Acc dot = Acc(0);
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      p[j] = math::exp(scale * row_dot<Acc>(qi, ks + j * s.d, s.d) - lse[r]);
      dp[j] = row_dot<Acc>(doi, vs + j * s.d, s.d);
      dot += p[j] * dp[j];
    }
    dot = block_all_reduce(dot, SumOp{}, Acc(0));
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) p[j] = scale * p[j] * (dp[j] - dot);
    __syncthreads();
    for (std::int64_t c = threadIdx.x; c < s.d; c += blockDim.x) {
      Acc acc = Acc(0);
      for (std::int64_t j = 0; j < visible; ++j) acc += p[j] * load<Acc>(ks, j * s.d + c);
      dq[r * s.d + c] = narrow<T>(acc);
    }
    if (threadIdx.x == 0) delta[r] = dot;
    __syncthreads();
  }
}

/// Per key row j: dv_j = sum_i P_ij dO_i, dk_j = sum_i dS_ij q_i over the query rows that see key j.
template <class T, class Acc>
__global__ void attention_keys_backward_kernel(const T* q, const T* k, const T* v, const Acc* lse, const T* dout,
                                               const Acc* delta, T* dk, T* dv, AttentionSizes s) {
  extern __shared__ unsigned char shared_bytes[];
  Acc* p = reinterpret_cast<Acc*>(shared_bytes);
  Acc* ds = p + s.tq;
  const Acc scale = static_cast<Acc>(s.scale);
  for (std::int64_t r = blockIdx.x; r < s.n * s.tk; r += gridDim.x) {
    const std::int64_t slice = r / s.tk, j = r % s.tk;
    const std::int64_t first = s.causal ? (j - (s.tk - s.tq) > 0 ? j - (s.tk - s.tq) : 0) : 0;
    const T *kj = k + r * s.d, *vj = v + r * s.d, *qs = q + slice * s.tq * s.d, *dos = dout + slice * s.tq * s.d;
    for (std::int64_t i = first + threadIdx.x; i < s.tq; i += blockDim.x) {
      const std::int64_t row = slice * s.tq + i;
      p[i] = math::exp(scale * row_dot<Acc>(qs + i * s.d, kj, s.d) - lse[row]);
      ds[i] = scale * p[i] * (row_dot<Acc>(dos + i * s.d, vj, s.d) - delta[row]);
    }
    __syncthreads();
    for (std::int64_t c = threadIdx.x; c < s.d; c += blockDim.x) {
      Acc acc_v = Acc(0), acc_k = Acc(0);
      for (std::int64_t i = first; i < s.tq; ++i) {
        acc_v += p[i] * load<Acc>(dos, i * s.d + c);
        acc_k += ds[i] * load<Acc>(qs, i * s.d + c);
      }
      dv[r * s.d + c] = narrow<T>(acc_v);
      dk[r * s.d + c] = narrow<T>(acc_k);
    }
    __syncthreads();
  }
}
}  // namespace device

/// Shared memory of one block, checked against the default limit (a limit of this implementation).
/// Rounded up to 16 bytes: ptxas widens a lone scalar load of the last score into the
/// 16-byte load of its aligned chunk (sm_90 SASS of attention_kernel<double>: `LDS.128`
/// for p[36] of 37), which must stay inside the allocation (compute-sanitizer memcheck
/// flagged it on an H200 when the row had an odd number of f64 scores).
inline std::size_t attention_shared_bytes(std::int64_t values, std::size_t value_size, const char* kernel) {
  const std::size_t bytes = (static_cast<std::size_t>(values) * value_size + 15) / 16 * 16;
  constexpr std::size_t reductions = 1024;  // block_all_reduce's static arrays (two per kernel, 33 values each)
  ::trainmem::detail::check(bytes + reductions <= 48 * 1024, kernel, ": ", values,
                            " scores per row do not fit a block's 48 KiB of shared memory on the CUDA backend");
  return bytes;
}

template <class T, class Acc>
void attention(const KernelContext& ctx, const T* q, const T* k, const T* v, T* out, Acc* lse,
               const AttentionSizes& s) {
  if (s.n == 0 || s.tq == 0) return;
  const std::size_t shared = attention_shared_bytes(s.tk, sizeof(Acc), "attention");
  device::attention_kernel<T, Acc>
      <<<row_blocks(s.n * s.tq), row_block_threads(s.tk), shared, ctx.stream>>>(q, k, v, out, lse, s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_kernel");
}

template <class T, class Acc>
void attention_backward(const KernelContext& ctx, const T* q, const T* k, const T* v, const Acc* lse, const T* dout,
                        T* dq, T* dk, T* dv, Acc* delta, const AttentionSizes& s) {
  if (s.n == 0 || s.tq == 0 || s.tk == 0) return;
  const std::size_t rows_shared = attention_shared_bytes(2 * s.tk, sizeof(Acc), "attention_backward");
  device::attention_rows_backward_kernel<T, Acc>
      <<<row_blocks(s.n * s.tq), row_block_threads(s.tk), rows_shared, ctx.stream>>>(q, k, v, lse, dout, dq, delta, s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_rows_backward_kernel");
  const std::size_t keys_shared = attention_shared_bytes(2 * s.tq, sizeof(Acc), "attention_backward");
  device::attention_keys_backward_kernel<T, Acc>
      <<<row_blocks(s.n * s.tk), row_block_threads(s.tq), keys_shared, ctx.stream>>>(q, k, v, lse, dout, delta, dk, dv,
                                                                                     s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_keys_backward_kernel");
}

}  // namespace trainmem::cuda::kernels

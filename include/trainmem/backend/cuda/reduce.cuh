// trainmem/backend/cuda/reduce.cuh — every reduction the CUDA kernels use, in the accumulator type.
//
// Within a block: block_all_reduce combines one value per thread in a fixed warp-shuffle
// order and hands the result to every thread; the row kernels (softmax, layer norm,
// cross-entropy) give each row one block and reduce with it. Over a whole tensor: no
// atomics; the first kernel writes one partial sum per block (per column chunk for
// column sums), the second adds the partials in a fixed order and hands the total to a
// `finish` functor that stores it (narrowing, scaling, or adding to an accumulator).
// The grid depends only on the problem size and the device, so the same inputs give
// the same bits on every run. The summand is a functor `value(i)` or `value(r, c)`, so
// a reduction of a product (x², dy·x̂) reads its inputs once and stores no intermediate.
#pragma once

#include <algorithm>
#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/math.hpp"

namespace trainmem::cuda::kernels {

namespace device {
// --- within one block --------------------------------------------------------------------
struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
/// max as std::max computes it ((a < b) ? b : a), so NaN handling matches the CPU loops.
struct MaxOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return (a < b) ? b : a;
  }
};

template <class T, class Combine>
__device__ __forceinline__ T warp_all_reduce(T value, Combine combine) {
  for (int offset = 16; offset > 0; offset >>= 1) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

/// Combines one value per thread over the block (blockDim.x a multiple of 32) and returns
/// the result to every thread. The order of combination is fixed, so sums are reproducible.
template <class T, class Combine>
__device__ T block_all_reduce(T value, Combine combine, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const int warps = static_cast<int>(blockDim.x + 31) >> 5;
  value = warp_all_reduce(value, combine);
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    T combined = lane < warps ? partial[lane] : identity;
    combined = warp_all_reduce(combined, combine);
    if (lane == 0) result = combined;
  }
  __syncthreads();
  const T out = result;
  __syncthreads();  // the next call reuses partial and result
  return out;
}

/// A row's maximum and sum of exp(x - max), reduced over the block (every thread gets
/// both): the stable base of softmax and log-sum-exp.
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
}  // namespace device

// --- sum of all elements ----------------------------------------------------------------
namespace device {
template <class Acc, class ValueAt>
__global__ void reduce_all_partials_kernel(ValueAt value, std::int64_t n, Acc* partial) {
  Acc acc = Acc(0);
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) acc += value(i);
  acc = block_all_reduce(acc, SumOp{}, Acc(0));
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

template <class Acc, class Finish>
__global__ void reduce_all_finish_kernel(const Acc* partial, int count, Finish finish) {
  Acc acc = Acc(0);
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) acc += partial[i];
  acc = block_all_reduce(acc, SumOp{}, Acc(0));
  if (threadIdx.x == 0) finish(acc);
}
}  // namespace device

/// finish(sum over i < n of value(i)), summed in Acc.
template <class Acc, class ValueAt, class Finish>
void reduce_all(const KernelContext& ctx, std::int64_t n, ValueAt value, Finish finish) {
  const unsigned blocks = std::min(blocks_for(ctx, n, 8), 1024u);
  ScratchBuffer partial(ctx, blocks * sizeof(Acc));
  device::reduce_all_partials_kernel<Acc><<<blocks, kThreads, 0, ctx.stream>>>(value, n, partial.as<Acc>());
  TRAINMEM_CUDA_CHECK_LAUNCH("reduce_all_partials_kernel");
  device::reduce_all_finish_kernel<Acc>
      <<<1, kThreads, 0, ctx.stream>>>(partial.as<const Acc>(), static_cast<int>(blocks), finish);
  TRAINMEM_CUDA_CHECK_LAUNCH("reduce_all_finish_kernel");
}

// --- sums over rows, one per column -------------------------------------------------------
inline constexpr int kColumnTile = 32;  // columns per block: one per lane, coalesced
inline constexpr int kColumnRows = 8;   // rows a block walks in parallel

namespace device {
template <class Acc, class ValueAt>
__global__ void reduce_columns_partials_kernel(ValueAt value, std::int64_t rows, std::int64_t cols,
                                               std::int64_t rows_per_chunk, Acc* partial) {
  __shared__ Acc tile[kColumnRows][kColumnTile + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColumnTile + threadIdx.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  Acc acc = Acc(0);
  if (c < cols)
    for (std::int64_t r = first + threadIdx.y; r < last; r += kColumnRows) acc += value(r, c);
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    Acc sum = Acc(0);
    for (int y = 0; y < kColumnRows; ++y) sum += tile[y][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * cols + c] = sum;
  }
}

template <class Acc, class Finish>
__global__ void reduce_columns_finish_kernel(const Acc* partial, std::int64_t chunks, std::int64_t cols,
                                             Finish finish) {
  for (std::int64_t c = global_thread(); c < cols; c += grid_stride()) {
    Acc sum = Acc(0);
    for (std::int64_t k = 0; k < chunks; ++k) sum += partial[k * cols + c];
    finish(c, sum);
  }
}
}  // namespace device

/// finish(c, sum over r < rows of value(r, c)) for every c < cols, summed in Acc.
template <class Acc, class ValueAt, class Finish>
void reduce_columns(const KernelContext& ctx, std::int64_t rows, std::int64_t cols, ValueAt value, Finish finish) {
  if (cols == 0) return;
  const std::int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
  // Enough row chunks for about four blocks per SM, each chunk at least kColumnRows rows.
  const std::int64_t max_chunks = std::max<std::int64_t>(1, (rows + kColumnRows - 1) / kColumnRows);
  std::int64_t chunks = std::clamp<std::int64_t>((4 * ctx.sm_count + tiles - 1) / tiles, 1, max_chunks);
  chunks = std::min<std::int64_t>(chunks, 65535);
  const std::int64_t rows_per_chunk = std::max<std::int64_t>(1, (rows + chunks - 1) / chunks);
  chunks = std::max<std::int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk);
  ScratchBuffer partial(ctx, static_cast<std::size_t>(chunks * cols) * sizeof(Acc));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  const dim3 block(kColumnTile, kColumnRows);
  device::reduce_columns_partials_kernel<Acc>
      <<<grid, block, 0, ctx.stream>>>(value, rows, cols, rows_per_chunk, partial.as<Acc>());
  TRAINMEM_CUDA_CHECK_LAUNCH("reduce_columns_partials_kernel");
  device::reduce_columns_finish_kernel<Acc>
      <<<blocks_for(ctx, cols), kThreads, 0, ctx.stream>>>(partial.as<const Acc>(), chunks, cols, finish);
  TRAINMEM_CUDA_CHECK_LAUNCH("reduce_columns_finish_kernel");
}

// --- sums along rows, one per row ---------------------------------------------------------
namespace device {
template <class Acc, class ValueAt, class Finish>
__global__ void reduce_rows_kernel(ValueAt value, std::int64_t rows, std::int64_t cols, Finish finish) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // the same trip count for every thread of a block
    Acc acc = Acc(0);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += value(r, c);
    acc = block_all_reduce(acc, SumOp{}, Acc(0));
    if (threadIdx.x == 0) finish(r, acc);
  }
}
}  // namespace device

/// finish(r, sum over c < cols of value(r, c)) for every r < rows, summed in Acc: one block per row.
template <class Acc, class ValueAt, class Finish>
void reduce_rows(const KernelContext& ctx, std::int64_t rows, std::int64_t cols, ValueAt value, Finish finish) {
  if (rows == 0) return;
  device::reduce_rows_kernel<Acc>
      <<<row_blocks(rows), row_block_threads(cols), 0, ctx.stream>>>(value, rows, cols, finish);
  TRAINMEM_CUDA_CHECK_LAUNCH("reduce_rows_kernel");
}

namespace device {
// --- common summands and finishes ---------------------------------------------------------
/// in[i] widened (a flat sum) or in[r * cols + c] widened (a column sum).
template <class Acc, class T>
struct WidenedElement {
  const T* in;
  std::int64_t cols;
  __device__ Acc operator()(std::int64_t i) const { return load<Acc>(in, i); }
  __device__ Acc operator()(std::int64_t r, std::int64_t c) const { return load<Acc>(in, r * cols + c); }
};
}  // namespace device

}  // namespace trainmem::cuda::kernels

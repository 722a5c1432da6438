// trainmem/backend/cuda/kernels/attention.cuh — fused scaled-dot-product attention in tiles.
//
// The CPU's algorithm (backend/cpu/kernels/attention.hpp) cut into square tiles of query
// rows and keys that live in shared memory, so each value read from global memory feeds
// a whole tile's products. Forward: one block per tile of query rows walks the key tiles
// with an online softmax (running max and sum per row, the output rescaled as the max
// grows) and writes the output and each row's log-sum-exp. Backward, without atomics
// (so the bits are the same on every run): one block per query tile computes delta =
// <P, dP> per row in a first walk over the keys and dq in a second; one block per key
// tile walks the query rows that see it for dk and dv. Every product inside a tile is
// block_product below: each thread a 4 x 4 patch in registers. CUDA cores only, f32 math
// (f64 for f64); the tiles (64, or 32 in f64) and the head dimension set the shared
// memory a block needs, checked against what the device allows.
//
// Measured on an H200 before tiling (one block per row, scores in shared memory, every
// product a loop over global memory): causal attention over [96, 1024, 64] took 73 ms
// forward and backward, 89% of a 6-block training step (results/gpu_check_h200_*_run6).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/error.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/backend/cuda/reduce.cuh"
#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cuda::kernels {

/// Query rows and keys per tile: 64, or 32 when the accumulator is f64 (twice the bytes).
template <class Acc>
inline constexpr int kAttentionTile = sizeof(Acc) == 8 ? 32 : 64;
inline constexpr int kAttentionThreads = 256;

namespace device {
inline constexpr int kPatch = 4;  // each thread's patch of a tile product: kPatch x kPatch

/// store(m, n, sum over k < K of a(m, k) b(k, n)) for every m < M, n < N: the block's
/// threads take kPatch x kPatch patches of the result in turn, each summed in registers.
template <class Acc, class A, class B, class Store>
__device__ __forceinline__ void block_product(int M, int N, int K, A a, B b, Store store) {
  const int column_patches = (N + kPatch - 1) / kPatch;
  const int patches = (M + kPatch - 1) / kPatch * column_patches;
  for (int patch = static_cast<int>(threadIdx.x); patch < patches; patch += static_cast<int>(blockDim.x)) {
    const int m0 = patch / column_patches * kPatch, n0 = patch % column_patches * kPatch;
    Acc sum[kPatch][kPatch] = {};
    for (int k = 0; k < K; ++k) {
      Acc av[kPatch], bv[kPatch];
#pragma unroll
      for (int i = 0; i < kPatch; ++i) av[i] = m0 + i < M ? a(m0 + i, k) : Acc(0);
#pragma unroll
      for (int j = 0; j < kPatch; ++j) bv[j] = n0 + j < N ? b(k, n0 + j) : Acc(0);
#pragma unroll
      for (int i = 0; i < kPatch; ++i)
#pragma unroll
        for (int j = 0; j < kPatch; ++j) sum[i][j] += av[i] * bv[j];
    }
#pragma unroll
    for (int i = 0; i < kPatch; ++i)
#pragma unroll
      for (int j = 0; j < kPatch; ++j)
        if (m0 + i < M && n0 + j < N) store(m0 + i, n0 + j, sum[i][j]);
  }
}

/// rows x d values at src (rows contiguous) into a tile of `tile_rows` rows with stride
/// `ld`; rows beyond `rows` are zero.
template <class Acc, class T>
__device__ __forceinline__ void load_tile(Acc* tile, const T* src, int rows, int tile_rows, int d, int ld) {
  for (int e = static_cast<int>(threadIdx.x); e < tile_rows * d; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e % d;
    tile[r * ld + c] = r < rows ? load<Acc>(src, static_cast<std::int64_t>(r) * d + c) : Acc(0);
  }
}
template <class Acc>
__device__ __forceinline__ void zero(Acc* values, int count) {
  for (int e = static_cast<int>(threadIdx.x); e < count; e += static_cast<int>(blockDim.x)) values[e] = Acc(0);
}

/// Backward's scores of one query tile (rows from i0, q and dO in qs and dos, their
/// log-sum-exp in row_lse) against one key tile (keys from j0, in ks and vs): P =
/// exp(scale q k^T - lse), 0 where the mask hides the key, into ps, and dP = dO v^T into dps.
template <class Acc>
__device__ __forceinline__ void probabilities_and_gradient(const AttentionSizes& s, const Acc* qs, const Acc* dos,
                                                           const Acc* ks, const Acc* vs, const Acc* row_lse,
                                                           std::int64_t i0, int rows, std::int64_t j0, int keys,
                                                           Acc* ps, Acc* dps) {
  constexpr int B = kAttentionTile<Acc>;
  const int d = static_cast<int>(s.d), ld = d + 1, lds = B + 1;
  const Acc scale = static_cast<Acc>(s.scale);
  block_product<Acc>(
      B, B, d, [&](int m, int c) { return qs[m * ld + c]; }, [&](int c, int n) { return ks[n * ld + c]; },
      [&](int m, int n, Acc x) {
        const bool seen = m < rows && n < keys && j0 + n < s.visible(i0 + m);
        ps[m * lds + n] = seen ? math::exp(scale * x - row_lse[m]) : Acc(0);
      });
  block_product<Acc>(
      B, B, d, [&](int m, int c) { return dos[m * ld + c]; }, [&](int c, int n) { return vs[n * ld + c]; },
      [&](int m, int n, Acc x) { dps[m * lds + n] = x; });
}
/// dS = scale P (dP - delta) of a tile, in place of dP.
template <class Acc>
__device__ __forceinline__ void score_gradient(const AttentionSizes& s, const Acc* ps, Acc* dps, const Acc* row_delta) {
  constexpr int B = kAttentionTile<Acc>, lds = B + 1;
  const Acc scale = static_cast<Acc>(s.scale);
  for (int e = static_cast<int>(threadIdx.x); e < B * B; e += static_cast<int>(blockDim.x)) {
    const int m = e / B, n = e % B;
    dps[m * lds + n] = scale * ps[m * lds + n] * (dps[m * lds + n] - row_delta[m]);
  }
}

/// Keys the last of `rows` query rows from `first` sees: the end of a query tile's key walk.
__device__ __forceinline__ std::int64_t keys_seen(const AttentionSizes& s, std::int64_t first, int rows) {
  const std::int64_t last = s.visible(first + rows - 1);
  return last < s.tk ? last : s.tk;
}

template <class T, class Acc>
__global__ void attention_kernel(const T* q, const T* k, const T* v, T* out, Acc* lse, AttentionSizes s) {
  constexpr int B = kAttentionTile<Acc>;
  const int d = static_cast<int>(s.d), ld = d + 1, lds = B + 1;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Acc* qs = reinterpret_cast<Acc*>(shared_bytes);
  Acc *ks = qs + B * ld, *vs = ks + B * ld, *os = vs + B * ld, *ps = os + B * ld;
  Acc *row_max = ps + B * lds, *row_sum = row_max + B, *row_rescale = row_sum + B;
  const std::int64_t tiles = (s.tq + B - 1) / B, slice = blockIdx.x / tiles, i0 = blockIdx.x % tiles * B;
  const int rows = static_cast<int>(s.tq - i0 < B ? s.tq - i0 : B);
  const Acc scale = static_cast<Acc>(s.scale);
  load_tile(qs, q + (slice * s.tq + i0) * s.d, rows, B, d, ld);
  zero(os, B * ld);
  for (int r = static_cast<int>(threadIdx.x); r < B; r += static_cast<int>(blockDim.x)) {
    row_max[r] = negative_infinity<Acc>();
    row_sum[r] = Acc(0);
  }
  const std::int64_t key_end = keys_seen(s, i0, rows);
  for (std::int64_t j0 = 0; j0 < key_end; j0 += B) {
    const int keys = static_cast<int>(s.tk - j0 < B ? s.tk - j0 : B);
    __syncthreads();  // the last tile's products are done with ks, vs and ps
    load_tile(ks, k + (slice * s.tk + j0) * s.d, keys, B, d, ld);
    load_tile(vs, v + (slice * s.tk + j0) * s.d, keys, B, d, ld);
    __syncthreads();
    block_product<Acc>(
        B, B, d, [&](int m, int c) { return qs[m * ld + c]; }, [&](int c, int n) { return ks[n * ld + c]; },
        [&](int m, int n, Acc x) {
          const bool seen = m < rows && n < keys && j0 + n < s.visible(i0 + m);
          ps[m * lds + n] = seen ? scale * x : negative_infinity<Acc>();
        });
    __syncthreads();
    // Online softmax: the row's new max, the tile's exp(score - max) in place, and the
    // factor that rescales what the row summed so far.
    for (int r = static_cast<int>(threadIdx.x); r < B; r += static_cast<int>(blockDim.x)) {
      Acc tile_max = negative_infinity<Acc>();
      for (int n = 0; n < B; ++n) tile_max = MaxOp{}(tile_max, ps[r * lds + n]);
      const Acc new_max = MaxOp{}(row_max[r], tile_max);
      Acc sum = Acc(0);
      if (new_max == negative_infinity<Acc>()) {  // nothing seen yet: every p is 0
        for (int n = 0; n < B; ++n) ps[r * lds + n] = Acc(0);
        row_rescale[r] = Acc(1);
      } else {
        for (int n = 0; n < B; ++n) sum += ps[r * lds + n] = math::exp(ps[r * lds + n] - new_max);
        row_rescale[r] = math::exp(row_max[r] - new_max);
      }
      row_sum[r] = row_sum[r] * row_rescale[r] + sum;
      row_max[r] = new_max;
    }
    __syncthreads();
    block_product<Acc>(
        B, d, B, [&](int m, int n) { return ps[m * lds + n]; }, [&](int n, int c) { return vs[n * ld + c]; },
        [&](int m, int c, Acc x) { os[m * ld + c] = row_rescale[m] * os[m * ld + c] + x; });
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < rows * d; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e % d;
    out[(slice * s.tq + i0 + r) * s.d + c] = narrow<T>(os[r * ld + c] / row_sum[r]);
  }
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += static_cast<int>(blockDim.x))
    lse[slice * s.tq + i0 + r] = row_max[r] + acc_log(row_sum[r]);
}

/// One query tile: P from lse, dP = dO V^T; first delta = <P, dP> per row over every key
/// tile, then dS = scale P (dP - delta) and dq = dS K.
template <class T, class Acc>
__global__ void attention_rows_backward_kernel(const T* q, const T* k, const T* v, const Acc* lse, const T* dout, T* dq,
                                               Acc* delta, AttentionSizes s) {
  constexpr int B = kAttentionTile<Acc>;
  const int d = static_cast<int>(s.d), ld = d + 1, lds = B + 1;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Acc* qs = reinterpret_cast<Acc*>(shared_bytes);
  Acc *dos = qs + B * ld, *ks = dos + B * ld, *vs = ks + B * ld, *dqs = vs + B * ld, *ps = dqs + B * ld;
  Acc *dps = ps + B * lds, *row_lse = dps + B * lds, *row_delta = row_lse + B;
  const std::int64_t tiles = (s.tq + B - 1) / B, slice = blockIdx.x / tiles, i0 = blockIdx.x % tiles * B;
  const int rows = static_cast<int>(s.tq - i0 < B ? s.tq - i0 : B);
  load_tile(qs, q + (slice * s.tq + i0) * s.d, rows, B, d, ld);
  load_tile(dos, dout + (slice * s.tq + i0) * s.d, rows, B, d, ld);
  zero(dqs, B * ld);
  for (int r = static_cast<int>(threadIdx.x); r < B; r += static_cast<int>(blockDim.x)) {
    row_lse[r] = r < rows ? lse[slice * s.tq + i0 + r] : Acc(0);
    row_delta[r] = Acc(0);
  }
  const std::int64_t key_end = keys_seen(s, i0, rows);
  // P and dP of one key tile into ps and dps.
  const auto probabilities_and_their_gradient = [&](std::int64_t j0, int keys) {
    __syncthreads();
    load_tile(ks, k + (slice * s.tk + j0) * s.d, keys, B, d, ld);
    load_tile(vs, v + (slice * s.tk + j0) * s.d, keys, B, d, ld);
    __syncthreads();
    probabilities_and_gradient(s, qs, dos, ks, vs, row_lse, i0, rows, j0, keys, ps, dps);
    __syncthreads();
  };
  for (std::int64_t j0 = 0; j0 < key_end; j0 += B) {
    probabilities_and_their_gradient(j0, static_cast<int>(s.tk - j0 < B ? s.tk - j0 : B));
    for (int r = static_cast<int>(threadIdx.x); r < B; r += static_cast<int>(blockDim.x)) {
      Acc dot = Acc(0);
      for (int n = 0; n < B; ++n) dot += ps[r * lds + n] * dps[r * lds + n];
      row_delta[r] += dot;
    }
  }
  for (std::int64_t j0 = 0; j0 < key_end; j0 += B) {
    probabilities_and_their_gradient(j0, static_cast<int>(s.tk - j0 < B ? s.tk - j0 : B));
    score_gradient(s, ps, dps, row_delta);
    __syncthreads();
    block_product<Acc>(
        B, d, B, [&](int m, int n) { return dps[m * lds + n]; }, [&](int n, int c) { return ks[n * ld + c]; },
        [&](int m, int c, Acc x) { dqs[m * ld + c] += x; });
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < rows * d; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e % d;
    dq[(slice * s.tq + i0 + r) * s.d + c] = narrow<T>(dqs[r * ld + c]);
  }
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += static_cast<int>(blockDim.x))
    delta[slice * s.tq + i0 + r] = row_delta[r];
}

/// One key tile: over the query tiles that see it, dv += P^T dO and dk += dS^T q.
template <class T, class Acc>
__global__ void attention_keys_backward_kernel(const T* q, const T* k, const T* v, const Acc* lse, const T* dout,
                                               const Acc* delta, T* dk, T* dv, AttentionSizes s) {
  constexpr int B = kAttentionTile<Acc>;
  const int d = static_cast<int>(s.d), ld = d + 1, lds = B + 1;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Acc* ks = reinterpret_cast<Acc*>(shared_bytes);
  Acc *vs = ks + B * ld, *dks = vs + B * ld, *dvs = dks + B * ld, *qs = dvs + B * ld, *dos = qs + B * ld;
  Acc *ps = dos + B * ld, *dps = ps + B * lds, *row_lse = dps + B * lds, *row_delta = row_lse + B;
  const std::int64_t tiles = (s.tk + B - 1) / B, slice = blockIdx.x / tiles, j0 = blockIdx.x % tiles * B;
  const int keys = static_cast<int>(s.tk - j0 < B ? s.tk - j0 : B);
  load_tile(ks, k + (slice * s.tk + j0) * s.d, keys, B, d, ld);
  load_tile(vs, v + (slice * s.tk + j0) * s.d, keys, B, d, ld);
  zero(dks, B * ld);
  zero(dvs, B * ld);
  // Under the causal mask query i sees key j when j < tk - tq + i + 1: the first query
  // row that sees this tile's first key, rounded down to its tile.
  const std::int64_t first = s.causal && j0 - (s.tk - s.tq) > 0 ? j0 - (s.tk - s.tq) : 0;
  for (std::int64_t i0 = first / B * B; i0 < s.tq; i0 += B) {
    const int rows = static_cast<int>(s.tq - i0 < B ? s.tq - i0 : B);
    __syncthreads();
    load_tile(qs, q + (slice * s.tq + i0) * s.d, rows, B, d, ld);
    load_tile(dos, dout + (slice * s.tq + i0) * s.d, rows, B, d, ld);
    for (int r = static_cast<int>(threadIdx.x); r < B; r += static_cast<int>(blockDim.x)) {
      row_lse[r] = r < rows ? lse[slice * s.tq + i0 + r] : Acc(0);
      row_delta[r] = r < rows ? delta[slice * s.tq + i0 + r] : Acc(0);
    }
    __syncthreads();
    probabilities_and_gradient(s, qs, dos, ks, vs, row_lse, i0, rows, j0, keys, ps, dps);
    __syncthreads();
    score_gradient(s, ps, dps, row_delta);
    __syncthreads();
    block_product<Acc>(
        B, d, B, [&](int n, int m) { return ps[m * lds + n]; }, [&](int m, int c) { return dos[m * ld + c]; },
        [&](int n, int c, Acc x) { dvs[n * ld + c] += x; });
    block_product<Acc>(
        B, d, B, [&](int n, int m) { return dps[m * lds + n]; }, [&](int m, int c) { return qs[m * ld + c]; },
        [&](int n, int c, Acc x) { dks[n * ld + c] += x; });
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < keys * d; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e % d;
    dk[(slice * s.tk + j0 + r) * s.d + c] = narrow<T>(dks[r * ld + c]);
    dv[(slice * s.tk + j0 + r) * s.d + c] = narrow<T>(dvs[r * ld + c]);
  }
}
}  // namespace device

/// Shared memory of one block holding `row_tiles` tiles of d values per row and
/// `square_tiles` tiles of scores (plus per-row values), checked against the device's
/// limit; the kernel is allowed that much (above the default 48 KiB, an opt-in).
template <class Acc, class Kernel>
std::size_t attention_shared_bytes(Kernel kernel, std::int64_t d, int row_tiles, int square_tiles, const char* what) {
  constexpr std::size_t B = kAttentionTile<Acc>;
  const std::size_t values = row_tiles * B * static_cast<std::size_t>(d + 1) + square_tiles * B * (B + 1) + 3 * B;
  const std::size_t bytes = (values * sizeof(Acc) + 15) / 16 * 16;
  int device = 0, limit = 0;
  TRAINMEM_CUDA_CHECK(cudaGetDevice(&device));
  TRAINMEM_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ::trainmem::detail::check(bytes <= static_cast<std::size_t>(limit), what, ": head dimension ", d, " needs ", bytes,
                            " bytes of shared memory per block on the CUDA backend; this device allows ", limit);
  TRAINMEM_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  return bytes;
}

/// Blocks for one per tile of `length` rows in each of n slices.
template <class Acc>
unsigned attention_blocks(std::int64_t n, std::int64_t length) {
  const std::int64_t blocks = n * ((length + kAttentionTile<Acc> - 1) / kAttentionTile<Acc>);
  ::trainmem::detail::check(blocks < (std::int64_t{1} << 31), "attention: ", blocks,
                            " tiles exceed one CUDA grid on the CUDA backend");
  return static_cast<unsigned>(blocks);
}

template <class T, class Acc>
void attention(const KernelContext& ctx, const T* q, const T* k, const T* v, T* out, Acc* lse,
               const AttentionSizes& s) {
  if (s.n == 0 || s.tq == 0) return;
  const auto kernel = device::attention_kernel<T, Acc>;
  const std::size_t shared = attention_shared_bytes<Acc>(kernel, s.d, 4, 1, "attention");
  kernel<<<attention_blocks<Acc>(s.n, s.tq), kAttentionThreads, shared, ctx.stream>>>(q, k, v, out, lse, s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_kernel");
}

template <class T, class Acc>
void attention_backward(const KernelContext& ctx, const T* q, const T* k, const T* v, const Acc* lse, const T* dout,
                        T* dq, T* dk, T* dv, Acc* delta, const AttentionSizes& s) {
  if (s.n == 0 || s.tq == 0 || s.tk == 0) return;
  const auto rows_kernel = device::attention_rows_backward_kernel<T, Acc>;
  const std::size_t rows_shared = attention_shared_bytes<Acc>(rows_kernel, s.d, 5, 2, "attention_backward");
  rows_kernel<<<attention_blocks<Acc>(s.n, s.tq), kAttentionThreads, rows_shared, ctx.stream>>>(q, k, v, lse, dout, dq,
                                                                                                delta, s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_rows_backward_kernel");
  const auto keys_kernel = device::attention_keys_backward_kernel<T, Acc>;
  const std::size_t keys_shared = attention_shared_bytes<Acc>(keys_kernel, s.d, 6, 2, "attention_backward");
  keys_kernel<<<attention_blocks<Acc>(s.n, s.tk), kAttentionThreads, keys_shared, ctx.stream>>>(q, k, v, lse, dout,
                                                                                                delta, dk, dv, s);
  TRAINMEM_CUDA_CHECK_LAUNCH("attention_keys_backward_kernel");
}

}  // namespace trainmem::cuda::kernels

// trainmem/backend/cpu/kernels/attention.hpp — fused scaled-dot-product attention, one
// (batch * head) slice at a time, so the [T, T] scores live in a thread's scratch and
// never in a tensor.
//
// Forward per slice: S = scale Q K^T, the causal mask, a max-subtracted row softmax P,
// O = P V, and each row's log-sum-exp (all that backward needs besides Q, K, V).
// Backward recomputes P = exp(scale Q K^T - lse), then dV = P^T dO, dP = dO V^T,
// delta_i = sum_j P_ij dP_ij, dS = P (dP - delta), dQ = scale dS K, dK = scale dS^T Q.
// Both run in blocks of query rows against only the keys a block sees (causal: half the
// product), with row sums in SIMD lanes (lane_sum.hpp); dK and dV add the blocks in order.
// Math in the accumulator type (f32, or f64 for f64) straight on the tensors' data when
// they are in it; 16-bit slices are widened into, and results narrowed from, scratch.
// Slices split over threads, each with its own scratch from the tracked allocator (shown
// as workspace while it runs).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/convert.hpp"
#include "trainmem/backend/cpu/kernels/lane_sum.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/backend/cpu/threads.hpp"
#include "trainmem/backend/cpu/workspace.hpp"
#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"

namespace trainmem::cpu::kernels {

namespace attention_impl {

template <class Acc>
using RowMatrix = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Acc>
using MatrixMap = Eigen::Map<RowMatrix<Acc>>;
template <class Acc>
using ConstMatrixMap = Eigen::Map<const RowMatrix<Acc>>;

/// A [rows, cols] block of T as an Acc matrix: the data itself when T is Acc, otherwise
/// widened into `scratch` (which then advances past it).
template <class Acc, class T>
ConstMatrixMap<Acc> widened(const T* src, std::int64_t rows, std::int64_t cols, Acc*& scratch) {
  if constexpr (std::is_same_v<T, Acc>) {
    return ConstMatrixMap<Acc>(src, rows, cols);
  } else {
    Acc* dst = scratch;
    scratch += rows * cols;
    widen_to_float(src, dst, static_cast<std::size_t>(rows * cols));
    return ConstMatrixMap<Acc>(dst, rows, cols);
  }
}

/// Where an Acc result for the [rows, cols] block at `dst` is computed: `dst` itself when
/// T is Acc, otherwise `scratch` (which advances), narrowed by store() afterwards.
template <class Acc, class T>
struct Result {
  T* dst;
  MatrixMap<Acc> matrix;
  Result(T* out, std::int64_t rows, std::int64_t cols, Acc*& scratch)
      : dst(out), matrix(place(out, rows * cols, scratch), rows, cols) {}
  void store() const {
    if constexpr (!std::is_same_v<T, Acc>)
      narrow_from_float(matrix.data(), dst, static_cast<std::size_t>(matrix.size()));
  }

 private:
  static Acc* place(T* out, std::int64_t n, Acc*& scratch) {
    if constexpr (std::is_same_v<T, Acc>) {
      return out;
    } else {
      Acc* at = scratch;
      scratch += n;
      return at;
    }
  }
};

/// Query rows per block: a block's scores run only against the keys its last row sees,
/// so under the causal mask a slice does about half the work of the whole [tq, tk]
/// product, and its scores take [kQueryBlock, tk] of scratch instead of [tq, tk].
inline constexpr std::int64_t kQueryBlock = 64;

/// Scratch elements of one block's scores (a slice shorter than a block takes its own rows).
inline std::int64_t block_scores(const AttentionSizes& s) { return std::min(kQueryBlock, s.tq) * s.tk; }

/// Runs body(first row, rows, keys the block's last row sees) over a slice's query blocks.
template <class Body>
void for_each_query_block(const AttentionSizes& s, Body&& body) {
  for (std::int64_t i0 = 0; i0 < s.tq; i0 += kQueryBlock) {
    const std::int64_t rows = std::min(kQueryBlock, s.tq - i0);
    body(i0, rows, s.visible(i0 + rows - 1));
  }
}

/// Runs body(slice, scratch) over the slices, `per_slice` accumulator elements of scratch per thread.
template <class Acc, class Body>
void for_each_slice(const AttentionSizes& s, std::int64_t per_slice, Allocator& allocator, Body&& body) {
  const bool split = s.n > 1 && s.n * s.tq * s.tk * s.d > kParallelGrain;
  const Workspace<Acc> scratch(allocator, static_cast<std::size_t>(per_slice * (split ? num_threads() : 1)));
  parallel_for(s.n, split, [&](std::int64_t slice) { body(slice, scratch.get() + per_slice * current_thread()); });
}

}  // namespace attention_impl

/// out = softmax(scale q k^T [+ causal mask]) v per slice; lse [n, tq] the rows' log-sum-exp.
template <class T, class Acc = AccumulatorOf<T>>
void attention(const T* q, const T* k, const T* v, T* out, Acc* lse, const AttentionSizes& s, Allocator& allocator) {
  using namespace attention_impl;
  constexpr bool kWiden = !std::is_same_v<T, Acc>;
  const std::int64_t qd = s.tq * s.d, kd = s.tk * s.d;
  const std::int64_t per_slice = block_scores(s) + (kWiden ? 2 * qd + 2 * kd : 0);
  const auto scale = static_cast<Acc>(s.scale);
  for_each_slice<Acc>(s, per_slice, allocator, [&](std::int64_t slice, Acc* scratch) {
    Acc* scores = scratch;
    scratch += block_scores(s);
    const auto Q = widened(q + slice * qd, s.tq, s.d, scratch);
    const auto K = widened(k + slice * kd, s.tk, s.d, scratch);
    const auto V = widened(v + slice * kd, s.tk, s.d, scratch);
    Result<Acc, T> O(out + slice * qd, s.tq, s.d, scratch);
    Acc* row_lse = lse + slice * s.tq;
    for_each_query_block(s, [&](std::int64_t i0, std::int64_t rows, std::int64_t keys) {
      MatrixMap<Acc> S(scores, rows, keys);
      S.noalias() = Q.middleRows(i0, rows) * K.topRows(keys).transpose();
      for (std::int64_t r = 0; r < rows; ++r) {
        Acc* row = S.data() + r * keys;
        const std::int64_t visible = s.visible(i0 + r);
        Acc max = -std::numeric_limits<Acc>::infinity();
#pragma omp simd reduction(max : max)
        for (std::int64_t j = 0; j < visible; ++j) max = std::max(max, row[j] * scale);
        const Acc sum =
            lane_sum<Acc>(visible, [&](std::int64_t j) { return row[j] = math::exp(row[j] * scale - max); });
        const Acc inv = Acc(1) / sum;
#pragma omp simd
        for (std::int64_t j = 0; j < visible; ++j) row[j] *= inv;
        std::fill(row + visible, row + keys, Acc(0));
        row_lse[i0 + r] = max + std::log(sum);
      }
      O.matrix.middleRows(i0, rows).noalias() = S * V.topRows(keys);
    });
    O.store();
  });
}

/// dq, dk, dv of attention from dout, recomputing the probabilities from q, k and lse;
/// delta [n, tq] receives each row's sum_j P_ij dP_ij.
template <class T, class Acc = AccumulatorOf<T>>
void attention_backward(const T* q, const T* k, const T* v, const Acc* lse, const T* dout, T* dq, T* dk, T* dv,
                        Acc* delta, const AttentionSizes& s, Allocator& allocator) {
  using namespace attention_impl;
  constexpr bool kWiden = !std::is_same_v<T, Acc>;
  const std::int64_t qd = s.tq * s.d, kd = s.tk * s.d, block = block_scores(s);
  const std::int64_t per_slice = 2 * block + (kWiden ? 3 * qd + 5 * kd : 0);
  const auto scale = static_cast<Acc>(s.scale);
  for_each_slice<Acc>(s, per_slice, allocator, [&](std::int64_t slice, Acc* scratch) {
    Acc *probabilities = scratch, *score_grads = scratch + block;
    scratch += 2 * block;
    const auto Q = widened(q + slice * qd, s.tq, s.d, scratch);
    const auto dO = widened(dout + slice * qd, s.tq, s.d, scratch);
    const auto K = widened(k + slice * kd, s.tk, s.d, scratch);
    const auto V = widened(v + slice * kd, s.tk, s.d, scratch);
    Result<Acc, T> dQ(dq + slice * qd, s.tq, s.d, scratch), dK(dk + slice * kd, s.tk, s.d, scratch),
        dV(dv + slice * kd, s.tk, s.d, scratch);
    dK.matrix.setZero();  // query blocks add into them
    dV.matrix.setZero();
    const Acc* row_lse = lse + slice * s.tq;
    Acc* row_delta = delta + slice * s.tq;
    for_each_query_block(s, [&](std::int64_t i0, std::int64_t rows, std::int64_t keys) {
      MatrixMap<Acc> P(probabilities, rows, keys), dS(score_grads, rows, keys);
      const auto Qb = Q.middleRows(i0, rows);
      const auto dOb = dO.middleRows(i0, rows);
      P.noalias() = Qb * K.topRows(keys).transpose();
      for (std::int64_t r = 0; r < rows; ++r) {
        Acc* row = P.data() + r * keys;
        const std::int64_t visible = s.visible(i0 + r);
        const Acc log_sum = row_lse[i0 + r];  // P = exp(scale s - lse), already normalised
#pragma omp simd
        for (std::int64_t j = 0; j < visible; ++j) row[j] = math::exp(row[j] * scale - log_sum);
        std::fill(row + visible, row + keys, Acc(0));
      }
      dV.matrix.topRows(keys).noalias() += P.transpose() * dOb;
      dS.noalias() = dOb * V.topRows(keys).transpose();  // dP, turned into dS row by row
      for (std::int64_t r = 0; r < rows; ++r) {
        const Acc* p = P.data() + r * keys;
        Acc* ds = dS.data() + r * keys;
        const Acc dot = lane_sum<Acc>(keys, [&](std::int64_t j) { return p[j] * ds[j]; });
#pragma omp simd
        for (std::int64_t j = 0; j < keys; ++j) ds[j] = scale * p[j] * (ds[j] - dot);
        row_delta[i0 + r] = dot;
      }
      dQ.matrix.middleRows(i0, rows).noalias() = dS * K.topRows(keys);
      dK.matrix.topRows(keys).noalias() += dS.transpose() * Qb;
    });
    dQ.store();
    dK.store();
    dV.store();
  });
}

}  // namespace trainmem::cpu::kernels

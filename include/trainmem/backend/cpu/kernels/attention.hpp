// trainmem/backend/cpu/kernels/attention.hpp — fused scaled-dot-product attention, one
// (batch * head) slice at a time, so the [T, T] scores live in a thread's scratch and
// never in a tensor.
//
// Forward per slice: S = scale Q K^T, the causal mask, a max-subtracted row softmax P,
// O = P V, and each row's log-sum-exp (all that backward needs besides Q, K, V).
// Backward recomputes P = exp(scale Q K^T - lse), then dV = P^T dO, dP = dO V^T,
// delta_i = sum_j P_ij dP_ij, dS = P (dP - delta), dQ = scale dS K, dK = scale dS^T Q.
// Math in the accumulator type (f32, or f64 for f64); slices split over threads, each
// with its own scratch from the tracked allocator (shown as workspace while it runs).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "trainmem/backend/cpu/allocator.hpp"
#include "trainmem/backend/cpu/kernels/parallel.hpp"
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

template <class T, class Acc>
void widen_slice(const T* src, Acc* dst, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) dst[i] = trainmem::detail::widen(src[i]);
}
template <class T, class Acc>
void narrow_slice(const Acc* src, T* dst, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) dst[i] = trainmem::detail::narrow<T>(src[i]);
}

inline int thread_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}
inline int thread_count(bool split) {
#if defined(_OPENMP)
  return split ? omp_get_max_threads() : 1;
#else
  (void)split;
  return 1;
#endif
}

/// Runs body(slice, scratch) over the slices, `per_slice` accumulator elements of scratch per thread.
template <class Acc, class Body>
void for_each_slice(const AttentionSizes& s, std::int64_t per_slice, Allocator& allocator, Body&& body) {
  const bool split = s.n > 1 && s.n * s.tq * s.tk * s.d > kParallelGrain;
  const int threads = thread_count(split);
  const Workspace<Acc> scratch(allocator, static_cast<std::size_t>(per_slice * threads));
  parallel_for(s.n, split, [&](std::int64_t slice) { body(slice, scratch.get() + per_slice * thread_index()); });
}

}  // namespace attention_impl

/// out = softmax(scale q k^T [+ causal mask]) v per slice; lse [n, tq] the rows' log-sum-exp.
template <class T, class Acc = AccumulatorOf<T>>
void attention(const T* q, const T* k, const T* v, T* out, Acc* lse, const AttentionSizes& s, Allocator& allocator) {
  const std::int64_t qd = s.tq * s.d, kd = s.tk * s.d;
  attention_impl::for_each_slice<Acc>(
      s, s.tq * s.tk + 2 * qd + 2 * kd, allocator, [&](std::int64_t slice, Acc* scratch) {
        attention_impl::MatrixMap<Acc> S(scratch, s.tq, s.tk), Q(scratch + s.tq * s.tk, s.tq, s.d),
            K(Q.data() + qd, s.tk, s.d), V(K.data() + kd, s.tk, s.d), O(V.data() + kd, s.tq, s.d);
        attention_impl::widen_slice(q + slice * qd, Q.data(), qd);
        attention_impl::widen_slice(k + slice * kd, K.data(), kd);
        attention_impl::widen_slice(v + slice * kd, V.data(), kd);
        S.noalias() = Q * K.transpose();
        Acc* row_lse = lse + slice * s.tq;
        for (std::int64_t i = 0; i < s.tq; ++i) {
          Acc* row = S.data() + i * s.tk;
          const std::int64_t visible = s.visible(i);
          Acc max = -std::numeric_limits<Acc>::infinity();
          for (std::int64_t j = 0; j < visible; ++j) max = std::max(max, row[j] * static_cast<Acc>(s.scale));
          Acc sum = 0;
          for (std::int64_t j = 0; j < visible; ++j)
            sum += row[j] = math::exp(row[j] * static_cast<Acc>(s.scale) - max);
          const Acc inv = Acc(1) / sum;
          for (std::int64_t j = 0; j < visible; ++j) row[j] *= inv;
          std::fill(row + visible, row + s.tk, Acc(0));
          row_lse[i] = max + std::log(sum);
        }
        O.noalias() = S * V;
        attention_impl::narrow_slice(O.data(), out + slice * qd, qd);
      });
}

/// dq, dk, dv of attention from dout, recomputing the probabilities from q, k and lse;
/// delta [n, tq] receives each row's sum_j P_ij dP_ij.
template <class T, class Acc = AccumulatorOf<T>>
void attention_backward(const T* q, const T* k, const T* v, const Acc* lse, const T* dout, T* dq, T* dk, T* dv,
                        Acc* delta, const AttentionSizes& s, Allocator& allocator) {
  const std::int64_t qd = s.tq * s.d, kd = s.tk * s.d, tt = s.tq * s.tk;
  attention_impl::for_each_slice<Acc>(s, 2 * tt + 3 * qd + 5 * kd, allocator, [&](std::int64_t slice, Acc* scratch) {
    attention_impl::MatrixMap<Acc> P(scratch, s.tq, s.tk), dS(scratch + tt, s.tq, s.tk), Q(scratch + 2 * tt, s.tq, s.d),
        dO(Q.data() + qd, s.tq, s.d), dQ(dO.data() + qd, s.tq, s.d), K(dQ.data() + qd, s.tk, s.d),
        V(K.data() + kd, s.tk, s.d), dK(V.data() + kd, s.tk, s.d), dV(dK.data() + kd, s.tk, s.d);
    attention_impl::widen_slice(q + slice * qd, Q.data(), qd);
    attention_impl::widen_slice(dout + slice * qd, dO.data(), qd);
    attention_impl::widen_slice(k + slice * kd, K.data(), kd);
    attention_impl::widen_slice(v + slice * kd, V.data(), kd);
    P.noalias() = Q * K.transpose();
    const Acc* row_lse = lse + slice * s.tq;
    for (std::int64_t i = 0; i < s.tq; ++i) {
      Acc* row = P.data() + i * s.tk;
      const std::int64_t visible = s.visible(i);
      for (std::int64_t j = 0; j < visible; ++j) row[j] = math::exp(row[j] * static_cast<Acc>(s.scale) - row_lse[i]);
      std::fill(row + visible, row + s.tk, Acc(0));
    }
    dV.noalias() = P.transpose() * dO;
    dS.noalias() = dO * V.transpose();  // dP, turned into dS row by row
    Acc* row_delta = delta + slice * s.tq;
    for (std::int64_t i = 0; i < s.tq; ++i) {
      const Acc* p = P.data() + i * s.tk;
      Acc* ds = dS.data() + i * s.tk;
      Acc dot = 0;
      for (std::int64_t j = 0; j < s.tk; ++j) dot += p[j] * ds[j];
      for (std::int64_t j = 0; j < s.tk; ++j) ds[j] = static_cast<Acc>(s.scale) * p[j] * (ds[j] - dot);
      row_delta[i] = dot;
    }
    dQ.noalias() = dS * K;
    dK.noalias() = dS.transpose() * Q;
    attention_impl::narrow_slice(dQ.data(), dq + slice * qd, qd);
    attention_impl::narrow_slice(dK.data(), dk + slice * kd, kd);
    attention_impl::narrow_slice(dV.data(), dv + slice * kd, kd);
  });
}

}  // namespace trainmem::cpu::kernels

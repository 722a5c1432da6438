// trainmem/core/gemm_args.hpp — what every backend's GEMM takes.
//
// C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b] for b < batch, all row-major.
// op(A) is m x k: A is stored [m, k], or [k, m] when trans_a. A batch stride of 0
// reuses one matrix for every batch entry (a weight shared across the batch).
#pragma once

#include <cstdint>

namespace trainmem {

struct GemmArgs {
  std::int64_t batch = 1;
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  double alpha = 1.0, beta = 0.0;

  std::int64_t lda() const { return trans_a ? m : k; }
  std::int64_t ldb() const { return trans_b ? k : n; }
  std::int64_t ldc() const { return n; }
  double flops() const { return 2.0 * static_cast<double>(batch) * m * n * k; }
};

namespace detail {
/// The arguments of c = op(a) op(b) for [batch] stacks of contiguous matrices.
inline GemmArgs gemm_args(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n,
                          std::int64_t k) {
  GemmArgs args;
  args.batch = batch;
  args.m = m;
  args.n = n;
  args.k = k;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.stride_a = m * k;
  args.stride_b = k * n;
  args.stride_c = m * n;
  return args;
}
}  // namespace detail

}  // namespace trainmem

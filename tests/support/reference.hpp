// tests/support/reference.hpp — plain-loop F64 references that tests compare ops against.
//
// Deliberately naive (triple loops, no blocking, no library calls), so that a
// disagreement points at the library, not at a shared helper.
#pragma once

#include <cstdint>
#include <vector>

namespace trainmem::testing {

/// C[b] = op(A[b]) op(B[b]) for row-major stacks: A is [m, k] (or [k, m] when trans_a),
/// B is [k, n] (or [n, k] when trans_b); C is [batch, m, n].
inline std::vector<double> matmul_reference(const std::vector<double>& a, const std::vector<double>& b,
                                            std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                                            bool trans_a, bool trans_b) {
  std::vector<double> c(static_cast<std::size_t>(batch * m * n), 0.0);
  for (std::int64_t p = 0; p < batch; ++p)
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (std::int64_t l = 0; l < k; ++l) {
          const double av = trans_a ? a[p * m * k + l * m + i] : a[p * m * k + i * k + l];
          const double bv = trans_b ? b[p * k * n + j * k + l] : b[p * k * n + l * n + j];
          acc += av * bv;
        }
        c[p * m * n + i * n + j] = acc;
      }
  return c;
}

/// Same, accumulating |op(A)| |op(B)|: the scale a dot product's rounding error is measured against.
inline std::vector<double> abs_matmul_reference(const std::vector<double>& a, const std::vector<double>& b,
                                                std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                                                bool trans_a, bool trans_b) {
  std::vector<double> abs_a(a.size()), abs_b(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = a[i] < 0 ? -a[i] : a[i];
  for (std::size_t i = 0; i < b.size(); ++i) abs_b[i] = b[i] < 0 ? -b[i] : b[i];
  return matmul_reference(abs_a, abs_b, batch, m, n, k, trans_a, trans_b);
}

}  // namespace trainmem::testing

// trainmem/backend/cpu/gemm_epilogue.hpp — what a CPU GEMM does to its FP32 result before storing it.
//
// C = act(alpha op(A) op(B) + beta C + bias): the bias row and the activation are applied
// to the accumulator (FP32, or F64 for f64) and C is rounded to its storage dtype once,
// after them, as cuda::Backend::gemm_bias does in the cuBLASLt epilogue. The bias arrives
// already widened to the accumulator type (n values, one small copy per call), so one
// epilogue serves every bias dtype.
#pragma once

#include <cstdint>

#include "trainmem/core/math.hpp"

namespace trainmem::cpu::kernels {

/// \brief The bias row (null: none) and whether GELU (tanh form, math::GeluTanh) follows it.
template <class Acc>
struct Epilogue {
  const Acc* bias = nullptr;
  bool gelu = false;
  bool empty() const { return bias == nullptr && !gelu; }
};

/// Applies the epilogue to rows x n of a row-major accumulator block with leading dimension ld.
template <class Acc>
void apply_epilogue(const Epilogue<Acc>& e, Acc* block, std::int64_t ld, std::int64_t rows, std::int64_t n) {
  if (e.empty()) return;
  for (std::int64_t r = 0; r < rows; ++r) {
    Acc* row = block + r * ld;
    if (e.bias)
      for (std::int64_t j = 0; j < n; ++j) row[j] += e.bias[j];
    if (e.gelu)
      for (std::int64_t j = 0; j < n; ++j) row[j] = math::GeluTanh{}(row[j]);
  }
}

}  // namespace trainmem::cpu::kernels

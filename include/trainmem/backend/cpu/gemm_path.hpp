// trainmem/backend/cpu/gemm_path.hpp — which CPU GEMM path runs, as a program can report it.
//
// The CPU backend sends a GEMM to oneDNN or to Eigen by a rule of ISA and shape
// (NOTE [CPU GEMM path] in gemm.hpp). A benchmark or a log line says which path a
// product took and what this build and CPU offer; these read the rule, they do not
// change it (force_gemm_path() does).
#pragma once

#include "trainmem/backend/cpu/gemm.hpp"

namespace trainmem::cpu {

/// \brief What this build and this CPU offer the GEMM rule.
struct OneDnnSupport {
  bool built_in = false;           // trainmem was built with oneDNN
  const char* isa = "none";        // oneDNN's effective instruction set on this CPU
  bool amx = false;                // AMX tiles: BF16 and F16 operands go to oneDNN
  bool bf16 = false;               // BF16 operands go to oneDNN (AMX, or AVX512-BF16 on an AMD core)
  std::int64_t f32_min_dim = 512;  // F32 products with m, n and k at least this go to oneDNN
};

inline OneDnnSupport onednn_support() {
  return {kernels::kHaveOneDnn, kernels::onednn_isa_name(), kernels::onednn_has_amx(), kernels::onednn_bf16_wins(),
          kernels::onednn_f32_min_dim()};
}

/// The path a GEMM of `g`'s shape with operands TA and result TC takes now:
/// "onednn", "eigen" or "widen" (16-bit operands widened to f32 for Eigen).
template <class TA, class TC = TA>
const char* gemm_path_taken(const GemmArgs& g) {
  return kernels::gemm_path_name<TA, TC>(g);
}

/// oneDNN's name for the kernel a GEMM of `g`'s shape would run ("" where none).
template <class TA, class TC = TA>
std::string onednn_kernel_taken(const GemmArgs& g) {
  return kernels::onednn_kernel_name<TA, TC>(g);
}

}  // namespace trainmem::cpu

// trainmem/backend/cuda/kernels/update.cuh — the optimizer's one pass over a parameter.
//
// The mirror of backend/cpu/kernels/update.hpp with the same update functors: the master
// and its moments change in place and the 16-bit model copy is written in the same
// pass. The loss scaler's found-inf flag is read on the device, so a skipped step
// needs no host wait.
#pragma once

#include <cstdint>

#include "trainmem/backend/cuda/element_io.cuh"
#include "trainmem/backend/cuda/launch.cuh"
#include "trainmem/core/rng.hpp"
#include "trainmem/core/stochastic_rounding.hpp"

namespace trainmem::cuda::kernels {

/// One optimizer pass over param (TP, the f32/f64 master): the gradient and the optional
/// 16-bit model copy have run-time dtypes; with `skip` set and non-zero, nothing changes,
/// nor with `mismatch` non-zero (a recompute that differed from its forward, fingerprint_checks.cuh,
/// raised at the next host wait: its gradients must not reach the parameters).
/// A bf16 copy may be rounded stochastically with draw i of `rng` (bf16_round_stochastic).
/// A copy element that became inf from a finite master claims `overflow` (copy_overflow_checks.cuh)
/// with `claim` and counts itself there.
namespace device {
template <class Update, class TP>
__global__ void apply_update_kernel(Update update, TP* param, const void* grad, DType grad_dtype, TP* first_moment,
                                    TP* second_moment, void* copy, DType copy_dtype, std::int64_t n, const float* skip,
                                    const unsigned long long* mismatch, bool stochastic, RngState rng,
                                    unsigned long long* overflow, unsigned long long claim) {
  if ((skip != nullptr && *skip != 0.0f) || *mismatch != 0) return;
  for (std::int64_t i = global_thread(); i < n; i += grid_stride()) {
    TP p = param[i];
    TP s1 = first_moment != nullptr ? first_moment[i] : TP(0);
    TP s2 = second_moment != nullptr ? second_moment[i] : TP(0);
    update(p, load_as<TP>(grad, grad_dtype, i), s1, s2);
    param[i] = p;
    if (first_moment != nullptr) first_moment[i] = s1;
    if (second_moment != nullptr) second_moment[i] = s2;
    if (copy == nullptr) continue;
    if (stochastic)
      static_cast<BFloat16*>(copy)[i] =
          bf16_round_stochastic(static_cast<float>(p), detail::random_bits(rng, static_cast<std::uint64_t>(i)));
    else store_as<TP>(copy, copy_dtype, i, p);
    const float written = load_as<float>(copy, copy_dtype, i);
    if (isinf(written) && isfinite(p)) {  // NOTE [Model copies that overflow]: the rare path
      atomicCAS(overflow, 0ull, claim);
      atomicAdd(overflow + 1, 1ull);
    }
  }
}
}  // namespace device

template <class Update, class TP>
void apply_update(const KernelContext& ctx, Update update, TP* param, const void* grad, DType grad_dtype,
                  TP* first_moment, TP* second_moment, void* copy, DType copy_dtype, std::int64_t n, const float* skip,
                  const unsigned long long* mismatch, const CopyRounding& rounding, unsigned long long* overflow,
                  unsigned long long claim) {
  if (n == 0) return;
  const bool stochastic = copy != nullptr && rounding.mode == RoundingMode::Stochastic;
  device::apply_update_kernel<<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(
      update, param, grad, grad_dtype, first_moment, second_moment, copy, copy_dtype, n, skip, mismatch, stochastic,
      rounding.rng, overflow, claim);
  TRAINMEM_CUDA_CHECK_LAUNCH("apply_update_kernel");
}

}  // namespace trainmem::cuda::kernels

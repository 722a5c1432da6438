// trainmem/backend/cuda/fused_update.cuh — the CUDA backend's optimizer pass and loss-scaler side.
//
// One kernel pass per parameter tensor (update rule, moments, optional 16-bit model copy
// with nearest-even or stochastic rounding) that a found-inf flag on the device can
// cancel without a host wait; the loss scaler's unscale and scale update as kernels. A
// base of cuda::Backend (CRTP: it launches through the backend's kernel context).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "trainmem/backend/cuda/kernels/loss_scale.cuh"
#include "trainmem/backend/cuda/kernels/update.cuh"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem::cuda {

/// \brief The fused update methods of cuda::Backend.
template <class Derived>
class FusedUpdate {
 public:
  using TensorT = Tensor<Derived>;

  /// One optimizer update pass: param (f32 or f64) and its moments updated in place, grad
  /// (any floating dtype) read, and an optional 16-bit model copy written from the result;
  /// first_moment, second_moment and model_copy may be undefined. When found_inf (an f32
  /// scalar) is defined and non-zero the pass changes nothing, decided by the kernel (no
  /// host wait), nor when a recompute's fingerprint differed from its forward's since the
  /// last host wait (fingerprint_checks.cuh); `rounding` says how the model copy is written (stochastic: bf16 only,
  /// element i with draw i).
  /// A copy element that became inf from a finite master is raised as CopyOverflowError
  /// naming `name` at the next host wait (copy_overflow_checks.cuh).
  template <class Update>
  void apply_update(Update update, const TensorT& param, const TensorT& grad, const TensorT& first_moment,
                    const TensorT& second_moment, const TensorT& model_copy, const TensorT& found_inf = TensorT(),
                    const CopyRounding& rounding = {}, std::string_view name = {}) {
    detail::expects(param.dtype() == DType::F32 || param.dtype() == DType::F64, "apply_update: an f32 or f64 param");
    detail::check_not_fp8(grad.dtype(), "apply_update");
    if (model_copy.defined()) detail::check_not_fp8(model_copy.dtype(), "apply_update");
    detail::expects(grad.numel() == param.numel() && (!model_copy.defined() || model_copy.numel() == param.numel()),
                    "apply_update: grad and model copy the size of param");
    detail::expects(
        rounding.mode == RoundingMode::NearestEven || !model_copy.defined() || model_copy.dtype() == DType::BF16,
        "apply_update: a bf16 model copy for stochastic rounding");
    const float* skip = found_inf.defined() ? scalar<float>(found_inf) : nullptr;
    const unsigned long long claim = model_copy.defined() && param.numel() > 0
                                         ? derived().copy_overflow_checks_.expect(std::string(name), model_copy.dtype())
                                         : 0ull;
    visit_floating(param.dtype(), "apply_update", [&]<class TP>() {
      if constexpr (std::is_same_v<TP, float> || std::is_same_v<TP, double>) {
        TP* s1 = first_moment.defined() ? first_moment.template data_as<TP>() : nullptr;
        TP* s2 = second_moment.defined() ? second_moment.template data_as<TP>() : nullptr;
        kernels::apply_update(derived().context(), update, param.template data_as<TP>(), grad.data(), grad.dtype(), s1,
                              s2, model_copy.defined() ? model_copy.data() : nullptr,
                              model_copy.defined() ? model_copy.dtype() : DType::F32, param.numel(), skip,
                              derived().fingerprint_checks_.record(), rounding,
                              derived().copy_overflow_checks_.record(), claim);
      }
    });
  }

  // --- mixed precision: the loss scaler's device side ------------------------------
  /// grads *= 1/scale[0] in place (one launch per 48 tensors); found_inf[0] = 1 if any stored
  /// result is inf or NaN (also one that overflows when unscaled); never cleared. f32 scalars.
  void unscale_grads(std::span<const TensorT> grads, const TensorT& scale, const TensorT& found_inf) {
    std::vector<kernels::GradRef> refs;
    refs.reserve(grads.size());
    for (const TensorT& g : grads) {
      if (!g.defined()) continue;
      detail::check_not_fp8(g.dtype(), "unscale_grads");
      refs.push_back({g.data(), g.numel(), g.dtype()});
    }
    kernels::unscale_grads(derived().context(), refs, scalar<float>(scale), scalar<float>(found_inf));
  }
  /// One step of the dynamic loss-scale rule (update_scale_state) in a one-thread kernel.
  void update_scale(const TensorT& scale, const TensorT& growth_tracker, const TensorT& hysteresis_left,
                    const TensorT& found_inf, const ScaleUpdateArgs& args) {
    kernels::update_scale(derived().context(), scalar<float>(scale), scalar<std::int32_t>(growth_tracker),
                          scalar<std::int32_t>(hysteresis_left), scalar<float>(found_inf), args);
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }

  /// A device scalar of the loss scaler or the optimizer (data_as checks its dtype).
  template <class T>
  static T* scalar(const TensorT& t) {
    detail::expects(t.numel() == 1, "a one-element ", dtype_of<T>(), " tensor");
    return t.template data_as<T>();
  }
};

}  // namespace trainmem::cuda

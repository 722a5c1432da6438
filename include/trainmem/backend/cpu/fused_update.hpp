// trainmem/backend/cpu/fused_update.hpp — the CPU backend's optimizer pass and loss-scaler side.
//
// One pass per parameter tensor: the update rule (SGD, AdamW) on the f32 master and its
// moments, reading a gradient of any floating dtype and writing the optional 16-bit
// model copy (nearest-even or stochastic rounding); the loss scaler's unscale with its
// found-inf flag and its scale update. A step the scaler skips changes nothing. It is a
// base of cpu::Backend (CRTP: the tensor type is the backend's), keeping no state.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "trainmem/backend/cpu/kernels/loss_scale.hpp"
#include "trainmem/backend/cpu/kernels/update.hpp"
#include "trainmem/core/backend_contract.hpp"
#include "trainmem/core/copy_overflow.hpp"
#include "trainmem/core/loss_scale_rule.hpp"
#include "trainmem/core/stochastic_rounding.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem::cpu {

/// \brief The fused update methods of cpu::Backend.
template <class Derived>
class FusedUpdate {
 public:
  using TensorT = Tensor<Derived>;
  /// One optimizer update pass: param (f32 or f64) and its moments updated in place, grad
  /// (any floating dtype) read, and an optional 16-bit model copy written from the result.
  /// first_moment, second_moment and model_copy may be undefined.
  template <class Update>
  void apply_update(Update update, const TensorT& param, const TensorT& grad, const TensorT& first_moment,
                    const TensorT& second_moment, const TensorT& model_copy) {
    apply_update(update, param, grad, first_moment, second_moment, model_copy, TensorT());
  }

  // --- mixed precision ----------------------------------------------------------------
  /// As apply_update above, and: when `found_inf` (f32 scalar) is defined and non-zero the
  /// pass changes nothing (a step the loss scaler skips, decided without a host sync on a
  /// GPU); `rounding` says how the 16-bit model copy is written (stochastic: bf16 only).
  /// A copy element that became inf from a finite value throws CopyOverflowError naming
  /// `name` once the pass is done (NOTE [Model copies that overflow] in core/copy_overflow.hpp).
  template <class Update>
  void apply_update(Update update, const TensorT& param, const TensorT& grad, const TensorT& first_moment,
                    const TensorT& second_moment, const TensorT& model_copy, const TensorT& found_inf,
                    const CopyRounding& rounding = {}, std::string_view name = {}) {
    if (found_inf.defined() && found_inf.template data_as<const float>()[0] != 0.0f) return;
    if (!model_copy.defined()) {
      update_with(update, param, grad, first_moment, second_moment, kernels::NoCopy{});
      return;
    }
    std::atomic<std::int64_t> overflowed{0};
    if (rounding.mode == RoundingMode::NearestEven) {
      visit_floating(model_copy.dtype(), "apply_update", [&]<class TC>() {
        update_with(update, param, grad, first_moment, second_moment,
                    kernels::NearestCopy<TC>{model_copy.template data_as<TC>(), &overflowed});
      });
    } else {
      detail::expects(model_copy.dtype() == DType::BF16, "apply_update: a bf16 model copy for stochastic rounding");
      update_with(update, param, grad, first_moment, second_moment,
                  kernels::StochasticBf16Copy{model_copy.template data_as<BFloat16>(), rounding.rng, &overflowed});
    }
    if (const std::int64_t n = overflowed.load(); n != 0)
      throw CopyOverflowError(detail::copy_overflow_message(
          name, detail::concat(n, " of ", model_copy.numel(), " elements"), model_copy.dtype()));
  }

  /// Every grad *= 1 / scale[0] in place (no write when that is 1), and found_inf[0] = 1
  /// when any element was inf or NaN. found_inf is never cleared here, so several calls
  /// (several optimizers, several devices) can share one flag. scale, found_inf: f32 scalars.
  void unscale_grads(std::span<const TensorT> grads, const TensorT& scale, const TensorT& found_inf) {
    const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale.template data_as<const float>()[0]));
    float* flag = found_inf.template data_as<float>();
    for (const TensorT& grad : grads) {
      visit_floating(grad.dtype(), "unscale_grads", [&]<class T>() {
        if (kernels::unscale_and_check(grad.template data_as<T>(), grad.numel(), inv_scale)) flag[0] = 1.0f;
      });
    }
  }

  /// One step of the dynamic loss-scale rule (update_scale_state) on backend scalars:
  /// scale f32, growth_tracker and hysteresis_left i32, found_inf f32 (non-zero: overflow).
  void update_scale(const TensorT& scale, const TensorT& growth_tracker, const TensorT& hysteresis_left,
                    const TensorT& found_inf, const ScaleUpdateArgs& args) {
    update_scale_state(scale.template data_as<float>()[0], growth_tracker.template data_as<std::int32_t>()[0],
                       hysteresis_left.template data_as<std::int32_t>()[0],
                       found_inf.template data_as<const float>()[0] != 0.0f, args);
  }

 private:
  /// The typed update pass behind both apply_update overloads; store_copy writes the model copy.
  template <class Update, class StoreCopy>
  void update_with(Update update, const TensorT& param, const TensorT& grad, const TensorT& first_moment,
                   const TensorT& second_moment, StoreCopy store_copy) {
    visit_floating(param.dtype(), "apply_update", [&]<class TP>() {
      if constexpr (std::is_same_v<TP, float> || std::is_same_v<TP, double>) {
        visit_floating(grad.dtype(), "apply_update", [&]<class TG>() {
          kernels::apply_update(update, param.template data_as<TP>(), grad.template data_as<const TG>(),
                                first_moment.defined() ? first_moment.template data_as<TP>() : nullptr,
                                second_moment.defined() ? second_moment.template data_as<TP>() : nullptr, param.numel(),
                                store_copy);
        });
      } else {
        detail::expects(false, "apply_update: an f32 or f64 param");
      }
    });
  }
};

}  // namespace trainmem::cpu

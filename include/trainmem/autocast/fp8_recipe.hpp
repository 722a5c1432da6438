// trainmem/autocast/fp8_recipe.hpp — the FP8 recipe: delayed scaling's settings.
//
// FP8 has too little range to hold a tensor as it is (E4M3: 2^-9 .. 448, E5M2:
// 2^-16 .. 57344), so each tensor is stored times a per-tensor scale. Delayed scaling
// (TransformerEngine's DelayedScaling recipe) picks that scale from the absolute maxima
// (amax) of the same tensor role in the last `history_length` steps, by `rule`:
//   max          the largest amax in the history (robust to a spike of one step);
//   most_recent  the last step's amax (follows a drifting range at once).
// scale = (fp8_max / amax) / 2^margin: a margin > 0 leaves headroom for growth between
// updates. Forward tensors (activations and weights) are E4M3, which has the precision;
// gradients are E5M2, which has the range (the HYBRID format of TransformerEngine).
#pragma once

#include <cstdint>
#include <string_view>

#include "trainmem/core/dtype.hpp"
#include "trainmem/error.hpp"

namespace trainmem::amp {

/// Which amax of the history sets the scale.
enum class AmaxRule : std::uint8_t { Max, MostRecent };

constexpr std::string_view name_of(AmaxRule rule) { return rule == AmaxRule::Max ? "max" : "most_recent"; }

/// \brief Delayed scaling's settings (TransformerEngine's DelayedScaling, HYBRID format).
struct DelayedScaling {
  std::int64_t history_length = 16;  // steps of amax each role remembers (TransformerEngine's default is 1024)
  std::int32_t margin = 0;           // scale = (fp8_max / amax) / 2^margin
  AmaxRule rule = AmaxRule::Max;
  DType forward_format = DType::F8E4M3;   // activations and weights
  DType backward_format = DType::F8E5M2;  // gradients of the outputs

  /// Throws (naming `who` and the field) unless these settings can run.
  void validate(std::string_view who) const {
    detail::check(history_length >= 1, who, ": DelayedScaling::history_length must be >= 1, got ", history_length);
    detail::check(margin >= 0 && margin <= 64, who, ": DelayedScaling::margin must be in [0, 64], got ", margin);
    detail::check(is_fp8(forward_format), who, ": DelayedScaling::forward_format must be an FP8 dtype, got ",
                  forward_format);
    detail::check(is_fp8(backward_format), who, ": DelayedScaling::backward_format must be an FP8 dtype, got ",
                  backward_format);
  }
};

}  // namespace trainmem::amp

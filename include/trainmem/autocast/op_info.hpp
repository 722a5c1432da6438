// trainmem/autocast/op_info.hpp — what an op declares about itself.
//
// Each op has one static OpInfo: its identity (name and kind, all the tape and the
// checkpoint policies see) and its autocast category (read at the op entry only).
// Ops never decide precision or what to keep themselves; these declarations let the
// policies decide.
#pragma once

#include <cstdint>
#include <string_view>

#include "trainmem/autograd/op_identity.hpp"

namespace trainmem {

/// How autocast treats an op's floating inputs (PyTorch's autocast lists, plus Fp32Math).
enum class AutocastCategory : std::uint8_t {
  LowerPrecision,  // run in the autocast dtype (f16/bf16): matmuls
  Fp32,            // run in f32: softmax, losses, reductions, exp, log
  Promote,         // run in the widest input dtype: binary element-wise ops
  Unchanged,       // run in the input's own dtype
  Fp32Math,        // f32 math on the data input's storage: norms (a 16-bit x gives a 16-bit y, rounded once)
};

constexpr std::string_view name_of(AutocastCategory category) {
  switch (category) {
    case AutocastCategory::LowerPrecision: return "lower_precision";
    case AutocastCategory::Fp32: return "fp32";
    case AutocastCategory::Promote: return "promote";
    case AutocastCategory::Unchanged: return "unchanged";
    case AutocastCategory::Fp32Math: return "fp32_math";
  }
  return "?";
}

/// An op's identity plus its autocast category: `OpInfo{"add", OpKind::Elementwise,
/// AutocastCategory::Promote}`.
struct OpInfo : OpIdentity {
  AutocastCategory autocast;
};

}  // namespace trainmem

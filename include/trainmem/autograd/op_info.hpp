// trainmem/autograd/op_info.hpp — what an op declares about itself.
//
// Each op has one static OpInfo: its name (for errors and policies), its kind (for
// selective checkpoint policies) and its autocast category (for the autocast seam).
// Ops never decide precision or what to keep themselves; these declarations let the
// policies decide.
#pragma once

#include <cstdint>
#include <string_view>

namespace trainmem {

/// Coarse op classes that checkpoint policies select on.
enum class OpKind : std::uint8_t {
  Matmul,       // matmul, linear, batched matmul: expensive to recompute
  Elementwise,  // activations, add, mul, scale, casts: cheap
  Reduction,    // sum, mean
  Norm,         // layer norm
  Softmax,      // softmax, log_softmax
  Loss,         // cross entropy
  Embedding,
  Random,       // dropout
  Shape,        // reshape, transpose, masks
  Tag,          // checkpoint_name: identity that names a tensor
};

constexpr std::string_view name_of(OpKind kind) {
  switch (kind) {
    case OpKind::Matmul: return "matmul";
    case OpKind::Elementwise: return "elementwise";
    case OpKind::Reduction: return "reduction";
    case OpKind::Norm: return "norm";
    case OpKind::Softmax: return "softmax";
    case OpKind::Loss: return "loss";
    case OpKind::Embedding: return "embedding";
    case OpKind::Random: return "random";
    case OpKind::Shape: return "shape";
    case OpKind::Tag: return "tag";
  }
  return "?";
}

/// How autocast treats an op's floating inputs (PyTorch's autocast lists).
enum class AutocastCategory : std::uint8_t {
  LowerPrecision,  // run in the autocast dtype (f16/bf16): matmuls
  Fp32,            // run in f32: softmax, norms, losses, reductions, exp, log
  Promote,         // run in the widest input dtype: binary element-wise ops
  Unchanged,       // run in the input's own dtype
};

constexpr std::string_view name_of(AutocastCategory category) {
  switch (category) {
    case AutocastCategory::LowerPrecision: return "lower_precision";
    case AutocastCategory::Fp32: return "fp32";
    case AutocastCategory::Promote: return "promote";
    case AutocastCategory::Unchanged: return "unchanged";
  }
  return "?";
}

struct OpInfo {
  std::string_view name;
  OpKind kind;
  AutocastCategory autocast;
};

}  // namespace trainmem

// trainmem/autograd/op_identity.hpp — what the tape knows of an op: its name and kind.
//
// Nodes name their op in errors, and checkpoint policies choose which op outputs to
// keep by the kind of op that made them. Nothing here is about precision: the autocast category
// an op also declares lives with the op entry (autocast/op_info.hpp).
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
  Random,  // dropout
  Shape,   // reshape, transpose, masks
  Tag,     // checkpoint_name: identity that names a tensor
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

struct OpIdentity {
  std::string_view name;
  OpKind kind;
};

}  // namespace trainmem

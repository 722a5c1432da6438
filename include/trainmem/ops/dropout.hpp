// trainmem/ops/dropout.hpp — dropout on the counter-based RNG.
//
// Dropout saves nothing: the keep mask is a pure function of the (seed, offset) the
// forward drew from the tape's generator, so backward regenerates it. That is both a
// memory saving (no mask kept) and what makes a checkpoint region's recompute draw
// the same mask: the region restores the generator to its entry state.
#pragma once

#include <string_view>

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kDropoutOp{"dropout", OpKind::Random, AutocastCategory::Unchanged};
}

/// `p` when it is a dropout probability (in [0, 1)); otherwise throws naming `who`.
inline float checked_dropout_probability(float p, std::string_view who) {
  detail::check(p >= 0.0f && p < 1.0f, who, ": the dropout probability must be in [0, 1), got ", p);
  return p;
}

/// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when
/// p == 0 or not training.
template <class B>
Var<B> dropout(const Var<B>& x, float p, bool training = true) {
  const auto& op = detail::kDropoutOp;
  detail::require_floating(op, x, "x");
  checked_dropout_probability(p, "dropout");
  if (!training || p == 0.0f) return x;
  OpRecorder<B> rec(op, {x}, static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  const RngState stream = rec.tape().rng().take(static_cast<std::uint64_t>(x.numel()));
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    rec.backend().dropout(tx, y, p, stream);
    return Outputs<B>{y};
  });
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dx = new_tensor(g[0].backend(), g[0].shape(), g[0].dtype());
    g[0].backend().dropout(g[0], dx, p, stream);
    return Grads<B>{dx};
  });
}

}  // namespace trainmem

// trainmem/ops/cast.hpp — a differentiable change of floating dtype.
//
// The gradient flows back cast to the input's dtype, so a bf16 model can be run in f32
// (or an f32 activation stored in bf16) inside a graph. Autocast leaves it alone: the
// caller names the dtype. It keeps nothing; a cast to the input's own dtype is the input.
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kCastOp{"cast", OpKind::Elementwise, AutocastCategory::Unchanged};
}

/// x in `dtype` (rounded to nearest even when narrowing); the gradient is cast back to x's dtype.
template <class B>
Var<B> cast(const Var<B>& x, DType dtype) {
  const auto& op = detail::kCastOp;
  detail::require_floating(op, x, "x");
  detail::check(is_floating(dtype), "cast: dtype must be floating, got ", dtype, " (for x ", x.dtype(), " ", x.shape(),
                ")");
  if (dtype == x.dtype()) return x;
  OpRecorder<B> rec(op, {x}, 0.0);
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] { return Outputs<B>{detail::unary(math::Identity{}, tx, dtype)}; });
  const DType input_dtype = x.dtype();
  return rec.finish(out[0],
                    [=](const Grads<B>& g) { return Grads<B>{detail::unary(math::Identity{}, g[0], input_dtype)}; });
}

}  // namespace trainmem

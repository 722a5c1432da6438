// trainmem/ops/op_helpers.hpp — small pieces every op file shares.
//
// What an op does between its OpRecorder's input() and finish(): check its arguments,
// allocate outputs as temporaries (saving one makes it a saved activation), run an
// element-wise kernel into a new tensor, and sum a broadcast gradient back down.
#pragma once

#include "trainmem/core/axis_view.hpp"
#include "trainmem/ops/op_recorder.hpp"

namespace trainmem {

/// Allocates an op output (a temporary until something saves it).
template <class B>
Tensor<B> new_tensor(B& backend, Shape shape, DType dtype) {
  return Tensor<B>::empty(std::move(shape), dtype, MemCategory::Temporary, backend);
}

}  // namespace trainmem

namespace trainmem::detail {

template <class B>
void require_floating(const OpInfo& op, const Var<B>& v, const char* what) {
  check(is_floating(v.dtype()), op.name, ": ", what, " must be floating, got ", v.dtype(), " ", v.shape());
}

template <class B>
void require_rank_at_least(const OpInfo& op, const Var<B>& v, std::size_t rank, const char* what) {
  check(v.shape().rank() >= rank, op.name, ": ", what, " must have rank >= ", rank, ", got ", v.shape());
}

/// out = op(a, b) into a new tensor of a's shape and `dtype`.
template <class B, class Op>
Tensor<B> binary(Op op, const Tensor<B>& a, const Tensor<B>& b, DType dtype) {
  Tensor<B> out = new_tensor(a.backend(), a.shape(), dtype);
  a.backend().map(op, a, b, out);
  return out;
}
template <class B, class Op>
Tensor<B> unary(Op op, const Tensor<B>& a, DType dtype) {
  Tensor<B> out = new_tensor(a.backend(), a.shape(), dtype);
  a.backend().map(op, a, out);
  return out;
}

/// Sums a gradient of `grad`'s shape down to `target`, a shape that broadcasts to it
/// (core/axis_view.hpp: a scalar, a row, or grad's shape with one axis collapsed).
template <class B>
Tensor<B> reduce_to(const Tensor<B>& grad, const Shape& target) {
  if (grad.shape() == target) return grad;
  Tensor<B> out = new_tensor(grad.backend(), target, grad.dtype());
  if (target.numel() == 1) grad.backend().sum_all(grad, out);
  else grad.backend().sum_axis(grad, out, *broadcast_view(grad.shape(), target));
  return out;
}

/// A tensor of `shape` whose every element is alpha * scalar[0].
template <class B>
Tensor<B> broadcast_scalar(const Tensor<B>& scalar, const Shape& shape, DType dtype, double alpha) {
  Tensor<B> out = Tensor<B>::zeros(shape, dtype, MemCategory::Temporary, scalar.backend());
  scalar.backend().map(math::AddScaled{alpha}, out, scalar, out);
  return out;
}

}  // namespace trainmem::detail

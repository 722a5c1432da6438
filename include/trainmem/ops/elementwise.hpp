// trainmem/ops/elementwise.hpp — add, sub, mul, div (with broadcasting) and scale.
//
// The second operand may have the first's shape, be one row of its last extent (a
// bias), have the first's shape with one axis set to 1 (a column [rows, 1], or any
// keepdim reduction's result), or be a scalar; its gradient is summed back down to its
// own shape.
// Binary ops run in the widest input dtype (autocast's "promote" category).
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {

inline constexpr OpInfo kAddOp{"add", OpKind::Elementwise, AutocastCategory::Promote};
inline constexpr OpInfo kSubOp{"sub", OpKind::Elementwise, AutocastCategory::Promote};
inline constexpr OpInfo kMulOp{"mul", OpKind::Elementwise, AutocastCategory::Promote};
inline constexpr OpInfo kDivOp{"div", OpKind::Elementwise, AutocastCategory::Promote};
inline constexpr OpInfo kScaleOp{"scale", OpKind::Elementwise, AutocastCategory::Unchanged};

template <class B>
void check_broadcast(const OpInfo& op, const Var<B>& a, const Var<B>& b) {
  require_floating(op, a, "a");
  require_floating(op, b, "b");
  const bool same = a.shape() == b.shape();
  const bool row = b.shape().rank() == 1 && a.shape().rank() >= 1 && b.shape()[0] == a.shape().back();
  const bool scalar = b.numel() == 1;
  const bool collapsed = collapsed_axis(a.shape(), b.shape()).has_value();
  check(same || row || scalar || collapsed, op.name, ": cannot broadcast b ", b.shape(), " to a ", a.shape(),
        " (b must have a's shape, be a row [", a.shape().back(),
        "], have a's shape with one axis set to 1 (a keepdim reduction's result), or be a scalar)");
}

/// a (+|-) b: sign is +1 or -1.
template <class B>
Var<B> add_sub(const OpInfo& op, const Var<B>& a, const Var<B>& b, double sign) {
  check_broadcast(op, a, b);
  OpRecorder<B> rec(op, {a, b}, static_cast<double>(a.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> ta = rec.input(0), tb = rec.input(1);
  auto out = rec.compute([&] { return Outputs<B>{binary(math::AddScaled{sign}, ta, tb, dtype)}; });
  const bool need_a = rec.needs_grad(0), need_b = rec.needs_grad(1);
  const Shape b_shape = b.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(2);
    if (need_a) grads[0] = g[0];
    if (need_b) {
      Tensor<B> db = reduce_to(g[0], b_shape);
      grads[1] = sign > 0 ? db : unary(math::Scale{-1.0}, db, db.dtype());
    }
    return grads;
  });
}

}  // namespace detail

/// a + b; b may be a's shape, a row [a.shape().back()], a's shape with one axis 1, or a scalar.
template <class B>
Var<B> add(const Var<B>& a, const Var<B>& b) {
  return detail::add_sub(detail::kAddOp, a, b, 1.0);
}

/// a - b; b may be a's shape, a row [a.shape().back()], a's shape with one axis 1, or a scalar.
template <class B>
Var<B> sub(const Var<B>& a, const Var<B>& b) {
  return detail::add_sub(detail::kSubOp, a, b, -1.0);
}

/// a * b element-wise; b may be a's shape, a row [a.shape().back()], a's shape with one axis 1, or a scalar.
template <class B>
Var<B> mul(const Var<B>& a, const Var<B>& b) {
  const auto& op = detail::kMulOp;
  detail::check_broadcast(op, a, b);
  OpRecorder<B> rec(op, {a, b}, static_cast<double>(a.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> ta = rec.input(0), tb = rec.input(1);
  const bool need_a = rec.needs_grad(0), need_b = rec.needs_grad(1);
  SavedTensor<B> saved_a = need_b ? rec.save(ta) : SavedTensor<B>();
  SavedTensor<B> saved_b = need_a ? rec.save(tb) : SavedTensor<B>();
  auto out = rec.compute([&] { return Outputs<B>{detail::binary(math::Mul{}, ta, tb, dtype)}; });
  const Shape b_shape = b.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(2);
    if (need_a) grads[0] = detail::binary(math::Mul{}, g[0], saved_b.unpack(), g[0].dtype());
    if (need_b)
      grads[1] = detail::reduce_to(detail::binary(math::Mul{}, g[0], saved_a.unpack(), g[0].dtype()), b_shape);
    return grads;
  });
}

/// a / b element-wise; b may be a's shape, a row [a.shape().back()], a's shape with one axis 1, or a scalar. Keeps b
/// and, when b needs a gradient, the output: db = -(dy / b) y, summed down to b's shape.
template <class B>
Var<B> div(const Var<B>& a, const Var<B>& b) {
  const auto& op = detail::kDivOp;
  detail::check_broadcast(op, a, b);
  OpRecorder<B> rec(op, {a, b}, static_cast<double>(a.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> ta = rec.input(0), tb = rec.input(1);
  const bool need_a = rec.needs_grad(0), need_b = rec.needs_grad(1);
  SavedTensor<B> saved_b = need_a || need_b ? rec.save(tb) : SavedTensor<B>();
  auto out = rec.compute([&] { return Outputs<B>{detail::binary(math::Div{}, ta, tb, dtype)}; });
  SavedTensor<B> saved_y = need_b ? rec.save(out[0]) : SavedTensor<B>();
  const Shape b_shape = b.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(2);
    const Tensor<B> dy_over_b = detail::binary(math::Div{}, g[0], saved_b.unpack(), g[0].dtype());
    if (need_a) grads[0] = dy_over_b;
    if (need_b)
      grads[1] = detail::reduce_to(
          detail::binary(math::DivBackwardDenominator{}, dy_over_b, saved_y.unpack(), g[0].dtype()), b_shape);
    return grads;
  });
}

/// alpha * x.
template <class B>
Var<B> scale(const Var<B>& x, double alpha) {
  const auto& op = detail::kScaleOp;
  detail::require_floating(op, x, "x");
  OpRecorder<B> rec(op, {x}, static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] { return Outputs<B>{detail::unary(math::Scale{alpha}, tx, dtype)}; });
  return rec.finish(out[0],
                    [=](const Grads<B>& g) { return Grads<B>{detail::unary(math::Scale{alpha}, g[0], g[0].dtype())}; });
}

template <class B>
Var<B> operator+(const Var<B>& a, const Var<B>& b) {
  return add(a, b);
}
template <class B>
Var<B> operator-(const Var<B>& a, const Var<B>& b) {
  return sub(a, b);
}
template <class B>
Var<B> operator*(const Var<B>& a, const Var<B>& b) {
  return mul(a, b);
}
template <class B>
Var<B> operator/(const Var<B>& a, const Var<B>& b) {
  return div(a, b);
}
template <class B>
Var<B> operator*(const Var<B>& a, double alpha) {
  return scale(a, alpha);
}
template <class B>
Var<B> operator*(double alpha, const Var<B>& a) {
  return scale(a, alpha);
}

}  // namespace trainmem

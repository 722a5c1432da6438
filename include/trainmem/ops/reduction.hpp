// trainmem/ops/reduction.hpp — sum and mean of all elements, or over one axis.
//
// Accumulate in f32 (f64 for f64) and produce that dtype; keep nothing (backward
// broadcasts the upstream gradient back over what was reduced). Autocast runs them in
// f32. Over an axis, keepdim leaves it with extent 1, so the result broadcasts against
// the input in add, sub, mul and div (core/axis_view.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kSumOp{"sum", OpKind::Reduction, AutocastCategory::Fp32};
inline constexpr OpInfo kMeanOp{"mean", OpKind::Reduction, AutocastCategory::Fp32};

template <class B>
Var<B> reduce_all(const OpInfo& op, const Var<B>& x, bool mean) {
  require_floating(op, x, "x");
  detail::check(x.numel() > 0, op.name, ": cannot reduce an empty tensor ", x.shape());
  OpRecorder<B> rec(op, {x}, static_cast<double>(x.numel()));
  const DType acc = accumulator_dtype(rec.compute_dtype());
  Tensor<B> tx = rec.input(0);
  const double factor = mean ? 1.0 / static_cast<double>(x.numel()) : 1.0;
  auto out = rec.compute([&] {
    Tensor<B> s = new_tensor(rec.backend(), Shape{}, acc);
    rec.backend().sum_all(tx, s);
    if (mean) rec.backend().map(math::Scale{factor}, s, s);
    return Outputs<B>{s};
  });
  const Shape shape = tx.shape();
  const DType dtype = tx.dtype();
  return rec.finish(out[0], [=](const Grads<B>& g) { return Grads<B>{broadcast_scalar(g[0], shape, dtype, factor)}; });
}

template <class B>
Var<B> reduce_axis(const OpInfo& op, const Var<B>& x, int axis, bool keepdim, bool mean) {
  require_floating(op, x, "x");
  const auto rank = static_cast<int>(x.shape().rank());
  check(rank >= 1, op.name, ": a scalar has no axis ", axis, " to reduce");
  check(axis >= -rank && axis < rank, op.name, ": axis ", axis, " is out of range for ", x.shape(), " (rank ", rank,
        ")");
  const auto at = static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
  const AxisView view = axis_view(x.shape(), at);
  check(!mean || view.extent > 0, op.name, ": the mean over an empty axis ", at, " of ", x.shape(), " is undefined");
  std::vector<std::int64_t> kept = x.shape().dims();
  kept[at] = 1;
  std::vector<std::int64_t> dropped = x.shape().dims();
  dropped.erase(dropped.begin() + static_cast<std::ptrdiff_t>(at));
  const Shape kept_shape(kept), out_shape = keepdim ? kept_shape : Shape(dropped);

  OpRecorder<B> rec(op, {x}, static_cast<double>(x.numel()));
  const DType acc = accumulator_dtype(rec.compute_dtype());
  Tensor<B> tx = rec.input(0);
  const double factor = mean ? 1.0 / static_cast<double>(view.extent) : 1.0;
  auto out = rec.compute([&] {
    Tensor<B> s = new_tensor(rec.backend(), out_shape, acc);
    if (s.numel() > 0) {
      rec.backend().sum_axis(tx, s, view);
      if (mean) rec.backend().map(math::Scale{factor}, s, s);
    }
    return Outputs<B>{s};
  });
  const Shape shape = tx.shape();
  const DType dtype = tx.dtype();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dx = Tensor<B>::zeros(shape, dtype, MemCategory::Temporary, g[0].backend());
    g[0].backend().map(math::AddScaled{factor}, dx, g[0].reshape(kept_shape), dx);
    return Grads<B>{dx};
  });
}
}  // namespace detail

/// The sum of all elements, a scalar.
template <class B>
Var<B> sum(const Var<B>& x) {
  return detail::reduce_all(detail::kSumOp, x, false);
}
/// The mean of all elements, a scalar.
template <class B>
Var<B> mean(const Var<B>& x) {
  return detail::reduce_all(detail::kMeanOp, x, true);
}

/// The sum over `axis` (negative counts from the last); keepdim leaves it with extent 1,
/// e.g. sum(x [B, T, C], -1, true) is [B, T, 1].
template <class B>
Var<B> sum(const Var<B>& x, int axis, bool keepdim = false) {
  return detail::reduce_axis(detail::kSumOp, x, axis, keepdim, false);
}

/// The mean over `axis` (negative counts from the last); keepdim leaves it with extent 1,
/// e.g. mean(x * x, -1, true) is the mean square per row that RMSNorm divides by.
template <class B>
Var<B> mean(const Var<B>& x, int axis, bool keepdim = false) {
  return detail::reduce_axis(detail::kMeanOp, x, axis, keepdim, true);
}

}  // namespace trainmem

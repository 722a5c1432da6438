// trainmem/ops/reduction.hpp — sum and mean of all elements.
//
// Accumulate in f32 (f64 for f64) and produce a scalar of that dtype; keep nothing
// (backward broadcasts the upstream scalar). Autocast runs them in f32.
#pragma once

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
    return std::vector<Tensor<B>>{s};
  });
  const Shape shape = tx.shape();
  const DType dtype = tx.dtype();
  return rec.finish(out[0], [=](const Grads<B>& g) { return Grads<B>{broadcast_scalar(g[0], shape, dtype, factor)}; });
}
}  // namespace detail

template <class B>
Var<B> sum(const Var<B>& x) {
  return detail::reduce_all(detail::kSumOp, x, false);
}
template <class B>
Var<B> mean(const Var<B>& x) {
  return detail::reduce_all(detail::kMeanOp, x, true);
}

}  // namespace trainmem

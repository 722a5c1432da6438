// trainmem/ops/softmax.hpp — softmax and log-softmax over the last dimension.
//
// Both keep only their output: softmax's Jacobian-vector product is y (dy - <dy, y>),
// log-softmax's is dy - exp(y) sum(dy). Max-subtracted, accumulated in f32; autocast
// runs them in f32.
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kSoftmaxOp{"softmax", OpKind::Softmax, AutocastCategory::Fp32};
inline constexpr OpInfo kLogSoftmaxOp{"log_softmax", OpKind::Softmax, AutocastCategory::Fp32};

template <class B>
Var<B> softmax_impl(const OpInfo& op, const Var<B>& x, bool log_output) {
  require_floating(op, x, "x");
  require_rank_at_least(op, x, 1, "x");
  OpRecorder<B> rec(op, {x}, 5.0 * static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    rec.backend().softmax(tx, y, log_output);
    return Outputs<B>{y};
  });
  SavedTensor<B> saved_y = rec.save(out[0]);
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const Tensor<B> y = saved_y.unpack();
    Tensor<B> dx = new_tensor(y.backend(), y.shape(), y.dtype());
    y.backend().softmax_backward(g[0].to(y.dtype()), y, dx, log_output);
    return Grads<B>{dx};
  });
}
}  // namespace detail

template <class B>
Var<B> softmax(const Var<B>& x) {
  return detail::softmax_impl(detail::kSoftmaxOp, x, false);
}
template <class B>
Var<B> log_softmax(const Var<B>& x) {
  return detail::softmax_impl(detail::kLogSoftmaxOp, x, true);
}

}  // namespace trainmem

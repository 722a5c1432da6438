// trainmem/ops/loss.hpp — cross-entropy with integer labels, mean over rows.
//
// Fused log-softmax + negative log-likelihood: forward keeps each row's log-sum-exp
// (one value per row), so backward forms softmax(logits) - onehot without keeping a
// probability matrix. Runs in f32 under autocast; the loss is an f32 (f64 for f64) scalar.
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kCrossEntropyOp{"cross_entropy", OpKind::Loss, AutocastCategory::Fp32};
}

/// mean_i( logsumexp(logits[i]) - logits[i, labels[i]] ) for logits [N, C], labels i32 [N].
template <class B>
Var<B> cross_entropy(const Var<B>& logits, const Tensor<B>& labels) {
  const auto& op = detail::kCrossEntropyOp;
  detail::require_floating(op, logits, "logits");
  detail::check(logits.shape().rank() == 2, "cross_entropy: logits must be [N, C], got ", logits.shape());
  detail::check(logits.shape()[0] > 0, "cross_entropy: logits ", logits.shape(),
                " are an empty batch (N = 0); the mean over no rows is undefined");
  detail::check(logits.shape()[1] > 0, "cross_entropy: logits ", logits.shape(), " have no classes (C = 0)");
  detail::check(labels.defined() && labels.dtype() == DType::I32 && labels.shape() == Shape{logits.shape()[0]},
                "cross_entropy: labels must be i32 [", logits.shape()[0], "], got ",
                labels.defined() ? labels.shape().str() + " " + std::string(name_of(labels.dtype())) : "undefined");
  OpRecorder<B> rec(op, {logits}, 4.0 * static_cast<double>(logits.numel()));
  const DType dtype = rec.compute_dtype();
  const DType acc = accumulator_dtype(dtype);
  Tensor<B> tl = rec.input(0);
  SavedTensor<B> saved_logits = rec.save(tl), saved_labels = rec.save(labels);
  auto out = rec.compute([&] {
    Tensor<B> loss = new_tensor(rec.backend(), Shape{}, acc);
    Tensor<B> lse = new_tensor(rec.backend(), Shape{tl.shape()[0]}, acc);
    rec.backend().cross_entropy(tl, labels, loss, lse, tl.rows());
    return Outputs<B>{loss, lse};
  });
  SavedTensor<B> saved_lse = rec.save(out[1]);
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const Tensor<B> lv = saved_logits.unpack();
    Tensor<B> dlogits = new_tensor(lv.backend(), lv.shape(), lv.dtype());
    lv.backend().cross_entropy_backward(g[0].to(accumulator_dtype(lv.dtype())), lv, saved_labels.unpack(),
                                        saved_lse.unpack(), dlogits, lv.rows());
    return Grads<B>{dlogits};
  });
}

}  // namespace trainmem

// trainmem/ops/norm.hpp — layer norm and RMS norm over the last dimension.
//
// Forward keeps the per-row statistics (mean and reciprocal standard deviation for
// layer norm, the reciprocal root mean square for RMS norm: one accumulator value each
// per row) so backward needs x, not a normalised copy. Statistics accumulate in f32
// (f64 for f64). Under autocast a 16-bit x is normalised in its own storage with f32
// math and f32 weights (NOTE [Norms in 16-bit storage] in autocast/autocast.hpp).
// Their closures take the SavedTensors by move: four of them copied and dropped again
// were a few percent of a small layer norm's host time.
#pragma once

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kLayerNormOp{"layer_norm", OpKind::Norm, AutocastCategory::Fp32Math};
inline constexpr OpInfo kRmsNormOp{"rms_norm", OpKind::Norm, AutocastCategory::Fp32Math};

/// Input i of a norm (a weight) as its kernel reads it: in its own dtype when the data
/// runs in 16 bits (the kernel widens it; no rounded copy), else in the compute dtype.
template <class B>
const Tensor<B>& norm_weight(OpRecorder<B>& rec, std::size_t i) {
  return is_16bit(rec.compute_dtype()) ? rec.var(i).value() : rec.input(i);
}
}  // namespace detail

/// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last dimension.
template <class B>
Var<B> layer_norm(const Var<B>& x, const Var<B>& gamma, const Var<B>& beta, double eps = 1e-5) {
  const auto& op = detail::kLayerNormOp;
  detail::require_floating(op, x, "x");
  detail::require_rank_at_least(op, x, 1, "x");
  const std::int64_t d = x.shape().back();
  detail::check(gamma.shape() == Shape{d} && beta.shape() == Shape{d}, "layer_norm: gamma ", gamma.shape(),
                " and beta ", beta.shape(), " must both be [", d, "] for x ", x.shape());
  detail::check(eps > 0.0, "layer_norm: eps must be positive, got ", eps);
  OpRecorder<B> rec(op, {x, gamma, beta}, 8.0 * static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  const DType stat_dtype = accumulator_dtype(dtype);
  const Tensor<B>& tx = rec.input(0);
  const Tensor<B>& tg = detail::norm_weight(rec, 1);
  const Tensor<B>& tb = detail::norm_weight(rec, 2);
  const std::int64_t rows = tx.rows();
  SavedTensor<B> saved_x = rec.save(tx), saved_gamma = rec.save(tg);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    Tensor<B> mean = new_tensor(rec.backend(), Shape{rows}, stat_dtype);
    Tensor<B> rstd = new_tensor(rec.backend(), Shape{rows}, stat_dtype);
    rec.backend().layer_norm(tx, tg, tb, y, mean, rstd, eps);
    return Outputs<B>{std::move(y), std::move(mean), std::move(rstd)};
  });
  SavedTensor<B> saved_mean = rec.save(out[1]), saved_rstd = rec.save(out[2]);
  return rec.finish(
      out[0], [saved_x = std::move(saved_x), saved_gamma = std::move(saved_gamma), saved_mean = std::move(saved_mean),
               saved_rstd = std::move(saved_rstd)](const Grads<B>& g) {
        const Tensor<B> xv = saved_x.unpack(), gv = saved_gamma.unpack();
        Tensor<B> dx = new_tensor(g[0].backend(), xv.shape(), xv.dtype());
        Tensor<B> dgamma = new_tensor(g[0].backend(), gv.shape(), gv.dtype());
        Tensor<B> dbeta = new_tensor(g[0].backend(), gv.shape(), gv.dtype());
        g[0].backend().layer_norm_backward(g[0].to(xv.dtype()), xv, gv, saved_mean.unpack(), saved_rstd.unpack(), dx,
                                           dgamma, dbeta);
        return Grads<B>{std::move(dx), std::move(dgamma), std::move(dbeta)};
      });
}

/// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension.
template <class B>
Var<B> rms_norm(const Var<B>& x, const Var<B>& weight, double eps = 1e-6) {
  const auto& op = detail::kRmsNormOp;
  detail::require_floating(op, x, "x");
  detail::require_floating(op, weight, "weight");
  detail::require_rank_at_least(op, x, 1, "x");
  const std::int64_t d = x.shape().back();
  detail::check(weight.shape() == Shape{d}, "rms_norm: weight ", weight.shape(), " must be [", d, "] for x ",
                x.shape());
  detail::check(eps > 0.0, "rms_norm: eps must be positive, got ", eps);
  OpRecorder<B> rec(op, {x, weight}, 4.0 * static_cast<double>(x.numel()));
  const DType dtype = rec.compute_dtype();
  const Tensor<B>& tx = rec.input(0);
  const Tensor<B>& tw = detail::norm_weight(rec, 1);
  SavedTensor<B> saved_x = rec.save(tx), saved_weight = rec.save(tw);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    Tensor<B> rstd = new_tensor(rec.backend(), Shape{tx.rows()}, accumulator_dtype(dtype));
    rec.backend().rms_norm(tx, tw, y, rstd, eps);
    return Outputs<B>{std::move(y), std::move(rstd)};
  });
  SavedTensor<B> saved_rstd = rec.save(out[1]);
  return rec.finish(out[0], [saved_x = std::move(saved_x), saved_weight = std::move(saved_weight),
                             saved_rstd = std::move(saved_rstd)](const Grads<B>& g) {
    const Tensor<B> xv = saved_x.unpack(), wv = saved_weight.unpack();
    Tensor<B> dx = new_tensor(g[0].backend(), xv.shape(), xv.dtype());
    Tensor<B> dweight = new_tensor(g[0].backend(), wv.shape(), wv.dtype());
    g[0].backend().rms_norm_backward(g[0].to(xv.dtype()), xv, wv, saved_rstd.unpack(), dx, dweight);
    return Grads<B>{std::move(dx), std::move(dweight)};
  });
}

}  // namespace trainmem

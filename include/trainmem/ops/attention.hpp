// trainmem/ops/attention.hpp — scaled-dot-product attention as one memory-efficient op.
//
// softmax(scale q k^T [+ causal mask]) v over q [n, tq, d] and k, v [n, tk, d] (n is
// batch * heads), computed by the backend slice by slice, so the [n, tq, tk] scores and
// probabilities never become tensors. The op saves q, k, v and each query row's
// log-sum-exp (n * tq f32 values); backward recomputes the probabilities from them.
// Per slice of a causal self-attention over T positions that is 3 T d + T saved values
// where bmm, scale, causal_mask, softmax, bmm save about 3 T^2 + 2 T d. The result is
// theirs up to rounding (the math is f32 throughout, also for 16-bit inputs). Matmul
// kind and LowerPrecision autocast category, as bmm: save_matmuls keeps its output.
#pragma once

#include <cmath>
#include <optional>

#include "trainmem/core/attention_sizes.hpp"
#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kAttentionOp{"scaled_dot_product_attention", OpKind::Matmul, AutocastCategory::LowerPrecision};
}  // namespace detail

/// softmax(scale q k^T) v per slice; `causal`: query i sees keys up to tk - tq + i;
/// scale defaults to 1 / sqrt(d).
template <class B>
Var<B> scaled_dot_product_attention(const Var<B>& q, const Var<B>& k, const Var<B>& v, bool causal,
                                    std::optional<double> scale = std::nullopt) {
  const OpInfo& op = detail::kAttentionOp;
  detail::require_floating(op, q, "q");
  detail::require_floating(op, k, "k");
  detail::require_floating(op, v, "v");
  const Shape &sq = q.shape(), &sk = k.shape();
  detail::check(sq.rank() == 3 && sk.rank() == 3 && v.shape() == sk && sq[0] == sk[0] && sq[2] == sk[2], op.name,
                ": expects q [n, tq, d] and k, v [n, tk, d], got q ", sq, ", k ", sk, ", v ", v.shape());
  detail::check(sk[1] > 0, op.name, ": no keys to attend to (k ", sk, ")");
  detail::check(!causal || sq[1] <= sk[1], op.name, ": a causal mask needs tq <= tk, got q ", sq, " and k ", sk);
  detail::check(!scale || std::isfinite(*scale), op.name, ": scale must be finite, got ", scale.value_or(0.0));
  const AttentionSizes sizes{sq[0], sq[1], sk[1], sq[2], scale.value_or(1.0 / std::sqrt(static_cast<double>(sq[2]))),
                             causal};

  OpRecorder<B> rec(op, {q, k, v}, 4.0 * static_cast<double>(sizes.n * sizes.tq * sizes.tk * sizes.d));
  const DType dtype = rec.compute_dtype();
  Tensor<B> tq = rec.input(0), tk = rec.input(1), tv = rec.input(2);
  SavedTensor<B> saved_q = rec.save(tq), saved_k = rec.save(tk), saved_v = rec.save(tv);
  auto out = rec.compute([&] {
    Tensor<B> o = new_tensor(rec.backend(), sq, dtype);
    Tensor<B> lse = new_tensor(rec.backend(), Shape{sizes.n, sizes.tq}, accumulator_dtype(dtype));
    rec.backend().attention(tq, tk, tv, o, lse, sizes);
    return Outputs<B>{o, lse};
  });
  SavedTensor<B> saved_lse = rec.save(out[1]);
  return rec.finish(out[0], [=](const Grads<B>& g) {
    const Tensor<B> q_ = saved_q.unpack(), k_ = saved_k.unpack(), v_ = saved_v.unpack(), lse = saved_lse.unpack();
    B& backend = q_.backend();
    Tensor<B> dq = new_tensor(backend, q_.shape(), q_.dtype());
    Tensor<B> dk = new_tensor(backend, k_.shape(), k_.dtype());
    Tensor<B> dv = new_tensor(backend, v_.shape(), v_.dtype());
    const Tensor<B> delta = new_tensor(backend, lse.shape(), lse.dtype());
    backend.attention_backward(q_, k_, v_, lse, g[0].to(q_.dtype()), dq, dk, dv, delta, sizes);
    return Grads<B>{dq, dk, dv};
  });
}

}  // namespace trainmem

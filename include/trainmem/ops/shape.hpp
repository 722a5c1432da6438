// trainmem/ops/shape.hpp — reshape, transpose, attention head split/merge, causal mask.
//
// Reshape is a free view and keeps nothing. Transpose and head split/merge are one
// kernel (swap the two middle axes of [a, b, c, d]) whose backward is the same swap
// back. The causal mask keeps nothing either: backward zeroes the same entries.
#pragma once

#include <limits>

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kReshapeOp{"reshape", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kTransposeOp{"transpose", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kSplitHeadsOp{"split_heads", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kMergeHeadsOp{"merge_heads", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kCausalMaskOp{"causal_mask", OpKind::Shape, AutocastCategory::Unchanged};

/// [a, b, c, d] -> [a, c, b, d] as an op; `out_shape` names the result.
template <class B>
Var<B> swap_middle(const OpInfo& op, const Var<B>& x, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d,
                   Shape out_shape) {
  OpRecorder<B> rec(op, {x}, 0.0);
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, dtype);
    rec.backend().swap_middle_axes(tx, y, a, b, c, d);
    return Outputs<B>{y};
  });
  const Shape in_shape = x.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dx = new_tensor(g[0].backend(), in_shape, g[0].dtype());
    g[0].backend().swap_middle_axes(g[0], dx, a, c, b, d);
    return Grads<B>{dx};
  });
}
}  // namespace detail

/// The same values with new extents (a view; no copy, nothing saved).
template <class B>
Var<B> reshape(const Var<B>& x, Shape shape) {
  const auto& op = detail::kReshapeOp;
  detail::check(shape.numel() == x.numel(), "reshape: cannot view ", x.shape(), " (", x.numel(), " elements) as ",
                shape, " (", shape.numel(), " elements)");
  OpRecorder<B> rec(op, {x}, 0.0);
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] { return Outputs<B>{tx.reshape(shape)}; });
  const Shape in_shape = x.shape();
  return rec.finish(out[0], [=](const Grads<B>& g) { return Grads<B>{g[0].reshape(in_shape)}; });
}

/// Swaps the last two axes: [..., r, c] -> [..., c, r].
template <class B>
Var<B> transpose(const Var<B>& x) {
  const auto& op = detail::kTransposeOp;
  detail::require_rank_at_least(op, x, 2, "x");
  const auto& s = x.shape();
  const std::int64_t r = s[s.rank() - 2], c = s[s.rank() - 1];
  auto dims = s.dims();
  std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
  return detail::swap_middle(op, x, s.leading(2), r, c, 1, Shape(dims));
}

/// [batch, T, H*Dh] -> [batch*H, T, Dh]: one attention matrix per (sequence, head).
template <class B>
Var<B> split_heads(const Var<B>& x, std::int64_t heads) {
  const auto& op = detail::kSplitHeadsOp;
  detail::check(x.shape().rank() == 3 && heads > 0 && x.shape()[2] % heads == 0, "split_heads: x ", x.shape(),
                " must be [batch, T, H*Dh] with H = ", heads, " dividing the last extent");
  const std::int64_t batch = x.shape()[0], t = x.shape()[1], dh = x.shape()[2] / heads;
  return detail::swap_middle(op, x, batch, t, heads, dh, Shape{batch * heads, t, dh});
}

/// [batch*H, T, Dh] -> [batch, T, H*Dh]: inverse of split_heads.
template <class B>
Var<B> merge_heads(const Var<B>& x, std::int64_t heads) {
  const auto& op = detail::kMergeHeadsOp;
  detail::check(x.shape().rank() == 3 && heads > 0 && x.shape()[0] % heads == 0, "merge_heads: x ", x.shape(),
                " must be [batch*H, T, Dh] with H = ", heads, " dividing the first extent");
  const std::int64_t batch = x.shape()[0] / heads, t = x.shape()[1], dh = x.shape()[2];
  return detail::swap_middle(op, x, batch, heads, t, dh, Shape{batch, t, heads * dh});
}

/// Sets scores[..., i, j] to -inf where j > i (a query may not see later keys).
template <class B>
Var<B> causal_mask(const Var<B>& scores) {
  const auto& op = detail::kCausalMaskOp;
  detail::require_rank_at_least(op, scores, 2, "scores");
  const auto& s = scores.shape();
  detail::check(s[s.rank() - 1] == s[s.rank() - 2], "causal_mask: scores must be [..., T, T], got ", s);
  OpRecorder<B> rec(op, {scores}, 0.0);
  const DType dtype = rec.compute_dtype();
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), tx.shape(), dtype);
    rec.backend().causal_mask(tx, y, -std::numeric_limits<double>::infinity());
    return Outputs<B>{y};
  });
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dx = new_tensor(g[0].backend(), g[0].shape(), g[0].dtype());
    g[0].backend().causal_mask(g[0], dx, 0.0);
    return Grads<B>{dx};
  });
}

}  // namespace trainmem

// trainmem/ops/slice_concat.hpp — slice takes a range of one axis out; concat joins tensors along one.
//
// Both are block copies of the [outer, extent, inner] view around the axis
// (core/axis_view.hpp): `outer` runs, each a contiguous stretch of extent * inner
// elements, copied by the backend's copy_rows (cudaMemcpy2DAsync on the GPU). Neither
// keeps anything: slice's backward writes the gradient into zeros at the same place,
// concat's hands each input its own stretch of the gradient. Concat runs in the widest
// input dtype (autocast's "promote" category, as torch.cat); slice keeps the dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainmem/ops/op_helpers.hpp"

namespace trainmem {

namespace detail {
inline constexpr OpInfo kSliceOp{"slice", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kConcatOp{"concat", OpKind::Shape, AutocastCategory::Promote};

/// `axis` (negative counts from the last) as an index below `rank`, or an Error naming the op.
inline std::size_t resolve_axis(const OpInfo& op, int axis, const Shape& shape) {
  const auto rank = static_cast<int>(shape.rank());
  check(rank >= 1, op.name, ": a scalar has no axis ", axis);
  check(axis >= -rank && axis < rank, op.name, ": axis ", axis, " is out of range for ", shape, " (rank ", rank, ")");
  return static_cast<std::size_t>(axis < 0 ? axis + rank : axis);
}

/// Copies the [outer, count, inner] block starting at `from` along the axis of `src`
/// (seen as `src_view`) into `dst` at `to` along its axis (seen as `dst_view`).
template <class B>
void copy_block(const Tensor<B>& src, const AxisView& src_view, std::int64_t from, const Tensor<B>& dst,
                const AxisView& dst_view, std::int64_t to, std::int64_t count) {
  const auto element = static_cast<std::size_t>(size_of(src.dtype()));
  const auto inner = static_cast<std::size_t>(src_view.inner) * element;
  src.backend().copy_rows(static_cast<std::byte*>(dst.data()) + static_cast<std::size_t>(to) * inner,
                          static_cast<std::size_t>(dst_view.extent) * inner,
                          static_cast<const std::byte*>(src.data()) + static_cast<std::size_t>(from) * inner,
                          static_cast<std::size_t>(src_view.extent) * inner, static_cast<std::size_t>(count) * inner,
                          static_cast<std::size_t>(src_view.outer));
}
}  // namespace detail

/// Elements begin .. end - 1 of `axis` (negative counts from the last), as a new tensor:
/// slice(x [B, T, C], -1, 0, C / 2) is the first half of every row.
template <class B>
Var<B> slice(const Var<B>& x, int axis, std::int64_t begin, std::int64_t end) {
  const auto& op = detail::kSliceOp;
  detail::require_floating(op, x, "x");
  const std::size_t at = detail::resolve_axis(op, axis, x.shape());
  const std::int64_t extent = x.shape()[at];
  detail::check(0 <= begin && begin <= end && end <= extent, op.name, ": range [", begin, ", ", end,
                ") is not within axis ", at, " of ", x.shape(), " (extent ", extent, ")");
  std::vector<std::int64_t> dims = x.shape().dims();
  dims[at] = end - begin;
  const Shape out_shape(dims), in_shape = x.shape();
  const AxisView in_view = axis_view(in_shape, at), out_view = axis_view(out_shape, at);

  OpRecorder<B> rec(op, {x}, 0.0);
  Tensor<B> tx = rec.input(0);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, tx.dtype());
    detail::copy_block(tx, in_view, begin, y, out_view, 0, end - begin);
    return Outputs<B>{y};
  });
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Tensor<B> dx = Tensor<B>::zeros(in_shape, g[0].dtype(), MemCategory::Temporary, g[0].backend());
    detail::copy_block(g[0], out_view, 0, dx, in_view, begin, end - begin);
    return Grads<B>{dx};
  });
}

/// The parts joined along `axis` (negative counts from the last); every other extent must
/// agree: concat({a [B, T, C1], b [B, T, C2]}, -1) is [B, T, C1 + C2].
template <class B>
Var<B> concat(const std::vector<Var<B>>& parts, int axis) {
  const auto& op = detail::kConcatOp;
  detail::check(!parts.empty(), op.name, ": nothing to join (no parts)");
  for (std::size_t i = 0; i < parts.size(); ++i) detail::require_floating(op, parts[i], "every part");
  const Shape& first = parts.front().shape();
  const std::size_t at = detail::resolve_axis(op, axis, first);
  std::vector<std::int64_t> dims = first.dims();
  std::vector<std::int64_t> offsets;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Shape& s = parts[i].shape();
    bool agrees = s.rank() == first.rank();
    for (std::size_t k = 0; agrees && k < s.rank(); ++k) agrees = k == at || s[k] == first[k];
    detail::check(agrees, op.name, ": part ", i, " ", s, " does not line up with part 0 ", first,
                  " (every extent but axis ", at, " must agree)");
    offsets.push_back(total);
    total += s[at];
  }
  dims[at] = total;
  const Shape out_shape(dims);
  const AxisView out_view = axis_view(out_shape, at);
  std::vector<Shape> shapes;
  for (const Var<B>& p : parts) shapes.push_back(p.shape());

  OpRecorder<B> rec(op, parts, 0.0);
  std::vector<Tensor<B>> inputs;
  for (std::size_t i = 0; i < parts.size(); ++i) inputs.push_back(rec.input(i));
  std::vector<bool> needs(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) needs[i] = rec.needs_grad(i);
  auto out = rec.compute([&] {
    Tensor<B> y = new_tensor(rec.backend(), out_shape, rec.compute_dtype());
    for (std::size_t i = 0; i < inputs.size(); ++i)
      detail::copy_block(inputs[i], axis_view(shapes[i], at), 0, y, out_view, offsets[i], shapes[i][at]);
    return Outputs<B>{y};
  });
  return rec.finish(out[0], [=](const Grads<B>& g) {
    Grads<B> grads(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      if (!needs[i]) continue;
      grads[i] = new_tensor(g[0].backend(), shapes[i], g[0].dtype());
      detail::copy_block(g[0], out_view, offsets[i], grads[i], axis_view(shapes[i], at), 0, shapes[i][at]);
    }
    return grads;
  });
}

}  // namespace trainmem

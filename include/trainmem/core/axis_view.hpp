// trainmem/core/axis_view.hpp — a tensor seen as [outer, extent, inner] around one axis.
//
// Reducing over an axis and broadcasting back over it are the same picture: element
// (o, e, i) of the full tensor pairs with element (o, i) of the reduced one. Every
// broadcast a binary op accepts is one such view of a: the same shape (extent 1), a
// scalar (outer = inner = 1), a bias row (outer = 1), or a with one axis collapsed to 1
// (a keepdim reduction's result: [rows, 1] is a column per row).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "trainmem/core/shape.hpp"

namespace trainmem {

/// \brief A tensor viewed as [outer, extent, inner]; its reduced partner is [outer, inner].
struct AxisView {
  std::int64_t outer = 1, extent = 1, inner = 1;

  std::int64_t numel() const { return outer * extent * inner; }
  std::int64_t reduced_numel() const { return outer * inner; }
};

/// `shape` around `axis` (which must be < rank).
inline AxisView axis_view(const Shape& shape, std::size_t axis) {
  AxisView v;
  for (std::size_t k = 0; k < shape.rank(); ++k) {
    if (k < axis) v.outer *= shape[k];
    else if (k == axis) v.extent = shape[k];
    else v.inner *= shape[k];
  }
  return v;
}

/// The one axis where b is 1 and a is not, when b has a's rank and every other extent.
inline std::optional<std::size_t> collapsed_axis(const Shape& a, const Shape& b) {
  if (a.rank() != b.rank()) return std::nullopt;
  std::optional<std::size_t> collapsed;
  for (std::size_t k = 0; k < a.rank(); ++k) {
    if (a[k] == b[k]) continue;
    if (b[k] != 1 || collapsed) return std::nullopt;
    collapsed = k;
  }
  return collapsed;
}

/// How b lines up with a in a binary op, as a view of a whose reduced partner is b; none
/// when b is none of: a's element count, one element, a with one axis collapsed to 1, or a
/// row of a's last extent.
inline std::optional<AxisView> broadcast_view(const Shape& a, const Shape& b) {
  const std::int64_t n = a.numel();
  if (b.numel() == n) return AxisView{1, 1, n};
  if (b.numel() == 1) return AxisView{1, n, 1};
  if (const auto axis = collapsed_axis(a, b)) return axis_view(a, *axis);
  if (a.rank() >= 1 && a.back() > 0 && b.numel() == a.back()) return AxisView{1, n / a.back(), a.back()};
  return std::nullopt;
}

}  // namespace trainmem

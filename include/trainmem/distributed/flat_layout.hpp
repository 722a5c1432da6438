// trainmem/distributed/flat_layout.hpp — a parameter list as one index space, cut into shards and buckets.
//
// Parameter i occupies elements [offset(i), offset(i) + numel(i)) of a flat index space,
// in list order. Rank r of N owns [r c, min((r + 1) c, Ψ)) with c = ceil(Ψ / N): a
// contiguous range, the same on every rank, empty for the last ranks when Ψ is small
// (Ψ = 4 on 3 ranks gives 2, 2, 0). Communication walks the space in windows of at
// most one bucket; a window's pieces say which part of which parameter lies where in
// it, so no buffer ever spans more than a bucket, however large the model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trainmem/autograd/var.hpp"
#include "trainmem/core/tensor.hpp"

namespace trainmem::dist {

/// \brief A half-open range [begin, end) of the flat index space.
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

/// \brief The part of parameter `param` at [param_offset, param_offset + count) of its
/// elements, which sits at `window_offset` in a window.
struct Piece {
  std::size_t param;
  std::int64_t param_offset, window_offset, count;
};

/// Elements [begin, end) of `t` as a 1-D view (t is contiguous).
template <class B>
Tensor<B> flat_view(const Tensor<B>& t, std::int64_t begin, std::int64_t end) {
  return t.reshape(Shape{t.numel()}).slice(begin, end);
}

/// Rank `rank`'s shard of `total` elements over `size` ranks.
inline Range shard_range(std::int64_t total, int rank, int size) {
  const std::int64_t c = (total + size - 1) / size;
  return {std::min(total, rank * c), std::min(total, (rank + 1) * c)};
}

/// How many elements of `window` each rank's shard of `total` holds.
inline std::vector<std::int64_t> shard_counts(Range window, std::int64_t total, int size) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) {
    const Range s = shard_range(total, q, size);
    counts[static_cast<std::size_t>(q)] =
        std::max<std::int64_t>(0, std::min(s.end, window.end) - std::max(s.begin, window.begin));
  }
  return counts;
}

/// \brief Where each parameter of a list lies in the flat index space.
class FlatLayout {
 public:
  FlatLayout() = default;
  template <class B>
  explicit FlatLayout(const std::vector<Var<B>>& params) {
    offsets_.push_back(0);
    for (const Var<B>& p : params) offsets_.push_back(offsets_.back() + p.numel());
  }

  std::size_t count() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  std::int64_t total() const { return offsets_.empty() ? 0 : offsets_.back(); }
  std::int64_t offset(std::size_t i) const { return offsets_[i]; }
  std::int64_t numel(std::size_t i) const { return offsets_[i + 1] - offsets_[i]; }

  /// Calls fn(Piece) for every non-empty part of a parameter inside `window`, in order.
  template <class Fn>
  void for_each_piece(Range window, Fn&& fn) const {
    if (window.empty()) return;
    // The first parameter whose end lies past window.begin.
    auto it = std::upper_bound(offsets_.begin(), offsets_.end(), window.begin);
    for (std::size_t i = static_cast<std::size_t>(it - offsets_.begin()) - 1; i < count(); ++i) {
      const std::int64_t begin = std::max(window.begin, offsets_[i]);
      const std::int64_t end = std::min(window.end, offsets_[i + 1]);
      if (offsets_[i] >= window.end) break;
      if (end > begin) fn(Piece{i, begin - offsets_[i], begin - window.begin, end - begin});
    }
  }

  /// Calls fn(Range) for consecutive windows of at most `bucket` elements covering `range`.
  template <class Fn>
  static void for_each_window(Range range, std::int64_t bucket, Fn&& fn) {
    for (std::int64_t begin = range.begin; begin < range.end; begin += bucket)
      fn(Range{begin, std::min(range.end, begin + bucket)});
  }

 private:
  std::vector<std::int64_t> offsets_;
};

}  // namespace trainmem::dist

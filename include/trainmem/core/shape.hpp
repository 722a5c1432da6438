// trainmem/core/shape.hpp — tensor extents, row-major.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "trainmem/error.hpp"

namespace trainmem {

/// \brief Extents of a contiguous row-major tensor. A scalar has rank 0 and numel 1.
///
/// The extents live inline (up to kMaxRank of them): every op makes a few Shapes, and a
/// heap allocation each was a large part of an op's host time on small tensors.
class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) { assign(dims.begin(), dims.size()); }
  explicit Shape(const std::vector<std::int64_t>& dims) { assign(dims.data(), dims.size()); }

  std::size_t rank() const { return rank_; }
  std::int64_t operator[](std::size_t axis) const {
    detail::check(axis < rank_, "Shape: axis ", axis, " of ", *this, " (rank ", rank_, ")");
    return dims_[axis];
  }
  std::int64_t back() const { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }
  /// The extents, as a view of this Shape.
  std::span<const std::int64_t> extents() const { return {dims_.data(), rank_}; }
  /// This shape with its last extent set to `last` (a rank-0 shape becomes [last]).
  Shape with_back(std::int64_t last) const {
    Shape out = *this;
    if (out.rank_ == 0) out.rank_ = 1;
    out.dims_[out.rank_ - 1] = last;
    out.validate();
    return out;
  }
  /// The extents as a vector, to edit into another Shape.
  std::vector<std::int64_t> dims() const { return {dims_.begin(), dims_.begin() + rank_}; }

  /// Checked at construction to fit int64 (so no product of extents here can overflow).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : extents()) n *= d;
    return n;
  }
  /// Product of all but the last extent: the number of rows of a [rows, cols] view.
  /// A product, not numel() / back(): a last extent of 0 leaves the rows as they are.
  std::int64_t rows() const { return leading(1); }
  /// Product of all but the last `trailing` extents (1 for a rank <= trailing).
  std::int64_t leading(std::size_t trailing) const {
    std::int64_t n = 1;
    for (std::size_t i = 0; i + trailing < rank_; ++i) n *= dims_[i];
    return n;
  }

  bool operator==(const Shape& other) const {
    return rank_ == other.rank_ && std::equal(dims_.begin(), dims_.begin() + rank_, other.dims_.begin());
  }

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const Shape& shape) {
    out << '[';
    for (std::size_t i = 0; i < shape.rank_; ++i) out << (i ? ", " : "") << shape.dims_[i];
    return out << ']';
  }

 private:
  void assign(const std::int64_t* dims, std::size_t rank) {
    if (rank > kMaxRank) {
      std::ostringstream listed;
      for (std::size_t i = 0; i < rank; ++i) listed << (i ? ", " : "") << dims[i];
      detail::check(false, "Shape: [", listed.str(), "] has rank ", rank, "; at most ", kMaxRank,
                    " extents are supported");
    }
    std::copy(dims, dims + rank, dims_.begin());
    rank_ = static_cast<std::uint8_t>(rank);
    validate();
  }
  void validate() const {
    for (auto d : extents()) detail::check(d >= 0, "Shape: negative extent in ", *this);
    for (auto d : extents())
      if (d == 0) return;  // an empty tensor: every product is 0
    std::int64_t n = 1;
    for (auto d : extents()) {
      detail::check(!__builtin_mul_overflow(n, d, &n), "Shape: ", *this,
                    " has more elements than an int64 holds (2^63 - 1)");
    }
  }
  std::array<std::int64_t, kMaxRank> dims_{};
  std::uint8_t rank_ = 0;
};

}  // namespace trainmem

// trainmem/core/shape.hpp — tensor extents, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "trainmem/error.hpp"

namespace trainmem {

/// \brief Extents of a contiguous row-major tensor. A scalar has rank 0 and numel 1.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) { validate(); }
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) { validate(); }

  std::size_t rank() const { return dims_.size(); }
  std::int64_t operator[](std::size_t axis) const { return dims_.at(axis); }
  std::int64_t back() const { return dims_.empty() ? 1 : dims_.back(); }
  const std::vector<std::int64_t>& dims() const { return dims_; }

  /// Checked at construction to fit int64 (so no product of extents here can overflow).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  /// Product of all but the last extent: the number of rows of a [rows, cols] view.
  /// A product, not numel() / back(): a last extent of 0 leaves the rows as they are.
  std::int64_t rows() const { return leading(1); }
  /// Product of all but the last `trailing` extents (1 for a rank <= trailing).
  std::int64_t leading(std::size_t trailing) const {
    std::int64_t n = 1;
    for (std::size_t i = 0; i + trailing < dims_.size(); ++i) n *= dims_[i];
    return n;
  }

  bool operator==(const Shape&) const = default;

  std::string str() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const Shape& shape) {
    out << '[';
    for (std::size_t i = 0; i < shape.dims_.size(); ++i) out << (i ? ", " : "") << shape.dims_[i];
    return out << ']';
  }

 private:
  void validate() const {
    for (auto d : dims_) detail::check(d >= 0, "Shape: negative extent in ", *this);
    for (auto d : dims_)
      if (d == 0) return;  // an empty tensor: every product is 0
    std::int64_t n = 1;
    for (auto d : dims_) {
      detail::check(!__builtin_mul_overflow(n, d, &n), "Shape: ", *this,
                    " has more elements than an int64 holds (2^63 - 1)");
    }
  }
  std::vector<std::int64_t> dims_;
};

}  // namespace trainmem

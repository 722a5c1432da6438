// trainmem/core/small_vector.hpp — a vector whose first N elements need no heap.
//
// Every recorded op keeps a handful of short lists (its input edges, its gradients); a
// heap allocation for each was most of an op's host time on small tensors. SmallVector
// keeps up to N elements inline and moves them all to a std::vector the first time it
// grows past N, so its elements are always contiguous. Slots past size() hold
// default-constructed values: a dropped Tensor releases its bytes at once.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

namespace trainmem {

/// \brief A contiguous sequence with inline room for N elements (T default-constructible).
template <class T, std::size_t N>
class SmallVector {
 public:
  SmallVector() = default;
  explicit SmallVector(std::size_t count) { resize(count); }
  SmallVector(std::initializer_list<T> values) {
    if (values.size() > N) spill(values.size());
    for (const T& value : values) push_back(value);
  }
  SmallVector(const SmallVector&) = default;
  SmallVector& operator=(const SmallVector&) = default;
  SmallVector(SmallVector&& other) noexcept
      : inline_(std::move(other.inline_)), heap_(std::move(other.heap_)), size_(other.size_), on_heap_(other.on_heap_) {
    other.reset();
  }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      inline_ = std::move(other.inline_);
      heap_ = std::move(other.heap_);
      size_ = other.size_;
      on_heap_ = other.on_heap_;
      other.reset();
    }
    return *this;
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return on_heap_ ? heap_.data() : inline_.data(); }
  const T* data() const { return on_heap_ ? heap_.data() : inline_.data(); }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void push_back(T value) {
    if (on_heap_) {
      heap_.push_back(std::move(value));
    } else if (size_ < N) {
      inline_[size_] = std::move(value);
    } else {
      spill(size_ + 1);
      heap_.push_back(std::move(value));
    }
    ++size_;
  }
  /// Grows with default-constructed elements or drops the last ones.
  void resize(std::size_t count) {
    if (!on_heap_ && count > N) spill(count);
    if (on_heap_) {
      heap_.resize(count);
    } else {
      for (std::size_t i = count; i < size_; ++i) inline_[i] = T();
    }
    size_ = count;
  }
  void clear() { resize(0); }

 private:
  /// Moves the inline elements to the heap, with room for `capacity`.
  void spill(std::size_t capacity) {
    heap_.reserve(capacity);
    for (std::size_t i = 0; i < size_; ++i) {
      heap_.push_back(std::move(inline_[i]));
      inline_[i] = T();
    }
    on_heap_ = true;
  }
  void reset() {
    for (T& slot : inline_) slot = T();
    heap_.clear();
    size_ = 0;
    on_heap_ = false;
  }

  std::array<T, N> inline_{};
  std::vector<T> heap_;
  std::size_t size_ = 0;
  bool on_heap_ = false;
};

}  // namespace trainmem

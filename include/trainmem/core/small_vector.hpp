// trainmem/core/small_vector.hpp — a vector whose first N elements need no heap.
//
// Every recorded op keeps a handful of short lists (its input edges, its gradients, its
// outputs); a heap allocation for each was most of an op's host time on small tensors.
// SmallVector keeps up to N elements in raw inline storage and moves them to the heap the
// first time it grows past N, so its elements are always contiguous. Only live elements
// exist: making, moving or dropping a SmallVector of one Tensor touches one Tensor, and a
// dropped element is destroyed (its bytes released) at once.
#pragma once

#include <cstddef>
#include <iterator>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace trainmem {

/// \brief A contiguous sequence with inline room for N elements (T default-constructible).
template <class T, std::size_t N>
class SmallVector {
  static_assert(N > 0, "SmallVector needs inline room for at least one element");

 public:
  SmallVector() = default;
  explicit SmallVector(std::size_t count) { resize(count); }
  /// The given elements, each moved in when it is a temporary (`Grads<B>{dx, dw}`): unlike
  /// an initializer_list, which can only be copied from, no element is made twice. One
  /// integer alone is a count (the constructor above), never an element.
  template <class... Values>
  requires(
      sizeof...(Values) > 0 && (std::is_constructible_v<T, Values&&> && ...) &&
      !(sizeof...(Values) == 1 &&
        ((std::is_integral_v<std::remove_cvref_t<Values>> ||
          std::is_same_v<std::remove_cvref_t<Values>, SmallVector>)&&...))) explicit SmallVector(Values&&... values) {
    if (sizeof...(Values) > N) grow(sizeof...(Values));
    (push_back(T(std::forward<Values>(values))), ...);
  }
  /// The elements of any contiguous range (a std::vector, a span).
  template <class Range>
  requires std::is_convertible_v<decltype(*std::data(std::declval<const Range&>())), const T&>
  explicit SmallVector(const Range& values) { append(values); }
  SmallVector(const SmallVector& other) { append(other); }
  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) {
      clear();
      append(other);
    }
    return *this;
  }
  SmallVector(SmallVector&& other) noexcept { take(other); }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      clear();
      free_heap();
      take(other);
    }
    return *this;
  }
  ~SmallVector() {
    clear();
    free_heap();
  }

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T& front() { return data_[0]; }
  const T& front() const { return data_[0]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }

  void push_back(T value) {
    if (size_ == capacity_) grow(size_ + 1);
    ::new (static_cast<void*>(data_ + size_)) T(std::move(value));
    ++size_;
  }
  /// Grows with default-constructed elements or drops the last ones.
  void resize(std::size_t count) {
    if (count > capacity_) grow(count);
    for (; size_ < count; ++size_) ::new (static_cast<void*>(data_ + size_)) T();
    while (size_ > count) std::destroy_at(data_ + --size_);
  }
  void clear() { resize(0); }

 private:
  bool on_heap() const { return data_ != inline_data(); }
  T* inline_data() { return std::launder(reinterpret_cast<T*>(inline_)); }
  const T* inline_data() const { return std::launder(reinterpret_cast<const T*>(inline_)); }

  template <class Range>
  void append(const Range& values) {
    const std::size_t count = std::size(values);
    if (size_ + count > capacity_) grow(size_ + count);
    for (const T& value : values) push_back(value);
  }

  /// Moves the elements to a heap block with room for at least `needed`.
  void grow(std::size_t needed) {
    const std::size_t capacity = needed > 2 * capacity_ ? needed : 2 * capacity_;
    T* block = std::allocator<T>().allocate(capacity);
    for (std::size_t i = 0; i < size_; ++i) {
      ::new (static_cast<void*>(block + i)) T(std::move(data_[i]));
      std::destroy_at(data_ + i);
    }
    free_heap();
    data_ = block;
    capacity_ = capacity;
  }
  void free_heap() {
    if (on_heap()) std::allocator<T>().deallocate(data_, capacity_);
    data_ = inline_data();
    capacity_ = N;
  }
  /// Takes `other`'s elements (its heap block, or each inline element moved); leaves it empty.
  void take(SmallVector& other) noexcept {
    if (other.on_heap()) {
      data_ = other.data_;
      capacity_ = other.capacity_;
      size_ = other.size_;
      other.data_ = other.inline_data();
      other.capacity_ = N;
      other.size_ = 0;
      return;
    }
    for (std::size_t i = 0; i < other.size_; ++i) ::new (static_cast<void*>(data_ + i)) T(std::move(other.data_[i]));
    size_ = other.size_;
    other.clear();
  }

  alignas(T) std::byte inline_[N * sizeof(T)];
  T* data_ = inline_data();
  std::size_t size_ = 0;
  std::size_t capacity_ = N;
};

}  // namespace trainmem

// trainmem/core/tensor.hpp — a typed view of backend storage.
//
// A Tensor is (storage, byte offset, shape, dtype): contiguous and row-major, so a
// reshape or a slice of the leading dimension is a new view of the same storage and
// costs nothing. Storage frees itself through the backend allocator that made it, so
// MemoryStats sees every byte come and go. The version counter lives in the storage
// (shared by all views): an in-place write bumps it, and a saved tensor whose version
// moved is detected in backward instead of silently giving wrong gradients.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainmem/core/dtype.hpp"
#include "trainmem/core/math.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/core/shape.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

/// \brief Bytes from one backend allocation, freed through the same backend.
template <class B>
class Storage {
 public:
  Storage(B& backend, std::size_t bytes, MemCategory category)
      : backend_(&backend), bytes_(bytes), category_(category), data_(backend.allocate(bytes, category)) {}
  ~Storage() { backend_->deallocate(data_, bytes_, category_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  B& backend() const { return *backend_; }
  MemCategory category() const { return category_; }
  void retag(MemCategory category) {
    backend_->memory().on_retag(category_, category, bytes_);
    category_ = category;
  }
  std::uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

  /// Something keeps these bytes for backward: a temporary becomes a saved activation
  /// while at least one keeper holds it, and a temporary again after the last lets go.
  void add_saved_ref() {
    if (saved_refs_++ == 0 && category_ == MemCategory::Temporary) retag(MemCategory::SavedActivation);
  }
  void drop_saved_ref() {
    if (--saved_refs_ == 0 && category_ == MemCategory::SavedActivation) retag(MemCategory::Temporary);
  }

 private:
  B* backend_;
  std::size_t bytes_;
  MemCategory category_;
  void* data_;
  std::uint64_t version_ = 0;
  std::int64_t saved_refs_ = 0;
};

/// \brief Contiguous row-major tensor with a run-time dtype, on backend B.
template <class B>
class Tensor {
 public:
  Tensor() = default;

  /// Uninitialised tensor.
  static Tensor empty(Shape shape, DType dtype, MemCategory category = MemCategory::Temporary,
                      B& backend = B::default_instance()) {
    std::size_t bytes = 0;
    detail::check(!__builtin_mul_overflow(static_cast<std::size_t>(shape.numel()), size_of(dtype), &bytes),
                  "Tensor::empty: ", shape, " ", dtype, " needs more bytes than a size_t holds");
    return Tensor(std::make_shared<Storage<B>>(backend, bytes, category), 0, std::move(shape), dtype);
  }
  static Tensor zeros(Shape shape, DType dtype, MemCategory category = MemCategory::Temporary,
                      B& backend = B::default_instance()) {
    Tensor t = empty(std::move(shape), dtype, category, backend);
    backend.fill_zero(t.data(), t.bytes());
    return t;
  }
  /// Every element `value`, rounded to `dtype` once (to nearest even; beyond f16's range
  /// it is inf; FP8 saturates, NOTE [FP8 conversion rule]). A floating tensor is written by a kernel, not uploaded, so
  /// a step that makes one (backward's seed of 1) waits for no host-to-device copy. An i32 value must be a whole number
  /// in range.
  static Tensor full(Shape shape, double value, DType dtype, MemCategory category = MemCategory::Temporary,
                     B& backend = B::default_instance()) {
    detail::check(dtype != DType::I32 || is_i32(value), "Tensor::full: value ", value, " is not an i32 (", kNotI32,
                  ")");
    Tensor t = empty(std::move(shape), dtype, category, backend);
    if (dtype == DType::I32 || is_fp8(dtype)) {  // no kernel writes i32 or FP8: upload
      visit_dtype(dtype, [&]<class S>() {
        const std::vector<S> values(static_cast<std::size_t>(t.numel()), detail::narrow<S>(value));
        if (!values.empty()) backend.upload(t.data(), values.data(), t.bytes());
      });
      return t;
    }
    backend.fill(t, value);
    return t;
  }
  /// Uploads host values (float or double), converting to `dtype` with round to nearest even.
  /// Integer values (ids, labels) default to DType::I32 (see the overload below).
  template <class T>
  requires std::is_floating_point_v<T>
  static Tensor from_host(Shape shape, std::span<const T> values, DType dtype = DType::F32,
                          MemCategory category = MemCategory::Temporary, B& backend = B::default_instance()) {
    detail::check(static_cast<std::int64_t>(values.size()) == shape.numel(), "Tensor::from_host: shape ", shape,
                  " needs ", shape.numel(), " values, got ", values.size());
    if (dtype == DType::I32) {
      for (std::size_t i = 0; i < values.size(); ++i) {
        const double v = static_cast<double>(values[i]);
        detail::check(is_i32(v), "Tensor::from_host: value ", v, " at index ", i, " is not an i32 (", kNotI32, ")");
      }
    }
    Tensor t = empty(std::move(shape), dtype, category, backend);
    visit_dtype(dtype, [&]<class S>() {
      std::vector<S> converted(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) converted[i] = detail::narrow<S>(values[i]);
      backend.upload(t.data(), converted.data(), t.bytes());
    });
    return t;
  }
  template <class T>
  requires std::is_floating_point_v<T>
  static Tensor from_host(Shape shape, const std::vector<T>& values, DType dtype = DType::F32,
                          MemCategory category = MemCategory::Temporary, B& backend = B::default_instance()) {
    return from_host(std::move(shape), std::span<const T>(values), dtype, category, backend);
  }
  /// Uploads integer values (token ids, class labels; std::int32_t, std::int64_t, ...) as
  /// DType::I32 by default, exactly: no float on the way, so 16777217 stays 16777217. A
  /// value outside [-2^31, 2^31) is an Error naming it and its index. A floating `dtype`
  /// converts each value as static_cast would.
  template <class T>
  requires std::is_integral_v<T> &&(!std::is_same_v<T, bool>)static Tensor
      from_host(Shape shape, std::span<const T> values, DType dtype = DType::I32,
                MemCategory category = MemCategory::Temporary, B& backend = B::default_instance()) {
    detail::check(static_cast<std::int64_t>(values.size()) == shape.numel(), "Tensor::from_host: shape ", shape,
                  " needs ", shape.numel(), " values, got ", values.size());
    if (dtype != DType::I32) {
      std::vector<double> widened(values.begin(), values.end());
      return from_host(std::move(shape), std::span<const double>(widened), dtype, category, backend);
    }
    std::vector<std::int32_t> narrowed(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      detail::check(std::in_range<std::int32_t>(values[i]), "Tensor::from_host: value ", values[i], " at index ", i,
                    " does not fit in i32 [-2^31, 2^31)");
      narrowed[i] = static_cast<std::int32_t>(values[i]);
    }
    Tensor t = empty(std::move(shape), dtype, category, backend);
    if (!narrowed.empty()) backend.upload(t.data(), narrowed.data(), t.bytes());
    return t;
  }
  template <class T>
  requires std::is_integral_v<T> &&(!std::is_same_v<T, bool>)static Tensor
      from_host(Shape shape, const std::vector<T>& values, DType dtype = DType::I32,
                MemCategory category = MemCategory::Temporary, B& backend = B::default_instance()) {
    return from_host(std::move(shape), std::span<const T>(values), dtype, category, backend);
  }

  /// Downloads and widens to T (float or double).
  template <class T = float>
  std::vector<T> to_host() const {
    require_defined("to_host");
    std::vector<T> out(static_cast<std::size_t>(numel()));
    if (out.empty()) return out;
    visit_dtype(dtype_, [&]<class S>() {
      std::vector<S> raw(out.size());
      backend().download(raw.data(), data(), bytes());
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(detail::widen(raw[i]));
    });
    return out;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * size_of(dtype_); }
  std::int64_t rows() const { return shape_.rows(); }
  std::int64_t cols() const { return shape_.back(); }

  void* data() const { return static_cast<std::byte*>(storage_->data()) + offset_; }
  template <class T>
  T* data_as() const {
    detail::check(dtype_of<std::remove_const_t<T>>() == dtype_, "Tensor::data_as: tensor is ", dtype_, ", asked for ",
                  dtype_of<std::remove_const_t<T>>());
    return static_cast<T*>(data());
  }

  B& backend() const { return storage_->backend(); }
  const std::shared_ptr<Storage<B>>& storage() const { return storage_; }
  MemCategory category() const { return storage_->category(); }
  std::uint64_t version() const { return storage_->version(); }
  /// Record an in-place write (every mutating method calls this).
  void bump_version() const { storage_->bump_version(); }

  /// Same storage, new extents with the same element count.
  Tensor reshape(Shape shape) const {
    require_defined("reshape");
    detail::check(shape.numel() == numel(), "reshape: cannot view ", shape_, " (", numel(), " elements) as ", shape,
                  " (", shape.numel(), " elements)");
    return Tensor(storage_, offset_, std::move(shape), dtype_);
  }
  /// Rows [begin, end) of the leading dimension, as a view.
  Tensor slice(std::int64_t begin, std::int64_t end) const {
    require_defined("slice");
    detail::check(shape_.rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice: range [", begin, ", ",
                  end, ") is outside the leading dimension of ", shape_);
    auto dims = shape_.dims();
    const std::size_t row_bytes = bytes() / static_cast<std::size_t>(dims[0] == 0 ? 1 : dims[0]);
    dims[0] = end - begin;
    return Tensor(storage_, offset_ + static_cast<std::size_t>(begin) * row_bytes, Shape(std::move(dims)), dtype_);
  }

  /// The values in `dtype` (round to nearest even once; beyond f16's range they are inf)
  /// as a new tensor of `category`, or this tensor itself, category unchanged, when it is
  /// `dtype` already. Casts are between floating dtypes: i32 holds ids, not quantities.
  Tensor to(DType dtype, MemCategory category = MemCategory::Temporary) const {
    require_defined("Tensor::to");
    if (dtype == dtype_) return *this;
    detail::check(is_floating(dtype_) && is_floating(dtype) && !is_fp8(dtype_) && !is_fp8(dtype),
                  "Tensor::to: cannot cast ", shape_, " ", dtype_, " to ", dtype,
                  "; casts are between f32, f64, f16 and bf16 (FP8 takes a scale: the backend's quantize_fp8 / "
                  "dequantize_fp8, quantize/dequantize first)");
    Tensor out = empty(shape_, dtype, category, backend());
    backend().map(math::Identity{}, *this, out);
    return out;
  }

  /// A new tensor with the same values.
  Tensor clone(MemCategory category = MemCategory::Temporary) const {
    require_defined("clone");
    Tensor t = empty(shape_, dtype_, category, backend());
    backend().copy(t.data(), data(), bytes());
    return t;
  }
  /// Copies `source` (same shape and dtype) into this tensor in place.
  void copy_from(const Tensor& source) const {
    require_defined("copy_from");
    detail::check(source.shape() == shape_ && source.dtype() == dtype_, "copy_from: destination is ", shape_, " ",
                  dtype_, ", source is ", source.shape(), " ", source.dtype());
    backend().copy(data(), source.data(), bytes());
    bump_version();
  }
  void zero_() const {
    backend().fill_zero(data(), bytes());
    bump_version();
  }

  bool same_storage(const Tensor& other) const { return storage_ == other.storage_; }
  /// Whether the two share at least one byte (views of one storage that do not overlap do not).
  bool overlaps(const Tensor& other) const {
    return same_storage(other) && bytes() > 0 && other.bytes() > 0 && offset_ < other.offset_ + other.bytes() &&
           other.offset_ < offset_ + bytes();
  }

  /// \brief A handle that does not keep the bytes alive: `lock()` is the tensor while
  /// something else keeps its storage, undefined once nothing does.
  class Weak {
   public:
    Weak() = default;
    explicit Weak(const Tensor& t) : storage_(t.storage_), offset_(t.offset_), shape_(t.shape_), dtype_(t.dtype_) {}
    Tensor lock() const {
      std::shared_ptr<Storage<B>> storage = storage_.lock();
      return storage ? Tensor(std::move(storage), offset_, shape_, dtype_) : Tensor();
    }

   private:
    std::weak_ptr<Storage<B>> storage_;
    std::size_t offset_ = 0;
    Shape shape_;
    DType dtype_ = DType::F32;
  };

 private:
  Tensor(std::shared_ptr<Storage<B>> storage, std::size_t offset, Shape shape, DType dtype)
      : storage_(std::move(storage)), offset_(offset), shape_(std::move(shape)), dtype_(dtype) {}
  void require_defined(const char* op) const { detail::check(defined(), op, ": tensor is undefined"); }
  /// Ids and labels: a value that is not an i32 exactly has no meaning, so it is refused, not rounded.
  static bool is_i32(double value) {
    return value == std::floor(value) && value >= -2147483648.0 && value <= 2147483647.0;
  }
  static constexpr const char* kNotI32 = "NaN, infinite, fractional or outside [-2^31, 2^31)";

  std::shared_ptr<Storage<B>> storage_;
  std::size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace trainmem

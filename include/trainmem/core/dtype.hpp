// trainmem/core/dtype.hpp — the run-time element type of a tensor.
//
// Autocast changes precision op by op, so dtype is a run-time property of a tensor
// while the backend is a compile-time one. `visit_dtype` turns the run-time value
// back into a C++ type exactly once, at the edge of each kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "trainmem/core/bfloat16.hpp"
#include "trainmem/core/half.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

/// Floating dtypes for values; I32 for labels and token ids.
enum class DType : std::uint8_t { F32, F64, F16, BF16, I32 };

constexpr std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

constexpr std::string_view name_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << name_of(dtype); }

constexpr bool is_16bit(DType dtype) { return dtype == DType::F16 || dtype == DType::BF16; }
constexpr bool is_floating(DType dtype) { return dtype != DType::I32; }

/// The dtype that holds both without loss of range: f64 > f32 > {f16, bf16};
/// f16 with bf16 widens to f32 (neither holds the other).
constexpr DType widest(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::F64 || b == DType::F64) return DType::F64;
  if (a == DType::I32) return b;
  if (b == DType::I32) return a;
  return DType::F32;
}

/// C++ storage type of a dtype.
template <DType D>
struct StorageOf;
// clang-format off
template <> struct StorageOf<DType::F32>  { using type = float; };
template <> struct StorageOf<DType::F64>  { using type = double; };
template <> struct StorageOf<DType::F16>  { using type = Half; };
template <> struct StorageOf<DType::BF16> { using type = BFloat16; };
template <> struct StorageOf<DType::I32>  { using type = std::int32_t; };
// clang-format on

/// dtype of a C++ storage type.
template <class T>
constexpr DType dtype_of();
// clang-format off
template <> constexpr DType dtype_of<float>()        { return DType::F32; }
template <> constexpr DType dtype_of<double>()       { return DType::F64; }
template <> constexpr DType dtype_of<Half>()         { return DType::F16; }
template <> constexpr DType dtype_of<BFloat16>()     { return DType::BF16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::I32; }
// clang-format on

/// Accumulator type for a storage type: double for double and for integers (exact for
/// every i32), float for the floating types.
template <class T>
using AccumulatorOf = std::conditional_t<std::is_same_v<T, double> || std::is_integral_v<T>, double, float>;
/// Accumulator type for a kernel touching several storage types: double if any is double.
template <class... Ts>
using AccumulatorFor = std::conditional_t<(std::is_same_v<Ts, double> || ...), double, float>;

/// Calls `fn.template operator()<T>()` with T the storage type of `dtype`.
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<Half>();
    case DType::BF16: return fn.template operator()<BFloat16>();
    case DType::I32: return fn.template operator()<std::int32_t>();
  }
  throw Error("visit_dtype: unknown dtype");
}

/// As visit_dtype, for kernels that only make sense on floating dtypes.
template <class Fn>
decltype(auto) visit_floating(DType dtype, const char* op, Fn&& fn) {
  detail::check(is_floating(dtype), op, ": expected a floating dtype, got ", dtype);
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<Half>();
    default: return fn.template operator()<BFloat16>();
  }
}

namespace detail {
/// Widen a stored element to its accumulator type; narrow back on store.
template <class T>
TRAINMEM_HOST_DEVICE AccumulatorOf<T> widen(T value) {
  return static_cast<AccumulatorOf<T>>(value);
}
/// double -> float rounding to odd: a later rounding to a narrower format (f16, bf16)
/// then rounds exactly once, as if from the double (float keeps > 2p+1 bits for both).
TRAINMEM_HOST_DEVICE float to_float_round_to_odd(double value) {
  const float nearest = static_cast<float>(value);
  if (static_cast<double>(nearest) == value || nearest != nearest) return nearest;
  std::uint32_t bits = float_bits(nearest);
  const bool rounded_away = (nearest > 0) == (static_cast<double>(nearest) > value);  // |nearest| > |value|
  if (rounded_away && (bits & 0x7fffffffu) != 0) bits -= 1;  // step back toward zero: truncation
  return bits_float(bits | 1u);
}

template <class T, class A>
TRAINMEM_HOST_DEVICE T narrow(A value) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    if constexpr (std::is_same_v<A, double>) return T(to_float_round_to_odd(value));
    else return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}
}  // namespace detail

}  // namespace trainmem

namespace trainmem {
/// The dtype statistics and reductions of a `dtype` tensor are kept in: f64 for f64, else f32.
constexpr DType accumulator_dtype(DType dtype) { return dtype == DType::F64 ? DType::F64 : DType::F32; }
}  // namespace trainmem

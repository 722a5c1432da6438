// trainmem/core/dtype.hpp — the run-time element type of a tensor.
//
// Autocast changes precision op by op, so dtype is a run-time property of a tensor
// while the backend is a compile-time one. `visit_dtype` turns the run-time value
// back into a C++ type exactly once, at the edge of each kernel.
//
// The FP8 dtypes (F8E4M3, F8E5M2; core/float8.hpp) are storage formats: tensors of them
// are created, copied, moved between host and device and saved, but only the FP8
// kernels (quantize_fp8, dequantize_fp8, gemm_fp8; HasFp8 in core/backend_contract.hpp)
// read or write their values. `visit_floating` refuses them, so no other kernel is
// ever instantiated for an FP8 element type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "trainmem/core/bfloat16.hpp"
#include "trainmem/core/float8.hpp"
#include "trainmem/core/half.hpp"
#include "trainmem/error.hpp"

namespace trainmem {

/// Floating dtypes for values; I32 for labels and token ids; the FP8 storage formats.
/// The codes are stable (state files store them through StateType): append only.
enum class DType : std::uint8_t { F32, F64, F16, BF16, I32, F8E4M3, F8E5M2 };

constexpr std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
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
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << name_of(dtype); }

constexpr bool is_16bit(DType dtype) { return dtype == DType::F16 || dtype == DType::BF16; }
constexpr bool is_floating(DType dtype) { return dtype != DType::I32; }
/// The 8-bit storage formats: only the FP8 kernels take them (see the top of this file).
constexpr bool is_fp8(DType dtype) { return dtype == DType::F8E4M3 || dtype == DType::F8E5M2; }

/// The dtype that holds both without loss of range: f64 > f32 > {f16, bf16};
/// f16 with bf16 widens to f32 (neither holds the other). Every FP8 value is an f16 and a
/// bf16 value, so an FP8 dtype with any wider one gives the wider one, and E4M3 with E5M2 f16.
constexpr DType widest(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::F64 || b == DType::F64) return DType::F64;
  if (a == DType::I32) return b;
  if (b == DType::I32) return a;
  if (is_fp8(a) && is_fp8(b)) return DType::F16;
  if (is_fp8(a)) return b;
  if (is_fp8(b)) return a;
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
template <> struct StorageOf<DType::F8E4M3> { using type = Float8E4M3; };
template <> struct StorageOf<DType::F8E5M2> { using type = Float8E5M2; };
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
template <> constexpr DType dtype_of<Float8E4M3>()   { return DType::F8E4M3; }
template <> constexpr DType dtype_of<Float8E5M2>()   { return DType::F8E5M2; }
// clang-format on

/// Accumulator type for a storage type: double for double and for integers (exact for
/// every i32), float for the floating types.
template <class T>
using AccumulatorOf = std::conditional_t<std::is_same_v<T, double> || std::is_integral_v<T>, double, float>;
/// Accumulator type for a kernel touching several storage types: double if any is double.
template <class... Ts>
using AccumulatorFor = std::conditional_t<(std::is_same_v<Ts, double> || ...), double, float>;

/// Calls `fn.template operator()<T>()` with T the storage type of `dtype`, FP8 included:
/// for code that moves or converts elements (uploads, downloads), not for kernels.
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::F32: return fn.template operator()<float>();
    case DType::F64: return fn.template operator()<double>();
    case DType::F16: return fn.template operator()<Half>();
    case DType::BF16: return fn.template operator()<BFloat16>();
    case DType::I32: return fn.template operator()<std::int32_t>();
    case DType::F8E4M3: return fn.template operator()<Float8E4M3>();
    case DType::F8E5M2: return fn.template operator()<Float8E5M2>();
  }
  throw Error("visit_dtype: unknown dtype");
}

namespace detail {
/// Throws from `op` for an FP8 dtype: a kernel that computes on values does not take one.
inline void check_not_fp8(DType dtype, const char* op) {
  check(!is_fp8(dtype), op, ": got an ", dtype,
        " tensor; FP8 is a storage format that only quantize_fp8, dequantize_fp8 and gemm_fp8 take "
        "(quantize/dequantize first)");
}
}  // namespace detail

/// As visit_dtype, for kernels that compute on floating dtypes: f32, f64, f16, bf16. An
/// FP8 dtype is refused (an Error naming `op`): FP8 tensors are dequantized first.
template <class Fn>
decltype(auto) visit_floating(DType dtype, const char* op, Fn&& fn) {
  detail::check(is_floating(dtype), op, ": expected a floating dtype, got ", dtype);
  detail::check_not_fp8(dtype, op);
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
/// double -> float rounding to odd: a later rounding to a narrower format (f16, bf16, FP8)
/// then rounds exactly once, as if from the double (float keeps > 2p+1 bits for each, at
/// every magnitude their finite values and rounding midpoints take).
TRAINMEM_HOST_DEVICE float to_float_round_to_odd(double value) {
  const float nearest = static_cast<float>(value);
  if (static_cast<double>(nearest) == value || nearest != nearest) return nearest;
  std::uint32_t bits = float_bits(nearest);
  const bool rounded_away = (nearest > 0) == (static_cast<double>(nearest) > value);  // |nearest| > |value|
  if (rounded_away && (bits & 0x7fffffffu) != 0) bits -= 1;  // step back toward zero: truncation
  return bits_float(bits | 1u);
}

/// The storage types narrower than f32, converted from f32 with one rounding.
template <class T>
inline constexpr bool kNarrowerThanFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> ||
                                           std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2>;

template <class T, class A>
TRAINMEM_HOST_DEVICE T narrow(A value) {
  if constexpr (kNarrowerThanFloat<T>) {
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

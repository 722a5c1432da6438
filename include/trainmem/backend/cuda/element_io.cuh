// trainmem/backend/cuda/element_io.cuh — how kernels read and write stored elements.
//
// Kernels compute in the accumulator type (float, or double for f64) and convert at
// the load and the store, with the same rounding as the host: `widen` and `narrow`
// give the bits of detail::widen/narrow (round to nearest even, once) for
// every value but NaN payloads. f16 uses the hardware conversions (Half is
// reinterpreted as __half); bf16 uses the shared BFloat16 code (integer operations). `Pack` moves up to 16 bytes per
// access when pointers allow it. `load_as`/`store_as` take the dtype at run time, for
// kernels where instantiating every dtype combination would cost more than a
// warp-uniform switch.
//
// NOTE [Device-only names]
// nvcc compiles a host function's call to a __device__-only function into a call that
// ends the process with status 1, without a diagnostic. So every __device__-only
// helper and every kernel lives in `trainmem::cuda::kernels::device`, which unqualified
// lookup from host code in `trainmem::cuda::kernels` (the launchers) never searches: a
// launcher names a kernel as `device::kernel`, and a host call to, say, `narrow` is a
// compile error instead of a process exit. What both sides need is `__host__ __device__` and stays outside.
// tests/backend/cuda/host_exit_guard.cmake scans the compiled host code for the fingerprint.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "trainmem/core/dtype.hpp"

namespace trainmem::cuda::kernels {

namespace device {
// --- typed conversions ---------------------------------------------------------------
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(Half h) { return __half2float(__ushort_as_half(h.bits)); }
__device__ __forceinline__ float widen(BFloat16 b) { return BFloat16::to_float(b.bits); }

/// As detail::narrow: a double reaches 16 bits with one rounding (through the
/// round-to-odd float), a float with one; f16 rounds in hardware, the rest in the shared code.
template <class T, class A>
__device__ __forceinline__ T narrow(A value) {
  if constexpr (std::is_same_v<T, Half>) {
    float single;
    if constexpr (std::is_same_v<A, double>) single = detail::to_float_round_to_odd(value);
    else single = static_cast<float>(value);
    return Half::from_bits(__half_as_ushort(__float2half_rn(single)));
  } else {
    return detail::narrow<T>(value);
  }
}

/// A stored element widened to the accumulator type Acc.
template <class Acc, class T>
__device__ __forceinline__ Acc load(const T* ptr, std::int64_t i) {
  return static_cast<Acc>(widen(ptr[i]));
}

// --- run-time dtype --------------------------------------------------------------------
template <class Acc>
__device__ __forceinline__ Acc load_as(const void* ptr, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<Acc>(static_cast<const float*>(ptr)[i]);
    case DType::F64: return static_cast<Acc>(static_cast<const double*>(ptr)[i]);
    case DType::F16: return static_cast<Acc>(widen(static_cast<const Half*>(ptr)[i]));
    case DType::BF16: return static_cast<Acc>(widen(static_cast<const BFloat16*>(ptr)[i]));
    default: return static_cast<Acc>(static_cast<const std::int32_t*>(ptr)[i]);
  }
}

template <class Acc>
__device__ __forceinline__ void store_as(void* ptr, DType dtype, std::int64_t i, Acc value) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(ptr)[i] = static_cast<float>(value); break;
    case DType::F64: static_cast<double*>(ptr)[i] = static_cast<double>(value); break;
    case DType::F16: static_cast<Half*>(ptr)[i] = narrow<Half>(value); break;
    case DType::BF16: static_cast<BFloat16*>(ptr)[i] = narrow<BFloat16>(value); break;
    default: static_cast<std::int32_t*>(ptr)[i] = static_cast<std::int32_t>(value); break;
  }
}
}  // namespace device

// --- packed access -----------------------------------------------------------------------
/// N consecutive elements, aligned so that one (or, for 32 bytes, two) vector accesses move them.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

/// Elements per pack for a kernel touching types Ts: 16 bytes of the widest type.
template <class... Ts>
__host__ __device__ constexpr int pack_width() {
  std::size_t widest = 0;
  ((widest = sizeof(Ts) > widest ? sizeof(Ts) : widest), ...);
  return widest >= 16 ? 1 : static_cast<int>(16 / widest);
}

/// Whether `ptr` can be read as Pack<T, N> from element 0.
template <class T, int N>
inline bool pack_aligned(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % sizeof(Pack<T, N>) == 0;
}

namespace device {
/// Minus infinity in the accumulator type, without <limits> in device code.
template <class Acc>
__device__ __forceinline__ Acc negative_infinity() {
  if constexpr (std::is_same_v<Acc, double>) return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
  else return __int_as_float(static_cast<int>(0xff800000u));
}

// Global-namespace CUDA math (the ops define trainmem::exp and trainmem::log for Vars).
// exp is math::exp, shared with the CPU loops (NOTE [Fast float math] in core/math.hpp).
__device__ __forceinline__ float acc_log(float x) { return ::logf(x); }
__device__ __forceinline__ double acc_log(double x) { return ::log(x); }
__device__ __forceinline__ float acc_sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double acc_sqrt(double x) { return ::sqrt(x); }
/// False for inf and NaN (x - x is NaN for both).
template <class Acc>
__device__ __forceinline__ bool acc_isfinite(Acc x) {
  return x - x == Acc(0);
}
}  // namespace device

}  // namespace trainmem::cuda::kernels

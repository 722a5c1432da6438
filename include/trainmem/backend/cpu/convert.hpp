// trainmem/backend/cpu/convert.hpp — bulk widening and narrowing of 16-bit storage.
//
// The scalar Half/BFloat16 conversions are the reference; these loops give the same
// bits, faster: bfloat16 widening is a shift the compiler vectorises, and half uses
// the F16C instructions when the target has them (both round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "trainmem/core/dtype.hpp"

namespace trainmem::cpu::detail {

template <class T>
void widen_to_float(const T* src, float* dst, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
    auto* out = reinterpret_cast<std::uint32_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint32_t>(bits[i]) << 16;
  } else if constexpr (std::is_same_v<T, Half>) {
    std::size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) dst[i] = Half::to_float(src[i].bits);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <class T>
void narrow_from_float(const float* src, T* dst, std::size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    const auto* in = reinterpret_cast<const std::uint32_t*>(src);
    auto* bits = reinterpret_cast<std::uint16_t*>(dst);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t x = in[i];
      const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
      const std::uint32_t quiet_nan = (x >> 16) | 0x40u;
      bits[i] = static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
  } else if constexpr (std::is_same_v<T, Half>) {
    std::size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
#endif
    for (; i < n; ++i) dst[i].bits = Half::from_float(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

}  // namespace trainmem::cpu::detail

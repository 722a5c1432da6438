// trainmem/core/bfloat16.hpp — bfloat16 storage type.
//
// bfloat16 is the top half of an IEEE float: same 8-bit exponent (FP32's range),
// 7 stored mantissa bits. Widening is a 16-bit shift; narrowing rounds to nearest
// even by adding 0x7fff plus the lowest kept bit, and turns NaN into a quiet NaN.
#pragma once

#include <cstdint>

#include "trainmem/core/bit_cast.hpp"

namespace trainmem {

/// \brief 16-bit brain float, storage only.
struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  TRAINMEM_HOST_DEVICE explicit BFloat16(float value) : bits(from_float(value)) {}
  TRAINMEM_HOST_DEVICE static BFloat16 from_bits(std::uint16_t raw) {
    BFloat16 b;
    b.bits = raw;
    return b;
  }
  TRAINMEM_HOST_DEVICE explicit operator float() const { return to_float(bits); }

  TRAINMEM_HOST_DEVICE static std::uint16_t from_float(float value) {
    const std::uint32_t x = detail::float_bits(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
    const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<std::uint16_t>((x + rounding) >> 16);
  }

  TRAINMEM_HOST_DEVICE static float to_float(std::uint16_t b) {
    return detail::bits_float(static_cast<std::uint32_t>(b) << 16);
  }
};

}  // namespace trainmem

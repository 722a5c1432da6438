// trainmem/core/half.hpp — IEEE 754 binary16 storage type.
//
// Conversion from float rounds to nearest even, keeps infinities, turns NaN into a
// quiet NaN with the top payload bits kept, and produces subnormals for magnitudes
// below 2^-14. Arithmetic is never done in Half: values are widened to float, so
// this type is storage only (the "storage" precision role).
//
// Where the host compiler targets F16C (every x86-64 CPU since 2013; -march=native
// here), the conversions are the vcvtps2ph / vcvtph2ps instructions, which give the
// same bits as the integer formulas below (the tests compare every 16-bit pattern and
// every rounding midpoint). The formulas stay the reference, the device code and the
// fallback: in software, half conversion is a chain of branches that no compiler
// vectorises, and it made every 16-bit element-wise pass of an FP16 step several times
// slower than the same pass in BF16, whose conversion is a shift.
#pragma once

#include <cstdint>

#include "trainmem/core/bit_cast.hpp"

#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#define TRAINMEM_HALF_F16C 1
#endif

namespace trainmem {

/// \brief 16-bit IEEE half precision, storage only.
struct Half {
  std::uint16_t bits = 0;

  Half() = default;
  TRAINMEM_HOST_DEVICE explicit Half(float value) : bits(from_float(value)) {}
  TRAINMEM_HOST_DEVICE static Half from_bits(std::uint16_t raw) {
    Half h;
    h.bits = raw;
    return h;
  }
  TRAINMEM_HOST_DEVICE explicit operator float() const { return to_float(bits); }

  TRAINMEM_HOST_DEVICE static std::uint16_t from_float(float value) {
#if defined(TRAINMEM_HALF_F16C)
    return static_cast<std::uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
    return from_float_formula(value);
#endif
  }

  TRAINMEM_HOST_DEVICE static float to_float(std::uint16_t h) {
#if defined(TRAINMEM_HALF_F16C)
    return _cvtsh_ss(h);
#else
    return to_float_formula(h);
#endif
  }

  /// The integer formula of round-to-nearest-even float -> binary16 (the reference).
  TRAINMEM_HOST_DEVICE static std::uint16_t from_float_formula(float value) {
    std::uint32_t x = detail::float_bits(value);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {  // infinity or NaN
      const std::uint32_t nan_payload = x > 0x7f800000u ? (0x200u | ((x >> 13) & 0x3ffu)) : 0u;
      return static_cast<std::uint16_t>(sign | 0x7c00u | nan_payload);
    }
    if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
    if (x < 0x38800000u) {                                                    // below 2^-14: subnormal half or zero
      if (x < 0x33000000u) return static_cast<std::uint16_t>(sign);           // <= 2^-25 ties to 0
      const int exponent = static_cast<int>(x >> 23);
      const std::uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
      const int shift = 126 - exponent;  // value / 2^-24 == mantissa >> shift
      std::uint32_t r = mantissa >> shift;
      const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1);
      if (rest > halfway || (rest == halfway && (r & 1u))) ++r;
      return static_cast<std::uint16_t>(sign | r);
    }
    std::uint32_t r = x - 0x38000000u;  // rebias the exponent from 127 to 15
    const std::uint32_t rest = r & 0x1fffu;
    r >>= 13;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }

  /// The integer formula of binary16 -> float (the reference).
  TRAINMEM_HOST_DEVICE static float to_float_formula(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1fu)  // infinity, or NaN made quiet (as the F16C instructions do)
      return detail::bits_float(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u));
    if (exponent == 0) {
      if (mantissa == 0) return detail::bits_float(sign);
      exponent = 127 - 15 + 1;  // normalise the subnormal
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ffu;
      return detail::bits_float(sign | (exponent << 23) | (mantissa << 13));
    }
    return detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
};

}  // namespace trainmem

// trainmem/core/float8.hpp — the two OCP 8-bit floating-point storage types, E4M3 and E5M2:
// one struct, Float8<Format>, over the two encodings (detail::Float8Format).
//
// E4M3 (OCP "E4M3", E4M3FN): sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinity, one NaN pattern per sign (S.1111.111); max 448, smallest normal 2^-6,
// smallest subnormal 2^-9. E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits,
// IEEE-style ±inf (S.11111.00) and NaNs (S.11111.{01,10,11}); max 57344, smallest
// normal 2^-14, smallest subnormal 2^-16.
//
// NOTE [FP8 conversion rule]
// Narrowing from f32 rounds to nearest, ties to even, at every binade including the
// subnormals, in saturating mode: the saturation mode the OCP 8-bit Floating Point
// Specification (OFP8, rev 1.0) defines for conversions from wider formats, which is what
// CUDA calls __NV_SATFINITE (cuda_fp8.h: "input larger than the maximum representable
// finite number MAXNORM of the target format round to the MAXNORM of the same sign as
// input"; the host path of cuda_fp8.hpp's __nv_cvt_double_to_fp8 (CUDA 13.0) sends every
// |x| above max + ulp/2, infinity included, to MAXNORM; on sm_89 and later the device path
// of __nv_cvt_float_to_fp8 is the instruction cvt.rn.satfinite).
// So, for both formats:
//   - a finite value whose rounded magnitude exceeds max, and ±inf, become ±max;
//   - NaN becomes NaN (E4M3 S.1111.111, E5M2 the quiet S.11111.10), sign kept;
//   - magnitudes at or below half the smallest subnormal become ±0 (the midpoint
//     itself ties to the even code, zero).
// Saturating ±inf to ±max is what both the spec's saturation mode and the hardware do;
// it is safe in training because an infinity never goes unnoticed: the amax recorded
// while quantizing is taken from the unconverted values, so a tensor holding inf or
// NaN gives amax inf or NaN, and the scaling recipe reacts to that.
// Widening to f32 is exact (every E4M3 and E5M2 value is an f32 value). Narrowing from
// double goes through detail::to_float_round_to_odd (core/dtype.hpp), which rounds once.
#pragma once

#include <cstdint>

#include "trainmem/core/bit_cast.hpp"

namespace trainmem {
namespace detail {

/// The encoding of an OCP 8-bit float with `kExpBits` exponent and `kManBits` mantissa
/// bits; `kIeeeSpecials`: the top exponent holds inf/NaN (E5M2), else only S.1111.111
/// is NaN (E4M3).
template <int kExpBits, int kManBits, bool kIeeeSpecials>
struct Float8Format {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinExponent = 1 - kBias;  // of the smallest normal
  /// Largest finite code without the sign: E4M3 0x7e (448), E5M2 0x7b (57344).
  static constexpr std::uint32_t kMaxCode = kIeeeSpecials ? ((((1u << kExpBits) - 1u) << kManBits) - 1u) : 0x7eu;
  /// Largest finite value, kMaxCode's: its significand (implicit 1 included) times
  /// 2^(exponent - kManBits), a whole number for both formats.
  static constexpr float kMax = static_cast<float>(((kMaxCode & ((1u << kManBits) - 1u)) | (1u << kManBits))
                                                   << ((kMaxCode >> kManBits) - kBias - kManBits));
  static constexpr std::uint8_t kNaNCode =
      kIeeeSpecials ? static_cast<std::uint8_t>(0x7cu | (1u << (kManBits - 1))) : static_cast<std::uint8_t>(0x7fu);

  TRAINMEM_HOST_DEVICE static constexpr bool is_nan(std::uint8_t code) {
    const unsigned magnitude = code & 0x7fu;
    return kIeeeSpecials ? magnitude > 0x7cu : magnitude == 0x7fu;
  }

  /// f32 -> code: round to nearest even, saturate to ±max (±inf too), NaN -> NaN. See NOTE [FP8 conversion rule].
  TRAINMEM_HOST_DEVICE static std::uint8_t from_float(float value) {
    const std::uint32_t x = float_bits(value);
    const auto sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
    const std::uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return static_cast<std::uint8_t>(sign | kNaNCode);
    if (magnitude == 0x7f800000u) return static_cast<std::uint8_t>(sign | kMaxCode);
    // f32 subnormals (and zero) lie far below half the smallest FP8 subnormal.
    if (magnitude < 0x00800000u) return sign;
    const int exponent = static_cast<int>(magnitude >> 23) - 127;
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;  // 24 bits, value 1.m * 2^23
    // Bits of the f32 significand dropped to keep kManBits after the point; more below
    // the smallest normal exponent, where the FP8 spacing stays that of the subnormals.
    const int drop = (23 - kManBits) + (exponent < kMinExponent ? kMinExponent - exponent : 0);
    if (drop > 24) return sign;  // below half the smallest subnormal
    std::uint32_t kept = significand >> drop;
    const std::uint32_t rest = significand & ((1u << drop) - 1u);
    const std::uint32_t half = 1u << (drop - 1);
    if (rest > half || (rest == half && (kept & 1u) != 0)) ++kept;
    // kept is the significand in units of the FP8 spacing at max(exponent, kMinExponent);
    // adding it to the exponent field below carries a rounded-up 2^(kManBits+1) into the
    // next binade, and a subnormal that rounds up to 2^kManBits into the smallest normal.
    const int field = exponent < kMinExponent ? 0 : exponent + kBias - 1;
    const std::uint32_t code = (static_cast<std::uint32_t>(field) << kManBits) + kept;
    return static_cast<std::uint8_t>(sign | (code > kMaxCode ? kMaxCode : code));
  }

  /// code -> f32, exact.
  TRAINMEM_HOST_DEVICE static float to_float(std::uint8_t code) {
    const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
    const std::uint32_t magnitude = code & 0x7fu;
    const std::uint32_t field = magnitude >> kManBits;
    const std::uint32_t mantissa = magnitude & ((1u << kManBits) - 1u);
    if (is_nan(code)) return bits_float(sign | 0x7fc00000u);
    if (kIeeeSpecials && field == (1u << kExpBits) - 1u) return bits_float(sign | 0x7f800000u);
    if (field == 0) {
      // Subnormal: mantissa * 2^(kMinExponent - kManBits), a small integer times a power of two.
      constexpr std::uint32_t kUnitBits = static_cast<std::uint32_t>(kMinExponent - kManBits + 127) << 23;
      return bits_float(sign | float_bits(static_cast<float>(mantissa) * bits_float(kUnitBits)));
    }
    return bits_float(sign | ((field - kBias + 127) << 23) | (mantissa << (23 - kManBits)));
  }
};

using Float8E4M3Format = Float8Format<4, 3, false>;
using Float8E5M2Format = Float8Format<5, 2, true>;

}  // namespace detail

/// \brief An OCP 8-bit float stored as its code, one struct for both formats: `Format`
/// (a detail::Float8Format) holds the encoding, so E4M3 and E5M2 differ only there.
/// Storage only: kernels widen to f32 to compute.
template <class Format>
struct Float8 {
  std::uint8_t bits = 0;
  static constexpr float max = Format::kMax;

  Float8() = default;
  /// Round to nearest even; out-of-range values and ±inf saturate to ±max; NaN -> NaN.
  TRAINMEM_HOST_DEVICE explicit Float8(float value) : bits(Format::from_float(value)) {}
  TRAINMEM_HOST_DEVICE static constexpr Float8 from_bits(std::uint8_t b) {
    Float8 f;
    f.bits = b;
    return f;
  }
  /// Exact.
  TRAINMEM_HOST_DEVICE explicit operator float() const { return Format::to_float(bits); }
};

/// \brief OCP FP8 E4M3 (FN): bias 7, no infinity, NaN = S.1111.111, max 448.
using Float8E4M3 = Float8<detail::Float8E4M3Format>;
/// \brief OCP FP8 E5M2: bias 15, ±inf and NaN as in IEEE 754, max 57344.
using Float8E5M2 = Float8<detail::Float8E5M2Format>;

static_assert(Float8E4M3::max == 448.0f && Float8E5M2::max == 57344.0f, "Float8: max differs from the OCP spec's");
static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1, "Float8: one byte per element");

}  // namespace trainmem

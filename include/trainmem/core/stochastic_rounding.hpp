// trainmem/core/stochastic_rounding.hpp — how an update pass rounds the 16-bit model copy.
//
// Round-to-nearest-even drops any change smaller than half a bf16 step, every time, so
// a bf16 value that receives many tiny updates never moves. Stochastic rounding rounds
// up with probability equal to the fraction it drops: add 16 random bits below the
// kept bits of the f32 pattern, then truncate. The expected stored value is the f32
// value. The random bits are counter-based (Philox draw `offset + i` for element i), so
// a step writes the same bits on every run and on the CPU and the GPU alike.
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"
#include "trainmem/core/bfloat16.hpp"
#include "trainmem/core/rng.hpp"

namespace trainmem {

enum class RoundingMode : std::uint8_t {
  NearestEven,  // IEEE round to nearest, ties to even
  Stochastic,   // round up with probability (dropped bits) / (one step); bf16 only
};

/// \brief How one update pass writes its 16-bit model copy: the mode and, for
/// stochastic rounding, the stream whose draw i rounds element i.
struct CopyRounding {
  RoundingMode mode = RoundingMode::NearestEven;
  RngState rng{};
};

/// f32 -> bf16, rounding up with probability (low 16 bits of `value`) / 2^16 given
/// uniform `random` bits. NaN stays a quiet NaN; infinities stay infinite.
TRAINMEM_HOST_DEVICE BFloat16 bf16_round_stochastic(float value, std::uint32_t random) {
  const std::uint32_t x = trainmem::detail::float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return BFloat16::from_bits(static_cast<std::uint16_t>((x >> 16) | 0x40u));
  return BFloat16::from_bits(static_cast<std::uint16_t>((x + (random & 0xffffu)) >> 16));
}

}  // namespace trainmem

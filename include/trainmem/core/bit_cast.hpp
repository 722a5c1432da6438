// trainmem/core/bit_cast.hpp — float <-> bit pattern, usable on host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "trainmem/config.hpp"

namespace trainmem::detail {

TRAINMEM_HOST_DEVICE std::uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

TRAINMEM_HOST_DEVICE float bits_float(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

}  // namespace trainmem::detail

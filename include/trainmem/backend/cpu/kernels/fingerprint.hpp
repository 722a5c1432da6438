// trainmem/backend/cpu/kernels/fingerprint.hpp — core/fingerprint.hpp over a buffer.
//
// At most kFingerprintWords words, so one thread does it in a few microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "trainmem/core/fingerprint.hpp"

namespace trainmem::cpu::kernels {

inline std::uint64_t fingerprint(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint64_t words = (bytes + 7) / 8;
  std::uint64_t sum = 0;
  for (std::uint64_t k = 0; k < trainmem::detail::fingerprint_samples(words); ++k) {
    const std::uint64_t j = trainmem::detail::fingerprint_word(k, words);
    std::uint64_t w = 0;
    const std::size_t first = static_cast<std::size_t>(j) * 8;
    std::memcpy(&w, p + first, bytes - first < 8 ? bytes - first : 8);  // views need not be aligned
    sum += trainmem::detail::fingerprint_term(w, j);
  }
  return sum;
}

}  // namespace trainmem::cpu::kernels

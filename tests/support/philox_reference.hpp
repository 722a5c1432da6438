// tests/support/philox_reference.hpp — Philox4x32-10 written from the paper, for tests.
//
// An independent implementation of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC'11), taking the full 4-word counter and 2-word key and following
// Random123's key schedule (key bumped before rounds 2..10). Tests check it against
// Random123's published known-answer vectors, then check the library against it.
#pragma once

#include <array>
#include <cstdint>

namespace trainmem::testing {

using PhiloxWords = std::array<std::uint32_t, 4>;

inline PhiloxWords philox4x32_10_reference(PhiloxWords counter, std::array<std::uint32_t, 2> key) {
  constexpr std::uint64_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kWeyl0;
      key[1] += kWeyl1;
    }
    const std::uint64_t p0 = kMultiplier0 * counter[0];
    const std::uint64_t p1 = kMultiplier1 * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
  }
  return counter;
}

/// The library's documented stream layout: draw i of stream (seed, offset) is word
/// (offset + i) % 4 of the block at counter (offset + i) / 4, keyed by the seed.
inline std::uint32_t philox_stream_reference(std::uint64_t seed, std::uint64_t offset, std::uint64_t index) {
  const std::uint64_t position = offset + index;
  const std::uint64_t block = position / 4;
  const PhiloxWords words =
      philox4x32_10_reference({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32), 0u, 0u},
                              {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return words[position % 4];
}

/// Uniform in [0, 1) from the top 24 bits of a draw (the library's dropout/init convention).
inline double uniform_from_bits(std::uint32_t bits) { return static_cast<double>(bits >> 8) / 16777216.0; }

}  // namespace trainmem::testing

// trainmem/core/rng.hpp — counter-based random numbers (Philox 4x32-10).
//
// A counter-based generator has no hidden state: the value at position i of a stream
// is a pure function of (seed, offset + i). So a checkpoint region captures the RNG
// in O(1) as a (seed, offset) pair and its recompute draws the same dropout masks bit
// for bit, on the CPU and on the GPU alike (the function is TRAINMEM_HOST_DEVICE).
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem {

/// \brief Where a random stream starts: everything recompute needs to replay it.
struct RngState {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // in 32-bit draws, always a multiple of 4
  bool operator==(const RngState&) const = default;
};

namespace detail {

struct Philox4 {
  std::uint32_t v[4];
};

TRAINMEM_HOST_DEVICE void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t product = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(product >> 32);
  lo = static_cast<std::uint32_t>(product);
}

/// Philox 4x32 with 10 rounds (Salmon et al., SC'11), the generator cuRAND and
/// PyTorch's CUDA dropout use.
TRAINMEM_HOST_DEVICE Philox4 philox4x32_10(std::uint64_t counter, std::uint64_t seed) {
  std::uint32_t c0 = static_cast<std::uint32_t>(counter), c1 = static_cast<std::uint32_t>(counter >> 32);
  std::uint32_t c2 = 0, c3 = 0;
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, c0, hi0, lo0);
    mul_hi_lo(0xCD9E8D57u, c2, hi1, lo1);
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

/// The 32-bit draw at position `index` of the stream that starts at `state`.
TRAINMEM_HOST_DEVICE std::uint32_t random_bits(RngState state, std::uint64_t index) {
  const std::uint64_t position = state.offset + index;
  return philox4x32_10(position >> 2, state.seed).v[position & 3u];
}

/// A 32-bit draw as a uniform float in [0, 1): its top 24 bits as a multiple of 2^-24.
TRAINMEM_HOST_DEVICE float uniform_from_bits(std::uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

/// Uniform float in [0, 1) with 24 random bits.
TRAINMEM_HOST_DEVICE float random_uniform(RngState state, std::uint64_t index) {
  return uniform_from_bits(random_bits(state, index));
}

}  // namespace detail

/// \brief Hands out non-overlapping (seed, offset) streams.
class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0x5eed) : state_{seed, 0} {}

  /// Reserves `count` draws and returns where they start.
  RngState take(std::uint64_t count) {
    const RngState start = state_;
    state_.offset += (count + 3u) & ~std::uint64_t{3};
    return start;
  }
  RngState state() const { return state_; }
  void set_state(RngState state) { state_ = state; }
  void manual_seed(std::uint64_t seed) { state_ = {seed, 0}; }

 private:
  RngState state_;
};

}  // namespace trainmem

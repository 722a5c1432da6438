// trainmem/core/fingerprint.hpp — a 64-bit fingerprint of every byte of a tensor, the same from any thread order.
//
// The bytes are read as little-endian 64-bit words (the last one zero-padded), and every
// word contributes: word j adds mix(word ^ j * golden) to a sum modulo 2^64, where mix is
// splitmix64's finaliser. Three properties follow, and checkpoint regions rely on them
// (DeterminismCheck::Fingerprint compares what a recompute saves with the forward's):
// - Any one changed word changes the fingerprint, always: for a fixed j the term is a
//   bijection of the word (an xor with a constant, then xor-shifts and odd multiplies), so
//   it changes and the sum with it. A cutout moved by one element is seen wherever it is.
// - Changes that cancel in a sum of values (one element +d, another -d; two swapped
//   elements; two sign flips) do not cancel here: each changed word's term moves by a
//   pseudo-random amount that depends on its position, so two of them cancel with
//   probability 2^-64, not by construction.
// - Integer addition does not care about order, so a parallel CPU loop and a GPU tree give
//   the same bits.
// The cost is one pass over the bytes: the CPU loop keeps the key as an induction
// (key += golden, no multiply) and runs vectorised, about 0.1 ns a byte on one AVX2 core,
// split over threads for a large tensor.
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem::detail {

/// Word j of a buffer is keyed with j * kFingerprintKey (the golden ratio in 64 bits).
inline constexpr std::uint64_t kFingerprintKey = 0x9E3779B97F4A7C15ull;

/// splitmix64's finaliser: a bijection of 64-bit words, every input bit reaching every output bit.
TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// What word `word` at index `index` adds to the fingerprint.
TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_term(std::uint64_t word, std::uint64_t index) {
  return fingerprint_mix(word ^ (index * kFingerprintKey));
}

}  // namespace trainmem::detail

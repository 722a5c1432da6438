// trainmem/core/fingerprint.hpp — a 64-bit fingerprint of a tensor's bytes that any thread order reproduces.
//
// The bytes are read as little-endian 64-bit words (the last one zero-padded); word j
// contributes mix(word ^ j * golden) and the contributions are added modulo 2^64. Integer
// addition does not care about order, so a parallel CPU loop and a GPU reduction give the
// same bits for the same bytes every time, and the position term means a permutation of
// the words changes it. mix is splitmix64's finaliser. Checkpoint regions compare the
// fingerprints of what a recompute saves with the forward's (DeterminismCheck::Fingerprint).
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem::detail {

TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_term(std::uint64_t word, std::uint64_t index) {
  std::uint64_t z = word ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace trainmem::detail

// trainmem/core/fingerprint.hpp — a 64-bit fingerprint of a tensor's bytes, the same from any thread order.
//
// The bytes are read as little-endian 64-bit words (the last one zero-padded). A tensor of
// up to kFingerprintWords words contributes all of them; a larger one eight runs of 128
// consecutive words, the runs spread evenly over it (fingerprint_word: runs, not single
// words, so a tensor that left the cache costs a few streamed runs, not 1,024 misses).
// The cost per tensor is bounded while any change that reaches many values (other
// weights, another dropout mask) is still seen. Word j contributes mix(word ^ j * golden), and the contributions
// are added modulo 2^64: integer addition does not care about order, so a parallel CPU
// loop and a GPU tree give the same bits, and the position term means moving words
// changes the sum. mix is splitmix64's finaliser. Checkpoint regions compare the
// fingerprints of what a recompute saves with the forward's (DeterminismCheck::Fingerprint);
// DeterminismCheck::Checksum hashes every byte instead.
#pragma once

#include <cstdint>

#include "trainmem/config.hpp"

namespace trainmem::detail {

inline constexpr std::uint64_t kFingerprintWords = 1024;

TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_term(std::uint64_t word, std::uint64_t index) {
  std::uint64_t z = word ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// How many words a buffer of `words` words contributes.
TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_samples(std::uint64_t words) {
  return words < kFingerprintWords ? words : kFingerprintWords;
}

inline constexpr std::uint64_t kFingerprintRun = 128;  // words per run; kFingerprintWords / kFingerprintRun runs

/// The index of the k-th contributing word of a buffer of `words` words: word k % 128 of
/// run k / 128, which starts at word (k / 128) * words / 8.
TRAINMEM_HOST_DEVICE std::uint64_t fingerprint_word(std::uint64_t k, std::uint64_t words) {
  if (words <= kFingerprintWords) return k;
  const std::uint64_t run = k / kFingerprintRun, runs = kFingerprintWords / kFingerprintRun;
  return run * words / runs + k % kFingerprintRun;
}

}  // namespace trainmem::detail

// trainmem/backend/cpu/kernels/fingerprint.hpp — core/fingerprint.hpp over a buffer.
//
// One vectorised pass: word j's key j * golden is carried as an induction (OpenMP's
// `linear`), so the loop's only multiplies are the mix's; the sum is split over threads in
// blocks above kParallelGrain words (an integer sum: the same bits for any split).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/fingerprint.hpp"

namespace trainmem::cpu::kernels {

/// The terms of whole words [first, last) of `p` (views need not be aligned: memcpy loads).
inline std::uint64_t fingerprint_words(const unsigned char* p, std::uint64_t first, std::uint64_t last) {
  constexpr std::uint64_t kKey = trainmem::detail::kFingerprintKey;
  std::uint64_t sum = 0, key = first * kKey;
#pragma omp simd reduction(+ : sum) linear(key : kKey)
  for (std::uint64_t j = first; j < last; ++j) {
    std::uint64_t w;
    std::memcpy(&w, p + j * 8, 8);
    sum += trainmem::detail::fingerprint_mix(w ^ key);
    key += kKey;
  }
  return sum;
}

inline std::uint64_t fingerprint(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint64_t whole = bytes / 8;
  constexpr std::uint64_t kBlock = kParallelGrain;  // words per block of the split
  const auto blocks = static_cast<std::int64_t>((whole + kBlock - 1) / kBlock);
  std::uint64_t sum = parallel_sum<std::uint64_t>(blocks, blocks > 1, [&](std::int64_t b) {
    const auto first = static_cast<std::uint64_t>(b) * kBlock;
    return fingerprint_words(p, first, std::min(first + kBlock, whole));
  });
  if (bytes % 8 != 0) {  // the last word, zero-padded
    std::uint64_t w = 0;
    std::memcpy(&w, p + whole * 8, bytes % 8);
    sum += trainmem::detail::fingerprint_term(w, whole);
  }
  return sum;
}

}  // namespace trainmem::cpu::kernels

// trainmem/backend/cpu/kernels/fingerprint.hpp — core/fingerprint.hpp over a buffer, split over threads.
//
// An integer sum, so OpenMP's reduction (whose order of combining varies) still gives
// the same bits every time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "trainmem/backend/cpu/kernels/parallel.hpp"
#include "trainmem/core/fingerprint.hpp"

namespace trainmem::cpu::kernels {

inline std::uint64_t fingerprint(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto words = static_cast<std::int64_t>(bytes / 8);
  const auto word = [p](std::int64_t j) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * j, 8);  // views need not be 8-byte aligned
    return trainmem::detail::fingerprint_term(w, static_cast<std::uint64_t>(j));
  };
  std::uint64_t sum = 0;
  if (words > kParallelGrain) {
#pragma omp parallel for reduction(+ : sum)
    for (std::int64_t j = 0; j < words; ++j) sum += word(j);
  } else {
    for (std::int64_t j = 0; j < words; ++j) sum += word(j);
  }
  if (const std::size_t tail = bytes % 8; tail != 0) {
    std::uint64_t w = 0;
    std::memcpy(&w, p + 8 * static_cast<std::size_t>(words), tail);
    sum += trainmem::detail::fingerprint_term(w, static_cast<std::uint64_t>(words));
  }
  return sum;
}

}  // namespace trainmem::cpu::kernels

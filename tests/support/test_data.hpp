// tests/support/test_data.hpp — deterministic test values, independent of the library's RNG.
//
// Test inputs come from splitmix64, written here, so a test's data never depends on
// the code under test (the library's Philox generator is itself under test) and is the
// same with every compiler and standard library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainmem/trainmem.hpp"

namespace trainmem::testing {

/// splitmix64 (Steele, Lea, Flood 2014): one 64-bit value per call.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  std::uint64_t state_;
};

/// `count` values uniform in [low, high), reproducible from `seed`.
inline std::vector<double> random_values(std::size_t count, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  SplitMix64 rng(seed);
  std::vector<double> out(count);
  for (auto& v : out) v = low + (high - low) * rng.uniform();
  return out;
}

/// `count` values whose magnitude is uniform in [low, high) and whose sign is random:
/// kept away from zero (for relu, whose kink a finite difference must not straddle).
inline std::vector<double> random_signed_away_from_zero(std::size_t count, std::uint64_t seed, double low,
                                                        double high) {
  SplitMix64 rng(seed);
  std::vector<double> out(count);
  for (auto& v : out) {
    const double magnitude = low + (high - low) * rng.uniform();
    v = (rng.next() & 1u) ? magnitude : -magnitude;
  }
  return out;
}

/// A tensor of random values in [low, high) (F64 unless told otherwise).
template <class B = cpu::Backend>
Tensor<B> random_tensor(Shape shape, std::uint64_t seed, double low = -1.0, double high = 1.0, DType dtype = DType::F64,
                        B& backend = B::default_instance()) {
  const auto values = random_values(static_cast<std::size_t>(shape.numel()), seed, low, high);
  return Tensor<B>::from_host(std::move(shape), values, dtype, MemCategory::Temporary, backend);
}

/// An i32 tensor (labels, token ids) from host integers.
template <class B = cpu::Backend>
Tensor<B> int_tensor(Shape shape, const std::vector<double>& values, B& backend = B::default_instance()) {
  return Tensor<B>::from_host(std::move(shape), values, DType::I32, MemCategory::Temporary, backend);
}

}  // namespace trainmem::testing

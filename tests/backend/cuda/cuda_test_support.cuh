// tests/backend/cuda/cuda_test_support.cuh — what the CUDA tests share: device gate, inputs, references.
//
// Every TEST_CASE starts with TRAINMEM_REQUIRE_CUDA_DEVICE(): without a device it says
// so (WARN), counts the skip, and returns; the skip report (skip_report.cu) prints
// the count once at the end of the run. Inputs are fresh random values each run (the
// seed is logged with INFO, so a failure can be replayed with TRAINMEM_TEST_SEED), and
// are rounded to the dtype under test before the FP64 reference sees them, so a
// comparison measures the computation, not the input rounding. Outputs land in pool
// memory that was poisoned with NaN bytes, so an element a kernel forgets to write
// fails the comparison.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "trainmem/cuda.hpp"

namespace trainmem::cuda_testing {

using Cpu = trainmem::cpu::Backend;
using Gpu = trainmem::cuda::Backend;

inline int& skipped_test_cases() {
  static int count = 0;
  return count;
}

/// True when a CUDA device is usable; otherwise warns and counts one skipped test case.
inline bool cuda_device_available() {
  if (trainmem::cuda::device_count() > 0) return true;
  ++skipped_test_cases();
  WARN("no CUDA device: skipped");
  return false;
}

#define TRAINMEM_REQUIRE_CUDA_DEVICE() \
  if (!::trainmem::cuda_testing::cuda_device_available()) return

/// A seed per test case: TRAINMEM_TEST_SEED when set, else fresh from the OS.
inline std::uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("TRAINMEM_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

/// \brief Random inputs for one test case; logs its seed.
class Inputs {
 public:
  Inputs() : seed_(fresh_seed()), engine_(seed_) {}
  std::uint64_t seed() const { return seed_; }

  std::vector<double> uniform(std::int64_t n, double low = -1.0, double high = 1.0) {
    std::uniform_real_distribution<double> dist(low, high);
    std::vector<double> out(static_cast<std::size_t>(n));
    for (auto& v : out) v = dist(engine_);
    return out;
  }
  std::vector<double> integers(std::int64_t n, std::int64_t low, std::int64_t high) {
    std::uniform_int_distribution<std::int64_t> dist(low, high);
    std::vector<double> out(static_cast<std::size_t>(n));
    for (auto& v : out) v = static_cast<double>(dist(engine_));
    return out;
  }
  std::int64_t integer(std::int64_t low, std::int64_t high) {
    return std::uniform_int_distribution<std::int64_t>(low, high)(engine_);
  }

 private:
  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

/// `values` rounded to `dtype` and back (what a tensor of that dtype holds).
inline std::vector<double> rounded_to(const std::vector<double>& values, DType dtype) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::F32: out[i] = static_cast<float>(values[i]); break;
      case DType::F16: out[i] = static_cast<float>(Half(static_cast<float>(values[i]))); break;
      case DType::BF16: out[i] = static_cast<float>(BFloat16(static_cast<float>(values[i]))); break;
      default: out[i] = values[i]; break;
    }
  }
  return out;
}

/// ‖out − ref‖ / ‖ref‖ (METHOD.md's measure); infinite when out holds a NaN or the sizes differ.
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i]) != std::isnan(ref[i])) return INFINITY;
    if (std::isnan(ref[i]) || (std::isinf(ref[i]) && out[i] == ref[i])) continue;
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (std::isnan(diff)) return INFINITY;
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

/// Relative-error budget of a computation whose results are stored in `dtype` (METHOD.md:
/// f32 far under 1e-3; bf16 between 1e-3 and 1e-2); f64 checks the formula itself.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-5;
    case DType::F16: return 4e-3;
    case DType::BF16: return 2e-2;
    default: return 0.0;
  }
}

/// Fills `bytes` of fresh pool memory with 0xFF (NaN in every floating dtype) and frees it,
/// so the next allocations of the backend start from NaN, not from zeros or old results.
inline void poison_pool(Gpu& backend, std::size_t bytes = std::size_t{64} << 20) {
  void* block = backend.allocate(bytes, MemCategory::Temporary);
  TRAINMEM_CUDA_CHECK(cudaMemsetAsync(block, 0xff, bytes, backend.stream()));
  backend.deallocate(block, bytes, MemCategory::Temporary);
}

/// Bits of each element of a tensor (for bit-for-bit comparisons across backends).
template <class B>
std::vector<std::uint64_t> bits_of(const Tensor<B>& t) {
  std::vector<std::uint64_t> out(static_cast<std::size_t>(t.numel()));
  std::vector<unsigned char> raw(t.bytes());
  t.backend().download(raw.data(), t.data(), t.bytes());
  const std::size_t width = size_of(t.dtype());
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint64_t v = 0;
    for (std::size_t b = 0; b < width; ++b) v |= static_cast<std::uint64_t>(raw[i * width + b]) << (8 * b);
    out[i] = v;
  }
  return out;
}

inline std::string dtype_name(DType dtype) { return std::string(name_of(dtype)); }

}  // namespace trainmem::cuda_testing

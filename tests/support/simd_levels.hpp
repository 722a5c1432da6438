// tests/support/simd_levels.hpp — a check run under every vector level this CPU has, so
// that each machine tests the portable loops and every vector form it can run.
#pragma once

#include <functional>

#include "trainmem/backend/cpu/simd.hpp"

namespace trainmem::testing {

/// Calls check(level) with each SimdLevel up to the CPU's forced in turn, then restores the cap.
inline void for_each_simd_level(const std::function<void(cpu::SimdLevel)>& check) {
  struct Restore {
    cpu::SimdLevel cap = cpu::kernels::simd_cap().load();
    ~Restore() { cpu::force_simd_level(cap); }
  } restore;
  for (const cpu::SimdLevel level : {cpu::SimdLevel::Scalar, cpu::SimdLevel::Avx2, cpu::SimdLevel::Avx512}) {
    if (level > cpu::kernels::detected_simd_level()) break;
    cpu::force_simd_level(level);
    check(level);
  }
}

}  // namespace trainmem::testing

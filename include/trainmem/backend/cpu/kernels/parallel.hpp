// trainmem/backend/cpu/kernels/parallel.hpp — when a CPU loop is worth splitting over threads.
//
// Every loop in backend/cpu/kernels/ widens elements to their accumulator type (float,
// or double for f64), computes with the shared functors of core/, and narrows on store;
// reductions accumulate in the accumulator type. Rows are independent, so outer loops
// are OpenMP-parallel when compiled with it, above the grain below.
#pragma once

#include <cstdint>

namespace trainmem::cpu::kernels {

// NOTE [Parallel and SIMD]
// Loops split across threads only above kParallelGrain elements (a fork/join costs
// more than a small loop). On `parallel for simd` the condition is written
// `if (parallel : ...)`: a bare `if` applies to the simd part too (OpenMP 5), and GCC
// then runs every small loop scalar — GELU over 64x512 was 5x slower that way.
inline constexpr std::int64_t kParallelGrain = 1 << 15;

}  // namespace trainmem::cpu::kernels

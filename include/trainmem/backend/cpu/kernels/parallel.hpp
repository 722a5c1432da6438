// trainmem/backend/cpu/kernels/parallel.hpp — when a CPU loop is worth splitting over threads.
//
// Every loop in backend/cpu/kernels/ widens elements to their accumulator type (float,
// or double for f64), computes with the shared functors of core/, and narrows on store;
// reductions accumulate in the accumulator type. Rows are independent, so outer loops
// are OpenMP-parallel when compiled with it, above the grain below.
#pragma once

#include <cstdint>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace trainmem::cpu::kernels {

/// The calling thread's index in the current OpenMP team (0 outside one, or without OpenMP).
inline int current_thread() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// NOTE [Parallel and SIMD]
// Loops split across threads only above kParallelGrain elements (a fork/join costs
// more than a small loop). Below it they do not enter OpenMP at all: a region whose
// `if` clause is false still builds a one-thread team, a malloc and a free per call,
// which on small tensors was the largest host cost of an op. Row loops take their body
// as a lambda (parallel_for below). Element-wise loops write both branches out, each
// `simd`: passed through a lambda, GCC stops inlining the functor and the loop runs
// scalar, several times slower (GELU over 64x512 was 5x slower scalar).
inline constexpr std::int64_t kParallelGrain = 1 << 15;

/// body(i) for i in [0, n), over threads when `split`.
template <class Body>
void parallel_for(std::int64_t n, bool split, Body&& body) {
  if (split) {
#pragma omp parallel for
    for (std::int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) body(i);
  }
}

/// The sum of term(i) for i in [0, n) in Acc; over threads (OpenMP's reduction) when `split`.
template <class Acc, class Term>
Acc parallel_sum(std::int64_t n, bool split, Term&& term) {
  Acc total = 0;
  if (split) {
#pragma omp parallel for reduction(+ : total)
    for (std::int64_t i = 0; i < n; ++i) total += term(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) total += term(i);
  }
  return total;
}

}  // namespace trainmem::cpu::kernels

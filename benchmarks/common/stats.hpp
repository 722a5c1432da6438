// benchmarks/common/stats.hpp — what every benchmark reports a timing with.
//
// A benchmark repeats a measurement and reports the median: on a shared machine the
// mean follows the slowest outliers, the median the typical run.
#pragma once

#include <algorithm>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace benchmarks {

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// Threads a parallel region of the CPU backend uses (1 without OpenMP), for the table header.
inline int cpu_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace benchmarks

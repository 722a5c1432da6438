// benchmarks/common/stats.hpp — what every benchmark reports a timing with.
//
// A benchmark repeats a measurement and reports the median: on a shared machine the
// mean follows the slowest outliers, the median the typical run.
#pragma once

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace benchmarks {

/// The q-quantile of `values` (0 <= q <= 1), linear between neighbours; 0 when empty.
inline double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(at));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (at - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

/// The median of `values` (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> values) { return quantile(std::move(values), 0.5); }

}  // namespace benchmarks

// trainmem/core/memory_report.hpp — MemoryStats as text: bytes by category, and two runs side by side.
//
// Library code never prints: both functions return the table as a std::string for the
// caller to print or log. A category with no byte in any column is left out, so a table
// lists what the run used; "total" is the figure at the overall peak (the sum of the
// per-category peaks is larger when they peak at different times). Bytes read as
// format_bytes writes them ("12.34 MiB", "456.0 KiB", "789 B").
//
//   std::fputs(trainmem::memory_table(backend.memory()).c_str(), stdout);
//   std::fputs(trainmem::memory_comparison(chosen, "bf16 full", plain, "fp32 none").c_str(), stdout);
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "trainmem/core/memory_stats.hpp"

namespace trainmem {

namespace detail {
/// One row: a left-aligned label (18 wide) and right-aligned cells (22 wide, the last 8).
inline std::string memory_row(std::string_view label, std::string_view a, std::string_view b, std::string_view c) {
  char line[160];
  std::snprintf(line, sizeof line, "%-18.*s %22.*s %22.*s", static_cast<int>(label.size()), label.data(),
                static_cast<int>(a.size()), a.data(), static_cast<int>(b.size()), b.data());
  std::string out = line;
  if (!c.empty()) {
    std::snprintf(line, sizeof line, " %8.*s", static_cast<int>(c.size()), c.data());
    out += line;
  }
  return out + "\n";
}
inline std::string bytes_cell(std::int64_t bytes) { return format_bytes(static_cast<double>(bytes)); }
}  // namespace detail

/// Live and peak bytes of every category that holds or held a byte, then the totals and
/// the device's share (every category but host_offload). Peaks are those of the current
/// peak window (MemoryStats::reset_peak, PeakWindow).
inline std::string memory_table(const MemoryStats& stats) {
  std::string out = detail::memory_row("bytes", "live", "peak", {});
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
    const auto category = static_cast<MemCategory>(c);
    const std::int64_t live = stats.live(category), peak = stats.peak(category);
    if (live == 0 && peak == 0) continue;
    out += detail::memory_row(name_of(category), detail::bytes_cell(live), detail::bytes_cell(peak), {});
  }
  out +=
      detail::memory_row("total", detail::bytes_cell(stats.live_total()), detail::bytes_cell(stats.peak_total()), {});
  out += detail::memory_row("device", detail::bytes_cell(stats.live_device()), detail::bytes_cell(stats.peak_device()),
                            {});
  return out;
}

/// Peak bytes per category of two runs (`a`, e.g. the chosen settings, and `b`, the
/// baseline) and the ratio a / b: "1.50x"; "new" where b used none, "-" where neither did.
inline std::string memory_comparison(const PeakBytes& a, std::string_view a_name, const PeakBytes& b,
                                     std::string_view b_name) {
  const auto ratio = [](std::int64_t x, std::int64_t y) {
    if (y == 0) return std::string(x == 0 ? "-" : "new");
    char text[32];
    std::snprintf(text, sizeof text, "%.2fx", static_cast<double>(x) / static_cast<double>(y));
    return std::string(text);
  };
  std::string out = detail::memory_row("peak bytes", a_name, b_name, "ratio");
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
    if (a.by_category[c] == 0 && b.by_category[c] == 0) continue;
    out += detail::memory_row(name_of(static_cast<MemCategory>(c)), detail::bytes_cell(a.by_category[c]),
                              detail::bytes_cell(b.by_category[c]), ratio(a.by_category[c], b.by_category[c]));
  }
  out += detail::memory_row("total (at peak)", detail::bytes_cell(a.total), detail::bytes_cell(b.total),
                            ratio(a.total, b.total));
  return out;
}

}  // namespace trainmem

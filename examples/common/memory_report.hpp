// examples/common/memory_report.hpp — what one training step costs in memory, by category.
//
// `measure_step` opens a peak window on a backend's MemoryStats (trainmem::PeakWindow),
// runs one step, and reads the peak of every category: the numbers a memory saving is
// judged by. With the timeline on it also keeps every allocation, free and re-tag of
// the step, and `write_memory_svg` draws it as stacked areas per category, with the
// step's phases (forward, backward, optimizer) as marks. The SVG is plain text; no
// plotting library is involved. The tables themselves are the library's
// (trainmem/core/memory_report.hpp); this file prints them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainmem/core/memory_report.hpp"
#include "trainmem/core/memory_stats.hpp"
#include "trainmem/error.hpp"

namespace examples {

using trainmem::kMemCategoryCount;
using trainmem::MemCategory;
using trainmem::MemoryStats;

/// \brief Peak bytes per category over one step, and (optionally) its timeline.
struct StepMemory {
  trainmem::PeakBytes peak;
  std::array<std::int64_t, kMemCategoryCount> live_at_start{};  // where the timeline starts
  std::vector<MemoryStats::TimelineEntry> timeline;
};

/// Runs `step` once in a fresh peak window of `stats`; records its timeline when asked.
template <class Step>
StepMemory measure_step(MemoryStats& stats, Step&& step, bool record_timeline) {
  StepMemory m;
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) m.live_at_start[c] = stats.live(static_cast<MemCategory>(c));
  stats.clear_timeline();
  stats.record_timeline(record_timeline);
  {
    const trainmem::PeakWindow window(stats);
    step();
    m.peak = window.peaks();
  }
  stats.record_timeline(false);
  if (record_timeline) m.timeline = stats.timeline();
  stats.clear_timeline();
  return m;
}

/// Peak bytes of a training loop's steady step: `step` runs once unmeasured (it allocates
/// what every later step finds: optimizer state, casts), then once measured.
template <class Step>
StepMemory measure_steady_step(MemoryStats& stats, Step&& step, bool record_timeline) {
  step();
  return measure_step(stats, step, record_timeline);
}

using trainmem::format_bytes;

/// Prints peak bytes per category of the chosen settings next to the plain FP32 step
/// (the table is the library's trainmem::memory_comparison).
inline void print_memory_table(const StepMemory& chosen, const std::string& chosen_name, const StepMemory& plain,
                               const std::string& plain_name) {
  std::fputs(trainmem::memory_comparison(chosen.peak, chosen_name, plain.peak, plain_name).c_str(), stdout);
}

inline std::string xml_escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

/// A round axis step (1, 2 or 5 times a power of ten) giving about `ticks` ticks up to `top`.
inline double nice_step(double top, int ticks) {
  const double raw = top / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * power >= raw) return m * power;
  return 10.0 * power;
}

/// Writes the step's timeline as an SVG of stacked live bytes per category.
inline void write_memory_svg(const StepMemory& m, const std::filesystem::path& path, const std::string& title) {
  trainmem::require(!m.timeline.empty(), "write_memory_svg: the step has no timeline (was it recorded?)");
  // Stacking order: long-lived state at the bottom, what a step creates on top.
  const std::array<MemCategory, kMemCategoryCount> order = {
      MemCategory::Parameter,       MemCategory::MasterWeight, MemCategory::OptimizerState, MemCategory::Gradient,
      MemCategory::SavedActivation, MemCategory::Temporary,    MemCategory::Workspace,      MemCategory::HostOffload};
  const std::array<const char*, kMemCategoryCount> colour = {
      // by MemCategory value
      "#4e79a7", "#f28e2b", "#b07aa1", "#76b7b2", "#e15759", "#edc948", "#9c755f", "#bab0ac"};

  // Live bytes per category after each event (marks change nothing but are points too).
  std::vector<std::array<double, kMemCategoryCount>> live;
  std::vector<std::pair<std::size_t, std::string>> marks;
  std::array<double, kMemCategoryCount> now{};
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) now[c] = static_cast<double>(m.live_at_start[c]);
  live.push_back(now);
  std::array<bool, kMemCategoryCount> used{};
  for (const auto& e : m.timeline) {
    if (e.event == MemoryStats::Event::Mark) {
      marks.emplace_back(live.size() - 1, e.label);
      continue;
    }
    now[static_cast<std::size_t>(e.category)] += static_cast<double>(e.bytes);
    live.push_back(now);
  }
  double top = 1.0;
  for (const auto& point : live) {
    double total = 0.0;
    for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
      total += point[c];
      used[c] = used[c] || point[c] > 0.0;
    }
    top = std::max(top, total);
  }

  constexpr double kWidth = 960, kHeight = 520, kLeft = 90, kRight = 190, kTop = 50, kBottom = 60;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const double mib = 1024.0 * 1024.0;
  const double step_mib = nice_step(top / mib, 5);
  const double y_max = std::ceil(top / mib / step_mib) * step_mib * mib;
  const double n = static_cast<double>(std::max<std::size_t>(1, live.size() - 1));
  const auto x_of = [&](double i) { return kLeft + plot_w * i / n; };
  const auto y_of = [&](double bytes) { return kTop + plot_h * (1.0 - bytes / y_max); };

  std::ofstream out(path);
  trainmem::require(out.good(), "write_memory_svg: cannot write ", path.string());
  char buf[256];
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << kWidth / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" << xml_escape(title)
      << "</text>\n";

  // Stacked areas as step functions: each event changes the value at its index.
  std::vector<double> below(live.size(), 0.0);
  for (MemCategory cat : order) {
    const auto c = static_cast<std::size_t>(cat);
    if (!used[c]) continue;
    std::string upper, lower;
    for (std::size_t i = 0; i < live.size(); ++i) {
      const double y_top = below[i] + live[i][c];
      if (i > 0) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(static_cast<double>(i)), y_of(below[i - 1] + live[i - 1][c]));
        upper += buf;
      }
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(static_cast<double>(i)), y_of(y_top));
      upper += buf;
    }
    for (std::size_t i = live.size(); i-- > 0;) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(static_cast<double>(i)), y_of(below[i]));
      lower += buf;
      if (i > 0) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", x_of(static_cast<double>(i)), y_of(below[i - 1]));
        lower += buf;
      }
    }
    out << "<polygon fill=\"" << colour[c] << "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"" << upper << lower
        << "\"/>\n";
    for (std::size_t i = 0; i < live.size(); ++i) below[i] += live[i][c];
  }

  // Axes, y ticks in MiB.
  out << "<g stroke=\"#333\">\n<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\""
      << kTop + plot_h << "\"/>\n<line x1=\"" << kLeft << "\" y1=\"" << kTop + plot_h << "\" x2=\"" << kLeft + plot_w
      << "\" y2=\"" << kTop + plot_h << "\"/>\n</g>\n";
  for (double v = 0.0; v <= y_max / mib + 1e-9; v += step_mib) {
    const double y = y_of(v * mib);
    std::snprintf(buf, sizeof buf, "%g", v);
    out << "<line x1=\"" << kLeft - 5 << "\" y1=\"" << y << "\" x2=\"" << kLeft + plot_w << "\" y2=\"" << y
        << "\" stroke=\"#ddd\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << buf
        << "</text>\n";
  }
  out << "<text transform=\"translate(24," << kTop + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << "live bytes (MiB)</text>\n";
  out << "<text x=\"" << kLeft + plot_w / 2 << "\" y=\"" << kHeight - 18 << "\" text-anchor=\"middle\">"
      << "allocator events during one training step (allocations, frees, re-tags), in order</text>\n";

  // Phase marks; a label that would run into the previous one moves down a line.
  double previous_x = -1e9, label_y = kTop + 12;
  for (const auto& [index, label] : marks) {
    const double x = x_of(static_cast<double>(index));
    label_y = x - previous_x < 70 ? label_y + 13 : kTop + 12;
    previous_x = x;
    out << "<line x1=\"" << x << "\" y1=\"" << kTop << "\" x2=\"" << x << "\" y2=\"" << kTop + plot_h
        << "\" stroke=\"#222\" stroke-dasharray=\"4,3\"/>\n<text x=\"" << x + 3 << "\" y=\"" << label_y
        << "\" font-size=\"11\">" << xml_escape(label) << "</text>\n";
  }

  // Legend with each category's peak over the step.
  double legend_y = kTop + 10;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const auto c = static_cast<std::size_t>(*it);
    if (!used[c]) continue;
    const auto name = trainmem::name_of(*it);
    out << "<rect x=\"" << kLeft + plot_w + 16 << "\" y=\"" << legend_y - 10 << "\" width=\"12\" height=\"12\" fill=\""
        << colour[c] << "\"/>\n<text x=\"" << kLeft + plot_w + 34 << "\" y=\"" << legend_y << "\">" << std::string(name)
        << "</text>\n<text x=\"" << kLeft + plot_w + 34 << "\" y=\"" << legend_y + 14
        << "\" font-size=\"10\" fill=\"#555\">peak " << format_bytes(static_cast<double>(m.peak.by_category[c]))
        << "</text>\n";
    legend_y += 36;
  }
  out << "<text x=\"" << kLeft + plot_w + 16 << "\" y=\"" << legend_y + 4 << "\" font-size=\"11\">total peak "
      << format_bytes(static_cast<double>(m.peak.total)) << "</text>\n";
  out << "</svg>\n";
  trainmem::require(out.good(), "write_memory_svg: writing ", path.string(), " failed");
}

}  // namespace examples

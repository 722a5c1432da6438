// trainmem/core/memory_stats.hpp — exact byte accounting by category.
//
// Every byte a backend allocator hands out is tagged with a category and counted
// here, live and peak, per category and in total. Checkpointing and mixed-precision
// claims are checked against these numbers. A saved activation is a tensor that was
// allocated as a temporary and then kept for backward: packing it re-tags its bytes,
// so "saved activation" counts exactly what the tape holds on to.
//
// Thread safety: every method may be called from several threads at once (a backend
// shared by threads that each train their own model): counters change under one
// mutex. timeline() hands out a reference, so read it while no thread allocates.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace trainmem {

enum class MemCategory : std::uint8_t {
  Parameter,
  Gradient,
  MasterWeight,
  OptimizerState,
  SavedActivation,
  Temporary,
  Workspace,
  HostOffload,  // pinned host copies of offloaded activations
};
inline constexpr std::size_t kMemCategoryCount = 8;

constexpr std::string_view name_of(MemCategory category) {
  constexpr std::array<std::string_view, kMemCategoryCount> names = {
      "parameter",        "gradient",  "master_weight", "optimizer_state",
      "saved_activation", "temporary", "workspace",     "host_offload"};
  return names[static_cast<std::size_t>(category)];
}

/// \brief Live and peak bytes per category, with an optional timeline.
class MemoryStats {
 public:
  enum class Event : std::uint8_t { Allocate, Free, Retag, Mark };
  struct TimelineEntry {
    Event event;
    MemCategory category;
    std::int64_t bytes;  // signed change to `category` (0 for a mark)
    std::int64_t live_total;
    std::string label;  // only for marks
  };

  void on_allocate(MemCategory category, std::size_t bytes) {
    change(category, static_cast<std::int64_t>(bytes), Event::Allocate);
  }
  void on_free(MemCategory category, std::size_t bytes) {
    change(category, -static_cast<std::int64_t>(bytes), Event::Free);
  }
  /// Moves live bytes from one category to another (a temporary becoming saved).
  void on_retag(MemCategory from, MemCategory to, std::size_t bytes) {
    if (from == to) return;
    change(from, -static_cast<std::int64_t>(bytes), Event::Retag);
    change(to, static_cast<std::int64_t>(bytes), Event::Retag);
  }

  std::int64_t live(MemCategory c) const {
    return locked([&] { return live_[index(c)]; });
  }
  std::int64_t peak(MemCategory c) const {
    return locked([&] { return peak_[index(c)]; });
  }
  std::int64_t live_total() const {
    return locked([&] { return live_total_; });
  }
  std::int64_t peak_total() const {
    return locked([&] { return peak_total_; });
  }
  std::int64_t allocations() const {
    return locked([&] { return allocations_; });
  }

  /// Starts a new peak window: every peak becomes the current live value.
  void reset_peak() {
    std::lock_guard lock(mutex_);
    peak_ = live_;
    peak_total_ = live_total_;
  }

  void record_timeline(bool on) {
    std::lock_guard lock(mutex_);
    recording_ = on;
  }
  bool recording_timeline() const {
    return locked([&] { return recording_; });
  }
  const std::vector<TimelineEntry>& timeline() const { return timeline_; }
  void clear_timeline() {
    std::lock_guard lock(mutex_);
    timeline_.clear();
  }
  /// Adds a labelled point to the timeline ("forward", "backward", ...).
  void mark(std::string label) {
    std::lock_guard lock(mutex_);
    if (recording_) timeline_.push_back({Event::Mark, MemCategory::Temporary, 0, live_total_, std::move(label)});
  }

 private:
  static std::size_t index(MemCategory c) { return static_cast<std::size_t>(c); }

  template <class F>
  auto locked(F&& read) const -> decltype(read()) {
    std::lock_guard lock(mutex_);
    return read();
  }

  void change(MemCategory category, std::int64_t delta, Event event) {
    std::lock_guard lock(mutex_);
    auto& live = live_[index(category)];
    live += delta;
    live_total_ += delta;
    if (live > peak_[index(category)]) peak_[index(category)] = live;
    if (live_total_ > peak_total_) peak_total_ = live_total_;
    if (event == Event::Allocate) ++allocations_;
    if (recording_) timeline_.push_back({event, category, delta, live_total_, {}});
  }

  std::array<std::int64_t, kMemCategoryCount> live_{};
  std::array<std::int64_t, kMemCategoryCount> peak_{};
  std::int64_t live_total_ = 0;
  std::int64_t peak_total_ = 0;
  std::int64_t allocations_ = 0;
  bool recording_ = false;
  std::vector<TimelineEntry> timeline_;
  mutable std::mutex mutex_;
};

/// Bytes for a person: "12.34 MiB", "456.0 KiB", "789 B".
inline std::string format_bytes(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024.0) std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1024.0 * 1024.0));
  else if (bytes >= 1024.0) std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  else std::snprintf(text, sizeof text, "%.0f B", bytes);
  return text;
}

}  // namespace trainmem

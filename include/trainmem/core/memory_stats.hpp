// trainmem/core/memory_stats.hpp — exact byte accounting by category.
//
// Every byte a backend allocator hands out is tagged with a category and counted
// here, live and peak, per category, in total and on the device (every category but
// HostOffload: what the accelerator itself holds; on the CPU the same as the total,
// as nothing is offloaded there). Checkpointing and mixed-precision
// claims are checked against these numbers. A saved activation is a tensor that was
// allocated as a temporary and then kept for backward: packing it re-tags its bytes,
// so "saved activation" counts exactly what the tape holds on to.
//
// A peak window is "the most bytes live since a mark": `PeakWindow` opens one for a
// scope (a training step) and nests, because closing it folds its peaks back into the
// window around it, so an outer measurement still sees the inner one's high point.
//
// Thread safety: every method may be called from several threads at once (a backend
// shared by threads that each train their own model): counters change under one
// mutex. timeline() hands out a reference, so read it while no thread allocates.
// Peak windows on one MemoryStats must close in the order they opened (one thread's
// nested scopes); windows of several threads at once would mix their peaks.
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

/// \brief Peak bytes per category and in total, as read from one peak window.
struct PeakBytes {
  std::array<std::int64_t, kMemCategoryCount> by_category{};
  std::int64_t total = 0;
  std::int64_t device = 0;  // every category but HostOffload

  std::int64_t operator[](MemCategory c) const { return by_category[static_cast<std::size_t>(c)]; }
  /// Keeps the larger of each figure: the peaks over this window and `other`.
  PeakBytes& merge(const PeakBytes& other) {
    for (std::size_t c = 0; c < kMemCategoryCount; ++c)
      if (other.by_category[c] > by_category[c]) by_category[c] = other.by_category[c];
    if (other.total > total) total = other.total;
    if (other.device > device) device = other.device;
    return *this;
  }
  bool operator==(const PeakBytes&) const = default;
};

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
  /// Live and peak bytes on the device: every category but HostOffload.
  std::int64_t live_device() const {
    return locked([&] { return live_device_; });
  }
  std::int64_t peak_device() const {
    return locked([&] { return peak_device_; });
  }
  std::int64_t allocations() const {
    return locked([&] { return allocations_; });
  }

  /// Every peak of the current window, read at one instant.
  PeakBytes peaks() const {
    return locked([&] { return PeakBytes{peak_, peak_total_, peak_device_}; });
  }

  /// Starts a new peak window: every peak becomes the current live value (what came
  /// before is forgotten; PeakWindow keeps it).
  void reset_peak() { (void)open_window(); }

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
  friend class PeakWindow;

  static std::size_t index(MemCategory c) { return static_cast<std::size_t>(c); }

  /// Starts a window and returns the peaks of the one it interrupts.
  PeakBytes open_window() {
    std::lock_guard lock(mutex_);
    PeakBytes outer{peak_, peak_total_, peak_device_};
    peak_ = live_;
    peak_total_ = live_total_;
    peak_device_ = live_device_;
    return outer;
  }
  /// Ends a window: the interrupted one's peaks become the larger of both.
  void close_window(const PeakBytes& outer) {
    std::lock_guard lock(mutex_);
    PeakBytes merged{peak_, peak_total_, peak_device_};
    merged.merge(outer);
    peak_ = merged.by_category;
    peak_total_ = merged.total;
    peak_device_ = merged.device;
  }

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
    if (category != MemCategory::HostOffload) live_device_ += delta;
    if (live > peak_[index(category)]) peak_[index(category)] = live;
    if (live_total_ > peak_total_) peak_total_ = live_total_;
    if (live_device_ > peak_device_) peak_device_ = live_device_;
    if (event == Event::Allocate) ++allocations_;
    if (recording_) timeline_.push_back({event, category, delta, live_total_, {}});
  }

  std::array<std::int64_t, kMemCategoryCount> live_{};
  std::array<std::int64_t, kMemCategoryCount> peak_{};
  std::int64_t live_total_ = 0;
  std::int64_t peak_total_ = 0;
  std::int64_t live_device_ = 0;
  std::int64_t peak_device_ = 0;
  std::int64_t allocations_ = 0;
  bool recording_ = false;
  std::vector<TimelineEntry> timeline_;
  mutable std::mutex mutex_;
};

/// \brief RAII: the peak bytes of a scope, e.g. one training step.
///
/// Opens a window on `stats` (peaks restart from the live bytes) and, when it ends,
/// folds its peaks back into the window it interrupted, so windows nest.
class PeakWindow {
 public:
  explicit PeakWindow(MemoryStats& stats) : stats_(&stats), outer_(stats.open_window()) {}
  ~PeakWindow() { stats_->close_window(outer_); }
  PeakWindow(const PeakWindow&) = delete;
  PeakWindow& operator=(const PeakWindow&) = delete;

  /// The peaks since this window opened (inner windows included).
  PeakBytes peaks() const { return stats_->peaks(); }

 private:
  MemoryStats* stats_;
  PeakBytes outer_;
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

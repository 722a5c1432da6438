// trainmem/backend/cpu/allocator.hpp — tracked, 64-byte-aligned host allocator.
//
// Every allocation is counted in MemoryStats under its category. Freed blocks are
// kept in a per-size cache and handed out again: a training step allocates the same
// sizes every step, and reusing warm pages avoids the page faults that a fresh large
// malloc costs. Cached bytes are not live bytes; `cached_bytes()` reports them and
// `release_cached()` returns them to the system. The cache is bounded: live + cached
// stays within twice the most this allocator ever had live (the high-water mark), so
// forward and backward can each keep their own sizes warm, while a program that changes
// its sizes (a batch-size search, a planner trying schedules) holds at most twice its
// largest step, not the sum of every size it tried. A miss that would pass the bound
// first frees cached blocks.
//
// Fault injection: `fail_allocation(k)` makes the k-th allocation from now throw
// trainmem::Error as an exhausted system would, so tests can check that every
// allocation point of a training step fails cleanly.
//
// Thread safety: allocate, deallocate, fail_allocation and the cache methods may be called from several
// threads at once (the cache is behind a mutex, MemoryStats locks its own counters), so
// threads that each train their own model can share one backend, the default one
// included. What one thread's tensors and tapes hold is not shared: a Tensor, Var or
// Tape is used by one thread at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "trainmem/core/memory_stats.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cpu {

class Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;
  static constexpr std::size_t kCacheBound = 2;

  explicit Allocator(MemoryStats& stats) : stats_(stats) {}
  ~Allocator() { release_cached(); }
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  void* allocate(std::size_t bytes, MemCategory category) {
    const std::size_t rounded = round_up(bytes);
    void* ptr = nullptr;
    std::lock_guard lock(mutex_);
    if (fail_countdown_ > 0 && --fail_countdown_ == 0)
      throw Error(detail::concat("cpu::Allocator: injected failure allocating ", bytes, " bytes for ",
                                 name_of(category), " (fail_allocation)"));
    if (auto it = cache_.find(rounded); it != cache_.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
    } else {
      high_water_ = std::max(high_water_, live_rounded_ + rounded);
      trim_cache_locked(kCacheBound * high_water_ - (live_rounded_ + rounded));
      ptr = std::aligned_alloc(kAlignment, rounded);
      detail::check(ptr != nullptr, "cpu::Allocator: out of memory allocating ", bytes, " bytes for ",
                    name_of(category), " (live ", stats_.live_total(), " bytes)");
    }
    live_rounded_ += rounded;
    stats_.on_allocate(category, bytes);
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes, MemCategory category) {
    if (ptr == nullptr) return;
    stats_.on_free(category, bytes);
    const std::size_t rounded = round_up(bytes);
    std::lock_guard lock(mutex_);
    live_rounded_ -= rounded;
    if (caching_) {
      cache_[rounded].push_back(ptr);
      cached_bytes_ += rounded;
    } else {
      std::free(ptr);
    }
  }

  /// The k-th allocation from now (1: the next) throws trainmem::Error, once; 0 disarms.
  void fail_allocation(std::int64_t k) {
    std::lock_guard lock(mutex_);
    fail_countdown_ = k > 0 ? k : 0;
  }

  /// Turn the block cache off (every free goes straight back to the system) or on.
  void set_caching(bool on) {
    {
      std::lock_guard lock(mutex_);
      caching_ = on;
    }
    if (!on) release_cached();
  }
  std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }
  void release_cached() {
    std::lock_guard lock(mutex_);
    trim_cache_locked(0);
  }
  /// The most bytes (rounded to blocks) this allocator has had live at once; live + cached
  /// stays within kCacheBound times it.
  std::size_t high_water_bytes() const {
    std::lock_guard lock(mutex_);
    return high_water_;
  }

 private:
  /// Frees cached blocks until at most `keep` bytes stay cached (mutex held).
  void trim_cache_locked(std::size_t keep) {
    for (auto it = cache_.begin(); it != cache_.end() && cached_bytes_ > keep;) {
      std::vector<void*>& blocks = it->second;
      while (!blocks.empty() && cached_bytes_ > keep) {
        std::free(blocks.back());
        blocks.pop_back();
        cached_bytes_ -= it->first;
      }
      it = blocks.empty() ? cache_.erase(it) : std::next(it);
    }
  }

  static std::size_t round_up(std::size_t bytes) {
    return bytes == 0 ? kAlignment : (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

  MemoryStats& stats_;
  bool caching_ = true;
  std::size_t cached_bytes_ = 0;
  std::size_t live_rounded_ = 0;  // live bytes as blocks (rounded up to kAlignment)
  std::size_t high_water_ = 0;    // the most live_rounded_ has been
  std::unordered_map<std::size_t, std::vector<void*>> cache_;
  std::int64_t fail_countdown_ = 0;  // > 0: allocations left until the injected failure
  mutable std::mutex mutex_;
};

}  // namespace trainmem::cpu

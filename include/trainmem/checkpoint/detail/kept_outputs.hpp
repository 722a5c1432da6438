// trainmem/checkpoint/detail/kept_outputs.hpp — the op outputs a region kept from its forward.
//
// Keyed by the op's ordinal in the region, so the recompute, which runs the same ops in
// the same order, can hand an op its outputs back instead of computing them (selective
// recompute skips the matmuls). A kept output is held by a SavedRef, so its bytes count
// as a saved activation for as long as the region keeps it. Where the backend can offload,
// outputs may instead live as host copies, fetched back for the length of one
// recompute; on a backend with nowhere to offload to there are none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/autograd/saved_tensor.hpp"
#include "trainmem/core/backend_contract.hpp"

namespace trainmem {
namespace detail {

/// \brief What a region's forward kept of its ops' outputs, by op ordinal.
template <class B>
class KeptOutputs {
 public:
  /// Bytes kept in memory (offloaded copies do not count).
  std::size_t bytes() const { return bytes_; }

  /// Keeps `outputs` in memory. With an op ordinal the recompute reuses them for that op;
  /// with -1 they are only held (a named tensor whose producer cannot be skipped).
  void save(std::int64_t op_index, const std::vector<Tensor<B>>& outputs) {
    if (op_index >= 0 && saved_.count(op_index) != 0) return;  // named after it was kept: held once
    auto& refs = refs_[op_index];
    for (const auto& t : outputs) {
      refs.emplace_back(t);
      bytes_ += t.bytes();
    }
    if (op_index >= 0) saved_[op_index] = outputs;
  }

  /// Copies `outputs` of op `op_index` to host memory; the recompute fetches them back.
  void offload(std::int64_t op_index, const std::vector<Tensor<B>>& outputs) requires HasOffload<B> {
    if (offloaded_.count(op_index) != 0) return;  // named after it was offloaded: copied once
    auto& entry = offloaded_[op_index];
    for (const auto& t : outputs) {
      entry.copies.push_back(t.backend().offload(t));
      offload_backend_ = &t.backend();
    }
  }

  /// The region's forward is over: the device waits for the copies out of what it offloaded,
  /// and their device bytes go back to the pool now (in stream order), not when the host
  /// next finds a copy done; so a stage's offloaded activations stop taking device memory
  /// where it ends, as the planner's profile measured (NOTE [Offload ordering]).
  void release_offloaded_sources() {
    if constexpr (HasOffload<B>) {
      if (offload_backend_ != nullptr) offload_backend_->release_offloaded_sources();
    }
  }

  /// Releases what nothing can use: of each op kept for reuse that the recompute never
  /// reaches (`reached(op_index)` is false), the outputs no save refers to
  /// (`referenced(tensor)` is false). Its referenced outputs stay held, no longer for
  /// reuse (feed_forward keeps z, which its backward saved, and lets y go). The host
  /// copies of such an op go too: no recompute would fetch them back for anything.
  template <class Reached, class Referenced>
  void release_unused(Reached&& reached, Referenced&& referenced) {
    for (auto it = offloaded_.begin(); it != offloaded_.end();)
      it = reached(it->first) ? std::next(it) : offloaded_.erase(it);
    for (auto it = saved_.begin(); it != saved_.end();) {
      if (reached(it->first)) {
        ++it;
        continue;
      }
      std::vector<SavedRef<B>>& refs = refs_[it->first];
      std::vector<SavedRef<B>> held;
      for (SavedRef<B>& ref : refs) {
        if (referenced(ref.tensor())) held.push_back(std::move(ref));
        else bytes_ -= ref.tensor().bytes();
      }
      if (held.empty()) refs_.erase(it->first);
      else refs = std::move(held);
      it = saved_.erase(it);
    }
  }

  /// During a recompute: the outputs of op `op_index` kept from the forward, or null.
  const std::vector<Tensor<B>>* find(std::int64_t op_index) const {
    if (auto it = saved_.find(op_index); it != saved_.end()) return &it->second;
    if (auto it = offloaded_.find(op_index); it != offloaded_.end()) return &it->second.fetched;
    return nullptr;
  }

  /// Brings every offloaded output back to device memory for one recompute.
  void fetch_offloaded(B& backend) {
    if constexpr (HasOffload<B>) {
      for (auto& [index, entry] : offloaded_) {
        entry.fetched.clear();
        for (auto& copy : entry.copies) entry.fetched.push_back(backend.fetch(copy));
      }
    }
  }
  /// Frees the fetched device copies once the recompute is done (the host copies stay).
  void drop_fetched() {
    for (auto& [index, entry] : offloaded_) entry.fetched.clear();
  }

 private:
  template <class Backend, bool = HasOffload<Backend>>
  struct HostCopyOf {
    using type = int;  // nothing to offload to
  };
  template <class Backend>
  struct HostCopyOf<Backend, true> {
    using type = decltype(std::declval<Backend&>().offload(std::declval<const Tensor<Backend>&>()));
  };
  struct Offloaded {
    std::vector<typename HostCopyOf<B>::type> copies;
    std::vector<Tensor<B>> fetched;
  };

  std::unordered_map<std::int64_t, std::vector<Tensor<B>>> saved_;
  std::unordered_map<std::int64_t, std::vector<SavedRef<B>>> refs_;
  std::unordered_map<std::int64_t, Offloaded> offloaded_;
  B* offload_backend_ = nullptr;  // the backend the copies went through, once there are any
  std::size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace trainmem

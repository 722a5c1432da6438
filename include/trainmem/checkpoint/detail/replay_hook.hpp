// trainmem/checkpoint/detail/replay_hook.hpp — the save hook a region pushes only while it recomputes.
//
// NOTE [Region recompute]
// fn runs again on the region's saved inputs, under the replay state the forward started
// from, and with the same op ordinals as the forward: an op whose outputs the forward
// kept gets them back instead of computing (so selective recompute skips the matmuls),
// and the k-th save of the recompute is checked against the k-th save of the forward and
// fills its slot. The recompute keeps nothing and decides nothing: everything it needs
// the forward recorded. It stops as soon as the last slot is filled (as PyTorch's
// non-reentrant checkpoint does), so the ops after it are never rerun.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "trainmem/checkpoint/detail/forward_record.hpp"
#include "trainmem/checkpoint/options.hpp"

namespace trainmem {
namespace detail {

/// \brief Replays a region's forward into the slots of its ForwardRecord.
template <class B>
class ReplayHook final : public SaveHook<B> {
 public:
  /// Thrown through fn once every slot is filled, to end the recompute early; the region
  /// that pushed the hook catches it.
  struct Stop {};

  ReplayHook(ForwardRecord<B>& record, bool early_stop) : record_(record), early_stop_(early_stop) {}

  std::int64_t begin_op(const OpIdentity&) override { return next_op_++; }

  const std::vector<Tensor<B>>* reuse_outputs(std::int64_t op_index) override {
    const auto* kept = record_.kept.find(op_index);
    if (kept != nullptr) ++checkpoint_stats().ops_reused;
    return kept;
  }

  void on_outputs(std::int64_t, const OpIdentity&, double, std::span<const Tensor<B>>) override {}

  /// The k-th save of the recompute fills the slot of the k-th save of the forward.
  SavedTensor<B> pack(const Tensor<B>& tensor, const SaveInfo& info) override {
    const std::size_t k = saves_++;
    const std::int64_t slot = record_.saves.verify(k, tensor, info.op->name);
    if (slot < 0) return {};
    record_.slots[static_cast<std::size_t>(slot)] = SavedRef<B>(tensor);
    if (early_stop_ && k == record_.last_placeholder_save) throw Stop{};
    return {};
  }

  bool replaying() const override { return true; }

  /// fn ran to the end: checks it saved as many tensors as the forward.
  void verify_complete() const { record_.saves.verify_complete(saves_); }

 private:
  ForwardRecord<B>& record_;
  bool early_stop_;
  std::int64_t next_op_ = 0;
  std::size_t saves_ = 0;
};

}  // namespace detail
}  // namespace trainmem

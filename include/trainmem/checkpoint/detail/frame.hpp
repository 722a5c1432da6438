// trainmem/checkpoint/detail/frame.hpp — one checkpoint region, from its forward to its last unpack.
//
// The frame owns what the region's forward recorded (ForwardRecord), fn itself, and the
// hook the forward runs under. Every placeholder the forward made shares the frame, so it
// lives exactly as long as some saved tensor can still ask for a slot. The first unpack
// of an empty slot recomputes: fn runs again under a ReplayHook, into a scratch node list
// (never onto the tape), and fills every slot the recompute reaches. Each slot is freed
// once unpacked, so a second backward (retain_graph) recomputes again.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/detail/forward_hook.hpp"
#include "trainmem/checkpoint/detail/replay_hook.hpp"

namespace trainmem {
namespace detail {

/// \brief A checkpoint region: its forward record, its fn, and its recompute.
template <class B>
class RegionFrame final : public Unpacker<B> {
 public:
  using Body = std::function<void(const std::vector<Var<B>>&)>;

  /// Opens a region on `tape`: captures the replay state and keeps `inputs`. Push
  /// forward_hook() while fn runs, then call finish_forward().
  static std::shared_ptr<RegionFrame> open(Tape<B>& tape, const CheckpointOptions& options, Body body,
                                           const std::vector<Var<B>>& inputs) {
    auto frame = std::make_shared<RegionFrame>(tape, options, std::move(body));
    frame->forward_.emplace(frame->record_, options, std::weak_ptr<Unpacker<B>>(frame));
    frame->forward_->save_inputs(tape, inputs);
    return frame;
  }

  RegionFrame(Tape<B>& tape, const CheckpointOptions& options, Body body)
      : tape_(tape),
        body_(std::move(body)),
        early_stop_(options.early_stop),
        record_(options.determinism, ReplayState<B>::capture(tape)) {}
  RegionFrame(const RegionFrame&) = delete;
  RegionFrame& operator=(const RegionFrame&) = delete;

  /// The hook fn's forward runs under.
  ForwardHook<B>* forward_hook() { return &*forward_; }
  /// fn's forward has returned.
  void finish_forward() { forward_->finish(); }

  Tensor<B> unpack(std::int64_t slot, const SavedTensor<B>&) override {
    auto& held = record_.slots.at(static_cast<std::size_t>(slot));
    if (!held.holds()) recompute();
    Tensor<B> t = held.tensor();
    held = SavedRef<B>();
    return t;
  }

 private:
  void recompute() {
    ++checkpoint_stats().recomputes;
    std::vector<Var<B>> inputs;
    for (std::size_t i = 0; i < record_.inputs.size(); ++i) {
      auto impl = std::make_shared<VarImpl<B>>();
      impl->value = record_.inputs[i].unpack();
      // A parameter input stays on no tape, so the ops take its cast from the cast cache
      // and keep what they kept in forward (an adopted one would be cast as an activation).
      if (!record_.input_is_parameter[i]) tape_.adopt(*impl);
      impl->requires_grad = record_.input_requires_grad[i];
      if (impl->requires_grad) impl->grad_slot = std::make_shared<GradSlot<B>>();
      inputs.emplace_back(std::move(impl));
    }
    record_.kept.fetch_offloaded(tape_.backend());
    std::vector<std::unique_ptr<Node<B>>> scratch;
    {
      typename Tape<B>::RecordInto record_into(tape_, scratch);
      typename ReplayState<B>::Scope replay_state(tape_, record_.saves.start());
      ReplayHook<B> replay(record_, early_stop_);
      typename Tape<B>::HookScope hook(tape_, &replay);
      try {
        body_(inputs);
        replay.verify_complete();
      } catch (const typename ReplayHook<B>::Stop&) {
      }
    }
    record_.kept.drop_fetched();
  }

  Tape<B>& tape_;
  Body body_;
  bool early_stop_;
  ForwardRecord<B> record_;
  std::optional<ForwardHook<B>> forward_;
};

}  // namespace detail
}  // namespace trainmem

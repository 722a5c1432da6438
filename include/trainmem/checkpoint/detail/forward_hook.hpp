// trainmem/checkpoint/detail/forward_hook.hpp — the save hook a region pushes while fn runs forward.
//
// NOTE [Region forward]
//  - The region keeps its inputs, saved through the enclosing context (the tape, or an
//    outer region: regions nest, and the innermost owns what is saved inside it; an
//    input the outer region drops is dropped by the inner one too, never held by a save).
//  - Each op's outputs go past the keep decision, which may keep (or offload) them.
//  - Each tensor an op saves for backward becomes a placeholder naming a slot of the
//    region, unless it is alive anyway (a parameter, its cached 16-bit cast or its f32
//    master, a region input, an output the region kept), in which case the saved tensor
//    refers to it directly.
//  - When fn returns, a kept output that no save refers to and that the recompute (which
//    stops at the last placeholder) never reaches is released: nothing could use it. Of
//    an op with several outputs, the ones a save refers to stay (held, not for reuse).
// The hook also orders the forward's events (ops computing, tensors saved), which is
// what tells which kept outputs a shortened recompute still reaches.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainmem/autocast/op_info.hpp"
#include "trainmem/autograd/tape.hpp"
#include "trainmem/checkpoint/detail/forward_record.hpp"
#include "trainmem/checkpoint/detail/keep_decision.hpp"

namespace trainmem {
namespace detail {

inline constexpr OpInfo kCheckpointInputOp{"checkpoint (region input)", OpKind::Shape, AutocastCategory::Unchanged};
inline constexpr OpInfo kCheckpointNameOp{"checkpoint_name", OpKind::Tag, AutocastCategory::Unchanged};

/// \brief Records a region's forward into its ForwardRecord; placeholders unpack through `unpacker`.
template <class B>
class ForwardHook final : public SaveHook<B> {
 public:
  ForwardHook(ForwardRecord<B>& record, const CheckpointOptions& options, std::weak_ptr<Unpacker<B>> unpacker)
      : record_(record), keep_(options.policy, options.memory_budget), unpacker_(std::move(unpacker)) {}

  /// Keeps the region's inputs through the context enclosing the region (call before
  /// this hook is pushed).
  void save_inputs(Tape<B>& tape, const std::vector<Var<B>>& inputs) {
    SaveHook<B>* parent = tape.hook();
    for (const Var<B>& in : inputs) {
      const Tensor<B>& value = in.value();
      if (parent != nullptr) {
        const std::int64_t index = parent->begin_op(kCheckpointInputOp);
        record_.inputs.push_back(parent->pack(value, SaveInfo{&kCheckpointInputOp, index, value.bytes(), 0.0}));
      } else {
        record_.inputs.push_back(SavedTensor<B>::keep(value, kCheckpointInputOp.name));
      }
      record_.input_requires_grad.push_back(in.requires_grad());
      record_.input_is_parameter.push_back(in.tape() == nullptr);
      // An input the enclosing region turned into its own placeholder is not alive anyway:
      // saves of it here become this region's placeholders too (its recompute fills them
      // from the input it gets back), or they alone would keep it through the forward.
      if (record_.inputs.back().holds_tensor()) alive_.insert(value.storage().get());
    }
  }

  std::int64_t begin_op(const OpIdentity&) override { return next_op_++; }

  const std::vector<Tensor<B>>* reuse_outputs(std::int64_t) override { return nullptr; }

  void on_outputs(std::int64_t op_index, const OpIdentity& op, double flops,
                  std::span<const Tensor<B>> outputs) override {
    compute_event_[op_index] = events_++;
    output_counts_[op_index] = outputs.size();
    std::size_t bytes = 0;
    for (const auto& t : outputs) bytes += t.bytes();
    keep(op_index, OpSummary{op, bytes, flops, {}}, std::vector<Tensor<B>>(outputs.begin(), outputs.end()));
  }

  SavedTensor<B> pack(const Tensor<B>& tensor, const SaveInfo& info) override {
    const bool alive = tensor.category() == MemCategory::Parameter || tensor.category() == MemCategory::MasterWeight ||
                       alive_.count(tensor.storage().get()) != 0;
    const std::int64_t event = events_++;
    packed_.insert(tensor.storage().get());
    if (alive) {
      record_.saves.record(tensor, info.op->name, -1);
      return SavedTensor<B>::keep(tensor, info.op->name);
    }
    last_placeholder_event_ = event;
    record_.last_placeholder_save = record_.saves.saves();
    const auto slot = static_cast<std::int64_t>(record_.slots.size());
    record_.slots.emplace_back();
    record_.saves.record(tensor, info.op->name, slot);
    return SavedTensor<B>::placeholder(tensor, info.op->name, unpacker_.lock(), slot);
  }

  /// checkpoint_name: lets the policy keep `x` under `name` (and skip its producer in recompute).
  void name_tensor(const VarImpl<B>& x, std::string_view name) override {
    const std::int64_t producer = x.hook == this ? x.op_index : -1;
    const bool single_output = producer >= 0 && output_counts_.count(producer) && output_counts_[producer] == 1;
    keep(single_output ? producer : -1, OpSummary{kCheckpointNameOp, x.value.bytes(), 0.0, name}, {x.value});
  }

  /// fn has returned: releases kept outputs that no saved tensor refers to and that the
  /// recompute will never reach, and the device bytes of what went to host memory.
  void finish() {
    record_.kept.release_unused(
        [this](std::int64_t op_index) {
          const auto computed = compute_event_.find(op_index);
          return computed != compute_event_.end() && computed->second < last_placeholder_event_;
        },
        [this](const Tensor<B>& t) { return packed_.count(t.storage().get()) != 0; });
    record_.kept.release_offloaded_sources();
  }

 private:
  /// Applies the keep decision; outputs kept in memory are alive from now on.
  void keep(std::int64_t op_index, const OpSummary& summary, const std::vector<Tensor<B>>& outputs) {
    if (keep_.keep(op_index, summary, outputs, record_.kept))
      for (const auto& t : outputs) alive_.insert(t.storage().get());
  }

  ForwardRecord<B>& record_;
  KeepDecision<B> keep_;
  std::weak_ptr<Unpacker<B>> unpacker_;
  std::set<const void*> alive_;   // storages alive anyway: saved directly
  std::set<const void*> packed_;  // storages some op saved (directly or as a placeholder)
  std::unordered_map<std::int64_t, std::size_t> output_counts_;
  std::unordered_map<std::int64_t, std::int64_t> compute_event_;
  std::int64_t events_ = 0;  // op computes and saves of the forward, in order
  std::int64_t last_placeholder_event_ = -1;
  std::int64_t next_op_ = 0;
};

}  // namespace detail
}  // namespace trainmem

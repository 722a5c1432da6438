// trainmem/checkpoint/detail/forward_record.hpp — what a region's forward leaves for its recompute.
//
// The forward writes it (ForwardHook), a recompute reads it and fills its slots
// (ReplayHook), and the region's frame owns it for as long as a placeholder can ask for
// a slot: the inputs fn runs on again, the outputs the policy kept, the record of every
// save the recompute must reproduce, and one slot per placeholder. A slot holds its
// recomputed tensor only from the recompute that fills it until its one unpack.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "trainmem/checkpoint/detail/determinism.hpp"
#include "trainmem/checkpoint/detail/kept_outputs.hpp"

namespace trainmem {
namespace detail {

/// \brief A region's inputs, kept outputs, saves and placeholder slots.
template <class B>
struct ForwardRecord {
  ForwardRecord(DeterminismCheck level, ReplayState<B> start) : saves(level, std::move(start)) {}

  std::vector<SavedTensor<B>> inputs;  // saved through the enclosing context
  std::vector<bool> input_requires_grad;
  std::vector<bool> input_is_parameter;  // on no tape: recompute gives it to the ops as a parameter
  KeptOutputs<B> kept;
  DeterminismRecord<B> saves;
  std::vector<SavedRef<B>> slots;  // one per placeholder
  /// The save that fills the last slot: a recompute that reaches it has every slot.
  std::size_t last_placeholder_save = std::numeric_limits<std::size_t>::max();
};

}  // namespace detail
}  // namespace trainmem
